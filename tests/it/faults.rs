//! Nodes that die, freeze and come back. Redlock's promise: a minority of
//! failed nodes costs nothing (bounded by the node timeout at worst), a
//! majority of failed nodes fails fast with per-node detail, and nothing a
//! frozen node executes later leaves a lock behind.

use std::sync::Arc;
use std::time::Instant;

use redfence::{Error, FailureReason, NodeErrorKind, Phase, Retry};

use crate::helpers::{
    client_with_timeout, eventually, lock_key, ms, pttl, report, secs, warm_up, LOCK_KEYS,
};
use crate::support::Cluster;

fn is_connect_failure(kind: &NodeErrorKind) -> bool {
    match kind {
        NodeErrorKind::Connect(_) | NodeErrorKind::ConnectionLost(_) => true,
        NodeErrorKind::Backoff { last, .. } => is_connect_failure(last),
        _ => false,
    }
}

#[tokio::test]
async fn one_of_three_killed_still_locks() {
    let mut cluster = Cluster::start(3);
    let client = client_with_timeout(cluster.urls(), ms(300));
    warm_up(&client, &cluster).await;
    cluster.node(1).kill();
    for round in 0..5 {
        let guard = client.acquire("survivor", secs(10)).await.unwrap();
        assert_eq!(
            cluster.count_keys(LOCK_KEYS),
            vec![1, 0, 1],
            "round {round}"
        );
        assert!(guard.validity() > secs(9));
        guard.extend(secs(10)).await.unwrap();
        let released = guard.release().await;
        assert_eq!(released.confirmed, 2, "round {round}: {released:?}");
        for f in &released.failures {
            assert_eq!(f.index, 1, "{released:?}");
            // The acquire never reached the dead node, so its release is
            // not even sent there.
            assert!(
                is_connect_failure(&f.kind) || matches!(f.kind, NodeErrorKind::Skipped),
                "{released:?}"
            );
        }
        assert!(
            eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await,
            "round {round}"
        );
    }
}

/// Two of three nodes killed after the client had connected: every attempt
/// fails on connection errors, the client retries until its deadline, and
/// the error lists both dead nodes.
#[tokio::test]
async fn two_of_three_killed_is_unavailable() {
    let mut cluster = Cluster::start(3);
    let dead = [
        format!("127.0.0.1:{}", cluster.nodes[0].port()),
        format!("127.0.0.1:{}", cluster.nodes[2].port()),
    ];
    let client = client_with_timeout(cluster.urls(), ms(300));
    warm_up(&client, &cluster).await;
    cluster.node(0).kill();
    cluster.node(2).kill();

    let max_wait = secs(1);
    let started = Instant::now();
    let err = client
        .lock("majority-down", secs(10))
        .retry(Retry::new().with_max_wait(max_wait))
        .acquire()
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(took < max_wait + secs(2), "took {took:?}: {err}");
    assert!(err.is_unavailable(), "{err}");
    let Error::NotAcquired(q) = &err else {
        panic!("{err:?}");
    };
    assert_eq!(q.phase, Phase::Acquire);
    assert_eq!(q.reason, FailureReason::Unavailable);
    assert_eq!((q.quorum, q.nodes), (2, 3));
    // The live node's vote may not be counted: the dead ones answer first
    // and already make a majority impossible.
    assert!(q.granted <= 1, "{err}");
    // Connection failures are not permanent: it kept trying.
    assert!(q.attempts > 1, "{err}");
    let failed: Vec<&str> = q.failures.iter().map(|f| f.addr.as_str()).collect();
    assert_eq!(
        failed,
        dead.iter().map(String::as_str).collect::<Vec<_>>(),
        "{err}"
    );
    for f in &q.failures {
        assert!(is_connect_failure(&f.kind), "{err}");
        assert!(!f.kind.is_permanent(), "{err}");
    }
    let message = report(&err);
    for addr in &dead {
        assert!(message.contains(addr.as_str()), "{message}");
    }
    // Grants on the live node were released after each failed attempt.
    assert!(eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
}

/// The same with a client that never reached the dead nodes: `Connect`
/// (then `Backoff`) rather than `ConnectionLost`.
#[tokio::test]
async fn majority_down_before_first_use() {
    let mut cluster = Cluster::start(3);
    cluster.node(0).kill();
    cluster.node(1).kill();
    let client = client_with_timeout(cluster.urls(), ms(300));
    let started = Instant::now();
    let err = client
        .lock("never-up", secs(10))
        .retry(Retry::new().with_max_wait(secs(1)))
        .acquire()
        .await
        .unwrap_err();
    assert!(started.elapsed() < secs(3), "{err}");
    let q = err.quorum_failure().unwrap();
    assert!(q.attempts > 1, "{err}");
    assert_eq!(q.reason, FailureReason::Unavailable);
    let indices: Vec<usize> = q.failures.iter().map(|f| f.index).collect();
    assert_eq!(indices, vec![0, 1], "{err}");
    for f in &q.failures {
        assert!(
            matches!(&f.kind, NodeErrorKind::Connect(_))
                || matches!(&f.kind, NodeErrorKind::Backoff { last, .. }
                    if matches!(**last, NodeErrorKind::Connect(_))),
            "{err}"
        );
    }
    // try_acquire calls it an error, not "held by someone else".
    let err = client.try_acquire("never-up", secs(10)).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    assert!(eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
}

/// A frozen minority does not slow anything down: acquire, extend and release
/// return at the first majority, long before the node timeout. What the
/// frozen nodes execute after they thaw (our SET, then our release, in that
/// order on each connection) leaves nothing behind.
async fn frozen_minority(n: usize, frozen: &[usize]) {
    let mut cluster = Cluster::start(n);
    // Far above what the test allows an operation to take: if any of them
    // waited for a frozen node, the assertions below would catch it.
    let node_timeout = secs(5);
    let client = client_with_timeout(cluster.urls(), node_timeout);
    warm_up(&client, &cluster).await;
    for &i in frozen {
        cluster.node(i).pause();
    }
    let quick = secs(2);

    let started = Instant::now();
    let guard = client.acquire("frozen", secs(30)).await.unwrap();
    assert!(
        started.elapsed() < quick,
        "acquire took {:?}",
        started.elapsed()
    );

    let started = Instant::now();
    guard.extend(secs(30)).await.unwrap();
    assert!(
        started.elapsed() < quick,
        "extend took {:?}",
        started.elapsed()
    );

    let started = Instant::now();
    let released = guard.release().await;
    assert!(
        started.elapsed() < quick,
        "release took {:?}",
        started.elapsed()
    );
    assert_eq!(released.confirmed, n / 2 + 1, "{released:?}");
    assert_eq!(released.pending, frozen.len(), "{released:?}");
    assert!(released.failures.is_empty(), "{released:?}");

    // The live nodes are clean already (or within the background finish).
    let live: Vec<usize> = (0..n).filter(|i| !frozen.contains(i)).collect();
    assert!(
        eventually(secs(2), || {
            let counts = cluster.count_keys(LOCK_KEYS);
            live.iter().all(|&i| counts[i] == 0)
        })
        .await
    );

    for &i in frozen {
        cluster.node(i).resume();
    }
    // The TTL is 30 s: keys disappearing within a few seconds were deleted
    // by the queued release, not expired.
    assert!(
        eventually(secs(3), || cluster.count_keys(LOCK_KEYS) == vec![0; n]).await,
        "{:?}",
        cluster.count_keys(LOCK_KEYS)
    );
    // And the thawed nodes vote again.
    let guard = client.acquire("frozen", secs(30)).await.unwrap();
    guard.release().await;
}

#[tokio::test]
async fn one_of_three_frozen() {
    frozen_minority(3, &[2]).await;
}

#[tokio::test]
async fn two_of_five_frozen() {
    frozen_minority(5, &[0, 3]).await;
}

/// Frozen before the client ever connected: the connect hangs, the other
/// nodes decide, and the frozen node's vote is simply missing.
#[tokio::test]
async fn frozen_before_first_use() {
    let mut cluster = Cluster::start(3);
    cluster.node(0).pause();
    let node_timeout = ms(300);
    let client = client_with_timeout(cluster.urls(), node_timeout);
    let started = Instant::now();
    let guard = client.acquire("cold-frozen", secs(30)).await.unwrap();
    assert!(started.elapsed() < node_timeout + secs(2));
    let released = guard.release().await;
    assert_eq!(released.confirmed, 2, "{released:?}");
    cluster.node(0).resume();
    assert!(
        eventually(secs(3), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await,
        "{:?}",
        cluster.count_keys(LOCK_KEYS)
    );
}

/// When the frozen node's vote is needed (another owner holds one live
/// node), the attempt waits for it exactly up to the node timeout and names
/// it as a timeout.
#[tokio::test]
async fn frozen_node_times_out_when_its_vote_is_needed() {
    let mut cluster = Cluster::start(3);
    let node_timeout = ms(400);
    let client = client_with_timeout(cluster.urls(), node_timeout);
    warm_up(&client, &cluster).await;
    let key = lock_key("needed");
    cluster.nodes[1].cli(&["SET", &key, "other", "PX", "30000"]);
    cluster.node(2).pause();

    let started = Instant::now();
    let err = client.try_acquire("needed", secs(30)).await.unwrap_err();
    let took = started.elapsed();
    assert!(
        took >= node_timeout - ms(20),
        "gave up after {took:?}: {err}"
    );
    assert!(took < node_timeout + secs(2), "took {took:?}: {err}");
    assert!(err.is_timeout(), "{err}");
    let q = err.quorum_failure().unwrap();
    assert_eq!(q.reason, FailureReason::Unavailable, "{err}");
    assert_eq!(q.granted, 1, "{err}");
    let timeout = q
        .failures
        .iter()
        .find(|f| f.index == 2)
        .expect("node 2 listed");
    assert!(
        matches!(timeout.kind, NodeErrorKind::Timeout(d) if d <= node_timeout),
        "{err}"
    );
    assert!(report(&err).contains("timed out after"), "{err}");

    cluster.node(2).resume();
    // Our grant on node 0 and whatever node 2 executes late are released;
    // the other owner's key on node 1 is untouched.
    assert!(
        eventually(secs(3), || cluster.count_keys(LOCK_KEYS) == vec![0, 1, 0]).await,
        "{:?}",
        cluster.count_keys(LOCK_KEYS)
    );
    assert_eq!(cluster.nodes[1].cli(&["GET", &key]), "other");
}

/// A node that restarts empty (no persistence: no keys, no cached scripts)
/// is reconnected and re-taught the scripts; every operation keeps working.
#[tokio::test]
async fn restarted_node_is_reconnected_and_scripts_reloaded() {
    let mut cluster = Cluster::start(3);
    let client = client_with_timeout(cluster.urls(), ms(300));
    warm_up(&client, &cluster).await;
    let key = lock_key("restart");

    let guard = client.acquire("restart", secs(10)).await.unwrap();
    cluster.node(0).restart();
    assert_eq!(
        cluster.count_keys(LOCK_KEYS),
        vec![0, 1, 1],
        "restart lost the key"
    );
    // Extend still has its majority (nodes 1 and 2).
    guard.extend(secs(20)).await.unwrap();
    assert!(pttl(&cluster.nodes[1], &key) > 10_000);
    let released = guard.release().await;
    assert!(released.confirmed >= 2, "{released:?}");
    assert!(eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);

    // Restart every node: each connection is broken and each script cache
    // empty. The client reconnects and falls back to EVAL everywhere.
    for i in 0..3 {
        cluster.node(i).restart();
    }
    let guard = client.acquire("restart", secs(10)).await.unwrap();
    assert!(guard.extend(secs(10)).await.is_ok());
    let released = guard.release().await;
    assert!(released.confirmed >= 2, "{released:?}");

    // Node 0 takes part again within a few operations.
    let deadline = Instant::now() + secs(5);
    loop {
        let guard = client.acquire("restart", secs(10)).await.unwrap();
        let on_first = cluster.count_keys(LOCK_KEYS)[0] == 1;
        guard.release().await;
        if on_first {
            break;
        }
        assert!(Instant::now() < deadline, "node 0 never voted again");
        tokio::time::sleep(ms(50)).await;
    }
    assert!(eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
}

/// `EVAL` calls a node has served so far.
fn evals(node: &crate::support::RedisServer) -> u64 {
    let stats = node.cli(&["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_eval:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// `SCRIPT FLUSH` on every node, connections intact: the next EVALSHA gets
/// `NOSCRIPT` everywhere, and only the EVAL fallback can make it work.
#[tokio::test]
async fn flushed_script_cache_falls_back_to_eval() {
    let cluster = Cluster::start(3);
    let client = client_with_timeout(cluster.urls(), ms(300));
    warm_up(&client, &cluster).await;
    for round in 0..2 {
        for node in &cluster.nodes {
            assert_eq!(node.cli(&["SCRIPT", "FLUSH"]), "OK");
        }
        let before: Vec<u64> = cluster.nodes.iter().map(evals).collect();
        let guard = client.acquire("flushed", secs(10)).await.unwrap();
        guard.extend(secs(10)).await.unwrap();
        let released = guard.release().await;
        assert!(released.confirmed >= 2, "round {round}: {released:?}");
        assert!(eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
        let after: Vec<u64> = cluster.nodes.iter().map(evals).collect();
        let fell_back = (0..3).filter(|&i| after[i] > before[i]).count();
        assert!(
            fell_back >= 2,
            "round {round}: no EVAL fallback seen: {before:?} {after:?}"
        );
    }
}

/// The fallback `EVAL` also caches the script: exactly one EVAL per script
/// after a flush, EVALSHA only afterwards. One node, so that no request is
/// left behind by an early decision.
#[tokio::test]
async fn eval_fallback_recaches_each_script_once() {
    let cluster = Cluster::start(1);
    let client = client_with_timeout(cluster.urls(), ms(300));
    let node = &cluster.nodes[0];
    let round = || async {
        let guard = client.acquire("recache", secs(10)).await.unwrap();
        guard.extend(secs(10)).await.unwrap();
        assert_eq!(guard.release().await.confirmed, 1);
    };
    round().await;
    assert_eq!(node.cli(&["SCRIPT", "FLUSH"]), "OK");
    // A first attempt is a transaction (`wire::transacted`); with the
    // fence left unseeded it asks again with the acquire script.
    let fence = crate::helpers::fence_key("recache");
    assert_eq!(node.cli(&["SET", &fence, "3"]), "OK");
    let before = evals(node);
    round().await;
    assert_eq!(
        evals(node),
        before + 3,
        "acquire, extend, release: one EVAL each"
    );
    round().await;
    round().await;
    assert_eq!(
        evals(node),
        before + 3,
        "EVAL sent although the scripts were cached"
    );
}

/// A client built while a minority is down works, and uses the node once it
/// is back.
#[tokio::test]
async fn node_down_at_start_joins_when_it_returns() {
    let mut cluster = Cluster::start(3);
    cluster.node(2).kill();
    let client = crate::helpers::builder(cluster.urls())
        .node_timeout(ms(300))
        .reconnect_backoff_max(ms(500))
        .build()
        .unwrap();
    for _ in 0..3 {
        let guard = client.acquire("late", secs(10)).await.unwrap();
        assert_eq!(cluster.count_keys(LOCK_KEYS), vec![1, 1, 0]);
        guard.release().await;
    }
    cluster.node(2).restart();
    let deadline = Instant::now() + secs(5);
    let mut rounds = 0;
    loop {
        rounds += 1;
        let guard = client.acquire("late", secs(10)).await.unwrap();
        let counts = cluster.count_keys(LOCK_KEYS);
        guard.release().await;
        if counts[2] == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 2 not used {rounds} rounds after its return"
        );
        tokio::time::sleep(ms(100)).await;
    }
    assert!(eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
}

/// A node that timed out and has answered nothing since is skipped (no
/// command piles up behind a stalled server) until a probe answers; the
/// failure says so, and the node is used again once it is back.
#[tokio::test]
async fn stalled_nodes_are_skipped_until_a_probe_answers() {
    let mut cluster = Cluster::start(3);
    let client = client_with_timeout(cluster.urls(), ms(300));
    warm_up(&client, &cluster).await;
    cluster.node(1).pause();
    cluster.node(2).pause();
    // First attempt: both paused nodes time out.
    let first = client
        .lock("stall", secs(10))
        .retry(Retry::once())
        .acquire()
        .await
        .unwrap_err();
    let timeouts = first
        .node_failures()
        .iter()
        .filter(|f| matches!(f.kind, NodeErrorKind::Timeout(_)))
        .count();
    assert_eq!(timeouts, 2, "{first}");
    // Soon after, they are known stalled: requests fail at once, except one
    // probe per node timeout. (Other resources: a background release may
    // still be on its way to node 0. Several rounds: a reply the paused node
    // sent just before SIGSTOP and the client read just after counts as a
    // sign of life, and a round may carry one node's probe.)
    let mut seen_stalled = [false; 3];
    let mut last = None;
    for round in 0..6 {
        let err = client
            .lock(format!("stall-{round}"), secs(10))
            .retry(Retry::once())
            .acquire()
            .await
            .unwrap_err();
        for f in err.node_failures() {
            if matches!(f.kind, NodeErrorKind::Stalled { .. }) {
                seen_stalled[f.index] = true;
            }
        }
        assert!(err.is_timeout() && err.is_unavailable(), "{err}");
        last = Some(err);
    }
    assert_eq!(seen_stalled, [false, true, true], "last: {last:?}");
    cluster.node(1).resume();
    cluster.node(2).resume();
    // A probe per node timeout brings them back.
    let back = client
        .lock("stall", secs(10))
        .retry(Retry::new().with_max_wait(secs(10)))
        .acquire()
        .await
        .unwrap();
    back.release().await;
    // Nothing of any attempt is left once the queued releases have run.
    assert!(eventually(secs(3), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
}

/// A long pause under load leaves no key behind: acquires stop being sent
/// to the stalled node, and releases of those already queued there are kept
/// until the node runs them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_pause_under_load_leaves_no_keys() {
    let mut cluster = Cluster::start(5);
    let client = client_with_timeout(cluster.urls(), ms(100));
    warm_up(&client, &cluster).await;
    cluster.node(4).pause();
    let cycles = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stop = Instant::now() + secs(2);
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let (client, cycles) = (client.clone(), cycles.clone());
            tokio::spawn(async move {
                let mut i = 0u32;
                while Instant::now() < stop {
                    let guard = client
                        .acquire(&format!("load:{t}:{i}"), secs(30))
                        .await
                        .unwrap();
                    guard.release().await;
                    cycles.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    cluster.node(4).resume();
    let cycles = cycles.load(std::sync::atomic::Ordering::Relaxed);
    assert!(cycles > 100, "only {cycles} cycles");
    // TTL 30 s: a key still there after 5 s is a leak, not a slow expiry.
    assert!(
        eventually(secs(5), || cluster.count_keys(LOCK_KEYS) == vec![0; 5]).await,
        "{:?} after {cycles} cycles",
        cluster.count_keys(LOCK_KEYS)
    );
    // The stalled node was spared most acquires: far fewer SETs than cycles.
    let stats = cluster.nodes[4].cli(&["INFO", "commandstats"]);
    let sets: usize = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_set:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        sets * 2 < cycles,
        "{sets} SETs reached the paused node in {cycles} cycles"
    );
}

/// The settling rule: a request still waiting for its connection when the
/// majority decided is not sent afterwards (it could otherwise land after
/// our own release). Node 2 is paused while the client first connects, so
/// its handshake hangs; it is resumed after the decision, the handshake
/// completes, and the SET must still not be sent.
#[tokio::test]
async fn straggler_connecting_at_the_decision_never_sends() {
    let mut cluster = Cluster::start(3);
    let client = crate::helpers::builder(cluster.urls())
        .node_timeout(ms(300))
        .connect_timeout(secs(5))
        .build()
        .unwrap();
    cluster.node(2).pause();
    let guard = client.acquire("settled", secs(30)).await.unwrap();
    cluster.node(2).resume();
    // The handshake now completes; give the straggler every chance to send.
    assert!(
        eventually(secs(3), || cluster.nodes[2]
            .cli(&["CLIENT", "LIST"])
            .lines()
            .count()
            >= 2)
        .await,
        "the client never connected to node 2"
    );
    tokio::time::sleep(ms(300)).await;
    let stats = cluster.nodes[2].cli(&["INFO", "commandstats"]);
    assert!(
        !stats.contains("cmdstat_set:"),
        "a SET reached node 2 after the decision:\n{stats}"
    );
    assert_eq!(cluster.count_keys(LOCK_KEYS)[2], 0);
    guard.release().await;
    assert!(eventually(secs(3), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
}
