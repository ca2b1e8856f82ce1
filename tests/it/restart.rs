//! The restart guard on real restarts: a node whose server started less
//! than the window ago does not vote, so a node that crashed and came back
//! without its data cannot grant a lock a second time while the first may
//! still be valid. The negative control shows the double grant without it.

use std::time::{Duration, Instant};

use redfence::{Client, Error, FailureReason, LockGuard, NodeErrorKind, RestartGuard, Retry};

use crate::helpers::{eventually, ms, nudge_until, report, secs, LOCK_KEYS};
use crate::support::Cluster;

fn guarded(cluster: &Cluster, window: Duration) -> Client {
    Client::builder(cluster.urls())
        .node_timeout(ms(500))
        .restart_guard(RestartGuard::new().with_window(window))
        .build()
        .unwrap()
}

fn restarted_on(err: &Error) -> Vec<usize> {
    err.node_failures()
        .iter()
        .filter(|f| matches!(f.kind, NodeErrorKind::Restarted { .. }))
        .map(|f| f.index)
        .collect()
}

/// Acquires `resource`, waiting up to 20 s (through a restart guard's
/// window), or panics with `what`.
async fn patiently(client: &Client, resource: &str, ttl: Duration, what: &str) -> LockGuard {
    client
        .lock(resource, ttl)
        .retry(Retry::new().with_max_wait(secs(20)))
        .acquire()
        .await
        .expect(what)
}

/// Repeats `op` (up to 20 times, 50 ms apart) until its error names exactly
/// `nodes` as restarted, and returns the last error: the first calls after
/// a restart find the old connections broken, the reconnects then see the
/// new servers.
async fn until_restarted_on<F, Fut>(nodes: &[usize], mut op: F) -> Error
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Error>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        let err = op().await;
        if restarted_on(&err) == nodes || tries == 20 {
            return err;
        }
        tokio::time::sleep(ms(50)).await;
    }
}

/// Servers that started a moment ago (which the client cannot tell from
/// servers that just restarted) do not vote until the window has passed;
/// nothing is sent to them meanwhile.
#[tokio::test]
async fn young_servers_vote_only_after_the_window() {
    let cluster = Cluster::start(3);
    let client = guarded(&cluster, secs(3));
    let started = Instant::now();
    let err = client.try_acquire("r", secs(1)).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    assert_eq!(restarted_on(&err).len(), 2, "{err}");
    for f in err.node_failures() {
        if let NodeErrorKind::Restarted { votes_in, .. } = f.kind {
            assert!(votes_in <= secs(3), "{err}");
        }
    }
    assert!(
        report(&err).contains("(restart guard)"),
        "the message names the guard: {err}"
    );
    assert_eq!(cluster.count_keys(LOCK_KEYS), vec![0; 3], "nothing was set");
    // A waiting acquire gets the lock once the servers are old enough.
    let guard = patiently(&client, "r", secs(1), "the servers vote after the window").await;
    // The servers started shortly before `started`; the guard counts from
    // the latest start their reported uptime allows.
    assert!(started.elapsed() >= ms(1000), "{:?}", started.elapsed());
    guard.release().await;

    // The default window is the longest TTL this client requested.
    let cluster = Cluster::start(1);
    let client = Client::builder(cluster.urls()).build().unwrap();
    let err = client.try_acquire("r", secs(30)).await.unwrap_err();
    assert_eq!(restarted_on(&err), vec![0], "{err}");
    // Off: the same server votes at once.
    let off = crate::helpers::client(cluster.urls()).unwrap();
    off.try_acquire("r", secs(30))
        .await
        .unwrap()
        .expect("no guard, no wait")
        .release()
        .await;
}

/// Two of three nodes crash while a lock is held and come back empty. An
/// unguarded client is granted the same lock at once: two holders (the
/// negative control). A guarded client is refused until the window has
/// passed since the restart, and by then the first lease has run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_empty_does_not_vote_twice() {
    let mut cluster = Cluster::start(3);
    let (ttl, window) = (secs(3), secs(3));
    let a = guarded(&cluster, window);
    let b = guarded(&cluster, window);
    // Let the servers age past the window, and connect both clients (b
    // then sees the restart as a change of run_id on reconnect).
    for client in [&a, &b] {
        let guard = patiently(client, "warm-up", ttl, "servers vote after the window").await;
        guard.release().await;
    }
    // Held on all three nodes. The servers were young when `a` connected,
    // so each is re-seeded once its window is over, in the background: a
    // node may still refuse (`Reseeding`) the first acquires after it.
    let mut tries = 0;
    let held = loop {
        tries += 1;
        let held = a.acquire("r", ttl).await.unwrap();
        if eventually(secs(1), || cluster.count_keys(LOCK_KEYS) == vec![1; 3]).await {
            break held;
        }
        assert!(tries < 20, "never held on all three nodes");
        held.release().await;
        tokio::time::sleep(ms(100)).await;
    };
    cluster.node(0).restart();
    cluster.node(1).restart();
    assert_eq!(
        cluster.count_keys(LOCK_KEYS),
        vec![0, 0, 1],
        "restarted empty"
    );

    // The holder cannot extend on the restarted nodes: first its old
    // connections to them are found broken, then the reconnects see new
    // servers, which do not vote.
    let err = until_restarted_on(&[0, 1], || async {
        let err = held.extend(ttl).await.unwrap_err();
        assert_eq!(
            err.quorum_failure().map(|q| q.reason),
            Some(FailureReason::Unavailable),
            "{err}"
        );
        err
    })
    .await;
    assert_eq!(restarted_on(&err), vec![0, 1], "{err}");

    // Negative control: without the guard the empty nodes grant again.
    let unguarded = crate::helpers::client(cluster.urls()).unwrap();
    let stolen = unguarded
        .try_acquire("r", ttl)
        .await
        .unwrap()
        .expect("the restarted nodes vote for a second holder");
    assert!(
        held.validity() > Duration::ZERO,
        "two valid holders at once"
    );
    stolen.release().await;

    // Guarded: refused while the first lease may be valid (after finding
    // its old connections broken, as above).
    let err = until_restarted_on(&[0, 1], || async {
        let err = b.try_acquire("r", ttl).await.unwrap_err();
        assert!(err.is_unavailable(), "{err}");
        err
    })
    .await;
    assert_eq!(restarted_on(&err), vec![0, 1], "{err}");
    // Granted only after the window, when the first lease is over.
    let second = patiently(&b, "r", ttl, "granted after the window").await;
    assert!(
        Instant::now() >= held.valid_until(),
        "granted {:?} before the first lease ended",
        held.valid_until() - Instant::now()
    );
    second.release().await;
    drop(held);
}

/// With fencing, a node that came back empty is re-seeded before it votes
/// in a fenced acquire: each fence the other nodes hold is copied to it at
/// the largest value among them (not reseeded from a clock), so the tokens
/// it takes part in keep increasing without any clock assumption.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_gets_its_fences_back_from_a_majority() {
    let mut cluster = Cluster::start(3);
    let client = guarded(&cluster, ms(1500));
    let mut last = std::collections::HashMap::new();
    for resource in ["a", "b"] {
        for _ in 0..5 {
            let guard = patiently(&client, resource, secs(1), "granted").await;
            last.insert(resource, guard.token().unwrap().get());
            guard.release().await;
        }
    }
    fn fence(cluster: &Cluster, node: usize, r: &str) -> Option<u64> {
        cluster.nodes[node]
            .cli(&["GET", &crate::helpers::fence_key(r)])
            .parse()
            .ok()
    }
    let expected: Vec<u64> = ["a", "b"]
        .iter()
        .map(|r| fence(&cluster, 1, r).max(fence(&cluster, 2, r)).unwrap())
        .collect();
    cluster.node(0).restart();
    let fence = |node: usize, r: &str| fence(&cluster, node, r);
    assert_eq!(
        cluster.nodes[0].count_keys("redfence:fence:*"),
        0,
        "lost its fences"
    );
    // Any fenced acquire (of another resource) finds node 0 young and
    // starts the re-seed; "a" and "b" are not touched until it is done.
    nudge_until(&client, secs(15), "node 0 was never re-seeded", || {
        fence(0, "a").is_some() && fence(0, "b").is_some()
    })
    .await;
    assert_eq!(
        vec![fence(0, "a").unwrap(), fence(0, "b").unwrap()],
        expected,
        "node 0 holds the majority's largest fence for each resource"
    );
    // Tokens keep increasing through it.
    for resource in ["a", "b"] {
        let guard = patiently(&client, resource, secs(1), "granted").await;
        assert!(guard.token().unwrap().get() > last[resource]);
        guard.release().await;
    }
}

/// Two of five nodes restarted empty, and the one other node holding the
/// largest fence paused: a re-seed must not copy from a node that lost its
/// own fences (here the other restarted node). Before the fix the re-seed
/// took the largest fence among the three nodes that answered, one of them
/// empty, and wrote a stale value: the next holder's token went down
/// (found by the fault suite's 8-minute `kill-nopersist-guard`). Now only
/// nodes that kept their fences count as sources; with fewer than a
/// majority of them the clock seed a lost fence gets anyway is the floor.
#[tokio::test]
async fn a_reseed_never_copies_from_a_node_that_lost_its_fences() {
    let mut cluster = Cluster::start(5);
    let window = ms(1500);
    let client = guarded(&cluster, window);
    // Past the window every node votes, and "x" has a fence everywhere.
    let guard = patiently(&client, "x", secs(1), "granted").await;
    guard.release().await;
    let key = &crate::helpers::fence_key("x");
    // The largest fence (the last token) lives on nodes 0, 1 and 2 only;
    // nodes 3 and 4 missed the last grants. Tokens stay below the clock.
    let base: u64 = cluster.nodes[0].cli(&["GET", key]).parse().unwrap();
    let (high, low) = (base + 1_000, base + 500);
    for (i, value) in [high, high, high, low, low].iter().enumerate() {
        assert_eq!(
            cluster.nodes[i].cli(&["SET", key, &value.to_string()]),
            "OK"
        );
    }
    cluster.node(0).restart();
    cluster.node(1).restart();
    cluster.node(2).pause();
    // Fenced acquires of another resource find nodes 0 and 1 young and
    // start their re-seeds (they fail: nodes 0 and 1 do not vote yet and
    // node 2 is paused).
    let deadline = Instant::now() + secs(20);
    let fence0 =
        |cluster: &Cluster| -> Option<u64> { cluster.nodes[0].cli(&["GET", key]).parse().ok() };
    while fence0(&cluster).is_none() {
        assert!(Instant::now() < deadline, "node 0 was never re-seeded");
        let _ = client
            .lock("c", secs(1))
            .retry(Retry::once())
            .acquire()
            .await;
        tokio::time::sleep(ms(100)).await;
    }
    let reseeded = fence0(&cluster).unwrap();
    assert!(
        reseeded > high,
        "node 0 re-seeded to {reseeded}, below the last token {high}"
    );
    cluster.node(2).resume();
    let guard = patiently(&client, "x", secs(1), "granted after the re-seed").await;
    let token = guard.token().unwrap().get();
    assert!(token > high, "token {token} after {high}");
    guard.release().await;
}

/// The re-seed of a restarted node reads the other nodes only once its
/// window is over. Read during the window, an attempt the server granted
/// before its restart may still be collecting grants elsewhere, so the
/// others may not hold that attempt's token yet and the copy can end below
/// it (the model check's 12-step counterexample, DESIGN.md §6). Seen here
/// through the sources' read counts (`MGET`; `SCAN` before fences were kept
/// per bucket): none while fenced acquires meet the
/// young node during its window, some once it is over. Before the fix the
/// re-seed started at the first fenced vote after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reseed_reads_nothing_before_the_window_is_over() {
    let mut cluster = Cluster::start(3);
    let window = secs(4);
    let client = guarded(&cluster, window);
    // Past the first window every node votes once its own re-seed is done
    // (fresh servers are young too): wait for all three, so that no other
    // node's re-seed reads the sources below.
    let mut tries = 0;
    loop {
        tries += 1;
        let guard = patiently(&client, "w", secs(1), "granted").await;
        let everywhere = eventually(secs(1), || cluster.count_keys(LOCK_KEYS) == vec![1; 3]).await;
        guard.release().await;
        if everywhere {
            break;
        }
        assert!(tries < 20, "never granted by all three nodes");
        tokio::time::sleep(ms(100)).await;
    }
    assert!(eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
    // A foreign value on node 2: acquires of "w" need node 0's vote, so
    // each one asks node 0 (a round decided without it may skip it).
    let key = crate::helpers::lock_key("w");
    assert_eq!(cluster.nodes[2].cli(&["SET", &key, "foreign"]), "OK");
    // The re-seed's reads are `MGET`s sent by the client; a release's
    // script reads the lock key with an `MGET` too (`[0 lua]` in
    // `MONITOR`), which does not count.
    let monitors = [1, 2].map(|i| cluster.nodes[i].monitor());
    let scans = |_: &Cluster| {
        monitors.each_ref().map(|m| {
            m.lines()
                .iter()
                .filter(|l| l.contains("\"MGET\"") && !l.contains(" lua] "))
                .count()
        })
    };
    let restarted = Instant::now();
    cluster.node(0).restart();
    let before = scans(&cluster);
    let mut met_young = 0;
    while restarted.elapsed() < secs(1) {
        if let Err(err) = client.try_acquire("w", secs(1)).await {
            if restarted_on(&err) == [0] {
                met_young += 1;
            }
        }
        tokio::time::sleep(ms(100)).await;
    }
    tokio::time::sleep(ms(300)).await;
    let during = scans(&cluster);
    assert!(
        restarted.elapsed() < window,
        "the machine is too slow for this test: {:?} passed",
        restarted.elapsed()
    );
    assert!(met_young > 0, "no fenced vote met the young node");
    assert_eq!(
        during, before,
        "the re-seed read the other nodes during the restart-guard window"
    );
    // Once the window is over the next fenced acquire starts the re-seed,
    // and node 0 votes again afterwards (with node 1: node 2 still refuses).
    patiently(&client, "w", secs(1), "granted after the window")
        .await
        .release()
        .await;
    assert!(
        scans(&cluster)
            .iter()
            .zip(before)
            .all(|(now, then)| *now > then),
        "the re-seed did not read both other nodes"
    );
}

/// Node 0 holds the largest fence (the last token) and node 2 missed the
/// last grants; node 1 restarts empty, and node 0 loses its fence for the
/// resource (fences no longer expire, but an `allkeys-*` eviction or an
/// operator can delete one; when this test was written they expired after
/// a retention). The re-seed of node 1 reads node 0 (no fence) and node 2
/// (an older one): copying node 2's value put node 1 below the last token,
/// and a quorum of nodes 1 and 2 handed out a token no larger (the model
/// check's 13-step counterexample). Where a source lacks a fence another
/// holds, the copy is now raised to at least the clock seed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reseed_past_an_expired_fence_copies_at_least_the_clock() {
    let mut cluster = Cluster::start(3);
    let client = guarded(&cluster, ms(1500));
    let older = patiently(&client, "e", secs(1), "granted").await;
    let older = {
        let token = older.token().unwrap().get();
        older.release().await;
        token
    };
    // The last tokens (up to 1,000 more, all below the clock) went through
    // nodes 0 and 1 only; node 2 missed them.
    let key = &crate::helpers::fence_key("e");
    let fence = |cluster: &Cluster, node: usize| -> Option<u64> {
        cluster.nodes[node].cli(&["GET", key]).parse().ok()
    };
    let last = older + 1_000;
    for (node, value) in [(0, last), (1, last), (2, older)] {
        assert_eq!(
            cluster.nodes[node].cli(&["SET", key, &value.to_string()]),
            "OK"
        );
    }
    // Node 0's fence is lost.
    assert_eq!(cluster.nodes[0].cli(&["DEL", key]), "1");
    cluster.node(1).restart();
    // Fenced acquires of another resource find node 1 young and, after its
    // window, re-seed it.
    let deadline = Instant::now() + secs(20);
    while fence(&cluster, 1).is_none() {
        assert!(Instant::now() < deadline, "node 1 was never re-seeded");
        if let Ok(guard) = client
            .lock("c", secs(1))
            .retry(Retry::once())
            .acquire()
            .await
        {
            guard.release().await;
        }
        tokio::time::sleep(ms(100)).await;
    }
    let reseeded = fence(&cluster, 1).unwrap();
    // A quorum of nodes 1 and 2.
    cluster.node(0).pause();
    let guard = patiently(&client, "e", secs(1), "granted by nodes 1 and 2").await;
    let token = guard.token().unwrap().get();
    guard.release().await;
    cluster.node(0).resume();
    assert!(
        token > last,
        "token {token} after {last} (node 1 was re-seeded to {reseeded})"
    );
}
