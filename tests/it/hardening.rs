//! Defects found by reading the code against DESIGN.md and by trying the
//! crate as a new user would, each provoked for real against real servers:
//! a false takeover, a lost lease that came back, a re-seed that could not
//! complete with an even number of nodes, a node address that now reaches
//! another server, fences that expired under a long hold, and key-space
//! collisions. Each test failed on the code before its fix.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use redfence::{AutoExtend, Client, ConfigError, LossReason, NodeErrorKind, RestartGuard, Retry};

use crate::helpers::{
    builder, calls, client_with_timeout, eventually, lock_key, ms, proxy_to, secs, warm_up,
};
use crate::support::proxy::Fault;
use crate::support::{Cluster, RedisServer};

/// A contender that crashed mid-attempt leaves its value on one node. Our
/// lock is granted by the other two; the watchdog's extends hear the
/// foreign value on that node every time. It never held our value there,
/// so that is no evidence of a takeover: the lease stands. The negative
/// control (our key replaced where it was ours) is still signalled, here
/// and in `lifecycle::another_owner_on_one_node_is_a_takeover`.
#[tokio::test]
async fn a_foreign_key_where_we_never_held_is_not_a_takeover() {
    let cluster = Cluster::start(3);
    let client = client_with_timeout(cluster.urls(), ms(200));
    warm_up(&client, &cluster).await;
    let key = lock_key("ft");
    cluster.nodes[2].cli(&["SET", &key, "crashed-contender", "PX", "60000"]);
    let guard = client
        .lock("ft", secs(1))
        .auto_extend(AutoExtend::new())
        .acquire()
        .await
        .unwrap();
    // About seven extensions (every third of the validity) in 2.5 s.
    let early = tokio::time::timeout(ms(2500), guard.lost()).await;
    assert!(
        early.is_err(),
        "a lease held on a majority was reported lost: {}",
        early.unwrap()
    );
    assert!(guard.lease().is_valid());
    assert_eq!(cluster.nodes[2].cli(&["GET", &key]), "crashed-contender");
    // Negative control: another owner where we did hold the key.
    cluster.nodes[0].cli(&["SET", &key, "thief", "PX", "60000"]);
    let lost = tokio::time::timeout(secs(5), guard.lost()).await.unwrap();
    assert_eq!(lost.reason, LossReason::TakenOver, "{lost}");
    guard.release().await;
}

/// The runtime's only thread is blocked past the lease's validity (a long
/// synchronous call, a GC-like stall), while the keys still live on the
/// nodes (a large drift allowance keeps them there after the validity).
/// The lease is lost at its validity's end, and stays lost: the watchdog
/// must not extend it afterwards, and no extend is sent.
#[test]
fn a_lease_that_ran_out_is_not_revived() {
    let cluster = Cluster::start(3);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = builder(cluster.urls())
            .node_timeout(ms(200))
            .drift_factor(0.3)
            .build()
            .unwrap();
        warm_up(&client, &cluster).await;
        // TTL 3 s, drift 0.9 s: valid for about 2.1 s, keys live 3 s.
        let guard = client
            .lock("frozen", secs(3))
            .auto_extend(AutoExtend::new())
            .acquire()
            .await
            .unwrap();
        let valid_until = guard.valid_until();
        // Extends counted by their `PEXPIRE` (the extend script's write):
        // `EVALSHA` counts would include the fence's `SEED`, which a node
        // answering after the acquire's decision runs in the background
        // (a fresh bucket), here once the runtime is unblocked.
        let extends = || -> u64 { cluster.nodes.iter().map(|n| calls(n, "pexpire")).sum() };
        let extends_before = extends();
        // Blocks the runtime past the validity but not past the keys' TTL.
        std::thread::sleep(valid_until.saturating_duration_since(Instant::now()) + ms(300));
        let lost = guard.lost().await;
        assert_eq!(lost.reason, LossReason::Unreachable, "{lost}");
        // Give the watchdog every chance to run now.
        tokio::time::sleep(ms(500)).await;
        assert!(!guard.lease().is_valid(), "the lease came back");
        assert_eq!(guard.validity(), Duration::ZERO, "the lease came back");
        assert!(guard.lease().loss().is_some(), "the loss was not recorded");
        let extends_after = extends();
        assert_eq!(
            extends_before, extends_after,
            "an extend was sent after the validity ran out"
        );
        // A manual extend of the lost lease is refused without a round trip.
        let err = guard.extend(secs(3)).await.unwrap_err();
        assert!(err.is_lost(), "{err}");
        guard.release().await;
    });
}

/// With two nodes, the re-seed of a young server has only one other node
/// to read from; quorum intersection among the N − 1 others needs N − q + 1
/// = 1 answer. A fresh pair, and a pair with one node restarted empty, both
/// grant fenced locks once the window has passed.
#[tokio::test]
async fn two_nodes_reseed_and_vote_after_the_window() {
    let mut cluster = Cluster::start(2);
    let client = Client::builder(cluster.urls())
        .node_timeout(ms(500))
        .restart_guard(RestartGuard::new().with_window(secs(1)))
        .build()
        .unwrap();
    let patient = || Retry::new().with_max_wait(secs(6));
    let guard = client
        .lock("pair", secs(1))
        .retry(patient())
        .acquire()
        .await
        .expect("a fresh pair grants a fenced lock after the window");
    let first = guard.token().unwrap();
    guard.release().await;
    cluster.node(1).kill();
    cluster.node(1).restart();
    let started = Instant::now();
    let guard = client
        .lock("pair", secs(1))
        .retry(patient())
        .acquire()
        .await
        .expect("a pair with a node restarted empty grants again after the window");
    assert!(
        started.elapsed() >= ms(900),
        "the restarted node voted early"
    );
    assert!(guard.token().unwrap() > first, "tokens keep increasing");
    guard.release().await;
}

/// Four nodes (quorum 3) with one down: the re-seed of a young node has two
/// of the three others to read from, which is N − q + 1 = 2.
#[tokio::test]
async fn four_nodes_with_one_down_reseed_and_vote() {
    let mut cluster = Cluster::start(4);
    cluster.node(3).kill();
    let client = Client::builder(cluster.urls())
        .node_timeout(ms(500))
        .restart_guard(RestartGuard::new().with_window(secs(1)))
        .build()
        .unwrap();
    let guard = client
        .lock("four", secs(1))
        .retry(Retry::new().with_max_wait(secs(6)))
        .acquire()
        .await
        .expect("three of four nodes grant a fenced lock after the window");
    assert!(guard.token().is_some());
    guard.release().await;
}

/// A node address that now reaches another server (a moved VIP, a replaced
/// pod) is a restart for the client that knew the old one: that server has
/// none of our locks. Without this, the client's second acquire gets a
/// majority from the new server and the node that refused the first one:
/// two holders at once.
#[tokio::test]
async fn an_address_that_reaches_another_server_is_a_restart() {
    let old = RedisServer::start();
    let new = RedisServer::start();
    let others = Cluster::start(2);
    let proxy = proxy_to(&old);
    let mut urls = vec![proxy.url()];
    urls.extend(others.urls());
    // The window is at least the longest TTL this client asked for.
    let window = secs(3);
    let client = Client::builder(urls)
        .node_timeout(ms(500))
        .restart_guard(RestartGuard::new().with_window(window))
        .build()
        .unwrap();
    // Every server is older than the window before the first vote.
    tokio::time::sleep(window + ms(1200)).await;
    let key = lock_key("vip");
    // Node 2 is held by someone else: the first lock lives on nodes 0 and 1.
    others.nodes[1].cli(&["SET", &key, "someone", "PX", "300"]);
    let first = client
        .lock("vip", window)
        .retry(Retry::new().with_max_wait(secs(5)))
        .acquire()
        .await
        .unwrap();
    assert!(eventually(secs(3), || others.nodes[1].cli(&["EXISTS", &key]) == "0").await);
    // Node 0's address now reaches the new server; the old connection dies.
    proxy.repoint(SocketAddr::from((Ipv4Addr::LOCALHOST, new.port())));
    proxy.set(Fault::Reset);
    assert!(eventually(secs(3), || proxy.open_connections() == 0).await);
    proxy.set(Fault::Pass);
    let mut second = None;
    let mut restarted = false;
    for _ in 0..20 {
        match client.try_acquire("vip", window).await {
            Ok(Some(guard)) => {
                second = Some(guard);
                break;
            }
            Ok(None) => {}
            Err(e) => {
                restarted |= e
                    .node_failures()
                    .iter()
                    .any(|f| f.index == 0 && matches!(f.kind, NodeErrorKind::Restarted { .. }));
            }
        }
        tokio::time::sleep(ms(50)).await;
    }
    assert!(
        second.is_none(),
        "a second holder while the first is valid ({:?} left)",
        first.validity()
    );
    assert!(restarted, "node 0 was never reported restarted");
    first.release().await;
}

/// Key names that could reach another deployment's keys are refused: an
/// empty prefix (the re-seed would scan `fence:*` across the database) and
/// a prefix that nests a key kind (`a:lock:` names the keys of resources
/// `lock:…` under `a:`).
#[test]
fn prefixes_that_reach_other_keys_are_refused() {
    for prefix in ["", "a:lock:", "a:fence:", "lock:", "x:lock:y:"] {
        let err = builder(["redis://127.0.0.1:1"])
            .key_prefix(prefix)
            .build()
            .unwrap_err();
        assert!(
            matches!(err, ConfigError::Prefix { .. }),
            "{prefix:?}: {err:?}"
        );
        crate::helpers::assert_message_style(&err.to_string());
    }
    for prefix in ["a:", "a:locks:", "app1:", "redfence:"] {
        assert!(
            builder(["redis://127.0.0.1:1"])
                .key_prefix(prefix)
                .build()
                .is_ok(),
            "{prefix:?}"
        );
    }
}

/// Two deployments on different database indexes of one server share its
/// pub/sub channels: the release notices of one must not wake the waiters
/// of the other. Counted with `PUBSUB NUMSUB` on the channels each side
/// subscribes to: never the same channel.
#[tokio::test]
async fn release_notices_stay_within_their_database() {
    let server = RedisServer::start();
    let url0 = server.url();
    let url1 = format!("{}/1", server.url());
    let a = client_with_timeout([url0], ms(500));
    let b = client_with_timeout([url1], ms(500));
    let held_a = a.acquire("shared-name", secs(10)).await.unwrap();
    let held_b = b.acquire("shared-name", secs(10)).await.unwrap();
    // One waiter on each side: each subscribes to its release channel.
    let wait = |c: &Client| {
        let c = c.clone();
        tokio::spawn(async move {
            c.lock("shared-name", secs(10))
                .retry(Retry::new().with_max_wait(secs(10)))
                .acquire()
                .await
                .map(|g| g.token())
        })
    };
    let (wa, wb) = (wait(&a), wait(&b));
    assert!(eventually(secs(5), || a.stats().waiting == 1 && b.stats().waiting == 1).await);
    let channels = server.cli(&["PUBSUB", "CHANNELS", "*shared-name*"]);
    let names: Vec<&str> = channels.lines().filter(|l| !l.is_empty()).collect();
    // Each side's fair-queue channels (the marker and its own) name its
    // database: two per database, none shared.
    let in_db = |db: &str| {
        names
            .iter()
            .filter(|n| n.contains(&format!("@{db}/")))
            .count()
    };
    assert_eq!(
        (names.len(), in_db("0"), in_db("1")),
        (4, 2, 2),
        "channels per database: {names:?}"
    );
    held_a.release().await;
    held_b.release().await;
    assert!(wa.await.unwrap().is_ok());
    assert!(wb.await.unwrap().is_ok());
}

/// A node that is always the last to answer and lost its script cache
/// (restarted, `SCRIPT FLUSH`): its `NOSCRIPT` comes back after the other
/// two decided the extend. The `EVAL` that loads the script must still be
/// sent, or that node never gets the script, never extends, and its key
/// expires while the lease is held (found by a flaky watchdog test).
#[tokio::test]
async fn a_slow_node_that_lost_its_scripts_still_extends() {
    let cluster = Cluster::start(3);
    let (slow, client) = behind_a_proxy_on_node_2(&cluster).await;
    let guard = client
        .lock("slow", ms(900))
        .auto_extend(AutoExtend::new())
        .acquire()
        .await
        .unwrap();
    let key = lock_key("slow");
    assert!(eventually(secs(3), || cluster.nodes[2].cli(&["EXISTS", &key]) == "1").await);
    cluster.nodes[2].cli(&["SCRIPT", "FLUSH"]);
    slow.set(Fault::Delay(ms(40)));
    // Three TTLs: the key on the slow node lives only if extends reach it.
    tokio::time::sleep(ms(2700)).await;
    assert!(guard.lease().is_valid(), "{:?}", guard.lease().loss());
    let left: i64 = cluster.nodes[2].cli(&["PTTL", &key]).parse().unwrap();
    assert!(left > 0, "the slow node's key is gone (PTTL {left})");
    slow.set(Fault::Pass);
    guard.release().await;
}

/// A fresh bucket, and a node that always answers last: the round decides
/// on the other two (each asked again with the script, which seeds), and
/// the slow node's transaction answers after that with an unseeded fence.
/// No vote is wanted from it any more and no late grant may land, but its
/// fence is seeded all the same (the `SEED` script, no lock key touched):
/// every node ends at the token, and the release leaves no key. Without
/// that step the slow node's fence stayed at 1 (a lagging node, costing a
/// write-back at a later acquisition it answers among the first).
#[tokio::test]
async fn a_slow_node_seeds_the_fence_its_transaction_found_absent() {
    let cluster = Cluster::start(3);
    let (slow, client) = behind_a_proxy_on_node_2(&cluster).await;
    slow.set(Fault::Delay(ms(40)));
    let fence = crate::helpers::fence_key("fresh-bucket");
    assert!(cluster
        .nodes
        .iter()
        .all(|n| n.cli(&["EXISTS", &fence]) == "0"));
    let guard = client.acquire("fresh-bucket", secs(10)).await.unwrap();
    let token = guard.token().unwrap().get().to_string();
    let level = eventually(secs(5), || {
        cluster
            .nodes
            .iter()
            .all(|n| n.cli(&["GET", &fence]).trim() == token)
    })
    .await;
    let fences: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| n.cli(&["GET", &fence]))
        .collect();
    assert!(level, "token {token}, fences {fences:?}");
    guard.release().await;
    slow.set(Fault::Pass);
    assert!(
        eventually(secs(5), || cluster.count_keys(crate::helpers::LOCK_KEYS)
            == vec![0, 0, 0])
        .await,
        "a key outlived the release"
    );
}

/// The same slow node on a fresh bucket: its transaction set our value
/// there after the round decided, so the node held our value although it
/// gave no vote. Another owner's value appearing there later is a takeover,
/// and the watchdog says so. Before the late transaction's node was counted
/// as ours, the watchdog took that value for a contender's leftover and
/// went on extending on the other two: the lease was never reported lost.
#[tokio::test]
async fn a_late_transactions_node_counts_as_ours_for_a_takeover() {
    let cluster = Cluster::start(3);
    let (slow, client) = behind_a_proxy_on_node_2(&cluster).await;
    slow.set(Fault::Delay(ms(40)));
    let guard = client
        .lock("late-ours", secs(3))
        .auto_extend(AutoExtend::new())
        .acquire()
        .await
        .unwrap();
    assert!(crate::helpers::landed(&cluster.nodes, "late-ours", secs(5)).await);
    slow.set(Fault::Pass);
    cluster.nodes[2].cli(&["SET", &lock_key("late-ours"), "someone-else", "PX", "5000"]);
    let lost = tokio::time::timeout(secs(10), guard.lost())
        .await
        .expect("the takeover on the late node was never reported");
    assert_eq!(lost.reason, LossReason::TakenOver, "{lost}");
    assert!(lost.validity_left > Duration::ZERO, "{lost}");
    guard.release().await;
}

/// The acquire is a script too, but its `EVAL` after a `NOSCRIPT` is not
/// sent once the round has decided: the release is queued behind it, and
/// a grant landing after its own release would block the resource for a
/// whole TTL. The slow node gets `SCRIPT LOAD` instead, so its next
/// acquire runs the script. Before this rule the slow node kept the key
/// after the release. On RESP3 connections (redis-rs's), where a first
/// attempt is the script; on our own, it is a transaction that needs no
/// script (`wire::transacted`), and leaves no key behind either.
#[tokio::test]
async fn a_slow_node_that_lost_its_scripts_keeps_no_late_grant() {
    for resp3 in [true, false] {
        a_slow_node_that_lost_its_scripts_keeps_no_late_grant_on(resp3).await;
    }
}

async fn a_slow_node_that_lost_its_scripts_keeps_no_late_grant_on(resp3: bool) {
    let cluster = Cluster::start(3);
    let slow = proxy_to(&cluster.nodes[2]);
    let mut urls = cluster.urls();
    urls[2] = slow.url();
    if resp3 {
        urls = urls
            .into_iter()
            .map(|u| format!("{u}/?protocol=resp3"))
            .collect();
    }
    let client = client_with_timeout(urls, ms(500));
    warm_up(&client, &cluster).await;
    // The acquire script is gone there, the release script is not (as
    // after a flush and a release's own `EVAL`): the release runs first.
    cluster.nodes[2].cli(&["SCRIPT", "FLUSH"]);
    let release = include_str!("../../src/wire/lua/release.lua");
    cluster.nodes[2].cli(&["SCRIPT", "LOAD", release]);
    slow.set(Fault::Delay(ms(40)));
    let guard = client.acquire("late", secs(10)).await.unwrap();
    guard.release().await;
    // Long after the slow node's NOSCRIPT came back: no key anywhere.
    tokio::time::sleep(ms(600)).await;
    assert_eq!(
        cluster.count_keys(crate::helpers::LOCK_KEYS),
        vec![0, 0, 0],
        "a late grant outlived its release"
    );
    if resp3 {
        assert_eq!(
            cluster.nodes[2].cli(&["SCRIPT", "EXISTS", redfence_acquire_sha()]),
            "1",
            "the script was loaded for the next acquire"
        );
    }
    slow.set(Fault::Pass);
}

/// The SHA1 of the acquire script, as the crate sends it.
fn redfence_acquire_sha() -> &'static str {
    static SHA: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SHA.get_or_init(|| {
        redis::Script::new(include_str!("../../src/wire/lua/acquire.lua"))
            .get_hash()
            .to_owned()
    })
}

/// A warmed-up client of `cluster` that reaches node 2 through a fault
/// proxy (the proxy is returned to slow it down).
async fn behind_a_proxy_on_node_2(
    cluster: &Cluster,
) -> (crate::support::proxy::FaultProxy, Client) {
    let slow = proxy_to(&cluster.nodes[2]);
    let mut urls = cluster.urls();
    urls[2] = slow.url();
    let client = client_with_timeout(urls, ms(500));
    warm_up(&client, cluster).await;
    (slow, client)
}

/// What one run of the straggler scenario left: a lock key of the
/// holder's on node 0, set by an acquire its replaced connection still
/// carried, and how many connections the proxy to node 0 accepted.
struct Straggler {
    key_left: Option<i64>,
    accepted: u64,
}

/// The acquire's `SET` stuck on a path that went silent: node 0 reached
/// through a proxy that holds the open connection's bytes while new
/// connections pass ([`Fault::StallBefore`]), as a middlebox that lost
/// the connection's state would. The round decides on nodes 1 and 2;
/// node 0's request times out, the client opens a fresh connection that
/// answers while the old one does not echo, and replaces it. The release
/// then goes over the new connection; after it, the proxy delivers what
/// it held. `urls` name one ACL user on every node.
async fn straggler_after_the_release(
    cluster: &Cluster,
    urls: Vec<String>,
    resource: &str,
) -> Straggler {
    let proxy = proxy_to(&cluster.nodes[0]);
    let mut urls = urls;
    urls[0] = urls[0].replace(
        &format!(":{}", cluster.nodes[0].port()),
        &format!(":{}", proxy.port()),
    );
    let client = Client::builder(urls)
        .node_timeout(ms(300))
        .connect_timeout(ms(1000))
        .restart_guard(RestartGuard::off())
        .build()
        .unwrap();
    warm_up(&client, cluster).await;
    let before = proxy.connections_accepted();
    proxy.stall_open();
    let guard = client.acquire(resource, secs(30)).await.unwrap();
    // Node 0's connection replaced: a probe lock reaches node 0 again.
    let probe = format!("{resource}-probe");
    let fresh = eventually(secs(15), || proxy.connections_accepted() > before).await;
    assert!(fresh, "no fresh connection to node 0");
    let node0 = &cluster.nodes[0];
    let mut reached = false;
    for _ in 0..100 {
        if let Ok(Some(g)) = client.try_acquire(&probe, secs(5)).await {
            // The round decides on nodes 1 and 2; node 0's answer may come
            // later.
            reached = eventually(ms(300), || {
                node0.cli(&["EXISTS", &lock_key(&probe)]).trim() == "1"
            })
            .await;
            g.release().await;
            if reached {
                break;
            }
        }
        tokio::time::sleep(ms(100)).await;
    }
    assert!(reached, "node 0 never reached again");
    // The release, over the new connection, has run on node 0 (it finds
    // nothing there) before the old path delivers what it held.
    let monitor = node0.monitor();
    let quoted = format!("\"{}\"", lock_key(resource));
    guard.release().await;
    assert!(
        eventually(secs(5), || monitor
            .lines()
            .iter()
            .any(|l| l.contains("EVALSHA") && l.contains(&quoted)))
        .await,
        "node 0 never ran the release"
    );
    let forwarded = proxy.bytes_forwarded();
    proxy.set(Fault::Pass);
    let _ = eventually(secs(2), || proxy.bytes_forwarded() > forwarded).await;
    tokio::time::sleep(ms(500)).await;
    let key = lock_key(resource);
    let key_left = (cluster.nodes[0].cli(&["EXISTS", &key]).trim() == "1")
        .then(|| crate::helpers::pttl(&cluster.nodes[0], &key));
    Straggler {
        key_left,
        accepted: proxy.connections_accepted() - before,
    }
}

/// The rows of docs/operations.md's ACL table the lock's defaults need
/// (every client, fencing, waiting, the restart guard).
const LOCK_ROWS: &[usize] = &[0, 1, 2, 3];

/// A replaced connection is cut off on the server (`CLIENT KILL ID`)
/// before its replacement carries anything, so an acquire it still carried
/// cannot run after the release sent on the new one and leave its key for
/// the TTL. The control, a user without `client|kill` (the ACL table of
/// docs/operations.md alone: the old connection is then only dropped), shows
/// the straggler's key on node 0 with most of its 30 s TTL: the scenario
/// makes one, and the check sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_connection_is_cut_off_before_its_stragglers_run() {
    let cluster = Cluster::start(3);
    let cutting = crate::acl::user_with(&cluster, "cutting", LOCK_ROWS, &["+client|kill"]);
    let plain = crate::acl::user_with(&cluster, "plain", LOCK_ROWS, &[]);
    let cut = straggler_after_the_release(&cluster, cutting, "straggler-cut").await;
    assert!(cut.accepted >= 1, "no fresh connection");
    assert_eq!(
        cut.key_left, None,
        "the replaced connection's acquire ran after the release (pttl in ms)"
    );
    let control = straggler_after_the_release(&cluster, plain, "straggler-control").await;
    assert!(control.accepted >= 1, "control: no fresh connection");
    assert!(
        control.key_left.is_some_and(|ms| ms > 20_000),
        "control: no straggler's key on node 0 ({:?}): the scenario shows nothing",
        control.key_left
    );
}

/// Resets every connection through `proxy` (both sides), then takes and
/// frees `resource` once `client` has reconnected.
async fn reset_and_lock_again(
    proxy: &crate::support::proxy::FaultProxy,
    client: &Client,
    resource: &str,
) {
    proxy.set(Fault::Reset);
    assert!(eventually(secs(5), || proxy.open_connections() == 0).await);
    proxy.set(Fault::Pass);
    for _ in 0..50 {
        if let Ok(guard) = client.acquire(resource, secs(5)).await {
            guard.release().await;
            return;
        }
        tokio::time::sleep(ms(100)).await;
    }
    panic!("{resource}: no lock after the reconnect");
}

/// After a lost connection, the next one to the same server cuts the old
/// one off (`CLIENT KILL ID`, which `MONITOR` does not show, counted in
/// `INFO commandstats`) while a first connection cuts off nothing: the
/// reconnect's form of
/// `a_replaced_connection_is_cut_off_before_its_stragglers_run`. Here the
/// server already closed the old one (the proxy reset both sides), so the
/// kill finds nothing to kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_cuts_off_the_lost_connection() {
    let server = RedisServer::start();
    let proxy = proxy_to(&server);
    let client = client_with_timeout([proxy.url()], ms(300));
    client
        .acquire("reconnect-cut", secs(5))
        .await
        .unwrap()
        .release()
        .await;
    assert_eq!(calls(&server, "client|id"), 1, "the handshake's CLIENT ID");
    assert_eq!(
        calls(&server, "client|kill"),
        0,
        "a first connection cut something off"
    );
    reset_and_lock_again(&proxy, &client, "reconnect-cut").await;
    assert!(proxy.connections_accepted() >= 2, "no reconnect");
    assert_eq!(calls(&server, "client|kill"), 1, "the reconnect's cut-off");
}

/// A user without `client|kill` (docs/operations.md leaves it out of the
/// table) is refused the cut-off once; the node does not ask again, so the
/// server's ACL log gets one entry, not one per reconnect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_cut_off_is_not_asked_again() {
    let cluster = Cluster::start(1);
    let server = &cluster.nodes[0];
    let urls = crate::acl::user_with(&cluster, "nokill", LOCK_ROWS, &[]);
    let proxy = proxy_to(server);
    let url = urls[0].replace(
        &format!(":{}", server.port()),
        &format!(":{}", proxy.port()),
    );
    let client = Client::builder([url])
        .node_timeout(ms(300))
        .restart_guard(RestartGuard::off())
        .build()
        .unwrap();
    let rejected = || -> u64 {
        server
            .cli(&["INFO", "commandstats"])
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_client|kill:"))
            .and_then(|l| l.split("rejected_calls=").nth(1))
            .and_then(|r| r.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    client
        .acquire("nokill", secs(5))
        .await
        .unwrap()
        .release()
        .await;
    for round in 1..=3 {
        reset_and_lock_again(&proxy, &client, "nokill").await;
        assert!(
            proxy.connections_accepted() > round,
            "no reconnect in round {round}"
        );
    }
    assert_eq!(
        rejected(),
        1,
        "CLIENT KILL refused more than once over {} connections",
        proxy.connections_accepted()
    );
    assert_eq!(calls(server, "client|kill"), 0);
}
