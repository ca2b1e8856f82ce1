//! The lock's life cycle on 1, 3 and 5 nodes: acquire, extend, release, what
//! the nodes hold at each step, ownership, and the scoped `with_lock` API.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redfence::limits::DRIFT_CONSTANT;
use redfence::{Error, FailureReason, LossReason, NodeErrorKind, Phase, Retry};

use crate::helpers::{
    eventually, landed, lock_key, ms, new_client, pttl, report, secs, warm_client, LOCK_KEYS,
};
use crate::support::Cluster;

/// The drift allowance of the default 0.01 factor.
fn default_drift(ttl: Duration) -> Duration {
    ttl / 100 + DRIFT_CONSTANT
}

/// The value of `key` on every node.
fn values(cluster: &Cluster, key: &str) -> Vec<String> {
    cluster.nodes.iter().map(|n| n.cli(&["GET", key])).collect()
}

async fn life_cycle(n: usize) {
    let cluster = Cluster::start(n);
    let client = warm_client(&cluster).await;
    assert_eq!(client.nodes(), n);
    assert_eq!(client.quorum(), n / 2 + 1);
    let key = lock_key("life");

    let ttl = secs(10);
    let before = Instant::now();
    let guard = client.acquire("life", ttl).await.unwrap();
    let after = Instant::now();
    assert_eq!(guard.resource(), "life");
    // Validity is counted from an instant inside the call, minus the drift.
    let drift = default_drift(ttl);
    assert!(guard.valid_until() >= before + ttl - drift, "{guard:?}");
    assert!(guard.valid_until() <= after + ttl - drift, "{guard:?}");
    assert!(guard.validity() <= ttl - drift);
    assert!(guard.validity() > ttl - drift - secs(3), "{guard:?}");

    // With every connection open, all N nodes get the SET, with one value.
    assert!(
        eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![1; n]).await,
        "{:?}",
        cluster.count_keys(LOCK_KEYS)
    );
    let held = values(&cluster, &key);
    assert!(held.iter().all(|v| *v == held[0]), "{held:?}");
    let (client_id, secret) = held[0].split_once(':').expect("value is id:secret");
    assert_eq!(client_id.len(), 16, "{held:?}");
    assert_eq!(secret.len(), 22, "{held:?}");
    for node in &cluster.nodes {
        let left = pttl(node, &key);
        assert!(left > 5_000 && left <= 10_000, "pttl {left}");
    }

    // Extend past the original TTL: validity is recomputed from the extend.
    let ttl2 = secs(20);
    let before = Instant::now();
    let validity = guard.extend(ttl2).await.unwrap();
    let after = Instant::now();
    let drift2 = default_drift(ttl2);
    assert!(validity <= ttl2 - drift2);
    assert!(validity > secs(10), "{validity:?}");
    assert!(guard.valid_until() >= before + ttl2 - drift2);
    assert!(guard.valid_until() <= after + ttl2 - drift2);
    let extended = cluster
        .nodes
        .iter()
        .filter(|node| pttl(node, &key) > 10_000)
        .count();
    assert!(extended >= client.quorum(), "{extended} nodes extended");
    assert_eq!(values(&cluster, &key), held, "extend changed the value");

    let released = guard.release().await;
    assert_eq!(released.nodes, n);
    assert!(released.confirmed >= client.quorum(), "{released:?}");
    assert!(released.failures.is_empty(), "{released:?}");
    assert_eq!(released.confirmed + released.pending, n, "{released:?}");
    assert!(
        eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; n]).await,
        "{:?}",
        cluster.count_keys(LOCK_KEYS)
    );

    // Free again, for this client and for any other.
    let other = new_client(&cluster);
    let again = other.try_acquire("life", ttl).await.unwrap();
    assert!(again.is_some());
    again.unwrap().release().await;
}

#[tokio::test]
async fn life_cycle_on_one_node() {
    life_cycle(1).await;
}

#[tokio::test]
async fn life_cycle_on_three_nodes() {
    life_cycle(3).await;
}

#[tokio::test]
async fn life_cycle_on_five_nodes() {
    life_cycle(5).await;
}

/// A fresh client connects on first use and decides at the first majority,
/// so its first lock is guaranteed on a majority only; release still works
/// and reports the nodes that never had the key as `NotHeld`.
#[tokio::test]
async fn first_lock_of_a_new_client_holds_at_least_a_majority() {
    let cluster = Cluster::start(5);
    let client = crate::helpers::client(cluster.urls()).unwrap();
    let guard = client.acquire("cold", secs(10)).await.unwrap();
    let counts = cluster.count_keys(LOCK_KEYS);
    assert!(
        counts.iter().filter(|&&c| c == 1).count() >= 3,
        "{counts:?}"
    );
    let released = guard.release().await;
    assert!(released.confirmed >= 3, "{released:?}");
    assert!(released
        .failures
        .iter()
        .all(|f| matches!(f.kind, NodeErrorKind::NotHeld)));
    assert_eq!(
        released.confirmed + released.failures.len() + released.pending,
        5
    );
    assert!(eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; 5]).await);
}

/// On one node a release is exact: one confirmation, nothing pending.
#[tokio::test]
async fn single_node_release_confirms_once() {
    let cluster = Cluster::start(1);
    let client = crate::helpers::client(cluster.urls()).unwrap();
    assert_eq!(client.quorum(), 1);
    let guard = client.acquire("single", secs(5)).await.unwrap();
    let released = guard.release().await;
    assert_eq!((released.confirmed, released.pending), (1, 0));
    assert_eq!(cluster.count_keys(LOCK_KEYS), vec![0]);
}

async fn held_is_contended(n: usize) {
    let cluster = Cluster::start(n);
    let client = warm_client(&cluster).await;
    let other = new_client(&cluster);
    let guard = client.acquire("held", secs(10)).await.unwrap();

    // try_acquire: "someone else has it" is not an error.
    assert!(client
        .try_acquire("held", secs(10))
        .await
        .unwrap()
        .is_none());
    assert!(other.try_acquire("held", secs(10)).await.unwrap().is_none());
    // Another resource is independent.
    let unrelated = other.try_acquire("unrelated", secs(10)).await.unwrap();
    assert!(unrelated.is_some());
    unrelated.unwrap().release().await;

    // A waiting acquire's first attempt is `try_acquire`'s: refused, it
    // does not say how long the holder keeps the lock (asking would cost
    // every uncontended acquire a `PTTL` on each node). Its pause (10 s)
    // outlasts the wait, so it is the only attempt.
    let err = other
        .lock("held", secs(10))
        .retry(Retry::new().with_max_wait(ms(300)).with_delay(secs(10)))
        .acquire()
        .await
        .unwrap_err();
    let q = err.quorum_failure().unwrap();
    assert_eq!(q.attempts, 1, "{err}");
    assert!(q.failures.len() > n - q.quorum, "{err}");
    assert!(
        q.failures
            .iter()
            .all(|f| matches!(f.kind, NodeErrorKind::HeldByOther { expires_in: None })),
        "{err}"
    );
    // A waiting acquire that retries gives up after its deadline with the
    // holder's detail.
    let err = other
        .lock("held", secs(10))
        .retry(
            Retry::new()
                .with_max_wait(secs(1))
                .with_delay(ms(20))
                .with_jitter(ms(1))
                .with_max_jitter(ms(1)),
        )
        .acquire()
        .await
        .unwrap_err();
    assert!(err.is_contended(), "{err}");
    let q = err.quorum_failure().unwrap();
    assert_eq!(q.phase, Phase::Acquire);
    assert_eq!(q.reason, FailureReason::Contended);
    assert_eq!(q.resource, "held");
    assert_eq!(q.granted, 0, "{err}");
    // The first attempt and, at 20 ms pauses for a second, at least one
    // retry (on a loaded machine too).
    assert!(q.attempts >= 2, "{err}");
    assert!(q.failures.len() > n - q.quorum, "{err}");
    for f in &q.failures {
        // A waiter's retries ask for the holder's TTL in the same round
        // trip (it wakes when the keys run out).
        match &f.kind {
            NodeErrorKind::HeldByOther {
                expires_in: Some(left),
            } if *left <= secs(10) => {}
            other => panic!("unexpected failure {other:?} in {err}"),
        }
    }
    // A single try does not ask.
    let err = other
        .lock("held", secs(10))
        .retry(Retry::once())
        .acquire()
        .await
        .unwrap_err();
    assert!(err
        .node_failures()
        .iter()
        .all(|f| matches!(f.kind, NodeErrorKind::HeldByOther { expires_in: None })));
    // Nothing of ours was left behind, and the holder's keys are intact.
    assert!(
        eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![1; n]).await,
        "{:?}",
        cluster.count_keys(LOCK_KEYS)
    );
    guard.release().await;
}

#[tokio::test]
async fn held_lock_is_contended_on_one_node() {
    held_is_contended(1).await;
}

#[tokio::test]
async fn held_lock_is_contended_on_three_nodes() {
    held_is_contended(3).await;
}

#[tokio::test]
async fn held_lock_is_contended_on_five_nodes() {
    held_is_contended(5).await;
}

/// Release is compare-and-delete: once another owner's value sits in the
/// key, a stale guard's release leaves it alone.
#[tokio::test]
async fn release_never_deletes_another_owners_key() {
    let cluster = Cluster::start(3);
    let client = warm_client(&cluster).await;
    let key = lock_key("owned");
    let guard = client.acquire("owned", secs(10)).await.unwrap();
    assert!(landed(&cluster.nodes, "owned", secs(5)).await);
    for node in &cluster.nodes {
        assert_eq!(node.cli(&["SET", &key, "other", "PX", "10000"]), "OK");
    }
    let released = guard.release().await;
    assert_eq!(released.confirmed, 0, "{released:?}");
    assert!(released.failures.len() >= 2, "{released:?}");
    for f in &released.failures {
        assert!(matches!(f.kind, NodeErrorKind::NotHeld), "{released:?}");
    }
    // The stragglers finish in the background; give them time, then check
    // through the client's own connections as well (same FIFO per node).
    tokio::time::sleep(ms(200)).await;
    assert!(client
        .try_acquire("owned", secs(1))
        .await
        .unwrap()
        .is_none());
    assert_eq!(values(&cluster, &key), vec!["other"; 3]);
}

/// Extend of a lock whose keys are gone fails as `NotHeld` and creates
/// nothing; extend of a lease whose validity ran out is refused as lost
/// without a round trip (a loss is final, even if keys remained).
#[tokio::test]
async fn extend_after_expiry_is_not_held() {
    let cluster = Cluster::start(3);
    // Connected to every node, so that the acquire reaches all three.
    let client = warm_client(&cluster).await;
    let guard = client.acquire("short", secs(10)).await.unwrap();
    let key = lock_key("short");
    // The third grant may land after the acquire returned: wait for it, so
    // that the deletes below are the last word on every node.
    assert!(landed(&cluster.nodes, "short", secs(5)).await);
    for node in &cluster.nodes {
        node.cli(&["DEL", &key]);
    }
    assert!(guard.lease().is_valid());
    let err = guard.extend(secs(10)).await.unwrap_err();
    let Error::ExtendFailed(q) = &err else {
        panic!("expected ExtendFailed, got {err:?}");
    };
    assert_eq!(q.phase, Phase::Extend);
    assert_eq!(q.reason, FailureReason::NotHeld, "{err}");
    assert_eq!((q.granted, q.quorum, q.nodes, q.attempts), (0, 2, 3, 1));
    assert!(q.failures.len() >= 2, "{err}");
    assert!(q
        .failures
        .iter()
        .all(|f| matches!(f.kind, NodeErrorKind::NotHeld)));
    assert!(
        report(&err).starts_with("lock on \"short\" not extended: extend of \"short\" failed"),
        "{err}"
    );
    assert_eq!(cluster.count_keys(LOCK_KEYS), vec![0; 3]);
    let released = guard.release().await;
    assert_eq!(released.confirmed, 0);

    let guard = client.acquire("short", ms(300)).await.unwrap();
    assert!(
        eventually(secs(3), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await,
        "the keys did not expire"
    );
    assert!(!guard.lease().is_valid());
    let err = guard.extend(secs(10)).await.unwrap_err();
    assert!(
        matches!(&err, Error::LockLost(l) if l.reason == LossReason::Expired),
        "{err:?}"
    );
    assert_eq!(cluster.count_keys(LOCK_KEYS), vec![0; 3]);
    assert!(guard.validity().is_zero(), "a failed extend grants nothing");
    let released = guard.release().await;
    assert_eq!(released.confirmed, 0);
}

/// Extend is compare-and-pexpire: another owner's key keeps its own TTL.
#[tokio::test]
async fn extend_of_a_lock_taken_over_fails_and_leaves_the_new_owner_alone() {
    let cluster = Cluster::start(3);
    let client = warm_client(&cluster).await;
    let key = lock_key("taken");
    let guard = client.acquire("taken", secs(10)).await.unwrap();
    let valid_until = guard.valid_until();
    assert!(landed(&cluster.nodes, "taken", secs(5)).await);
    for node in &cluster.nodes {
        node.cli(&["SET", &key, "other", "PX", "5000"]);
    }
    let err = guard.extend(secs(60)).await.unwrap_err();
    assert_eq!(
        err.quorum_failure().map(|q| q.reason),
        Some(FailureReason::NotHeld),
        "{err}"
    );
    for node in &cluster.nodes {
        assert_eq!(node.cli(&["GET", &key]), "other");
        assert!(pttl(node, &key) <= 5_000);
    }
    // A failed extend does not move the deadline.
    assert_eq!(guard.valid_until(), valid_until);
    drop(guard);
}

/// A shorter extend shortens the keys too, and the guard's deadline with them.
#[tokio::test]
async fn extend_can_shorten() {
    let cluster = Cluster::start(3);
    let client = warm_client(&cluster).await;
    let key = lock_key("shorten");
    let guard = client.acquire("shorten", secs(30)).await.unwrap();
    let validity = guard.extend(secs(2)).await.unwrap();
    assert!(validity <= secs(2), "{validity:?}");
    assert!(guard.validity() <= secs(2));
    let shortened = cluster
        .nodes
        .iter()
        .filter(|n| (0..=2_000).contains(&pttl(n, &key)))
        .count();
    assert!(shortened >= 2, "{shortened}");
    guard.release().await;
}

/// Dropping a guard without `release` frees the lock in the background, long
/// before its TTL.
#[tokio::test]
async fn dropped_guard_releases_in_the_background() {
    let cluster = Cluster::start(3);
    let client = warm_client(&cluster).await;
    let guard = client.acquire("dropped", secs(60)).await.unwrap();
    assert!(landed(&cluster.nodes, "dropped", secs(5)).await);
    drop(guard);
    assert!(
        eventually(secs(3), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await,
        "{:?}",
        cluster.count_keys(LOCK_KEYS)
    );
    let again = client.try_acquire("dropped", secs(60)).await.unwrap();
    assert!(again.is_some());
}

/// Guards still held when their runtime shuts down are dropped by the
/// shutdown, which runs their release's first step (queuing the deletes)
/// in `drop`: neither that nor the watchdog's abort may panic, on either
/// runtime flavour. Tokio swallows a panic in a task's drop, so a panic
/// hook counts the panics on the runtime's threads.
#[test]
fn guards_dropped_by_a_shutting_down_runtime_do_not_panic() {
    const THREAD: &str = "rf-shutdown-test";
    static PANICS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() == Some(THREAD) {
                PANICS.fetch_add(1, Ordering::SeqCst);
            }
            previous(info);
        }));
    });
    let cluster = Cluster::start(3);
    for multi_thread in [false, true] {
        let mut builder = if multi_thread {
            tokio::runtime::Builder::new_multi_thread()
        } else {
            tokio::runtime::Builder::new_current_thread()
        };
        let runtime = builder.enable_all().thread_name(THREAD).build().unwrap();
        let (held, acquired) = std::sync::mpsc::channel();
        let urls = cluster.urls();
        runtime.spawn(async move {
            let client = crate::helpers::client(urls).unwrap();
            let plain = client
                .acquire(&format!("shutdown-{multi_thread}"), secs(60))
                .await
                .unwrap();
            let watched = client
                .lock(format!("shutdown-auto-{multi_thread}"), secs(60))
                .auto_extend(redfence::AutoExtend::new())
                .acquire()
                .await
                .unwrap();
            held.send(()).unwrap();
            std::future::pending::<()>().await;
            drop((plain, watched));
        });
        // A current-thread runtime runs its tasks only inside `block_on`.
        let started = Instant::now();
        while acquired.try_recv().is_err() {
            assert!(started.elapsed() < secs(30), "the locks were not acquired");
            runtime.block_on(async { tokio::time::sleep(ms(10)).await });
        }
        std::thread::Builder::new()
            .name(THREAD.into())
            .spawn(move || drop(runtime))
            .unwrap()
            .join()
            .expect("dropping the runtime panicked");
        assert_eq!(
            PANICS.load(Ordering::SeqCst),
            0,
            "multi_thread: {multi_thread}"
        );
    }
}

#[tokio::test]
async fn lease_reports_resource_and_shrinking_validity() {
    let cluster = Cluster::start(3);
    let client = warm_client(&cluster).await;
    let guard = client.acquire("lease", secs(10)).await.unwrap();
    let lease = guard.lease();
    assert_eq!(lease.resource(), "lease");
    assert!(lease.is_valid());
    assert_eq!(lease.valid_until(), guard.valid_until());
    let first = lease.validity();
    tokio::time::sleep(ms(50)).await;
    let second = lease.validity();
    assert!(second < first, "{first:?} then {second:?}");
    assert!(first - second >= ms(50));
    // The lease follows the guard's extends.
    guard.extend(secs(20)).await.unwrap();
    assert!(lease.validity() > secs(10));
    assert_eq!(lease.valid_until(), guard.valid_until());
    // The secret value never shows in debug output.
    let key = lock_key("lease");
    let value = cluster.nodes[0].cli(&["GET", &key]);
    let (_, secret) = value.split_once(':').unwrap();
    assert!(!format!("{lease:?} {guard:?} {client:?}").contains(secret));
    guard.release().await;
}

/// `with_lock` holds the lock for the whole future, and releases after it.
#[tokio::test]
async fn with_lock_releases_after_the_future_completes() {
    let cluster = Cluster::start(3);
    let client = new_client(&cluster);
    let out = client
        .with_lock("scoped", secs(10), |lease| {
            let cluster = &cluster;
            async move {
                assert_eq!(lease.resource(), "scoped");
                assert!(lease.is_valid());
                tokio::time::sleep(ms(100)).await;
                // Still held after an await point, on a majority at least.
                let held = cluster
                    .count_keys(LOCK_KEYS)
                    .iter()
                    .filter(|&&c| c == 1)
                    .count();
                assert!(held >= 2, "{:?}", cluster.count_keys(LOCK_KEYS));
                tokio::time::sleep(ms(100)).await;
                42
            }
        })
        .await
        .unwrap();
    assert_eq!(out, 42);
    assert!(eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
}

/// An `Err` from the closure is handed back as the value, after the release.
#[tokio::test]
async fn with_lock_releases_when_the_closure_fails() {
    let cluster = Cluster::start(3);
    let client = new_client(&cluster);
    let saw_lock = AtomicBool::new(false);
    let (saw, nodes) = (&saw_lock, &cluster);
    let out: Result<Result<(), String>, Error> = client
        .with_lock("failing", secs(10), move |_lease| async move {
            tokio::time::sleep(ms(50)).await;
            saw.store(
                nodes.count_keys(LOCK_KEYS).iter().sum::<usize>() >= 2,
                Ordering::SeqCst,
            );
            Err(String::from("boom"))
        })
        .await;
    assert_eq!(out.unwrap(), Err(String::from("boom")));
    assert!(saw_lock.load(Ordering::SeqCst));
    assert!(eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
    let again = client.try_acquire("failing", secs(10)).await.unwrap();
    assert!(again.is_some());
}

/// A panic in the closure releases the lock first, then propagates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_releases_when_the_closure_panics() {
    let cluster = Arc::new(Cluster::start(3));
    let client = new_client(&cluster);
    let held_inside = Arc::new(AtomicBool::new(false));
    let task = tokio::spawn({
        let (client, cluster, held_inside) = (client.clone(), cluster.clone(), held_inside.clone());
        async move {
            client
                .with_lock("panicky", secs(30), |_lease| async move {
                    tokio::time::sleep(ms(50)).await;
                    let held = cluster.count_keys(LOCK_KEYS).iter().sum::<usize>() >= 2;
                    held_inside.store(held, Ordering::SeqCst);
                    panic!("closure panicked on purpose");
                })
                .await
        }
    });
    let join = task.await.unwrap_err();
    assert!(join.is_panic(), "{join:?}");
    let message = join.into_panic();
    assert_eq!(
        message.downcast_ref::<&str>(),
        Some(&"closure panicked on purpose")
    );
    assert!(held_inside.load(Ordering::SeqCst));
    // The release completed on a majority before the panic resumed: a new
    // acquire succeeds at once, long before the 30 s TTL.
    let started = Instant::now();
    let again = client.try_acquire("panicky", secs(30)).await.unwrap();
    assert!(again.is_some(), "lock still held after the panic");
    assert!(started.elapsed() < secs(2));
    again.unwrap().release().await;
    assert!(eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
}

/// `with_lock` waits like `acquire` when the lock is busy, and runs nothing
/// when it cannot get it.
#[tokio::test]
async fn with_lock_does_not_run_without_the_lock() {
    let cluster = Cluster::start(3);
    let client = new_client(&cluster);
    let guard = client.acquire("busy", secs(10)).await.unwrap();
    let ran = AtomicBool::new(false);
    let flag = &ran;
    let err = client
        .lock("busy", secs(10))
        .retry(Retry::new().with_max_wait(ms(200)))
        .run(move |_| async move { flag.store(true, Ordering::SeqCst) })
        .await
        .unwrap_err();
    assert!(err.is_contended(), "{err}");
    assert!(!ran.load(Ordering::SeqCst));
    guard.release().await;
}
