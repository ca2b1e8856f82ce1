//! Redis Sentinel nodes (`redis+sentinel://`) against real groups: a
//! master, a replica and three Sentinels per test (tests/support/sentinel.rs).
//! A failover is a restart: the promoted replica, which missed the last
//! acquire (its replication cut before it), counts as started at its
//! promotion; the guard-off control shows the second holder it would give.
//! Each test has its own group, so the failovers run concurrently.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redfence::{Client, ConfigError, NodeErrorKind, NodeSpec, RestartGuard, Retry};

use crate::helpers::{eventually, lock_key, ms, notice_channel, secs};
use crate::support::sentinel::{GroupOptions, SentinelGroup, MASTER_NAME};
use crate::support::RedisServer;

fn client(nodes: Vec<NodeSpec>, guard: RestartGuard) -> Client {
    Client::builder(nodes)
        .node_timeout(ms(500))
        .restart_guard(guard)
        .build()
        .unwrap()
}

/// The lock's operations through the Sentinels, with the builder form; and
/// a master name the Sentinels do not know, a typed permanent error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_node_locks_extends_fences_and_wakes_waiters() {
    let group = SentinelGroup::start();
    let ports: Vec<String> = group
        .sentinels
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let spec = NodeSpec::sentinel(&ports, MASTER_NAME);
    assert!(spec.is_sentinel());
    // Classic waiters, woken by the release notice on the master.
    let client = Client::builder([spec])
        .node_timeout(ms(500))
        .restart_guard(RestartGuard::off())
        .fair(false)
        .build()
        .unwrap();
    let first = client.acquire("s", secs(5)).await.unwrap();
    assert_eq!(group.servers[0].count_keys(&lock_key("s")), 1);
    assert!(first.extend(secs(10)).await.unwrap() > secs(5));
    let t1 = first.token().unwrap().get();
    let waiter = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .lock("s", secs(5))
                // A fallback far beyond the test: only a notice wakes it.
                .retry(
                    Retry::new()
                        .with_max_wait(secs(60))
                        .with_delay(secs(50))
                        .with_jitter(Duration::ZERO),
                )
                .acquire()
                .await
        }
    });
    let master = &group.servers[0];
    let channel = notice_channel(&lock_key("s"));
    assert!(
        eventually(secs(10), || master
            .cli(&["PUBSUB", "NUMSUB", &channel])
            .ends_with('1'))
        .await,
        "the waiter never subscribed on the master"
    );
    tokio::time::sleep(ms(100)).await;
    first.release().await;
    let second = tokio::time::timeout(secs(20), waiter)
        .await
        .expect("woken by the notice")
        .unwrap()
        .unwrap();
    assert!(second.token().unwrap().get() > t1);
    second.release().await;

    // The audit: the group as the Sentinels see it, and the failover's cost.
    let audit = client.audit().await;
    let text = format!("{audit:#}");
    assert!(text.contains("3 of 3 sentinels answer, quorum 2"), "{text}");
    assert!(text.contains("a failover loses the locks"), "{text}");
    assert!(text.contains("min-replicas-to-write 0"), "{text}");
    let unknown = client_of(&group.url().replace(MASTER_NAME, "nosuch"));
    let err = unknown.acquire("s", secs(5)).await.unwrap_err();
    // Permanent, so not retried; but a connect that failed just before
    // (the node's own) reports it as the backoff's last failure.
    let unknown_master =
        |k: &NodeErrorKind| matches!(k, NodeErrorKind::UnknownMaster { name } if name == "nosuch");
    let kind = &err.node_failures()[0].kind;
    assert!(
        unknown_master(kind)
            || matches!(kind, NodeErrorKind::Backoff { last, .. } if unknown_master(last)),
        "{err}: {:?}",
        err.node_failures()
    );

    // The master demoted behind the Sentinels' back (no failover, so no
    // newer epoch for the watch): its refused write (`READONLY`) is
    // `Demoted`, and the connection is dropped, so the next request asks
    // the Sentinels again and refuses the same server (now a replica).
    assert_eq!(group.servers[1].cli(&["REPLICAOF", "NO", "ONE"]), "OK");
    assert_eq!(
        group.servers[0].cli(&[
            "REPLICAOF",
            "127.0.0.1",
            &group.servers[1].port().to_string()
        ]),
        "OK"
    );
    let err = client.try_acquire("s", secs(5)).await.unwrap_err();
    assert!(
        matches!(&err.node_failures()[0].kind, NodeErrorKind::Demoted { role } if role.contains("READONLY")),
        "{err}"
    );
    let err = client.try_acquire("s", secs(5)).await.unwrap_err();
    assert!(
        matches!(
            &err.node_failures()[0].kind,
            NodeErrorKind::Demoted { .. } | NodeErrorKind::Backoff { .. }
        ),
        "{err}"
    );

    // A Sentinel that names a replica (here: told to watch the demoted
    // master as the master) is not believed: `Demoted`, and nothing is
    // sent to it. Last: the client above follows the Sentinels, and when
    // this came first its watch sometimes moved to the server this
    // Sentinel named before the READONLY check (CI, under load).
    let s0 = &group.sentinels[0];
    assert_eq!(s0.cli(&["SENTINEL", "REMOVE", MASTER_NAME]), "OK");
    let demoted_port = group.servers[0].port().to_string();
    let monitor = [
        "SENTINEL",
        "MONITOR",
        MASTER_NAME,
        "127.0.0.1",
        &demoted_port,
        "2",
    ];
    assert_eq!(s0.cli(&monitor), "OK");
    let split = client_of(&format!(
        "redis+sentinel://127.0.0.1:{}/{MASTER_NAME}",
        s0.port()
    ));
    let err = split.try_acquire("split", secs(5)).await.unwrap_err();
    assert!(
        matches!(&err.node_failures()[0].kind, NodeErrorKind::Demoted { role } if role == "slave"),
        "{err}"
    );
    assert_eq!(group.servers[0].count_keys(&lock_key("split")), 0);
}

fn client_of(url: &str) -> Client {
    client(vec![NodeSpec::from(url)], RestartGuard::off())
}

/// Sentinels that do not answer: each is asked within the node timeout,
/// and the node fails with `NoSentinel`, never hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_sentinel_answering_is_a_typed_error() {
    // Servers started and killed: their ports refuse connections.
    let mut dead: Vec<RedisServer> = (0..2).map(|_| RedisServer::start()).collect();
    let url = format!(
        "redis+sentinel://127.0.0.1:{},127.0.0.1:{}/{MASTER_NAME}",
        dead[0].port(),
        dead[1].port()
    );
    for server in &mut dead {
        server.kill();
    }
    let client = client_of(&url);
    let started = Instant::now();
    let err = client.try_acquire("s", secs(5)).await.unwrap_err();
    assert!(started.elapsed() < secs(10));
    let kind = &err.node_failures()[0].kind;
    let no_sentinel = |k: &NodeErrorKind| matches!(k, NodeErrorKind::NoSentinel { asked: 2, .. });
    assert!(
        no_sentinel(kind)
            || matches!(kind, NodeErrorKind::Backoff { last, .. } if no_sentinel(last)),
        "{err}"
    );
}

/// Malformed Sentinel URLs are refused at build time.
#[test]
fn malformed_sentinel_urls_are_config_errors() {
    for url in [
        "redis+sentinel://127.0.0.1:26379",
        "redis+sentinel://127.0.0.1:26379/",
        "redis+sentinel://127.0.0.1:port/m",
        "redis+sentinel://127.0.0.1:1,,127.0.0.1:2/m",
        "redis+sentinel://127.0.0.1:1/m/notadb",
    ] {
        match Client::new([url]) {
            Err(ConfigError::UnsupportedUrl { index: 0, .. }) => {}
            other => panic!("{url}: {other:?}"),
        }
    }
    // The same Sentinels and name twice: one vote listed twice.
    let url = "redis+sentinel://127.0.0.1:1/m";
    assert!(matches!(
        Client::new([url, url]),
        Err(ConfigError::DuplicateNode { .. })
    ));
}

/// The lease of the lock the replica misses, and the guard's window.
const TTL: Duration = Duration::from_secs(10);

/// A failover while a lock is held: the replica, cut off from replication,
/// misses the acquire; the master dies; the Sentinels promote the replica.
/// Guarded, no second holder inside the lease (across the reconnects the
/// attempts make) and the next token is above the lost one; the control
/// (guard off) shows the second holder with the lost holder's token.
async fn failover_while_held(guarded: bool) {
    let mut group = SentinelGroup::start();
    let guard = if guarded {
        RestartGuard::new().with_window(TTL)
    } else {
        RestartGuard::off()
    };
    let client = client(vec![NodeSpec::from(group.url())], guard);
    // The master older than the window (as the Sentinels know it) before
    // the first vote.
    tokio::time::sleep(TTL + ms(1500)).await;
    let warm = client.acquire("f", TTL).await.unwrap();
    warm.release().await;
    let fence_key = client.fence_key("f");
    let (master, replica) = (&group.servers[0], &group.servers[1]);
    // The replica has the fence and the release (an empty lock key).
    assert!(
        eventually(secs(10), || {
            let m = master.cli(&["GET", &fence_key]);
            !m.is_empty()
                && replica.cli(&["GET", &fence_key]) == m
                && matches!(replica.cli(&["GET", &lock_key("f")]).as_str(), "" | "(nil)")
        })
        .await,
        "the replica never had the fence and the release"
    );
    group.cut_replication();
    let first = client.acquire("f", TTL).await.unwrap();
    let lost = first.token().unwrap().get();
    group.servers[0].kill();
    // Attempts inside the lease, as the failover happens and after.
    let (mut attempts, mut quarantined, mut second, mut last) = (0, 0, None, String::new());
    let mut promoted = false;
    while first.validity() > ms(300) {
        promoted = promoted
            || group.servers[1]
                .role()
                .is_some_and(|role| role.starts_with("master"));
        attempts += 1;
        match client.try_acquire("f", TTL).await {
            Ok(Some(guard)) => {
                second = Some((guard.token().unwrap().get(), first.validity()));
                break;
            }
            Ok(None) => last = String::from("contended"),
            Err(e) => {
                last = e.to_string();
                quarantined += usize::from(e.node_failures().iter().any(|f| {
                    matches!(
                        f.kind,
                        NodeErrorKind::Restarted { .. } | NodeErrorKind::Reseeding
                    )
                }));
            }
        }
        tokio::time::sleep(ms(100)).await;
    }
    assert!(promoted, "no failover inside the lease");
    if guarded {
        assert_eq!(
            second, None,
            "a second holder inside the lease, lost token {lost}"
        );
        assert!(
            quarantined >= 1,
            "{attempts} attempts, none met the quarantine"
        );
        // A fresh client (no lineage) also counts the promoted replica as
        // started at its promotion (the Sentinels' role-reported-time).
        let fresh = self::client(vec![NodeSpec::from(group.url())], guard);
        let err = fresh.try_acquire("f", TTL).await.unwrap_err();
        assert!(
            matches!(err.node_failures()[0].kind, NodeErrorKind::Restarted { .. }),
            "{err}"
        );
        let next = client
            .lock("f", TTL)
            .retry(Retry::new().with_max_wait(secs(30)))
            .acquire()
            .await
            .expect("granted after the window");
        let token = next.token().unwrap().get();
        assert!(token > lost, "token {token} after the lost holder's {lost}");
        next.release().await;
    } else {
        let (token, left) = second.unwrap_or_else(|| {
            panic!(
                "the control shows no second holder after {attempts} attempts, the last: {last}; the promoted replica's lock key: {:?}",
                group.servers[1].cli(&["GET", &lock_key("f")])
            )
        });
        assert!(left > Duration::ZERO);
        assert!(
            token <= lost,
            "the control's token {token}, the lost {lost}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_is_a_restart_for_the_guard() {
    failover_while_held(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_guard_a_failover_gives_a_second_holder() {
    failover_while_held(false).await;
}

/// `EVALSHA` calls the server ran or refused (`INFO commandstats`).
fn evalsha_stats(server: &RedisServer) -> String {
    server
        .cli(&["INFO", "commandstats"])
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .unwrap_or_default()
        .to_owned()
}

/// A graceful failover (`SENTINEL FAILOVER`) demotes a master that keeps
/// answering: its refused write drops the connection, the Sentinels are
/// asked again, and the demoted server gets no lock command after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_master_is_not_used() {
    let group = SentinelGroup::start();
    let client = client(vec![NodeSpec::from(group.url())], RestartGuard::off());
    client.acquire("d", secs(5)).await.unwrap().release().await;
    group.failover();
    group.wait_master(1);
    // The node's watch of the Sentinels (every 500 ms here) sees the
    // switch, whether or not the old master was already reconfigured.
    tokio::time::sleep(secs(2)).await;
    let granted = client
        .lock("d", secs(5))
        .retry(Retry::new().with_max_wait(secs(20)))
        .acquire()
        .await
        .expect("granted by the new master");
    assert_eq!(group.servers[1].count_keys(&lock_key("d")), 1);
    granted.release().await;
    let before = evalsha_stats(&group.servers[0]);
    for _ in 0..10 {
        client.acquire("d", secs(5)).await.unwrap().release().await;
    }
    assert_eq!(
        evalsha_stats(&group.servers[0]),
        before,
        "the demoted master was asked"
    );
}

/// Sentinels redeployed (their configuration written from a template
/// again, so their config epochs start from 0, below the failover this
/// client saw): three of three agreeing on the master at the older epoch
/// are believed, and the node starts over from it (DESIGN.md, section 3b)
/// instead of refusing every answer as older than the last failover seen,
/// which would leave the node unavailable for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeployed_sentinels_starting_from_epoch_0_are_believed() {
    let mut group = SentinelGroup::start();
    let client = client(vec![NodeSpec::from(group.url())], RestartGuard::off());
    client.acquire("e", secs(5)).await.unwrap().release().await;
    group.failover();
    group.wait_master(1);
    let epoch = |g: &SentinelGroup| {
        let m = g.sentinels[0].cli(&["SENTINEL", "MASTER", MASTER_NAME]);
        crate::support::sentinel::field(&m, "config-epoch").map(str::to_owned)
    };
    assert_eq!(epoch(&group).as_deref(), Some("1"));
    // The client follows the failover: it admits the new master at epoch 1.
    let deadline = Instant::now() + secs(20);
    loop {
        let granted = client
            .lock("e", secs(5))
            .retry(Retry::new().with_max_wait(secs(10)))
            .acquire()
            .await
            .expect("granted around the failover");
        let on_new = group.servers[1].count_keys(&lock_key("e")) == 1;
        granted.release().await;
        if on_new {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the client never reached the new master"
        );
        tokio::time::sleep(ms(200)).await;
    }

    group.redeploy_sentinels();
    assert_eq!(epoch(&group).as_deref(), Some("0"));
    // Every connection to the master dropped: the next request asks the
    // redeployed Sentinels where the master is.
    let killed = group.servers[1].cli(&["CLIENT", "KILL", "TYPE", "normal"]);
    assert_ne!(killed, "0", "the client had no connection to drop");
    let again = client
        .lock("e", secs(5))
        .retry(Retry::new().with_max_wait(secs(15)))
        .acquire()
        .await
        .expect("granted through the redeployed sentinels");
    assert_eq!(group.servers[1].count_keys(&lock_key("e")), 1);
    again.release().await;
    // The watch of the Sentinels (every 500 ms) sees epoch 0 as the
    // newest now: it does not drop the connection, nor refuse the master.
    tokio::time::sleep(secs(2)).await;
    for _ in 0..5 {
        client.acquire("e", secs(5)).await.unwrap().release().await;
    }
}

/// A Sentinel group as one of three nodes: during its failover (and its
/// new master's window) it loses its vote, and the set keeps granting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_group_in_three_nodes_loses_one_vote_in_its_failover() {
    let mut group = SentinelGroup::start();
    let plain: Vec<RedisServer> = (0..2).map(|_| RedisServer::start()).collect();
    let window = secs(3);
    let mut nodes = vec![NodeSpec::from(group.url())];
    nodes.extend(plain.iter().map(|s| NodeSpec::from(s.url())));
    let client = client(nodes, RestartGuard::new().with_window(window));
    tokio::time::sleep(window + ms(1500)).await;
    // The client sees the old master first (another resource: a release of
    // "g" that the replica had not received before the kill would leave a
    // key on the promoted master that no vote wrote, and the check below
    // would take it for one; it did, under load).
    let seen = client.acquire("seen", secs(2)).await.unwrap();
    seen.release().await;
    group.servers[0].kill();
    // The promotion's time, bounded from below by a thread of its own that
    // asks `ROLE` every 20 ms: the promotion came after the start of the
    // last question answered "slave", so the client's window (which starts
    // when the client sees the new master, later still) cannot end before
    // that start plus the window. The loop below looks only between
    // acquires, and a loaded machine stretches both those and the
    // `redis-cli` processes to seconds: the time of the first "master"
    // answer, used before, came late and made the window seem to end
    // later than the client's (a false failure under load).
    let promoted = Arc::new(Mutex::new(None::<Instant>));
    let watching = Arc::new(AtomicBool::new(true));
    let watcher = std::thread::spawn({
        let (promoted, watching) = (promoted.clone(), watching.clone());
        let port = group.servers[1].port().to_string();
        move || {
            let mut asked = Instant::now();
            let mut replica_until = asked;
            while watching.load(Ordering::Relaxed) {
                let role = std::process::Command::new("redis-cli")
                    .args(["-h", "127.0.0.1", "-p", &port, "ROLE"])
                    .output();
                match role {
                    Ok(o) if o.stdout.starts_with(b"master") => {
                        *promoted.lock().unwrap() = Some(replica_until);
                        return;
                    }
                    Ok(o) if o.stdout.starts_with(b"slave") => replica_until = asked,
                    _ => {}
                }
                std::thread::sleep(ms(20));
                asked = Instant::now();
            }
        }
    });
    let end = Instant::now() + DOWN_AND_WINDOW;
    let (mut granted, mut promoted_at, mut without_it) = (0, None, 0);
    while Instant::now() < end {
        if promoted_at.is_none() {
            promoted_at = *promoted.lock().unwrap();
        }
        let guard = client
            .lock("g", secs(2))
            .retry(Retry::new().with_max_wait(secs(3)))
            .acquire()
            .await
            .expect("the set keeps granting");
        // Held by the two plain nodes alone while the promoted master is
        // in its window (a second before its end, for margin).
        if promoted_at.is_some_and(|t: Instant| t.elapsed() + secs(1) < window) {
            assert_eq!(
                group.servers[1].count_keys(&lock_key("g")),
                0,
                "the promoted master voted inside its window"
            );
            without_it += 1;
        }
        guard.release().await;
        granted += 1;
        tokio::time::sleep(ms(50)).await;
    }
    watching.store(false, Ordering::Relaxed);
    let _ = watcher.join();
    assert!(
        promoted_at.is_some() && granted > 10 && without_it >= 1,
        "{granted} grants, {without_it} without the promoted master, promoted {promoted_at:?}"
    );
    // Its window over, the new master votes again.
    let back = eventually(secs(15), || group.servers[1].count_keys(&lock_key("g")) > 0);
    let holder = tokio::spawn({
        let client = client.clone();
        async move {
            loop {
                let guard = client.acquire("g", secs(2)).await;
                if let Ok(guard) = guard {
                    tokio::time::sleep(ms(20)).await;
                    guard.release().await;
                }
            }
        }
    });
    let rejoined = back.await;
    holder.abort();
    assert!(rejoined, "the new master never held a lock again");
}

/// Down-after, the election and the new master's window, with margin.
const DOWN_AND_WINDOW: Duration = Duration::from_secs(8);

/// `user:pass@` in a Sentinel URL is the master's ACL user, as on a plain
/// node: `url` with it.
fn with_userinfo(url: &str, userinfo: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a url");
    format!("{scheme}://{userinfo}@{rest}")
}

/// A lock held across a `SENTINEL FAILOVER` of `group` (guard window 3 s):
/// no second holder inside the lease, on either master; then the next
/// token, from the promoted replica, is above the held one.
async fn held_across_a_failover(group: &SentinelGroup, builder: redfence::Builder) {
    let window = secs(3);
    let client = builder
        .node_timeout(ms(500))
        .restart_guard(RestartGuard::new().with_window(window))
        .build()
        .unwrap();
    // The master older than the window before the first vote.
    tokio::time::sleep(window + ms(1500)).await;
    let first = client.acquire("x", TTL).await.unwrap();
    let held = first.token().unwrap().get();
    assert_eq!(group.servers[0].count_keys(&lock_key("x")), 1);
    assert!(first.extend(TTL).await.unwrap() > secs(5));
    assert_eq!(
        client
            .try_acquire("x", TTL)
            .await
            .unwrap()
            .map(|g| g.token()),
        None
    );
    // The replica has the lock and the fence before the failover (a
    // synchronous-enough group: this test is about reaching the servers,
    // `failover_while_held` about the writes a failover loses).
    let fence_key = client.fence_key("x");
    assert!(
        eventually(secs(10), || {
            let (master, replica) = (&group.servers[0], &group.servers[1]);
            replica.count_keys(&lock_key("x")) == 1
                && replica.cli(&["GET", &fence_key]) == master.cli(&["GET", &fence_key])
        })
        .await,
        "the replica never had the lock and the fence"
    );
    group.failover();
    group.wait_master(1);
    let mut attempts = 0;
    while first.validity() > ms(300) {
        attempts += 1;
        if let Ok(Some(second)) = client.try_acquire("x", TTL).await {
            panic!(
                "a second holder (token {:?}) while {held} was held, attempt {attempts}",
                second.token()
            );
        }
        tokio::time::sleep(ms(100)).await;
    }
    tokio::time::sleep(first.validity() + ms(100)).await;
    let next = client
        .lock("x", TTL)
        .retry(Retry::new().with_max_wait(secs(30)))
        .acquire()
        .await
        .expect("granted by the promoted replica");
    let token = next.token().unwrap().get();
    assert!(token > held, "token {token} after the held {held}");
    assert_eq!(group.servers[1].count_keys(&lock_key("x")), 1);
    next.release().await;
}

/// A TLS-only group (`--port 0`, `tls-replication yes`: the replica and
/// the Sentinels talk TLS too) through `rediss+sentinel://` and the test
/// CA: discovery and the master's connection both go through TLS; a lock
/// is held across a failover, fenced. A client without the CA is refused
/// by the Sentinels' certificates: a `Tls` reason in `NoSentinel`.
#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_sentinel_group_locks_fences_and_survives_a_failover() {
    use crate::support::certs::certs;
    use redfence::Tls;

    let group = SentinelGroup::start_with(GroupOptions {
        tls: Some(certs().cluster_node(false)),
        ..GroupOptions::default()
    });
    let url = group.url();
    assert!(url.starts_with("rediss+sentinel://"), "{url}");
    // A generous node timeout: the refusal comes in a handshake's time.
    // With 500 ms the test failed once in CI, under load, with another
    // error than the certificate's (its kind was not shown then; it is
    // now).
    let untrusted = Client::builder([NodeSpec::from(url.as_str())])
        .node_timeout(secs(5))
        .restart_guard(RestartGuard::off())
        .tls(Tls::new().root_ca_pem(certs().other_ca_pem.clone()))
        .build()
        .unwrap();
    let err = untrusted.try_acquire("x", TTL).await.unwrap_err();
    let refused = |k: &NodeErrorKind| matches!(k, NodeErrorKind::NoSentinel { asked: 3, reason } if reason.contains("certificate"));
    let kind = &err.node_failures()[0].kind;
    assert!(
        refused(kind) || matches!(kind, NodeErrorKind::Backoff { last, .. } if refused(last)),
        "{err}: {kind:?}"
    );
    let builder =
        Client::builder([NodeSpec::from(url)]).tls(Tls::new().root_ca_pem(certs().ca_pem.clone()));
    held_across_a_failover(&group, builder).await;
}

/// The master and the replica take only an ACL user (the `default` user
/// has a password the client does not know), and the Sentinels a password
/// of their own (`requirepass`): `user:pass@` in the Sentinel URL
/// authenticates to the master, as on a plain node, and
/// `?sentinel_password=` (percent-encoded) to the Sentinels, across a
/// failover. Without the master's credentials the master refuses the
/// client (`Auth`); without the Sentinels' every Sentinel does
/// (`NoSentinel`), and the URL is never shown with either password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_and_sentinel_passwords_reach_the_master() {
    let group = SentinelGroup::start_with(GroupOptions {
        acl_user: Some(("locker".into(), "l0ck-pass".into())),
        sentinel_password: Some("s3n@t:nel".into()),
        ..GroupOptions::default()
    });
    let sentinel_auth = "?sentinel_password=s3n%40t%3Anel";
    let url = with_userinfo(&group.url(), "locker:l0ck-pass") + sentinel_auth;

    let anonymous = client_of(&(group.url() + sentinel_auth));
    let err = anonymous.try_acquire("x", TTL).await.unwrap_err();
    let auth = |k: &NodeErrorKind| matches!(k, NodeErrorKind::Auth(_));
    let kind = &err.node_failures()[0].kind;
    assert!(
        auth(kind) || matches!(kind, NodeErrorKind::Backoff { last, .. } if auth(last)),
        "{err}"
    );

    let no_sentinel_password = client_of(&with_userinfo(&group.url(), "locker:l0ck-pass"));
    let err = no_sentinel_password
        .try_acquire("x", TTL)
        .await
        .unwrap_err();
    let refused = |k: &NodeErrorKind| matches!(k, NodeErrorKind::NoSentinel { asked: 3, reason } if reason.contains("NOAUTH") || reason.contains("uthentication"));
    let kind = &err.node_failures()[0].kind;
    assert!(
        refused(kind) || matches!(kind, NodeErrorKind::Backoff { last, .. } if refused(last)),
        "{err}"
    );

    let spec = NodeSpec::from(url.as_str());
    let shown = format!("{spec:?}");
    assert!(
        !shown.contains("l0ck-pass")
            && !shown.contains("s3n")
            && shown.contains("sentinel_password=***"),
        "{shown}"
    );
    held_across_a_failover(&group, Client::builder([spec])).await;
}
