//! Waiting by notification: waiters sleep until a release is heard, take
//! turns without a herd, share one subscription connection per node, and
//! still get the lock when a notice is lost (fallback) or never sent (the
//! holder's TTL).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redfence::{Client, Retry};

use crate::helpers::{
    eventually, lock_key, ms, new_client, notice_channel, secs, warm_up, LOCK_KEYS,
};
use crate::support::{Cluster, RedisServer};

/// Subscription (pub/sub) connections open on a node.
fn pubsub_connections(node: &RedisServer) -> usize {
    node.cli(&["CLIENT", "LIST", "TYPE", "pubsub"])
        .lines()
        .filter(|l| l.starts_with("id="))
        .count()
}

/// A client waiting by notification without the fair queue: every node
/// publishes, and the clients' heads compete for each release.
fn classic(cluster: &Cluster, node_timeout: Duration) -> Client {
    crate::helpers::builder(cluster.urls())
        .node_timeout(node_timeout)
        .fair(false)
        .build()
        .unwrap()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// 100 waiters on one resource, 5 nodes: every one gets the lock in turn,
/// exclusively, each release hands over within a few round trips, the
/// client holds one subscription connection per node, and the attempts stay
/// near one per acquisition (polling would make many per waiter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_waiters_take_turns_on_five_nodes() {
    let cluster = Cluster::start(5);
    // The unordered competition (the fair queue subscribes on two nodes
    // only; tests/it/fair.rs has its own form of this test).
    let client = classic(&cluster, secs(1));
    warm_up(&client, &cluster).await;
    let first = client.acquire("sale", secs(10)).await.unwrap();
    let before = client.stats();
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    // (grant instant, release instant) per holder.
    let turns = Arc::new(Mutex::new(Vec::<(Instant, Instant)>::new()));
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let (client, inside, overlaps, turns) = (
            client.clone(),
            inside.clone(),
            overlaps.clone(),
            turns.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let guard = client
                .lock("sale", secs(10))
                .retry(Retry::new().with_max_wait(secs(120)))
                .acquire()
                .await
                .expect("every waiter gets the lock");
            let granted = Instant::now();
            if inside.swap(true, Ordering::SeqCst) {
                overlaps.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(ms(2)).await;
            inside.store(false, Ordering::SeqCst);
            let releasing = Instant::now();
            turns.lock().unwrap().push((granted, releasing));
            guard.release().await;
        }));
    }
    // All waiting (each made its first attempt: they all start before any
    // of them has queued): one subscription connection per node, not per
    // waiter.
    assert!(
        eventually(secs(30), || client.stats().waiting == 100).await,
        "the waiters did not all start: {:?}",
        client.stats()
    );
    assert!(
        eventually(secs(10), || cluster
            .nodes
            .iter()
            .all(|n| pubsub_connections(n) == 1))
        .await,
        "{:?}",
        cluster
            .nodes
            .iter()
            .map(pubsub_connections)
            .collect::<Vec<_>>()
    );
    let released_first = Instant::now();
    first.release().await;
    for task in tasks {
        tokio::time::timeout(secs(120), task)
            .await
            .expect("a waiter hung")
            .unwrap();
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    let mut turns = turns.lock().unwrap().clone();
    assert_eq!(turns.len(), 100);
    turns.sort();
    // Handoffs: each release to the next grant, in grant order.
    let mut handoffs = Vec::new();
    let mut previous_release = released_first;
    for &(granted, releasing) in &turns {
        assert!(granted >= previous_release, "granted before the release");
        handoffs.push(granted - previous_release);
        previous_release = releasing;
    }
    handoffs.sort();
    let stats = client.stats();
    let attempts = stats.attempts - before.attempts;
    println!(
        "100 waiters, 5 nodes: handoff p50 {:?} p99 {:?} max {:?}; {attempts} attempts for 100 acquisitions",
        percentile(&handoffs, 0.5),
        percentile(&handoffs, 0.99),
        handoffs[99],
    );
    // Each waiter's first attempt, one per acquisition (the head's retry
    // after the release) and one after subscribing: 201 measured. The
    // margin is for fallback wake-ups on a loaded machine. Polling with the
    // default policy makes several per waiter per second.
    assert!(attempts <= 100 + 100 + 50, "{attempts} attempts");
    assert_eq!(client.stats().waiting, 0);
    assert!(
        eventually(secs(5), || cluster.count_keys(LOCK_KEYS) == vec![0; 5]).await,
        "{:?}",
        cluster.count_keys(LOCK_KEYS)
    );
    // The last waiter left: the subscriptions are dropped once they have
    // lingered unused (the connections stay open for the next wait).
    assert!(
        eventually(secs(20), || cluster.nodes.iter().all(|n| n
            .cli(&["PUBSUB", "NUMSUB", &notice_channel(&lock_key("sale"))])
            .ends_with("0")))
        .await
    );
    drop(client);
    assert!(
        eventually(secs(5), || cluster
            .nodes
            .iter()
            .all(|n| pubsub_connections(n) == 0))
        .await,
        "dropping the client closes its subscription connections"
    );
}

/// Waiters with a short deadline return by it, with the holder's detail,
/// however long the holder keeps the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_return_by_their_deadline() {
    let cluster = Cluster::start(3);
    let client = new_client(&cluster);
    warm_up(&client, &cluster).await;
    let holder = client.acquire("busy", secs(30)).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..10u64 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let max_wait = ms(300 + 50 * i);
            let started = Instant::now();
            let err = client
                .lock("busy", secs(30))
                .retry(Retry::new().with_max_wait(max_wait))
                .acquire()
                .await
                .unwrap_err();
            (max_wait, started.elapsed(), err)
        }));
    }
    for task in tasks {
        let (max_wait, elapsed, err) = task.await.unwrap();
        assert!(err.is_contended(), "{err}");
        assert!(!err.node_failures().is_empty(), "{err}");
        assert!(
            elapsed >= max_wait,
            "gave up early: {elapsed:?} < {max_wait:?}"
        );
        // Bounded: the deadline plus at most one attempt (one node timeout).
        assert!(elapsed <= max_wait + secs(1) + ms(500), "{elapsed:?}");
    }
    holder.release().await;
}

/// The lock is freed without a release notice (its key deleted behind the
/// holder's back): the waiter still gets it through the fallback delay,
/// long before the holder's 30 s TTL would have run out.
#[tokio::test]
async fn a_lost_notice_falls_back_to_the_retry_delay() {
    let cluster = Cluster::start(1);
    // A classic waiter (the fair queue's timers: tests/it/fair.rs).
    let client = classic(&cluster, secs(1));
    let holder = client.acquire("silent", secs(30)).await.unwrap();
    let waiter = tokio::spawn({
        let client = client.clone();
        async move {
            let started = Instant::now();
            let guard = client
                .lock("silent", secs(30))
                .retry(
                    Retry::new()
                        .with_max_wait(secs(20))
                        .with_delay(ms(100))
                        .with_jitter(ms(100))
                        .with_max_jitter(ms(200)),
                )
                .acquire()
                .await;
            (started.elapsed(), guard)
        }
    });
    // Wait until the waiter is subscribed, then free the lock silently.
    let key = lock_key("silent");
    assert!(
        eventually(secs(10), || cluster.nodes[0]
            .cli(&["PUBSUB", "NUMSUB", &notice_channel(&key)])
            .ends_with('1'))
        .await
    );
    tokio::time::sleep(ms(100)).await;
    cluster.nodes[0].cli(&["DEL", &key]);
    let (elapsed, guard) = tokio::time::timeout(secs(25), waiter)
        .await
        .unwrap()
        .unwrap();
    let guard = guard.expect("acquired by the fallback");
    assert!(elapsed < secs(20), "{elapsed:?}");
    guard.release().await;
    drop(holder);
}

/// A holder that vanished without releasing (its keys expire, nobody
/// publishes): the waiter wakes when the TTL it was told runs out, although
/// its fallback delay is far longer.
#[tokio::test]
async fn a_crashed_holder_is_followed_at_its_ttl() {
    let cluster = Cluster::start(3);
    let client = new_client(&cluster);
    warm_up(&client, &cluster).await;
    let crashed = crate::helpers::builder(cluster.urls()).build().unwrap();
    let holder = crashed.acquire("crash", ms(1500)).await.unwrap();
    // A crash: no release is ever sent (the guard is leaked, not dropped).
    std::mem::forget(holder);
    let started = Instant::now();
    let guard = client
        .lock("crash", secs(10))
        .retry(
            Retry::new()
                .with_max_wait(secs(30))
                .with_delay(secs(25))
                .with_jitter(Duration::ZERO),
        )
        .acquire()
        .await
        .expect("acquired at the holder's expiry");
    let waited = started.elapsed();
    println!("followed a crashed holder after {waited:?} (TTL 1.5 s)");
    assert!(waited >= ms(1000), "{waited:?}");
    assert!(waited < secs(20), "{waited:?}: the fallback, not the TTL");
    guard.release().await;
}

/// A paused node does not stop the notices: the other nodes publish the
/// release, and the waiter gets the lock on the remaining majority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_does_not_lose_the_release() {
    let mut cluster = Cluster::start(3);
    // Every node's copy of the notice wakes a classic waiter; the fair
    // queue's form of this test is in tests/it/fair.rs.
    let client = classic(&cluster, ms(300));
    warm_up(&client, &cluster).await;
    let holder = client.acquire("p", secs(30)).await.unwrap();
    let waiter = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .lock("p", secs(30))
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
    let key = lock_key("p");
    assert!(
        eventually(secs(10), || cluster.nodes.iter().all(|n| n
            .cli(&["PUBSUB", "NUMSUB", &notice_channel(&key)])
            .ends_with('1')))
        .await
    );
    tokio::time::sleep(ms(100)).await;
    cluster.node(0).pause();
    let released = Instant::now();
    holder.release().await;
    let guard = tokio::time::timeout(secs(20), waiter)
        .await
        .expect("woken by the notice")
        .unwrap()
        .unwrap();
    println!("acquired {:?} after the release", released.elapsed());
    cluster.node(0).resume();
    guard.release().await;
}

/// A waiter that gives up (its future dropped) leaves the queue: the one
/// behind it becomes head and is woken by the next release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_head_hands_its_place_on() {
    let cluster = Cluster::start(1);
    // Classic waiters (the fair queue's form: tests/it/fair.rs).
    let client = classic(&cluster, secs(1));
    let holder = client.acquire("q", secs(30)).await.unwrap();
    let patient = Retry::new()
        .with_max_wait(secs(60))
        .with_delay(secs(50))
        .with_jitter(Duration::ZERO);
    let head = tokio::spawn({
        let client = client.clone();
        async move { client.lock("q", secs(30)).retry(patient).acquire().await }
    });
    let key = lock_key("q");
    assert!(
        eventually(secs(10), || cluster.nodes[0]
            .cli(&["PUBSUB", "NUMSUB", &notice_channel(&key)])
            .ends_with('1'))
        .await
    );
    tokio::time::sleep(ms(200)).await;
    let second = tokio::spawn({
        let client = client.clone();
        async move { client.lock("q", secs(30)).retry(patient).acquire().await }
    });
    tokio::time::sleep(ms(200)).await;
    head.abort();
    assert!(head.await.unwrap_err().is_cancelled());
    holder.release().await;
    let guard = tokio::time::timeout(secs(20), second)
        .await
        .expect("the second waiter was woken")
        .unwrap()
        .unwrap();
    guard.release().await;
}

/// Two clients whose tasks keep the queue full (workers in a loop, each
/// going straight back to `acquire` after its release) share the lock: a
/// client hands a release straight to its own next waiter only
/// `max_local_handoffs` times in a row while the other client waits too,
/// then lets its head compete with the other's. The negative control
/// (`u32::MAX`, never yield) shows what the bound prevents: the client
/// holding the lock keeps it, and the other gets (almost) nothing until
/// its waiters' deadlines. Within a client every task gets turns: a task
/// coming straight back queues behind the waiting ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn looping_clients_take_turns_with_each_other() {
    let cluster = Cluster::start(3);
    let bounded = looping_clients(&cluster, "bounded", 2).await;
    // The control is a scheduling race that a loaded machine can hide (the
    // other client's fallback timers fire before the holder's own waiters
    // are scheduled): it must show the domination in one of five runs
    // (three were not always enough with four test threads on 2 cores:
    // 24 switches in the third).
    let mut unbounded = looping_clients(&cluster, "unbounded", u32::MAX).await;
    for run in 1..5 {
        if bounded.switches > 3 * unbounded.switches && bounded.longest < unbounded.longest {
            break;
        }
        unbounded = looping_clients(&cluster, &format!("unbounded-{run}"), u32::MAX).await;
    }
    let default = looping_clients(&cluster, "default", 16).await;
    println!("2 looping clients, max_local_handoffs 2: {bounded}; u32::MAX: {unbounded}; 16 (default): {default}");
    // Bounded at 2, a client yields every third release and the other wins
    // about half of those: measured 47–60 switches in 300 grants, runs of
    // at most 15–21. Never yielding: 1–2 switches, one client 303 of 310
    // (the other's tasks got in when the first's stopped). The default
    // (16): 8–15 switches, 40–60 % each.
    assert!(bounded.switches >= 25, "{bounded}");
    assert!(
        bounded.switches > 3 * unbounded.switches,
        "{bounded} vs {unbounded}"
    );
    assert!(
        bounded.longest < unbounded.longest,
        "{bounded} vs {unbounded}"
    );
    for (c, n) in bounded.per_client.iter().enumerate() {
        assert!(*n >= bounded.grants / 5, "client {c}: {bounded}");
    }
    for (c, n) in default.per_client.iter().enumerate() {
        assert!(*n >= default.grants / 10, "client {c}: {default}");
    }
}

struct Turns {
    grants: usize,
    per_client: [usize; 2],
    longest: usize,
    switches: usize,
}

impl std::fmt::Display for Turns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "grants per client {:?}, longest run {}, {} switches",
            self.per_client, self.longest, self.switches
        )
    }
}

/// Two clients × 6 tasks looping on one resource until 300 grants.
async fn looping_clients(cluster: &Cluster, name: &str, handoffs: u32) -> Turns {
    const TASKS: usize = 6;
    const TOTAL: usize = 300;
    let clients: Vec<Client> = (0..2)
        .map(|_| {
            crate::helpers::builder(cluster.urls())
                .node_timeout(secs(1))
                // The bound on local handoffs is the classic competition's
                // fairness; the fair queue has its own (tests/it/fair.rs).
                .fair(false)
                .max_local_handoffs(handoffs)
                .build()
                .unwrap()
        })
        .collect();
    for c in &clients {
        warm_up(c, cluster).await;
    }
    let resource = format!("shared-loop-{name}");
    let granted = Arc::new(AtomicUsize::new(0));
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    // (client, task) of each grant, in grant order.
    let order = Arc::new(Mutex::new(Vec::<(usize, usize)>::new()));
    let mut tasks = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        for t in 0..TASKS {
            let (client, resource, granted, inside, overlaps, order) = (
                client.clone(),
                resource.clone(),
                granted.clone(),
                inside.clone(),
                overlaps.clone(),
                order.clone(),
            );
            tasks.push(tokio::spawn(async move {
                while granted.load(Ordering::SeqCst) < TOTAL {
                    let guard = client
                        .lock(&resource, secs(10))
                        .retry(Retry::new().with_max_wait(secs(60)))
                        .acquire()
                        .await
                        .expect("every waiter gets the lock");
                    if inside.swap(true, Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    granted.fetch_add(1, Ordering::SeqCst);
                    order.lock().unwrap().push((c, t));
                    tokio::time::sleep(ms(1)).await;
                    inside.store(false, Ordering::SeqCst);
                    guard.release().await;
                }
            }));
        }
    }
    for task in tasks {
        tokio::time::timeout(secs(120), task)
            .await
            .expect("a worker hung")
            .unwrap();
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    let order = order.lock().unwrap().clone();
    // Every task of both clients got turns (FIFO within a client); in the
    // unbounded run the other client's tasks may wait long but still come
    // in once the first client's workers stop.
    for c in 0..2 {
        for t in 0..TASKS {
            assert!(
                order.contains(&(c, t)),
                "{name}: task {t} of client {c} never got the lock: {order:?}"
            );
        }
    }
    Turns {
        grants: order.len(),
        per_client: [0, 1].map(|c| order.iter().filter(|(o, _)| *o == c).count()),
        longest: order
            .chunk_by(|a, b| a.0 == b.0)
            .map(<[_]>::len)
            .max()
            .unwrap_or(0),
        switches: order.windows(2).filter(|w| w[0].0 != w[1].0).count(),
    }
}
