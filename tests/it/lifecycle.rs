//! The lease lifecycle: auto-extension (the watchdog), the lost-lock signal,
//! the hold bound, and that releasing stops everything first. Timing claims
//! are lower bounds or generous upper bounds; ordering is asserted exactly.
//! Node timeouts (100-200 ms) are small enough that a watchdog fits several
//! tries into a sub-second TTL, large enough for a loaded machine's round
//! trips.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redfence::{AutoExtend, Error, FailureReason, LossReason, NodeErrorKind, Retry};

use crate::helpers::{
    calls, client_with_timeout, eventually, landed, lock_key, ms, report, secs, warm_up, LOCK_KEYS,
};
use crate::support::Cluster;

/// Sets a flag when dropped: shows that a future was cancelled.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_extension_holds_for_ten_ttls_while_others_fail() {
    let cluster = Cluster::start(3);
    let holder = client_with_timeout(cluster.urls(), ms(150));
    let other = client_with_timeout(cluster.urls(), ms(150));
    warm_up(&holder, &cluster).await;
    let ttl = ms(800);
    let guard = holder
        .lock("long-job", ttl)
        .auto_extend(AutoExtend::new())
        .acquire()
        .await
        .unwrap();
    assert!(guard.is_auto_extended());
    let lease = guard.lease();
    let started = Instant::now();
    let mut refusals = 0;
    while started.elapsed() < 10 * ttl {
        assert!(
            other.try_acquire("long-job", ttl).await.unwrap().is_none(),
            "another client got the lock after {:?}",
            started.elapsed()
        );
        refusals += 1;
        assert!(lease.loss().is_none(), "{:?}", lease.loss());
        tokio::time::sleep(ms(100)).await;
    }
    assert!(lease.is_valid());
    assert!(refusals >= 10, "{refusals}");
    // The keys still carry a TTL (extended, never made permanent).
    for node in &cluster.nodes {
        let left: i64 = node.cli(&["PTTL", &lock_key("long-job")]).parse().unwrap();
        assert!(left > 0 && left <= 800, "PTTL {left}");
    }
    let released_at = Instant::now();
    guard.release().await;
    let next = other
        .lock("long-job", ttl)
        .acquire()
        .await
        .expect("acquired after the release");
    println!(
        "held {:?} (TTL {ttl:?}), {refusals} refusals; next holder after {:?}",
        released_at - started,
        released_at.elapsed()
    );
    next.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_a_majority_fires_the_lost_signal_before_validity_ends() {
    let mut cluster = Cluster::start(3);
    let client = client_with_timeout(cluster.urls(), ms(200));
    warm_up(&client, &cluster).await;
    let cancelled = Arc::new(AtomicBool::new(false));
    let (tx, rx) = tokio::sync::oneshot::channel();
    let flag = cancelled.clone();
    let work = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .lock("paused", ms(1500))
                .auto_extend(AutoExtend::new())
                .run(|lease| async move {
                    let _flag = DropFlag(flag);
                    let _ = tx.send(lease);
                    // Far longer than the test: only cancellation ends it.
                    tokio::time::sleep(secs(600)).await;
                })
                .await
        }
    });
    let lease = tokio::time::timeout(secs(10), rx).await.unwrap().unwrap();
    // Let one extension happen, so the validity checked below is the
    // watchdog's, then freeze two of three nodes.
    let first = lease.valid_until();
    assert!(
        eventually(secs(5), || lease.valid_until() > first).await,
        "no extension"
    );
    cluster.node(0).pause();
    cluster.node(1).pause();
    let lost = tokio::time::timeout(secs(10), lease.lost()).await.unwrap();
    let valid_until = lease.valid_until();
    assert_eq!(lost.reason, LossReason::Unreachable, "{lost}");
    assert!(
        lost.at <= valid_until,
        "signalled {:?} after the validity ended",
        lost.at - valid_until
    );
    let failure = lost.failure.as_ref().expect("the failed extend");
    assert!(failure.reason == FailureReason::Unavailable, "{failure}");
    assert!(
        failure
            .failures
            .iter()
            .filter(|f| f.kind.is_timeout())
            .count()
            >= 2,
        "{failure}"
    );
    println!(
        "lost {:?} before the computed validity ended: {lost}",
        lost.validity_left
    );
    // The scoped API cancelled the closure's future and says "lost".
    let result = tokio::time::timeout(secs(10), work).await.unwrap().unwrap();
    let err = result.unwrap_err();
    assert!(err.is_lost(), "{err}");
    assert!(!err.is_contended());
    assert_eq!(
        err.lost_lock().map(|l| l.reason),
        Some(LossReason::Unreachable)
    );
    assert!(
        report(&err).starts_with("lock on \"paused\" lost while held: lock on \"paused\" lost: "),
        "{err}"
    );
    assert!(
        cancelled.load(Ordering::SeqCst),
        "the future was not dropped"
    );
    cluster.node(0).resume();
    cluster.node(1).resume();
}

#[tokio::test]
async fn keys_deleted_on_a_majority_are_reported_not_held() {
    let cluster = Cluster::start(3);
    let client = client_with_timeout(cluster.urls(), ms(200));
    warm_up(&client, &cluster).await;
    let guard = client
        .lock("stolen", secs(3))
        .auto_extend(AutoExtend::new())
        .acquire()
        .await
        .unwrap();
    let key = lock_key("stolen");
    // Every write of the acquire has run: the deletes are the last word.
    assert!(landed(&cluster.nodes, "stolen", secs(5)).await);
    for node in &cluster.nodes[..2] {
        node.cli(&["DEL", &key]);
    }
    // The next extension (at a third of the validity) finds them gone.
    let lost = tokio::time::timeout(secs(10), guard.lost()).await.unwrap();
    assert_eq!(lost.reason, LossReason::NotHeld, "{lost}");
    assert!(
        lost.validity_left > Duration::ZERO,
        "detected early: {lost}"
    );
    let failure = lost.failure.as_ref().unwrap();
    assert_eq!(failure.reason, FailureReason::NotHeld);
    assert!(
        failure
            .failures
            .iter()
            .filter(|f| matches!(f.kind, NodeErrorKind::NotHeld))
            .count()
            >= 2
    );
    assert!(!guard.lease().is_valid());
    // A lost lease is not extended again, and no round trip is made (the
    // pause lets the failed extend's last answer arrive first).
    tokio::time::sleep(ms(300)).await;
    let evals: u64 = cluster.nodes.iter().map(|n| calls(n, "evalsha")).sum();
    let err = guard.extend(secs(3)).await.unwrap_err();
    assert!(
        matches!(&err, Error::LockLost(l) if l.reason == LossReason::NotHeld),
        "{err}"
    );
    let after: u64 = cluster.nodes.iter().map(|n| calls(n, "evalsha")).sum();
    assert_eq!(evals, after, "an extend of a lost lease was sent");
    guard.release().await;
}

/// Another owner's value on a single node (someone was granted the key
/// there after ours vanished) ends the lease, although a majority still
/// extends: the watchdog hears every node's answer.
#[tokio::test]
async fn another_owner_on_one_node_is_a_takeover() {
    let cluster = Cluster::start(3);
    let client = client_with_timeout(cluster.urls(), ms(200));
    warm_up(&client, &cluster).await;
    let guard = client
        .lock("shared", secs(3))
        .auto_extend(AutoExtend::new())
        .acquire()
        .await
        .unwrap();
    assert!(landed(&cluster.nodes, "shared", secs(5)).await);
    cluster.nodes[2].cli(&["SET", &lock_key("shared"), "someone-else", "PX", "3000"]);
    let lost = tokio::time::timeout(secs(10), guard.lost()).await.unwrap();
    assert_eq!(lost.reason, LossReason::TakenOver, "{lost}");
    assert!(lost.validity_left > Duration::ZERO, "{lost}");
    assert_eq!(
        cluster.nodes[2].cli(&["GET", &lock_key("shared")]),
        "someone-else",
        "the other owner's key is left alone"
    );
    guard.release().await;
}

#[tokio::test]
async fn the_hold_bound_ends_the_lease() {
    let cluster = Cluster::start(3);
    let holder = client_with_timeout(cluster.urls(), ms(150));
    warm_up(&holder, &cluster).await;
    let granted = Instant::now();
    let guard = holder
        .lock("bounded", ms(900))
        .auto_extend(AutoExtend::new().with_max_hold(ms(2000)))
        .acquire()
        .await
        .unwrap();
    let lost = tokio::time::timeout(secs(10), guard.lost()).await.unwrap();
    assert_eq!(lost.reason, LossReason::HoldLimit, "{lost}");
    let held = lost.at - granted;
    // Extended past one TTL, ended by the bound (plus timer slack).
    assert!(held > ms(900), "{held:?}");
    assert!(held <= ms(2000) + ms(500), "{held:?}");
    // The keys expire a drift allowance after the validity: another
    // client gets the lock then, without any release.
    let other = client_with_timeout(cluster.urls(), ms(150));
    let next = other
        .lock("bounded", secs(1))
        .retry(Retry::new().with_max_wait(secs(5)))
        .acquire()
        .await
        .expect("free after the bound");
    assert!(
        Instant::now() - granted <= ms(2000) + secs(2),
        "the keys outlived the bound"
    );
    next.release().await;
    guard.release().await;

    // The extension-count bound.
    let guard = holder
        .lock("counted", ms(600))
        .auto_extend(AutoExtend::new().with_max_extensions(2))
        .acquire()
        .await
        .unwrap();
    let first = guard.valid_until();
    let lost = tokio::time::timeout(secs(10), guard.lost()).await.unwrap();
    assert_eq!(lost.reason, LossReason::HoldLimit, "{lost}");
    assert!(guard.valid_until() > first, "extended before stopping");
    guard.release().await;
}

#[tokio::test]
async fn without_auto_extension_lost_resolves_when_validity_ends() {
    let cluster = Cluster::start(1);
    let client = client_with_timeout(cluster.urls(), ms(200));
    let guard = client.acquire("plain", ms(400)).await.unwrap();
    assert!(!guard.is_auto_extended());
    let lease = guard.lease();
    let lost = tokio::time::timeout(secs(10), lease.lost()).await.unwrap();
    assert_eq!(lost.reason, LossReason::Expired);
    assert!(lost.at >= lease.valid_until());
    // Running out is recorded once seen, and final.
    assert_eq!(
        lease.loss().map(|l| l.reason),
        Some(LossReason::Expired),
        "expiry is a recorded loss"
    );
    // Releasing ends the lease for every view of it.
    let guard = client.acquire("plain", secs(10)).await.unwrap();
    let view = guard.lease();
    let waiting = tokio::spawn(view.lost());
    guard.release().await;
    let lost = tokio::time::timeout(secs(5), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(lost.reason, LossReason::Released);
    assert!(!view.is_valid());
}

/// Releasing (or dropping) the guard stops the watchdog before the release
/// is sent: afterwards no extend reaches any node, the keys are gone, and
/// no task is left running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_and_drop_stop_the_watchdog_and_leak_no_task() {
    let cluster = Cluster::start(3);
    let client = client_with_timeout(cluster.urls(), ms(100));
    warm_up(&client, &cluster).await;
    let metrics = tokio::runtime::Handle::current().metrics();
    // Let background work of the warm-up finish.
    tokio::time::sleep(ms(300)).await;
    let baseline = metrics.num_alive_tasks();
    // Frequent extensions, so one is often in flight at the release.
    let auto = AutoExtend::new().with_interval(ms(20));
    let mut guards = Vec::new();
    for i in 0..20 {
        let guard = client
            .lock(format!("w{i}"), secs(2))
            .auto_extend(auto)
            .acquire()
            .await
            .unwrap();
        guards.push(guard);
    }
    assert!(
        metrics.num_alive_tasks() >= baseline + 20,
        "one watchdog each"
    );
    tokio::time::sleep(ms(200)).await;
    for (i, guard) in guards.into_iter().enumerate() {
        if i % 2 == 0 {
            guard.release().await;
        } else {
            drop(guard);
        }
    }
    assert!(
        eventually(secs(5), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await,
        "{:?}",
        cluster.count_keys(LOCK_KEYS)
    );
    assert!(
        eventually(secs(5), || metrics.num_alive_tasks() <= baseline).await,
        "tasks alive: {} (baseline {baseline})",
        metrics.num_alive_tasks()
    );
    // Nothing extends any more: the script call count stays put.
    let before: Vec<u64> = cluster.nodes.iter().map(|n| calls(n, "evalsha")).collect();
    tokio::time::sleep(ms(300)).await;
    let after: Vec<u64> = cluster.nodes.iter().map(|n| calls(n, "evalsha")).collect();
    assert_eq!(before, after, "extends after the release");
}

#[tokio::test]
async fn invalid_auto_extension_is_refused_before_acquiring() {
    let cluster = Cluster::start(1);
    let client = client_with_timeout(cluster.urls(), ms(100));
    for (auto, reason) in [
        (
            AutoExtend::new().with_interval(Duration::ZERO),
            "interval must be greater than zero",
        ),
        (
            AutoExtend::new().with_interval(ms(950)),
            "interval leaves less than one node timeout before the validity ends",
        ),
        (
            AutoExtend::new().with_max_hold(Duration::ZERO),
            "max hold must be greater than zero",
        ),
    ] {
        let err = client
            .lock("r", secs(1))
            .auto_extend(auto)
            .acquire()
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::InvalidAutoExtend { reason: r } if *r == reason),
            "{err}"
        );
        assert_eq!(err.to_string(), format!("invalid auto-extension: {reason}"));
        crate::helpers::assert_message_style(&err.to_string());
    }
    // A TTL too short for the default interval and the node timeout.
    let err = client
        .lock("r", ms(150))
        .auto_extend(AutoExtend::new())
        .try_acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidAutoExtend { .. }), "{err}");
    assert_eq!(cluster.count_keys(LOCK_KEYS), vec![0]);
}

/// The client default applies to every request; `manual_extend` opts out.
#[tokio::test]
async fn client_default_and_opt_out() {
    let cluster = Cluster::start(1);
    let client = crate::helpers::builder(cluster.urls())
        .node_timeout(ms(200))
        .auto_extend(AutoExtend::new())
        .build()
        .unwrap();
    let auto = client.acquire("a", secs(2)).await.unwrap();
    assert!(auto.is_auto_extended());
    let manual = client
        .lock("b", secs(2))
        .manual_extend()
        .acquire()
        .await
        .unwrap();
    assert!(!manual.is_auto_extended());
    let value = client
        .with_lock(
            "c",
            secs(2),
            |lease| async move { lease.resource().to_owned() },
        )
        .await
        .unwrap();
    assert_eq!(value, "c");
    auto.release().await;
    manual.release().await;
}

/// A release that meets dropped connections (a load balancer's reset, an
/// idle timeout, `CLIENT KILL`) is sent again over new ones until the keys
/// would have expired: the lock is free at once, not after its TTL. Issue
/// 31: the release failed with "connection lost" on every node and the
/// keys stayed for the whole 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_over_dropped_connections_is_sent_again() {
    let cluster = Cluster::start(3);
    let client = client_with_timeout(cluster.urls(), ms(500));
    warm_up(&client, &cluster).await;
    let guard = client.acquire("dropped", secs(30)).await.unwrap();
    for node in &cluster.nodes {
        node.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
    }
    let released = guard.release().await;
    println!("released over dropped connections: {released:?}");
    let key = lock_key("dropped");
    let freed = eventually(secs(3), || {
        cluster
            .nodes
            .iter()
            .all(|n| n.cli(&["EXISTS", &key]).trim() == "0")
    })
    .await;
    assert!(
        freed,
        "the keys stayed after a release over dropped connections: {released:?}"
    );
    let again = client.try_acquire("dropped", secs(30)).await.unwrap();
    again.expect("free again").release().await;
}
