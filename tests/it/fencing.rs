//! Fencing tokens against real nodes: strictly increasing across holders
//! (also across a node killed and restarted with its data, and under
//! contention), Kleppmann's paused-holder scenario and a node whose lock
//! key vanished early (two holders at once), both rejected by the fenced
//! store; the write-back round; fence state that expires; fencing off.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redfence::{
    Client, FailureReason, FencedStore, FencingToken, NodeErrorKind, Phase, Retry, StoreError,
};

use crate::helpers::{
    eventually, fence_key, lock_key, ms, pttl, report, secs, warm_client, warm_up, LOCK_KEYS,
};
use crate::support::{Cluster, RedisServer, ServerOptions};

const FENCE_KEYS: &str = "redfence:fence:*";

async fn store_on(server: &RedisServer) -> FencedStore<redis::aio::MultiplexedConnection> {
    let conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    FencedStore::new(conn).timeout(secs(2))
}

fn token(guard: &redfence::LockGuard) -> u64 {
    guard.token().expect("fencing is on by default").get()
}

/// Sequential holders, from two clients, get tokens that go up by exactly
/// one when every node saw every acquisition; the first is seeded from the
/// node clock (microseconds, so above 10^15).
#[tokio::test]
async fn tokens_increase_across_holders_on_1_3_and_5_nodes() {
    for n in [1, 3, 5] {
        let cluster = Cluster::start(n);
        let a = warm_client(&cluster).await;
        let b = warm_client(&cluster).await;
        // The bucket's first use finds no fence on a node and writes the
        // clock seed back there (`fence_state_is_bounded_by_the_buckets_and_kept`),
        // to the granting nodes: acquire until every node holds the same
        // seeded fence. The warm-up's first lock may have landed on a bare
        // majority (its own resource). Count from here.
        let level = |cluster: &Cluster| {
            let fences: Vec<String> = cluster
                .nodes
                .iter()
                .map(|s| s.cli(&["GET", &fence_key("seq")]))
                .collect();
            fences.iter().all(|f| *f == fences[0])
                && fences[0].parse::<u64>().is_ok_and(|f| f >= 1 << 40)
        };
        for _ in 0..20 {
            if level(&cluster) {
                break;
            }
            a.acquire("seq", secs(5)).await.unwrap().release().await;
            assert!(eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; n]).await);
            // The write-back's last answers arrive after the hand-out.
            tokio::time::sleep(ms(50)).await;
        }
        assert!(level(&cluster), "n={n}: seeded and level everywhere");
        let before = a.stats().write_backs + b.stats().write_backs;
        let mut last = 0;
        for i in 0..10 {
            let client = if i % 2 == 0 { &a } else { &b };
            let guard = client.acquire("seq", secs(5)).await.unwrap();
            let t = token(&guard);
            assert!(
                t > 1_000_000_000_000_000,
                "n={n}: seeded from the clock: {t}"
            );
            assert!(t < 1 << 53, "n={n}: {t}");
            if last != 0 {
                assert!(t > last, "n={n}: token {t} after {last}");
            }
            last = t;
            // Extending keeps the token.
            guard.extend(secs(5)).await.unwrap();
            assert_eq!(token(&guard), t);
            guard.release().await;
            // Wait for the release on every node, so the next acquire is
            // granted everywhere and the fences stay equal.
            assert!(eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; n]).await);
        }
        let write_backs = a.stats().write_backs + b.stats().write_backs - before;
        assert_eq!(write_backs, 0, "n={n}: every node saw every acquisition");
        // Every node stores the last token.
        let stored: Vec<String> = cluster
            .nodes
            .iter()
            .map(|s| s.cli(&["GET", &fence_key("seq")]))
            .collect();
        assert!(
            stored.iter().all(|f| *f == last.to_string()),
            "{stored:?} vs {last}"
        );
    }
}

/// Kleppmann's scenario: holder 1 stalls past its validity without
/// extending, holder 2 acquires with a larger token and writes, holder 1
/// wakes and writes with its old token: the fenced store refuses, and the
/// stored value is holder 2's.
/// Single-node mode behaves the same way.
#[tokio::test]
async fn paused_holder_is_fenced_off() {
    for n in [1, 3] {
        paused_holder_is_fenced_off_on(n).await;
    }
}

async fn paused_holder_is_fenced_off_on(n: usize) {
    let cluster = Cluster::start(n);
    let storage = RedisServer::start();
    let store = store_on(&storage).await;
    let one = warm_client(&cluster).await;
    let two = warm_client(&cluster).await;

    let g1 = one.acquire("kleppmann", ms(300)).await.unwrap();
    let t1 = g1.token().unwrap();
    // The "GC pause": no extend, the lease runs out.
    tokio::time::sleep(ms(400)).await;
    assert!(!g1.lease().is_valid());

    let g2 = two.acquire("kleppmann", secs(10)).await.unwrap();
    let t2 = g2.token().unwrap();
    assert!(t2 > t1, "{t2} after {t1}");
    store.write("membership:42", b"from-2", t2).await.unwrap();

    let err = store
        .write("membership:42", b"from-1", t1)
        .await
        .unwrap_err();
    let stale = err.stale().unwrap_or_else(|| panic!("{err}"));
    assert_eq!((stale.presented, stale.current), (t1, t2));
    assert_eq!(stale.key, "membership:42");
    let stored = store.read("membership:42").await.unwrap().unwrap();
    assert_eq!(
        (stored.value.as_slice(), stored.token),
        (&b"from-2"[..], t2)
    );
    // The same holder may write again with its token.
    store
        .write("membership:42", b"from-2 again", t2)
        .await
        .unwrap();
    g2.release().await;
    drop(g1);
}

/// A node whose lock key vanishes early (a clock jump there) lets a second
/// client take a lock the first still believes valid: mutual exclusion is
/// broken, by construction. The second holder's token is still larger
/// (here only thanks to the write-back: the node that joins its quorum
/// missed the first acquisition), so fencing still refuses the stale writer.
#[tokio::test]
async fn early_expiry_on_one_node_breaks_exclusion_but_not_fencing() {
    let mut cluster = Cluster::start_with(3, |_| ServerOptions {
        appendonly: true,
        appendfsync_always: true,
        ..ServerOptions::default()
    });
    let storage = RedisServer::start();
    let store = store_on(&storage).await;
    let one = warm_client(&cluster).await;
    let two = warm_client(&cluster).await;
    let resource = "jump";

    // Every node has a fence for the resource, all equal.
    one.acquire(resource, secs(5))
        .await
        .unwrap()
        .release()
        .await;
    assert!(eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);

    // Holder 1 is granted by nodes 0 and 1; node 2 is down and misses the
    // acquisition (its fence stays one behind), then comes back with its
    // data.
    cluster.node(2).kill();
    let g1 = one.try_acquire(resource, secs(30)).await.unwrap().unwrap();
    let t1 = g1.token().unwrap();
    cluster.node(2).restart();

    // The clock jump on node 1: its copy of holder 1's key is gone.
    cluster.nodes[1].cli(&["DEL", &lock_key(resource)]);

    // Holder 2 gets nodes 1 and 2 while holder 1 is still valid (waiting
    // for its connection to node 2 to come back).
    let before = two.stats();
    let g2 = two
        .lock(resource, secs(30))
        .retry(Retry::new().with_max_wait(secs(10)))
        .acquire()
        .await
        .unwrap();
    assert!(
        g1.lease().is_valid() && g2.lease().is_valid(),
        "two holders at once"
    );
    let t2 = g2.token().unwrap();
    assert!(t2 > t1, "{t2} after {t1}");
    let after = two.stats();
    assert_eq!(
        after.write_backs - before.write_backs,
        1,
        "{before:?} {after:?}"
    );
    // Node 2's fence was raised to the token by the write-back.
    let fence2: u64 = cluster.nodes[2]
        .cli(&["GET", &fence_key(resource)])
        .parse()
        .unwrap();
    assert_eq!(fence2, t2.get());

    store.write("order:7", b"from-2", t2).await.unwrap();
    let err = store.write("order:7", b"from-1", t1).await.unwrap_err();
    assert!(err.is_stale(), "{err}");
    let stored = store.read("order:7").await.unwrap().unwrap();
    assert_eq!(stored.value, b"from-2");
    g2.release().await;
    g1.release().await;
}

/// The write-back is ownership-checked: when the lock key has vanished on
/// the node the token must be written to, the attempt fails in the
/// write-back phase with `NotHeld`, releases, and hands nothing out.
/// Provoked with a loop deleting the lock key on that node as fast as it
/// can, so the key is often gone between the two rounds; the test only
/// needs it to happen once within 30 s.
#[tokio::test]
async fn write_back_to_a_node_that_lost_the_key_fails() {
    let cluster = Cluster::start(3);
    let client = warm_client(&cluster).await;
    let resource = "wb";
    let key = lock_key(resource);
    // Seed the fences on all nodes.
    client
        .acquire(resource, secs(5))
        .await
        .unwrap()
        .release()
        .await;
    assert!(eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
    // Puts node 0's fence far ahead of node 2's, so that a grant by nodes
    // 0 and 2 needs a write-back to node 2. Redone before every attempt: a
    // write-back that succeeds levels them.
    let put_ahead = || {
        let ahead = cluster.nodes[2]
            .cli(&["GET", &fence_key(resource)])
            .parse::<u64>()
            .unwrap()
            + 1000;
        cluster.nodes[0].cli(&["SET", &fence_key(resource), &ahead.to_string()]);
        ahead
    };
    // Node 1 is held by someone else: the quorum must be nodes 0 and 2.
    cluster.nodes[1].cli(&["SET", &key, "someone-else"]);

    let stop = Arc::new(AtomicBool::new(false));
    let deleter = {
        let (stop, url, key) = (Arc::clone(&stop), cluster.nodes[2].url(), key.clone());
        std::thread::spawn(move || {
            let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
            // Pipelined, so node 2 always has DELs queued: between our
            // acquire and our write-back (a round trip apart) it runs some.
            let mut pipe = redis::pipe();
            for _ in 0..64 {
                pipe.cmd("DEL").arg(&key).ignore();
            }
            while !stop.load(Ordering::Relaxed) {
                let _: redis::RedisResult<()> = pipe.query(&mut conn);
            }
        })
    };
    let mut seen = None;
    let mut attempts = 0;
    let mut other: Vec<String> = Vec::new();
    let deadline = Instant::now() + secs(30);
    while Instant::now() < deadline {
        attempts += 1;
        let ahead = put_ahead();
        match client.try_acquire(resource, secs(5)).await {
            Ok(Some(guard)) => {
                // Granted when the key survived: the token is the one
                // written back.
                assert!(token(&guard) > ahead);
                guard.release().await;
            }
            Ok(None) => other.push("contended".to_owned()),
            Err(err) => {
                let q = err.quorum_failure().unwrap_or_else(|| panic!("{err}"));
                if q.phase == Phase::WriteBack {
                    seen = Some(err);
                    break;
                }
                other.push(err.to_string());
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    deleter.join().unwrap();
    let err = seen.unwrap_or_else(|| {
        panic!(
            "the write-back never found the key gone in {attempts} attempts; {} other outcomes, the last: {:?}",
            other.len(),
            other.last()
        )
    });
    let q = err.quorum_failure().unwrap();
    assert_eq!(q.reason, FailureReason::NotHeld, "{err}");
    assert!(
        q.failures
            .iter()
            .any(|f| f.index == 2 && matches!(f.kind, NodeErrorKind::NotHeld)),
        "{err}"
    );
    assert!(report(&err).contains("token write-back"), "{err}");
    assert!(client.stats().write_backs_failed >= 1);
    // The failed attempt released node 0.
    assert!(eventually(secs(2), || cluster.nodes[0].count_keys(LOCK_KEYS) == 0).await);
}

/// Many tasks, many rounds, one resource, with a node killed and restarted
/// (with its data: AOF, fsync always) mid-run: the tokens, recorded inside
/// the critical sections (so in grant order), strictly increase, and every
/// fenced write is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_strictly_increase_under_contention_and_restart() {
    for n in [3, 5] {
        let mut cluster = Cluster::start_with(n, |_| ServerOptions {
            appendonly: true,
            appendfsync_always: true,
            ..ServerOptions::default()
        });
        let storage = RedisServer::start();
        let store = store_on(&storage).await;
        let client = warm_client(&cluster).await;
        let order: Arc<Mutex<Vec<u64>>> = Arc::default();
        let tasks = 8;
        let rounds = 25;
        let run = |client: Client, order: Arc<Mutex<Vec<u64>>>, store: FencedStore<_>| async move {
            for _ in 0..rounds {
                let guard = client
                    .lock("contended-tokens", secs(5))
                    .retry(Retry::new().with_max_wait(secs(60)))
                    .acquire()
                    .await
                    .unwrap();
                let t = guard.token().unwrap();
                order.lock().unwrap().push(t.get());
                store.write("row", t.get().to_string(), t).await.unwrap();
                guard.release().await;
            }
        };
        let handles: Vec<_> = (0..tasks)
            .map(|_| tokio::spawn(run(client.clone(), Arc::clone(&order), store.clone())))
            .collect();
        // Kill node 0 once a quarter of the grants happened, bring it back
        // (same port, same data) at half. Node 0 usually answers first, so
        // after the restart its fence, behind by the grants it missed, is
        // in winning quorums and the write-back brings it level.
        let total = tasks * rounds;
        assert!(wait_for(&order, total / 4, secs(60)).await);
        cluster.node(0).kill();
        assert!(wait_for(&order, total / 2, secs(60)).await);
        cluster.node(0).restart();
        for h in handles {
            h.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        assert_eq!(order.len(), total);
        for pair in order.windows(2) {
            assert!(
                pair[1] > pair[0],
                "n={n}: token {} after {}",
                pair[1],
                pair[0]
            );
        }
        let stored = store.read("row").await.unwrap().unwrap();
        assert_eq!(stored.token.get(), *order.last().unwrap());
        eprintln!("n={n}: {} grants, {:?}", order.len(), client.stats());
    }
}

async fn wait_for(order: &Mutex<Vec<u64>>, count: usize, within: Duration) -> bool {
    eventually(within, || order.lock().unwrap().len() >= count).await
}

/// What fencing stores: one fence key per bucket of resources and node,
/// never expiring, so the state does not grow with the number of distinct
/// resources ever locked. 3,000 resources leave at most
/// `FENCE_BUCKETS` fence keys per node, with no TTL, and no lock key once
/// released; tokens of one resource still increase. A bucket's first use
/// seeds its fence from the attempt's clock seed on every node alike.
#[tokio::test]
async fn fence_state_is_bounded_by_the_buckets_and_kept() {
    let cluster = Cluster::start(3);
    let client = crate::helpers::builder(cluster.urls())
        .node_timeout(secs(1))
        .build()
        .unwrap();
    warm_up(&client, &cluster).await;
    let before = client.stats().write_backs;
    let guard = client.acquire("fresh", secs(5)).await.unwrap();
    let first = token(&guard);
    assert!(
        first > 1_000_000_000_000_000,
        "seeded from the clock: {first}"
    );
    guard.release().await;
    assert_eq!(
        client.stats().write_backs - before,
        0,
        "every node seeded the bucket with the attempt's one seed"
    );
    let key = fence_key("fresh");
    let stored = cluster
        .nodes
        .iter()
        .filter(|node| node.cli(&["GET", &key]) == first.to_string())
        .count();
    assert!(stored >= 2, "stored on {stored} nodes");
    for node in &cluster.nodes {
        assert_eq!(pttl(node, &key), -1, "fences never expire");
    }
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let client = client.clone();
            tokio::spawn(async move {
                for i in 0..375 {
                    let guard = client.acquire(&format!("r{t}:{i}"), secs(5)).await.unwrap();
                    guard.release().await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let buckets = usize::from(redfence::limits::FENCE_BUCKETS);
    for count in cluster.count_keys(FENCE_KEYS) {
        assert!(count <= buckets, "{count} fence keys for 3,000 resources");
        assert!(count > buckets / 2, "the resources spread over the buckets");
    }
    assert!(eventually(secs(5), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
    let guard = client.acquire("fresh", secs(5)).await.unwrap();
    assert!(token(&guard) > first);
    guard.release().await;
}

/// With fencing off, the acquire is a plain `SET NX`, no fence key is
/// written, and the guard has no token.
#[tokio::test]
async fn fencing_off_has_no_token_and_no_fence_keys() {
    let cluster = Cluster::start(3);
    let client = crate::helpers::builder(cluster.urls())
        .node_timeout(secs(1))
        .fencing(false)
        .build()
        .unwrap();
    assert!(!client.fencing());
    let guard = client.acquire("plain", secs(5)).await.unwrap();
    assert_eq!(guard.token(), None);
    assert_eq!(cluster.count_keys(FENCE_KEYS), vec![0; 3]);
    guard.release().await;
    let stats: Vec<String> = cluster
        .nodes
        .iter()
        .map(|s| s.cli(&["INFO", "commandstats"]))
        .collect();
    for st in &stats {
        // No transaction, no fence.
        assert!(
            !st.contains("cmdstat_exec") && !st.contains("cmdstat_incr"),
            "{st}"
        );
    }
    let sets = stats
        .iter()
        .filter(|st| st.contains("cmdstat_set:"))
        .count();
    assert!(sets >= 2, "the acquire was a plain SET on a majority");
}

/// The acquire script reads the fence as a Lua number, exact below 2^53
/// (tokens reach it around the year 2255): a fence at 2^53 or more is an
/// error reply from that node, never a wrong token, and so is one that
/// `INCR` cannot move past `i64::MAX`; the attempt releases what it took.
#[tokio::test]
async fn fences_past_2_pow_53_are_refused() {
    let cluster = Cluster::start(1);
    let client = warm_client(&cluster).await;
    let limit = 1u64 << 53;
    cluster.nodes[0].cli(&["SET", &fence_key("edge"), &(limit - 2).to_string()]);
    let guard = client.acquire("edge", secs(5)).await.unwrap();
    assert_eq!(token(&guard), limit - 1, "exact just below 2^53");
    guard.release().await;
    for (fence, says) in [(limit - 1, "2^53"), (i64::MAX.unsigned_abs(), "overflow")] {
        cluster.nodes[0].cli(&["SET", &fence_key("edge"), &fence.to_string()]);
        let err = client
            .lock("edge", secs(5))
            .retry(Retry::once())
            .acquire()
            .await
            .unwrap_err();
        let q = err.quorum_failure().unwrap();
        assert!(
            matches!(q.failures[0].kind, NodeErrorKind::Redis(_)),
            "{err}"
        );
        assert!(report(&err).contains(says), "{err}");
        assert!(eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0]).await);
    }
}

/// The fenced store's own errors: a timeout (the store server paused), and
/// a token compared exactly at full u64 width.
#[tokio::test]
async fn fenced_store_errors() {
    let mut storage = RedisServer::start();
    let store = store_on(&storage).await.timeout(ms(200));
    let big = FencingToken::new(u64::MAX);
    let below = FencingToken::new(u64::MAX - 1);
    store.write("wide", b"max", big).await.unwrap();
    let err = store.write("wide", b"less", below).await.unwrap_err();
    assert_eq!(err.stale().unwrap().current, big);
    assert_eq!(store.read("never").await.unwrap(), None);
    storage.pause();
    let err = store.write("wide", b"x", big).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Timeout(t) if t == ms(200)),
        "{err}"
    );
    storage.resume();
    // A key of the wrong type is a backend error, not a panic.
    storage.cli(&["SET", "plain-string", "x"]);
    let err = store.write("plain-string", b"v", big).await.unwrap_err();
    assert!(matches!(err, StoreError::Backend(_)), "{err}");
}

/// A first fenced attempt goes as `MULTI`/`SET`/`INCR`/`EXEC` on a plain
/// connection, and a transaction cannot seed a fence: one it finds absent
/// comes back as 1 (the control below shows what the transaction alone
/// answers). Such a value, or one a transaction left below 2^40 when its
/// client died before seeding, is never a token: the attempt asks again
/// with the script, and every other script that moves or reads a fence
/// (the multi-resource acquire, the read-write lock's read and write)
/// seeds one below 2^40 itself. Every token here is at least the clock
/// seed of the test's start.
#[tokio::test]
async fn an_unseeded_fence_is_never_a_token_on_any_path() {
    use crate::helpers::{calls, new_client};
    let cluster = Cluster::start(1);
    let node = &cluster.nodes[0];
    let floor = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    // The control: the transaction on an absent fence.
    let mut conn = redis::Client::open(node.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let (set, moved): (String, u64) = redis::pipe()
        .atomic()
        .cmd("SET")
        .arg("control:lock")
        .arg("v")
        .arg("NX")
        .arg("PX")
        .arg(5_000)
        .cmd("INCR")
        .arg("control:fence")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        (set.as_str(), moved),
        ("OK", 1),
        "what the checker must catch"
    );
    assert!(moved < floor);

    let client = new_client(&cluster);
    let low = |keys: &[String]| {
        for key in keys {
            assert_eq!(node.cli(&["SET", key, "3"]), "OK");
        }
    };
    // Absent: the transaction, then the script once.
    let (execs, scripts) = (calls(node, "exec"), calls(node, "evalsha"));
    let first = client.try_acquire("fresh", secs(5)).await.unwrap().unwrap();
    assert!(token(&first) >= floor, "{} < {floor}", token(&first));
    assert_eq!(calls(node, "exec") - execs, 1);
    assert_eq!(calls(node, "evalsha") - scripts, 1, "asked again once");
    let t1 = token(&first);
    first.release().await;
    // Seeded: the transaction alone.
    let scripts = calls(node, "evalsha");
    let second = client.try_acquire("fresh", secs(5)).await.unwrap().unwrap();
    assert_eq!(token(&second), t1 + 1);
    assert_eq!(calls(node, "evalsha"), scripts, "no second request");
    second.release().await;
    // Left low by a transaction whose client went away.
    low(&[fence_key("fresh")]);
    let third = client.acquire("fresh", secs(5)).await.unwrap();
    assert!(token(&third) >= floor, "{} < {floor}", token(&third));
    third.release().await;
    // The multi-resource acquire.
    low(&[fence_key("m:a"), fence_key("m:b")]);
    let both = client
        .try_lock_all(["m:a", "m:b"], secs(5))
        .await
        .unwrap()
        .unwrap();
    for t in both.tokens() {
        assert!(t.unwrap().get() >= floor, "{t:?} < {floor}");
    }
    both.release().await;
    // The read-write lock's write, then its read (the generation seen).
    let rw = client.rw_lock("doc").unwrap();
    let every_fence = || -> Vec<String> {
        let keys = node.cli(&["KEYS", FENCE_KEYS]);
        keys.lines().map(str::to_owned).collect()
    };
    let w = rw.try_write(secs(5)).await.unwrap().unwrap();
    w.release().await;
    low(&every_fence());
    let w = rw.try_write(secs(5)).await.unwrap().unwrap();
    assert!(w.token().unwrap().get() >= floor, "{:?}", w.token());
    w.release().await;
    low(&every_fence());
    let r = rw.try_read(secs(5)).await.unwrap().unwrap();
    assert!(r.token().unwrap().get() >= floor, "{:?}", r.token());
    r.release().await;
    assert!(eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0]).await);
}
