//! Multi-resource locks against real servers: all or nothing (a resource
//! held by a mutex leaves no key of the set anywhere), tokens per resource
//! interleaved with single-resource mutex holders, overlapping sets in
//! opposite orders all finishing without overlap, extend and release
//! together, auto-extension and `lost()`, release on drop, cut-off
//! acquires, a node down and a node paused, waking on the release of any
//! resource, every typed error, and a Redis Cluster node (one slot works,
//! several slots refused at the call, never `CROSSSLOT`). Counts and order
//! are asserted, never tight timings.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use redfence::{AutoExtend, Error, NodeSpec, ResourceSetError, Retry};
use tokio::time::timeout;

use crate::helpers::{
    calls, client_with_timeout, eventually, lock_key, ms, new_client, notice_only_retry, pttl,
    secs, warm_up, LOCK_KEYS,
};
use crate::support::cluster::RedisCluster;
use crate::support::Cluster;

const TTL: Duration = Duration::from_secs(30);

/// Counts the given keys that exist, in one script.
const HELD_KEYS: &str =
    "local n = 0 for i = 1, #KEYS do n = n + redis.call('EXISTS', KEYS[i]) end return n";

/// How many nodes hold every key of `resources`; panics on a node that
/// holds some but not all (a partial set). A round decides at a majority,
/// so on a loaded machine the last node's key may land later or not at
/// all: assert on a majority, and on all or nothing per node.
fn nodes_holding(cluster: &Cluster, resources: &[&str]) -> usize {
    cluster
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, node)| {
            // One read of every key (a script: atomic), so that keys of
            // one set, which expire at the same instant, are never seen
            // on either side of it.
            let keys: Vec<String> = resources.iter().map(|r| lock_key(r)).collect();
            let count = keys.len().to_string();
            let mut args = vec!["EVAL", HELD_KEYS, count.as_str()];
            args.extend(keys.iter().map(String::as_str));
            let held: usize = node.cli(&args).trim().parse().expect("a count");
            assert!(
                held == 0 || held == resources.len(),
                "node {i}: a partial set ({held} of {resources:?})"
            );
            held == resources.len()
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_held_by_a_mutex_leaves_no_key_of_the_set_anywhere() {
    let cluster = Cluster::start(3);
    let client = new_client(&cluster);
    warm_up(&client, &cluster).await;
    let other = new_client(&cluster);
    warm_up(&other, &cluster).await;
    let held = other.acquire("acct:b", TTL).await.unwrap();
    assert!(nodes_holding(&cluster, &["acct:b"]) >= 2);
    // Once, no waiting: nothing taken, `Ok(None)`.
    let tried = client
        .try_lock_all(["acct:a", "acct:b", "acct:c"], TTL)
        .await
        .unwrap();
    assert!(tried.is_none());
    // Waiting a little: refused as contended, after several attempts.
    let err = client
        .lock_set(["acct:c", "acct:a", "acct:b"], TTL)
        .retry(Retry::new().with_max_wait(ms(600)).with_delay(ms(50)))
        .acquire()
        .await
        .unwrap_err();
    assert!(err.is_contended(), "{err}");
    let failure = err.quorum_failure().unwrap();
    assert!(failure.attempts >= 2, "{failure:?}");
    assert_eq!(failure.resource, "acct:c, acct:a, acct:b");
    // Every node holds the mutex's key alone: no key of a or c was ever
    // left (the script wrote nothing where b was held).
    for (i, node) in cluster.nodes.iter().enumerate() {
        assert!(node.count_keys(LOCK_KEYS) <= 1, "node {i}");
        assert_eq!(pttl(node, &lock_key("acct:a")), -2, "node {i}");
        assert_eq!(pttl(node, &lock_key("acct:c")), -2, "node {i}");
    }
    held.release().await;
    // The release returns at a majority: the last node's delete may still
    // be on its way (its key would count as one of the set's there).
    assert!(eventually(secs(5), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
    let all = client
        .try_lock_all(["acct:a", "acct:b", "acct:c"], TTL)
        .await
        .unwrap()
        .expect("all free now");
    assert!(nodes_holding(&cluster, &["acct:a", "acct:b", "acct:c"]) >= 2);
    // Each resource is the mutex's lock: a mutex on any of them is refused.
    for resource in ["acct:a", "acct:b", "acct:c"] {
        assert!(other.try_acquire(resource, TTL).await.unwrap().is_none());
    }
    let released = all.release().await;
    assert_eq!(released.len(), 3);
    assert!(released.iter().all(|r| r.confirmed >= 2), "{released:?}");
    assert!(eventually(secs(5), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_per_resource_increase_across_sets_and_mutex_holders() {
    let cluster = Cluster::start(3);
    let client = new_client(&cluster);
    warm_up(&client, &cluster).await;
    let resources = ["t:a", "t:b", "t:c"];
    let mut last: HashMap<&str, u64> = HashMap::new();
    let mut note = |resource: &'static str, token: u64, round: usize| {
        if let Some(before) = last.insert(resource, token) {
            assert!(
                token > before,
                "round {round}: {resource} {token} after {before}"
            );
        }
    };
    for round in 0..12 {
        if round % 3 == 0 {
            // A mutex holder of one resource in between.
            let resource = resources[round % resources.len()];
            let guard = client.acquire(resource, TTL).await.unwrap();
            note(resource, guard.token().unwrap().get(), round);
            guard.release().await;
        } else {
            // Sets in changing orders.
            let mut set = resources.to_vec();
            set.rotate_left(round % 3);
            if round % 2 == 0 {
                set.reverse();
            }
            let guard = client.lock_all(set.clone(), TTL).await.unwrap();
            let tokens = guard.tokens();
            assert_eq!(tokens.len(), 3);
            for (resource, token) in set.iter().zip(&tokens) {
                let token = token.expect("fenced").get();
                assert_eq!(guard.token(resource).map(|t| t.get()), Some(token));
                note(resource, token, round);
            }
            assert_eq!(guard.resources().collect::<Vec<_>>(), set);
            guard.release().await;
        }
    }
    assert_eq!(last.len(), 3);
}

/// One holder's interval on one resource, for the overlap checker.
type Intervals = Arc<Mutex<Vec<(String, Instant, Instant)>>>;

/// The first two intervals of one resource that overlap (instants of one
/// process, or nanoseconds of the machine's monotonic clock).
fn first_overlap<T: Ord + Copy + std::fmt::Debug>(intervals: &[(String, T, T)]) -> Option<String> {
    let mut by_resource: HashMap<&str, Vec<(T, T)>> = HashMap::new();
    for (resource, start, end) in intervals {
        by_resource
            .entry(resource)
            .or_default()
            .push((*start, *end));
    }
    for (resource, mut spans) in by_resource {
        spans.sort();
        for pair in spans.windows(2) {
            if pair[1].0 < pair[0].1 {
                return Some(format!("{resource}: {pair:?}"));
            }
        }
    }
    None
}

#[test]
fn the_overlap_checker_sees_an_overlap() {
    let t = Instant::now();
    let ok = [
        ("a".to_string(), t, t + ms(5)),
        ("a".to_string(), t + ms(5), t + ms(9)),
        ("b".to_string(), t + ms(1), t + ms(20)),
    ];
    assert_eq!(first_overlap(&ok), None);
    let bad = [
        ("a".to_string(), t, t + ms(5)),
        ("a".to_string(), t + ms(4), t + ms(9)),
    ];
    assert!(first_overlap(&bad).is_some());
}

/// Two groups of tasks lock overlapping sets in opposite orders (and a
/// mutex group takes the shared resource alone): every task finishes all
/// its rounds, and no two holders of one resource overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_orders_all_finish_without_overlap() {
    let cluster = Cluster::start(3);
    let client = new_client(&cluster);
    warm_up(&client, &cluster).await;
    let other = new_client(&cluster);
    warm_up(&other, &cluster).await;
    let intervals: Intervals = Arc::default();
    let retry = Retry::new().with_max_wait(secs(60));
    let rounds = 5;
    let mut tasks = Vec::new();
    for task in 0..9 {
        let client = if task % 2 == 0 {
            client.clone()
        } else {
            other.clone()
        };
        let intervals = Arc::clone(&intervals);
        tasks.push(tokio::spawn(async move {
            let set: Vec<&str> = match task % 3 {
                0 => vec!["o:x", "o:y", "o:z"],
                1 => vec!["o:z", "o:y", "o:x"],
                _ => vec!["o:y"],
            };
            let mut done = 0;
            for _ in 0..rounds {
                if set.len() == 1 {
                    let guard = client
                        .lock(set[0], TTL)
                        .retry(retry)
                        .acquire()
                        .await
                        .unwrap();
                    let start = Instant::now();
                    tokio::time::sleep(ms(3)).await;
                    intervals
                        .lock()
                        .unwrap()
                        .push((set[0].to_string(), start, Instant::now()));
                    guard.release().await;
                } else {
                    let guard = client
                        .lock_set(set.clone(), TTL)
                        .retry(retry)
                        .acquire()
                        .await
                        .unwrap();
                    let start = Instant::now();
                    tokio::time::sleep(ms(3)).await;
                    let end = Instant::now();
                    intervals
                        .lock()
                        .unwrap()
                        .extend(set.iter().map(|r| (r.to_string(), start, end)));
                    guard.release().await;
                }
                done += 1;
            }
            done
        }));
    }
    let mut finished = 0;
    for task in tasks {
        finished += timeout(secs(120), task).await.unwrap().unwrap();
    }
    assert_eq!(finished, 9 * rounds);
    let intervals = intervals.lock().unwrap();
    // 6 set tasks × 3 resources + 3 mutex tasks, per round.
    assert_eq!(intervals.len(), rounds * (6 * 3 + 3));
    assert_eq!(first_overlap(&intervals), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_and_release_move_every_resource_together() {
    let cluster = Cluster::start(3);
    let client = new_client(&cluster);
    warm_up(&client, &cluster).await;
    let set = ["e:a", "e:b", "e:c"];
    let guard = client.lock_all(set, secs(5)).await.unwrap();
    assert!(guard.validity() <= secs(5));
    let validity = guard.extend(secs(60)).await.unwrap();
    assert!(validity > secs(30), "{validity:?}");
    assert!(nodes_holding(&cluster, &set) >= 2);
    // The extension returns at the quorum: the last node's may come later,
    // or never (not yet queued at the decision, it is not sent). On each
    // node every key moved or none did (one script per node), and a
    // majority moved.
    let lefts = |node: &crate::support::RedisServer| -> Vec<i64> {
        set.iter()
            .map(|resource| pttl(node, &lock_key(resource)))
            .collect()
    };
    let moved = |ok: fn(i64) -> bool| -> Option<usize> {
        let mut count = 0;
        for node in &cluster.nodes {
            match lefts(node).into_iter().filter(|&left| ok(left)).count() {
                0 => {}
                n if n == set.len() => count += 1,
                _ => return None,
            }
        }
        Some(count)
    };
    let report = || -> Vec<Vec<i64>> { cluster.nodes.iter().map(lefts).collect() };
    assert!(
        eventually(secs(10), || moved(|left| left > 30_000)
            .is_some_and(|n| n >= 2))
        .await,
        "{:?}",
        report()
    );
    // Shorter again: the keys follow.
    guard.extend(secs(4)).await.unwrap();
    assert!(
        eventually(secs(10), || moved(|left| (1..=4_000).contains(&left))
            .is_some_and(|n| n >= 2))
        .await,
        "{:?}",
        report()
    );
    let released = guard.release().await;
    assert!(released.iter().all(|r| r.confirmed >= 2), "{released:?}");
    assert!(eventually(secs(5), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
}

/// `EVALSHA` calls on each node since its last `CONFIG RESETSTAT`.
fn evalshas(cluster: &Cluster) -> Vec<u64> {
    cluster.nodes.iter().map(|n| calls(n, "evalsha")).collect()
}

/// The whole set is extended with one script per node and released with
/// one script per node, however many resources it has (the mutex's
/// per-resource extend and release sent 3 each here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_script_per_node_extends_or_releases_the_whole_set() {
    let cluster = Cluster::start(3);
    let client = new_client(&cluster);
    warm_up(&client, &cluster).await;
    let set = ["o:a", "o:b", "o:c"];
    let guard = client.lock_all(set, TTL).await.unwrap();
    // Decided at the quorum: the last node's acquire may land later, or
    // be dropped unsent.
    assert!(eventually(secs(10), || nodes_holding(&cluster, &set) >= 2).await);
    tokio::time::sleep(ms(300)).await;
    for node in &cluster.nodes {
        node.cli(&["CONFIG", "RESETSTAT"]);
    }
    guard.extend(secs(60)).await.unwrap();
    // Decided at the quorum: a straggler's request may be dropped unsent.
    let majority_once = |counts: Vec<u64>| {
        counts.iter().all(|&n| n <= 1) && counts.iter().filter(|&&n| n == 1).count() >= 2
    };
    assert!(
        eventually(secs(10), || majority_once(evalshas(&cluster))).await,
        "extend: {:?}",
        evalshas(&cluster)
    );
    tokio::time::sleep(ms(300)).await;
    assert!(
        majority_once(evalshas(&cluster)),
        "extend: {:?}",
        evalshas(&cluster)
    );
    assert!(
        eventually(secs(10), || cluster
            .nodes
            .iter()
            .filter(|node| set.iter().all(|r| pttl(node, &lock_key(r)) > 30_000))
            .count()
            >= 2)
        .await
    );
    for node in &cluster.nodes {
        node.cli(&["CONFIG", "RESETSTAT"]);
    }
    // A release is sent to every node, whatever the decision.
    let released = guard.release().await;
    assert!(released.iter().all(|r| r.confirmed >= 2), "{released:?}");
    assert!(
        eventually(secs(10), || evalshas(&cluster) == vec![1; 3]).await,
        "release: {:?}",
        evalshas(&cluster)
    );
    assert!(eventually(secs(5), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
    // Nothing more follows (no per-resource release in the background).
    tokio::time::sleep(ms(300)).await;
    assert_eq!(evalshas(&cluster), vec![1; 3]);
}

/// A release deletes only the keys that still hold the set's value: a
/// resource taken over meanwhile (expired and locked by another owner,
/// here written by hand) keeps its new owner's key on every node, and its
/// `Released` confirms nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_deletes_only_the_keys_still_ours() {
    let cluster = Cluster::start(3);
    let client = new_client(&cluster);
    warm_up(&client, &cluster).await;
    let set = ["g:a", "g:b", "g:c"];
    let guard = client.lock_all(set, TTL).await.unwrap();
    assert!(eventually(secs(10), || nodes_holding(&cluster, &set) >= 2).await);
    for node in &cluster.nodes {
        node.cli(&["SET", &lock_key("g:b"), "another-owner", "PX", "30000"]);
    }
    let released = guard.release().await;
    assert_eq!(released[1].confirmed, 0, "{released:?}");
    assert!(released[1].failures.len() >= 2, "{released:?}");
    assert!(
        released[0].confirmed >= 2 && released[2].confirmed >= 2,
        "{released:?}"
    );
    assert!(eventually(secs(5), || cluster.count_keys(LOCK_KEYS) == vec![1; 3]).await);
    for node in &cluster.nodes {
        assert_eq!(node.cli(&["GET", &lock_key("g:b")]).trim(), "another-owner");
    }
}

/// An extension moves every key of the set on a node or none there: a
/// node that lost one key (expired early, deleted by hand) does not extend
/// the others, so it never ends up holding part of the set for longer. The
/// mutex's per-resource extend, used before, extended `x:a` there alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_moves_every_key_of_a_node_or_none() {
    let cluster = Cluster::start(3);
    let client = new_client(&cluster);
    warm_up(&client, &cluster).await;
    let set = ["x:a", "x:b"];
    // Every node must hold the set (the last node's acquire, decided at
    // the quorum, may be dropped unsent on a loaded machine: again).
    let mut tries = 0;
    let guard = loop {
        tries += 1;
        let guard = client.lock_all(set, secs(20)).await.unwrap();
        if eventually(secs(5), || nodes_holding(&cluster, &set) == 3).await {
            break guard;
        }
        assert!(tries < 10, "no acquire reached every node");
        guard.release().await;
    };
    cluster.nodes[0].cli(&["DEL", &lock_key("x:b")]);
    guard.extend(secs(120)).await.unwrap();
    assert!(
        eventually(secs(10), || cluster.nodes[1..]
            .iter()
            .all(|node| set.iter().all(|r| pttl(node, &lock_key(r)) > 60_000)))
        .await
    );
    let left = pttl(&cluster.nodes[0], &lock_key("x:a"));
    assert!(
        (1..=20_000).contains(&left),
        "node 0 extended part of the set: {left} ms"
    );
    // Another owner's key on a second node: no majority holds the whole
    // set, the extend fails, and that node's other key is not extended.
    cluster.nodes[1].cli(&["SET", &lock_key("x:a"), "another-owner", "PX", "30000"]);
    let err = guard.extend(secs(200)).await.unwrap_err();
    assert!(matches!(err, Error::ExtendFailed(_)), "{err}");
    let left = pttl(&cluster.nodes[1], &lock_key("x:b"));
    assert!(
        (1..=120_000).contains(&left),
        "node 1 extended part of the set: {left} ms"
    );
    drop(guard);
}

/// Waiters of one resource of a set are woken by the set's release (its
/// notice, within seconds, not their 10 s timer): a mutex waiter, a fair
/// waiter in the resource's queue (named by the home's full release) and
/// another set's waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_a_resource_are_woken_by_the_release_of_the_set() {
    let cluster = Cluster::start(3);
    for fair in [false, true] {
        let holder = crate::fair::client(&cluster, fair);
        warm_up(&holder, &cluster).await;
        let other = crate::fair::client(&cluster, fair);
        warm_up(&other, &cluster).await;
        let set = ["v:a", "v:b", "v:c"];
        let guard = holder.lock_all(set, TTL).await.unwrap();
        let mutex = tokio::spawn({
            let other = other.clone();
            async move {
                let started = Instant::now();
                let guard = other
                    .lock("v:b", TTL)
                    .retry(notice_only_retry())
                    .acquire()
                    .await;
                let waited = started.elapsed();
                let granted = match guard {
                    Ok(guard) => {
                        drop(guard.release().await);
                        true
                    }
                    Err(_) => false,
                };
                (granted, waited)
            }
        });
        if fair {
            assert!(eventually(secs(10), || crate::fair::queued(&cluster, "v:b") == 1).await);
        }
        let sets = tokio::spawn({
            let other = other.clone();
            async move {
                let started = Instant::now();
                let guard = other
                    .lock_set(["v:c", "v:d"], TTL)
                    .retry(notice_only_retry())
                    .acquire()
                    .await;
                let waited = started.elapsed();
                let granted = match guard {
                    Ok(guard) => {
                        drop(guard.release().await);
                        true
                    }
                    Err(_) => false,
                };
                (granted, waited)
            }
        });
        tokio::time::sleep(ms(500)).await;
        assert!(
            !mutex.is_finished() && !sets.is_finished(),
            "granted while held"
        );
        let released = guard.release().await;
        assert!(released.iter().all(|r| r.confirmed >= 2), "{released:?}");
        for (name, waiter) in [("mutex", mutex), ("set", sets)] {
            let (granted, waited) = timeout(secs(30), waiter).await.unwrap().unwrap();
            assert!(granted, "{name} waiter (fair {fair}): not granted");
            assert!(
                waited < secs(8),
                "{name} waiter (fair {fair}): woken by its timer, not the notice ({waited:?})"
            );
        }
        assert!(eventually(secs(5), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_guard_releases_every_resource() {
    let cluster = Cluster::start(3);
    let client = new_client(&cluster);
    warm_up(&client, &cluster).await;
    let guard = client.lock_all(["d:a", "d:b"], TTL).await.unwrap();
    assert!(nodes_holding(&cluster, &["d:a", "d:b"]) >= 2);
    drop(guard);
    assert!(eventually(secs(5), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
    // And `into_guards` hands each resource's mutex guard over.
    let guards = client
        .lock_all(["d:a", "d:b"], TTL)
        .await
        .unwrap()
        .into_guards();
    assert_eq!(guards.len(), 2);
    let mut guards = guards.into_iter();
    guards.next().unwrap().release().await;
    assert!(
        eventually(secs(5), || cluster
            .count_keys(LOCK_KEYS)
            .iter()
            .all(|&n| n <= 1))
        .await
    );
    assert!(nodes_holding(&cluster, &["d:b"]) >= 2);
    drop(guards);
    assert!(eventually(secs(5), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_extended_set_outlives_its_ttl_and_reports_its_loss() {
    let mut cluster = Cluster::start(3);
    let client = client_with_timeout(cluster.urls(), ms(200));
    warm_up(&client, &cluster).await;
    let guard = client
        .lock_set(["l:a", "l:b"], ms(1500))
        .auto_extend(AutoExtend::new())
        .acquire()
        .await
        .unwrap();
    assert!(guard.is_auto_extended());
    let first = guard.valid_until();
    let leases = guard.leases();
    assert!(
        eventually(secs(5), || leases.iter().all(|l| l.valid_until() > first)).await,
        "no extension"
    );
    tokio::time::sleep(secs(2)).await;
    assert!(leases.iter().all(|l| l.is_valid()));
    assert!(nodes_holding(&cluster, &["l:a", "l:b"]) >= 2);
    cluster.node(0).pause();
    cluster.node(1).pause();
    let lost = timeout(secs(10), guard.lost()).await.unwrap();
    assert!(["l:a", "l:b"].contains(&lost.resource.as_str()), "{lost:?}");
    cluster.node(0).resume();
    cluster.node(1).resume();
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_all_runs_under_the_set_and_is_cancelled_on_loss() {
    let mut cluster = Cluster::start(3);
    let client = client_with_timeout(cluster.urls(), ms(200));
    warm_up(&client, &cluster).await;
    let inner = client.clone();
    let seen = client
        .with_all(["w:a", "w:b"], TTL, |leases| async move {
            let names: Vec<String> = leases.iter().map(|l| l.resource().to_owned()).collect();
            let tokens = leases.iter().all(|l| l.token().is_some());
            let free = inner.try_acquire("w:b", TTL).await.unwrap().is_none();
            (names, tokens, free)
        })
        .await
        .unwrap();
    assert_eq!(seen, (vec!["w:a".into(), "w:b".into()], true, true));
    assert!(eventually(secs(5), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
    let run = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .lock_set(["w:a", "w:b"], ms(1500))
                .auto_extend(AutoExtend::new())
                .run(|_| tokio::time::sleep(secs(600)))
                .await
        }
    });
    // Strict: an extension moves every key of a node or none, so no node
    // holds part of the set (`nodes_holding` panics on a partial one).
    assert!(eventually(secs(5), || nodes_holding(&cluster, &["w:a", "w:b"]) >= 2).await);
    for _ in 0..10 {
        nodes_holding(&cluster, &["w:a", "w:b"]);
        tokio::time::sleep(ms(200)).await;
    }
    cluster.node(1).pause();
    cluster.node(2).pause();
    let err = timeout(secs(15), run).await.unwrap().unwrap().unwrap_err();
    assert!(err.is_lost(), "{err}");
    cluster.node(1).resume();
    cluster.node(2).resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_the_release_of_any_resource() {
    let cluster = Cluster::start(3);
    let client = new_client(&cluster);
    warm_up(&client, &cluster).await;
    let other = new_client(&cluster);
    warm_up(&other, &cluster).await;
    for held_resource in ["k:a", "k:b"] {
        let held = other.acquire(held_resource, TTL).await.unwrap();
        let waiter = tokio::spawn({
            let client = client.clone();
            async move {
                let started = Instant::now();
                let guard = client
                    .lock_set(["k:a", "k:b"], TTL)
                    .retry(notice_only_retry())
                    .acquire()
                    .await;
                (guard, started.elapsed())
            }
        });
        tokio::time::sleep(ms(500)).await;
        assert!(!waiter.is_finished(), "granted while {held_resource} held");
        held.release().await;
        let (guard, waited) = timeout(secs(30), waiter).await.unwrap().unwrap();
        guard.unwrap().release().await;
        assert!(
            waited < secs(8),
            "{held_resource}: woken by its timer, not the notice ({waited:?})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_down_or_paused_still_grants_the_set() {
    let mut cluster = Cluster::start(3);
    let client = client_with_timeout(cluster.urls(), ms(300));
    warm_up(&client, &cluster).await;
    cluster.node(2).kill();
    let guard = client.lock_all(["n:a", "n:b"], TTL).await.unwrap();
    assert!(guard.tokens().iter().all(Option::is_some));
    assert!(client
        .try_lock_all(["n:b", "n:c"], TTL)
        .await
        .map_or(true, |g| g.is_none()));
    guard.release().await;
    cluster.node(2).restart();
    cluster.node(1).pause();
    let guard = client.lock_all(["n:a", "n:b"], TTL).await.unwrap();
    guard.release().await;
    cluster.node(1).resume();
    // Two of three down: refused, typed, and bounded.
    cluster.node(0).kill();
    cluster.node(1).kill();
    let started = Instant::now();
    let err = client
        .lock_set(["n:a", "n:b"], TTL)
        .retry(Retry::new().with_max_wait(secs(1)))
        .acquire()
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    assert!(started.elapsed() < secs(20));
}

/// The restart guard is the mutex's: young servers (just started, which
/// the client cannot tell from restarted ones) do not vote for a set
/// either, nothing is set on them, and once the window has passed the set
/// is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn young_servers_do_not_vote_for_a_set_until_the_window_passed() {
    let cluster = Cluster::start(3);
    let client = redfence::Client::builder(cluster.urls())
        .node_timeout(ms(500))
        .restart_guard(redfence::RestartGuard::new().with_window(secs(3)))
        .build()
        .unwrap();
    let err = client
        .try_lock_all(["g:a", "g:b"], secs(1))
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    let young = err
        .node_failures()
        .iter()
        .filter(|f| matches!(f.kind, redfence::NodeErrorKind::Restarted { .. }))
        .count();
    assert!(young >= 2, "{err}");
    assert_eq!(cluster.count_keys(LOCK_KEYS), vec![0; 3]);
    // A TTL under the window: the guard's window is at least the longest
    // TTL the client has asked for.
    let guard = client
        .lock_set(["g:a", "g:b"], secs(2))
        .retry(Retry::new().with_max_wait(secs(20)))
        .acquire()
        .await
        .unwrap();
    assert_eq!(guard.tokens().iter().filter(|t| t.is_some()).count(), 2);
    guard.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_acquires_leave_no_key() {
    let cluster = Cluster::start(3);
    let client = client_with_timeout(cluster.urls(), ms(300));
    warm_up(&client, &cluster).await;
    let set = ["c:a", "c:b", "c:c"];
    let (mut cut_off, mut acquired) = (0, 0);
    for i in 0..120 {
        let got = if i % 10 == 4 {
            client.lock_all(set, TTL).now_or_never().ok_or(())
        } else {
            let budget = Duration::from_micros(rand::random_range(0..3_000));
            timeout(budget, client.lock_all(set, TTL))
                .await
                .map_err(|_| ())
        };
        match got {
            Err(()) => cut_off += 1,
            Ok(Ok(guard)) => {
                acquired += 1;
                if i % 2 == 0 {
                    drop(guard);
                } else {
                    let _ = timeout(Duration::from_micros(500), guard.release()).await;
                }
            }
            Ok(Err(e)) => panic!("round {i}: {e}"),
        }
        // Let the background releases of this round land.
        assert!(
            eventually(secs(5), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await,
            "round {i}: keys left: {:?}",
            cluster.count_keys(LOCK_KEYS)
        );
    }
    assert!(cut_off > 0, "{cut_off} cut off, {acquired} acquired");
    let guard = client.try_lock_all(set, TTL).await.unwrap().expect("free");
    guard.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sets_are_typed_errors() {
    let cluster = Cluster::start(1);
    let client = new_client(&cluster);
    let none: [&str; 0] = [];
    let set_error = |e: Error| match e {
        Error::InvalidResourceSet(problem) => problem,
        other => panic!("not a set error: {other}"),
    };
    let empty = set_error(client.lock_all(none, TTL).await.unwrap_err());
    assert_eq!(empty, ResourceSetError::Empty);
    let twice = client.lock_all(["a", "b", "a"], TTL).await.unwrap_err();
    assert_eq!(
        twice.to_string(),
        "invalid set of resources: resource \"a\" given twice (positions 0 and 2)"
    );
    crate::helpers::assert_message_style(&twice.to_string());
    assert!(matches!(
        set_error(twice),
        ResourceSetError::Duplicate {
            first: 0,
            second: 2,
            ..
        }
    ));
    let many: Vec<String> = (0..=redfence::limits::MAX_RESOURCES)
        .map(|i| format!("r{i}"))
        .collect();
    let too_many = set_error(client.try_lock_all(many, TTL).await.unwrap_err());
    assert!(
        matches!(too_many, ResourceSetError::TooMany { count: 65, max: 64 }),
        "{too_many}"
    );
    // Each name and the TTL: the mutex's own checks.
    let empty_name = client.lock_all(["a", ""], TTL).await.unwrap_err();
    assert!(
        matches!(empty_name, Error::InvalidResource(_)),
        "{empty_name}"
    );
    let zero = client
        .lock_all(["a", "b"], Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(zero, Error::InvalidTtl { .. }), "{zero}");
    let auto = client
        .lock_set(["a", "b"], ms(10))
        .auto_extend(AutoExtend::new())
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(
            auto,
            Error::InvalidTtl { .. } | Error::InvalidAutoExtend { .. }
        ),
        "{auto}"
    );
    // Nothing was sent for any of them.
    assert_eq!(cluster.count_keys(LOCK_KEYS), vec![0]);
}

/// Two resources of one fence bucket share a hash slot (the bucket is
/// their keys' hash tag); `item:0` and `item:1` do not.
fn same_slot_pair(client: &redfence::Client) -> (String, String) {
    let first = client.fence_key("item:0");
    let other = (1..100_000)
        .map(|i| format!("item:{i}"))
        .find(|r| client.fence_key(r) == first)
        .expect("a resource of the same bucket");
    ("item:0".into(), other)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_takes_a_one_slot_set_and_refuses_a_set_across_slots() {
    let cluster = RedisCluster::start_small(3);
    let client = crate::helpers::builder([NodeSpec::cluster(cluster.seed_urls())])
        .node_timeout(secs(1))
        .build()
        .unwrap();
    let (a, b) = same_slot_pair(&client);
    assert_eq!(
        RedisCluster::slot_of(&client.fence_key(&a)),
        RedisCluster::slot_of(&client.fence_key(&b))
    );
    let guard = timeout(secs(30), client.lock_all([a.as_str(), b.as_str()], TTL))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(guard.tokens().iter().filter(|t| t.is_some()).count(), 2);
    // The keys are the mutex's: a mutex on either is refused.
    assert!(client.try_acquire(&b, TTL).await.unwrap().is_none());
    guard.release().await;
    assert!(client.try_acquire(&a, TTL).await.unwrap().is_some());
    // Across slots: refused at the call, with both names, nothing sent.
    let err = client
        .lock_all([a.as_str(), "item:1"], TTL)
        .await
        .unwrap_err();
    match &err {
        Error::InvalidResourceSet(ResourceSetError::CrossSlot { first, other }) => {
            assert_eq!((first.as_str(), other.as_str()), (a.as_str(), "item:1"));
        }
        other => panic!("not a cross-slot refusal: {other}"),
    }
    assert!(!err.to_string().contains("CROSSSLOT"), "{err}");
}

// Worker processes.

/// A worker process (does nothing unless started by
/// `processes_in_opposite_orders_all_finish_without_overlap`): `W_TASKS`
/// tasks each lock the set `W_SET` (comma-separated, in that order)
/// `W_ROUNDS` times, holding it 2 ms, and print each hold
/// (`HOLD resource start end`, ns of the machine's monotonic clock) and
/// `DONE` per task.
#[test]
fn worker() {
    if std::env::var("REDFENCE_MULTI_WORKER").is_err() {
        return;
    }
    let var = |k: &str| std::env::var(k).expect(k);
    let urls: Vec<String> = var("W_URLS").split(',').map(str::to_owned).collect();
    let set: Vec<String> = var("W_SET").split(',').map(str::to_owned).collect();
    let tasks: usize = var("W_TASKS").parse().unwrap();
    let rounds: usize = var("W_ROUNDS").parse().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let client = crate::helpers::builder(urls)
            .node_timeout(secs(1))
            .build()
            .unwrap();
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let (client, set) = (client.clone(), set.clone());
                tokio::spawn(async move {
                    for _ in 0..rounds {
                        let guard = client
                            .lock_set(set.clone(), TTL)
                            .retry(Retry::new().with_max_wait(secs(90)))
                            .acquire()
                            .await
                            .expect("every round finishes");
                        let start = crate::fair::now_ns();
                        tokio::time::sleep(ms(2)).await;
                        let end = crate::fair::now_ns();
                        for resource in &set {
                            println!("HOLD {resource} {start} {end}");
                        }
                        guard.release().await;
                    }
                    println!("DONE");
                })
            })
            .collect();
        for handle in handles {
            handle.await.unwrap();
        }
    });
}

/// 4 processes × 3 tasks, two processes locking `x, y, z` and two
/// `z, y, x`, 5 rounds each: every task of every process finishes, and the
/// merged history (one clock for the machine) has no two holders of one
/// resource at once.
#[test]
fn processes_in_opposite_orders_all_finish_without_overlap() {
    let cluster = Cluster::start(3);
    let exe = std::env::current_exe().expect("the test binary");
    let (procs, tasks, rounds) = (4, 3, 5);
    let children: Vec<_> = (0..procs)
        .map(|p| {
            let set = if p % 2 == 0 {
                "p:x,p:y,p:z"
            } else {
                "p:z,p:y,p:x"
            };
            Command::new(&exe)
                .args([
                    "multi::worker",
                    "--exact",
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .env("REDFENCE_MULTI_WORKER", "1")
                .env("W_URLS", cluster.urls().join(","))
                .env("W_SET", set)
                .env("W_TASKS", tasks.to_string())
                .env("W_ROUNDS", rounds.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawning a worker")
        })
        .collect();
    let (mut done, mut holds) = (0, Vec::new());
    for child in children {
        let out = child.wait_with_output().expect("worker output");
        // The harness prints "test multi::worker ... " without a newline
        // before the first line of the worker's own output.
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if line.ends_with("DONE") {
                done += 1;
            } else if let Some(at) = line.find("HOLD ") {
                let f: Vec<&str> = line[at + 5..].split(' ').collect();
                holds.push((
                    f[0].to_owned(),
                    f[1].parse::<u64>().unwrap(),
                    f[2].parse::<u64>().unwrap(),
                ));
            }
        }
    }
    assert_eq!(done, procs * tasks, "tasks that finished");
    assert_eq!(holds.len(), procs * tasks * rounds * 3);
    assert_eq!(first_overlap(&holds), None);
}
