//! Semaphores against real servers: K permits granted and the K+1-th
//! refused, a waiter woken by the release of any slot, tokens increasing
//! per slot, a dead holder's permit freed by its TTL, a release that frees
//! only its own slot, auto-extension and `lost()`, a node down, cut-off
//! acquires, the K rule, the typed errors, the waiters' line (arrival
//! order across clients, no overtaking by a holder that asks again, on a
//! plain node and on a Redis Cluster node). Counts and order are
//! asserted, never tight timings.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use futures::FutureExt;
use redfence::{AutoExtend, Error, Retry, Semaphore};
use tokio::time::timeout;

use crate::helpers::{
    client_with_timeout, eventually, lock_key, ms, new_client, secs, warm_up, LOCK_KEYS,
};
use crate::support::Cluster;

const TTL: Duration = Duration::from_secs(30);

/// A waiting policy whose fallback pause (10 s) is far longer than a wait
/// woken by a notice: a waiter that gets its permit within a few seconds
/// was woken by the release, not by its timer.
fn notice_only() -> Retry {
    Retry::new()
        .with_max_wait(secs(30))
        .with_delay(secs(10))
        .with_jitter(ms(1))
        .with_max_jitter(ms(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k_permits_then_refused_then_woken_by_any_slots_release() {
    let cluster = Cluster::start(3);
    let client = new_client(&cluster);
    warm_up(&client, &cluster).await;
    let sem = client.semaphore("backup", 3).unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(sem.try_acquire(TTL).await.unwrap().expect("a free permit"));
    }
    let slots: BTreeSet<u32> = held.iter().map(|p| p.slot()).collect();
    assert_eq!(slots, BTreeSet::from([0, 1, 2]));
    assert!(
        sem.try_acquire(TTL).await.unwrap().is_none(),
        "a 4th permit"
    );
    assert_eq!(sem.held().await.unwrap(), 3);
    // Each slot in turn: the waiter (another client) hears its release.
    let other = new_client(&cluster);
    let other_sem = other.semaphore("backup", 3).unwrap();
    for round in 0..3 {
        let waiter = tokio::spawn({
            let sem = other_sem.clone();
            async move {
                let started = Instant::now();
                let permit = sem.permit(TTL).retry(notice_only()).acquire().await;
                (permit, started.elapsed())
            }
        });
        // Let the waiter fail its pass and subscribe.
        tokio::time::sleep(ms(500)).await;
        assert!(
            !waiter.is_finished(),
            "round {round}: granted while all held"
        );
        let at = held.iter().position(|p| p.slot() == round).unwrap();
        let released = held.swap_remove(at);
        released.release().await;
        let (permit, waited) = timeout(secs(20), waiter).await.unwrap().unwrap();
        let permit = permit.unwrap();
        assert_eq!(permit.slot(), round, "the freed slot");
        assert!(
            waited < secs(8),
            "round {round}: woken by its timer, not the notice ({waited:?})"
        );
        held.push(sem_permit_back(&sem, permit).await);
    }
}

/// Hands a permit of another client back to `sem`'s client: releases it
/// and takes the slot again (the only free one) through `sem`.
async fn sem_permit_back(sem: &Semaphore, permit: redfence::Permit) -> redfence::Permit {
    let slot = permit.slot();
    permit.release().await;
    let again = sem.try_acquire(TTL).await.unwrap().expect("the freed slot");
    assert_eq!(again.slot(), slot);
    again
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_strictly_per_slot_across_holders() {
    let cluster = Cluster::start(3);
    let a = new_client(&cluster);
    let b = new_client(&cluster);
    warm_up(&a, &cluster).await;
    let sems = [
        a.semaphore("tokens", 2).unwrap(),
        b.semaphore("tokens", 2).unwrap(),
    ];
    let mut last: HashMap<u32, u64> = HashMap::new();
    let mut per_slot: HashMap<u32, usize> = HashMap::new();
    for i in 0..30 {
        // Two holders at once, from alternating clients.
        let p1 = sems[i % 2].acquire(TTL).await.unwrap();
        let p2 = sems[(i + 1) % 2].acquire(TTL).await.unwrap();
        assert_ne!(p1.slot(), p2.slot());
        for p in [&p1, &p2] {
            let token = p.token().unwrap().get();
            if let Some(prev) = last.insert(p.slot(), token) {
                assert!(token > prev, "slot {}: {token} after {prev}", p.slot());
            }
            *per_slot.entry(p.slot()).or_default() += 1;
            assert_eq!(p.resource(), format!("tokens:permit:{}", p.slot()));
        }
        if i % 3 == 0 {
            drop(p1); // released in the background
            p2.release().await;
            assert!(eventually(secs(5), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
        } else {
            p1.release().await;
            p2.release().await;
        }
    }
    assert_eq!(per_slot.values().sum::<usize>(), 60);
    assert_eq!(per_slot.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holders_permit_is_free_within_its_ttl() {
    let cluster = Cluster::start(3);
    let client = new_client(&cluster);
    warm_up(&client, &cluster).await;
    let sem = client.semaphore("dies", 1).unwrap();
    let permit = sem.permit(secs(2)).manual_extend().acquire().await.unwrap();
    // A holder that vanished without releasing.
    std::mem::forget(permit);
    let other = new_client(&cluster);
    let other_sem = other.semaphore("dies", 1).unwrap();
    assert!(other_sem.try_acquire(TTL).await.unwrap().is_none());
    let started = Instant::now();
    let permit = other_sem
        .permit(TTL)
        .retry(Retry::new().with_max_wait(secs(15)))
        .acquire()
        .await
        .unwrap();
    // Freed by the keys' expiry (2 s), not before; generous above.
    assert!(started.elapsed() < secs(12), "{:?}", started.elapsed());
    assert_eq!(permit.slot(), 0);
    permit.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_frees_only_its_own_slot() {
    let cluster = Cluster::start(3);
    let client = new_client(&cluster);
    warm_up(&client, &cluster).await;
    let sem = client.semaphore("own", 2).unwrap();
    let a = sem.acquire(TTL).await.unwrap();
    let b = sem.acquire(TTL).await.unwrap();
    let (slot_a, slot_b) = (a.slot(), b.slot());
    let key_b = lock_key(b.resource());
    a.release().await;
    let views = sem.inspect().await.unwrap();
    assert!(
        views[slot_a as usize].holder.is_none(),
        "{:?}",
        views[slot_a as usize]
    );
    assert!(views[slot_b as usize].holder.is_some());
    // On every node: the acquire decided at two of three, and the third
    // node's request may still be on its way (under load it was, once);
    // a release of `a` that deleted `b`'s key would leave it gone.
    assert!(
        eventually(secs(5), || cluster
            .nodes
            .iter()
            .all(|node| node.cli(&["EXISTS", &key_b]) == "1"))
        .await
    );
    // The next permit is the freed slot; then none.
    let c = sem.try_acquire(TTL).await.unwrap().unwrap();
    assert_eq!(c.slot(), slot_a);
    assert!(sem.try_acquire(TTL).await.unwrap().is_none());
    b.release().await;
    c.release().await;
    assert!(eventually(secs(5), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_extended_permit_outlives_its_ttl_and_reports_its_loss() {
    let mut cluster = Cluster::start(3);
    let client = client_with_timeout(cluster.urls(), ms(200));
    warm_up(&client, &cluster).await;
    let sem = client.semaphore("extended", 2).unwrap();
    let permit = sem
        .permit(ms(1500))
        .auto_extend(AutoExtend::new())
        .acquire()
        .await
        .unwrap();
    assert!(permit.is_auto_extended());
    let first = permit.valid_until();
    let lease = permit.lease();
    assert!(
        eventually(secs(5), || lease.valid_until() > first).await,
        "no extension"
    );
    // Held past its TTL.
    tokio::time::sleep(secs(2)).await;
    assert!(lease.is_valid());
    assert_eq!(sem.held().await.unwrap(), 1);
    cluster.node(0).pause();
    cluster.node(1).pause();
    let lost = timeout(secs(10), permit.lost()).await.unwrap();
    assert_eq!(lost.resource, permit.resource());
    cluster.node(0).resume();
    cluster.node(1).resume();
    drop(permit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_permit_runs_under_a_permit_and_run_is_cancelled_on_loss() {
    let mut cluster = Cluster::start(3);
    let client = client_with_timeout(cluster.urls(), ms(200));
    warm_up(&client, &cluster).await;
    let sem = client.semaphore("scoped", 1).unwrap();
    let inner = sem.clone();
    let value = sem
        .with_permit(TTL, |lease| async move {
            assert_eq!(lease.resource(), "scoped:permit:0");
            // The only permit is ours.
            inner.try_acquire(TTL).await.unwrap().is_none()
        })
        .await
        .unwrap();
    assert!(value);
    assert!(eventually(secs(5), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
    let run = tokio::spawn({
        let sem = sem.clone();
        async move {
            sem.permit(ms(1500))
                .auto_extend(AutoExtend::new())
                .run(|_| tokio::time::sleep(secs(600)))
                .await
        }
    });
    assert!(eventually(secs(5), || cluster.count_keys(LOCK_KEYS) == vec![1; 3]).await);
    cluster.node(1).pause();
    cluster.node(2).pause();
    let err = timeout(secs(15), run).await.unwrap().unwrap().unwrap_err();
    assert!(err.is_lost(), "{err}");
    cluster.node(1).resume();
    cluster.node(2).resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_down_of_three_still_grants_k() {
    let mut cluster = Cluster::start(3);
    let client = client_with_timeout(cluster.urls(), ms(300));
    warm_up(&client, &cluster).await;
    cluster.node(2).kill();
    let sem = client.semaphore("degraded", 2).unwrap();
    let a = sem.acquire(TTL).await.unwrap();
    let b = sem.acquire(TTL).await.unwrap();
    assert_ne!(a.slot(), b.slot());
    // No third: refused (with a node down a held slot may read as
    // "unavailable", an error, as for the mutex), never granted.
    let third = sem.try_acquire(TTL).await;
    assert!(
        matches!(third, Ok(None) | Err(Error::NotAcquired(_))),
        "{third:?}"
    );
    a.release().await;
    b.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_acquires_leave_no_permit_held() {
    let cluster = Cluster::start(3);
    let client = client_with_timeout(cluster.urls(), ms(300));
    warm_up(&client, &cluster).await;
    let sem = client.semaphore("cut", 2).unwrap();
    let (mut cut_off, mut acquired) = (0, 0);
    for i in 0..150 {
        let got = if i % 10 == 4 {
            sem.acquire(TTL).now_or_never().ok_or(())
        } else {
            let budget = if i % 10 == 9 {
                ms(300)
            } else {
                Duration::from_micros(rand::random_range(0..3_000))
            };
            timeout(budget, sem.acquire(TTL)).await.map_err(|_| ())
        };
        match got {
            Err(()) => cut_off += 1,
            Ok(Ok(permit)) => {
                acquired += 1;
                match i % 3 {
                    0 => drop(permit),
                    1 => {
                        let _ = timeout(Duration::from_micros(500), permit.release()).await;
                    }
                    _ => {
                        permit.release().await;
                    }
                }
            }
            Ok(Err(e)) => panic!("round {i}: {e}"),
        }
    }
    assert!(
        cut_off > 0 && acquired > 0,
        "{cut_off} cut off, {acquired} acquired"
    );
    let clean = eventually(secs(5), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await;
    assert!(clean, "keys left: {:?}", cluster.count_keys(LOCK_KEYS));
    let a = sem.try_acquire(TTL).await.unwrap().expect("permit 1");
    let b = sem.try_acquire(TTL).await.unwrap().expect("permit 2");
    a.release().await;
    b.release().await;
}

/// The K rule: K is part of the name's contract. A client with a smaller
/// K uses the lower slots only; holders above it keep their slots until
/// they release, so the bound is max(old, new) until they leave. A larger
/// K adds slots at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_k_follows_the_stated_rule() {
    let cluster = Cluster::start(3);
    let client = new_client(&cluster);
    warm_up(&client, &cluster).await;
    let three = client.semaphore("resized", 3).unwrap();
    let two = client.semaphore("resized", 2).unwrap();
    let four = client.semaphore("resized", 4).unwrap();
    let mut held: Vec<_> = Vec::new();
    for _ in 0..3 {
        held.push(three.acquire(TTL).await.unwrap());
    }
    // Shrunk: nothing for K = 2 while slots 0 and 1 are held; the holder
    // of slot 2 keeps it (three holders = max(3, 2)).
    assert!(two.try_acquire(TTL).await.unwrap().is_none());
    assert_eq!(three.held().await.unwrap(), 3);
    // Grown: slot 3 at once.
    let fourth = four.try_acquire(TTL).await.unwrap().expect("slot 3");
    assert_eq!(fourth.slot(), 3);
    fourth.release().await;
    // The holder of slot 2 leaves: K = 2 still finds nothing (slot 2 is
    // not one of its slots).
    let at = held.iter().position(|p| p.slot() == 2).unwrap();
    held.swap_remove(at).release().await;
    assert!(two.try_acquire(TTL).await.unwrap().is_none());
    // Slot 0 leaves: K = 2 gets it.
    let at = held.iter().position(|p| p.slot() == 0).unwrap();
    held.swap_remove(at).release().await;
    let p = two.try_acquire(TTL).await.unwrap().expect("slot 0");
    assert_eq!(p.slot(), 0);
    p.release().await;
    for p in held {
        p.release().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_semaphores_are_typed_errors() {
    let cluster = Cluster::start(1);
    let client = new_client(&cluster);
    let zero = client.semaphore("x", 0).unwrap_err();
    assert!(
        matches!(zero, Error::InvalidPermits { permits: 0, .. }),
        "{zero}"
    );
    assert_eq!(
        zero.to_string(),
        "invalid number of permits 0: a semaphore needs at least one permit"
    );
    let many = client
        .semaphore("x", Semaphore::MAX_PERMITS + 1)
        .unwrap_err();
    assert!(matches!(many, Error::InvalidPermits { .. }), "{many}");
    assert!(matches!(
        client.semaphore("", 2),
        Err(Error::InvalidResource(_))
    ));
    let long = "n".repeat(1020);
    assert!(matches!(
        client.semaphore(&long, 2),
        Err(Error::InvalidResource(_))
    ));
    let sem = client.semaphore("x", 2).unwrap();
    assert_eq!(sem.permits(), 2);
    assert_eq!(sem.slot_resource(1), Some("x:permit:1"));
    assert_eq!(sem.slot_resource(2), None);
    assert!(matches!(
        sem.acquire(Duration::ZERO).await,
        Err(Error::InvalidTtl { .. })
    ));
    assert!(matches!(
        sem.try_acquire(Duration::ZERO).await,
        Err(Error::InvalidTtl { .. })
    ));
    let bad_auto = sem
        .permit(ms(100))
        .auto_extend(AutoExtend::new().with_interval(secs(10)))
        .acquire()
        .await;
    assert!(
        matches!(bad_auto, Err(Error::InvalidAutoExtend { .. })),
        "{bad_auto:?}"
    );
    // Nothing was sent for any of them.
    assert_eq!(cluster.count_keys(LOCK_KEYS), vec![0]);
}

/// 12 waiters of 4 clients join a semaphore of 2 permits, both held, one
/// after another (each once the previous stands in the semaphore's line):
/// with the line (`fair`, the default) they get permits exactly in that
/// order. The control: without it (every waiting client retries on every
/// release), the same arrivals are served out of order in at least one of
/// three runs, so the order check can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_several_clients_get_permits_in_arrival_order() {
    let cluster = Cluster::start(3);
    let (fair, fair_attempts) = permit_order(&cluster, "order-fair", true).await;
    assert_eq!(fair, (0..12).collect::<Vec<_>>(), "grant order (fair)");
    let mut unordered = Vec::new();
    let mut unordered_attempts = 0;
    for run in 0..3 {
        (unordered, unordered_attempts) =
            permit_order(&cluster, &format!("order-unordered-{run}"), false).await;
        if unordered != (0..12).collect::<Vec<_>>() {
            break;
        }
    }
    println!(
        "grant order: fair {fair:?} ({fair_attempts} attempts), \
         fair(false) {unordered:?} ({unordered_attempts} attempts)"
    );
    assert_ne!(
        unordered,
        (0..12).collect::<Vec<_>>(),
        "fair(false) kept arrival order in three runs: the control shows nothing"
    );
}

/// The semaphore's line (`{name}:queue`): its holder and its queued
/// waiters, summed over the nodes.
fn in_line(cluster: &Cluster, name: &str) -> usize {
    let line = format!("{name}:queue");
    let holding = cluster
        .nodes
        .iter()
        .any(|n| n.cli(&["EXISTS", &lock_key(&line)]).trim() == "1");
    usize::from(holding) + crate::fair::queued(cluster, &line)
}

/// Joins waiters 0..12 (round robin over 4 clients) in order behind two
/// held permits of a 2-permit semaphore, releases both, and returns the
/// order of the waiters' grants and the clients' attempts meanwhile.
async fn permit_order(cluster: &Cluster, name: &str, fair: bool) -> (Vec<usize>, u64) {
    let clients: Vec<redfence::Client> =
        (0..4).map(|_| crate::fair::client(cluster, fair)).collect();
    for c in &clients {
        warm_up(c, cluster).await;
    }
    let sem = clients[0].semaphore(name, 2).unwrap();
    let held = [
        sem.try_acquire(TTL).await.unwrap().expect("a free permit"),
        sem.try_acquire(TTL).await.unwrap().expect("a free permit"),
    ];
    let attempts = || clients.iter().map(|c| c.stats().attempts).sum::<u64>();
    let start = attempts();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for w in 0..12 {
        let sem = clients[w % 4].semaphore(name, 2).unwrap();
        let order = order.clone();
        let before = attempts();
        tasks.push(tokio::spawn(async move {
            let permit = sem
                .permit(TTL)
                .retry(notice_only())
                .acquire()
                .await
                .expect("every waiter gets a permit");
            order.lock().unwrap().push(w);
            tokio::time::sleep(ms(5)).await;
            permit.release().await;
        }));
        // The next waiter arrives once this one waits: in the line, or
        // (fair(false)) past its first pass.
        let joined = eventually(secs(10), || {
            if fair {
                in_line(cluster, name) > w
            } else {
                attempts() > before
                    || clients.iter().map(|c| c.stats().waiting).sum::<u64>() > w as u64
            }
        })
        .await;
        assert!(joined, "waiter {w} never joined");
        tokio::time::sleep(ms(20)).await;
    }
    for permit in held {
        permit.release().await;
    }
    for t in tasks {
        timeout(secs(60), t).await.expect("a waiter hung").unwrap();
    }
    let order = order.lock().unwrap().clone();
    (order, attempts() - start)
}

/// A holder that releases and at once asks again does not take the slot
/// from the waiter whose turn it is: with the line (fencing on), the
/// waiter's claim makes the release keep the freed key for it, so the
/// holder's `try_acquire` finds it held and the waiter gets it. The
/// control: a waiter outside the line (`fair(false)`) makes no claim, and
/// the holder takes the slot back first in at least one round of four
/// runs (without the claim, the line's waiter is overtaken in the same
/// way: 2 of 3 rounds when tried).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_asking_again_does_not_overtake_the_waiter_whose_turn_it_is() {
    let cluster = Cluster::start(3);
    let fair = overtakes(&cluster, "again-fair", true).await;
    // A race without the line (the waiter's retry against the holder's
    // next call): up to 4 runs of 3 rounds until it shows.
    let mut unordered = 0;
    for run in 0..4 {
        unordered = overtakes(&cluster, &format!("again-unordered-{run}"), false).await;
        if unordered > 0 {
            break;
        }
    }
    println!(
        "the holder took the slot back first: {fair} of 3 rounds with the line, \
         {unordered} of 3 without"
    );
    assert_eq!(fair, 0, "overtaken with the line");
    assert!(
        unordered > 0,
        "without the line the holder never took it back: the control shows nothing"
    );
}

/// Three rounds on a semaphore of 1 permit: the holder (one client) and a
/// waiter (another, `fair` or not) that waits until it is in line (or past
/// its first pass); the holder releases and at once tries again. Returns
/// the rounds in which the holder got the slot back.
async fn overtakes(cluster: &Cluster, name: &str, fair: bool) -> usize {
    let holder = crate::fair::client(cluster, true);
    let waiter = crate::fair::client(cluster, fair);
    warm_up(&holder, cluster).await;
    warm_up(&waiter, cluster).await;
    let ours = holder.semaphore(name, 1).unwrap();
    let theirs = waiter.semaphore(name, 1).unwrap();
    let mut permit = ours.try_acquire(TTL).await.unwrap().expect("a free permit");
    let mut taken_back = 0;
    for round in 0..3 {
        let before = waiter.stats().attempts;
        let waiting = tokio::spawn({
            let theirs = theirs.clone();
            async move { theirs.permit(TTL).retry(notice_only()).acquire().await }
        });
        let ready = eventually(secs(10), || {
            if fair {
                in_line(cluster, name) > 0
            } else {
                waiter.stats().attempts > before && waiter.stats().waiting > 0
            }
        })
        .await;
        assert!(ready, "round {round}: the waiter never waited");
        // Its claim (or marks) and subscriptions in place.
        tokio::time::sleep(ms(300)).await;
        permit.release().await;
        if let Some(again) = ours.try_acquire(TTL).await.unwrap() {
            taken_back += 1;
            // Let the waiter have it next, then take it back for the next
            // round.
            again.release().await;
        }
        let got = timeout(secs(30), waiting)
            .await
            .expect("the waiter hung")
            .unwrap()
            .expect("the waiter's permit");
        got.release().await;
        permit = ours
            .permit(TTL)
            .retry(notice_only())
            .acquire()
            .await
            .expect("the permit back");
    }
    permit.release().await;
    taken_back
}

/// On a Redis Cluster node (the sharded release, the line's mutex and the
/// claims on the slots' own shards): the waiter whose turn it is gets the
/// permit its holder releases, and the holder asking again at once finds
/// it kept for the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_node_the_waiter_whose_turn_it_is_gets_the_released_permit() {
    let cluster = crate::support::cluster::RedisCluster::start_small(3);
    let client = || {
        crate::helpers::builder([redfence::NodeSpec::cluster(cluster.seed_urls())])
            .node_timeout(secs(1))
            .build()
            .unwrap()
    };
    let (holder, waiter) = (client(), client());
    let ours = holder.semaphore("cluster-backup", 1).unwrap();
    let theirs = waiter.semaphore("cluster-backup", 1).unwrap();
    let permit = timeout(secs(30), ours.acquire(TTL)).await.unwrap().unwrap();
    let waiting =
        tokio::spawn(async move { theirs.permit(TTL).retry(notice_only()).acquire().await });
    // In line, its claim made and the slot's channel subscribed.
    assert!(eventually(secs(20), || waiter.stats().waiting > 0).await);
    tokio::time::sleep(ms(300)).await;
    permit.release().await;
    assert!(
        ours.try_acquire(TTL).await.unwrap().is_none(),
        "the holder took back the permit kept for the waiter"
    );
    let got = timeout(secs(30), waiting)
        .await
        .expect("the waiter hung")
        .unwrap()
        .expect("the waiter's permit");
    assert!(got.token().is_some());
    got.release().await;
}

/// Waiting acquires cut off at any point of their wait (in the line, while
/// claiming, waiting for a release, taking their claim back after the
/// grant): none leaves a permit, a line or a kept slot behind once the
/// background releases ran, and both permits are free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_waiters_leave_nothing_held() {
    let cluster = Cluster::start(3);
    let holder = client_with_timeout(cluster.urls(), ms(300));
    let waiter = client_with_timeout(cluster.urls(), ms(300));
    warm_up(&holder, &cluster).await;
    warm_up(&waiter, &cluster).await;
    let ours = holder.semaphore("cut-wait", 1).unwrap();
    let theirs = waiter.semaphore("cut-wait", 1).unwrap();
    let (mut cut_off, mut acquired) = (0, 0);
    for round in 0..100 {
        let permit = timeout(secs(20), ours.acquire(TTL))
            .await
            .expect("the holder hung")
            .expect("the holder's permit");
        // The release comes after `delay`; half the waiters are cut off
        // anywhere, half within a few ms after it (the grant, the claim
        // taken back).
        let delay = Duration::from_micros(rand::random_range(0..30_000));
        let budget = if round % 2 == 0 {
            Duration::from_micros(rand::random_range(0..40_000))
        } else {
            delay + Duration::from_micros(rand::random_range(0..5_000))
        };
        let waiting = tokio::spawn({
            let theirs = theirs.clone();
            async move { timeout(budget, theirs.permit(TTL).retry(notice_only()).acquire()).await }
        });
        tokio::time::sleep(delay).await;
        permit.release().await;
        match waiting.await.unwrap() {
            Err(_) => cut_off += 1,
            Ok(Ok(permit)) => {
                acquired += 1;
                permit.release().await;
            }
            Ok(Err(e)) => panic!("{e}"),
        }
    }
    assert!(
        cut_off > 0 && acquired > 0,
        "{cut_off} cut off, {acquired} acquired"
    );
    let clean = eventually(secs(10), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await;
    assert!(clean, "keys left: {:?}", cluster.count_keys(LOCK_KEYS));
    let a = ours
        .try_acquire(TTL)
        .await
        .unwrap()
        .expect("the permit, free again");
    a.release().await;
}
