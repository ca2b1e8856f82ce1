//! The fair queue (issue 16): waiters of several clients and processes get
//! a hot lock in arrival order, one release costs one attempt however many
//! wait, and the queue's failures (a cancelled or killed waiter, its home
//! node restarted empty or paused) cost order and time, never safety.
//!
//! The multi-process tests run this test binary again as worker processes
//! (`fair::worker`, which does nothing unless `REDFENCE_FAIR_WORKER` is
//! set); each worker prints one line per grant on a clock shared by the
//! processes (`CLOCK_MONOTONIC`), and the test checks the merged history.

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redfence::{Client, Retry};

use crate::helpers::{calls, eventually, lock_key, ms, secs, warm_up};
use crate::support::Cluster;

/// The fair queue's key of `resource` under the default prefix.
pub(crate) fn queue_key(resource: &str) -> String {
    format!("{}queue:{resource}", redfence::limits::DEFAULT_PREFIX)
}

/// Tickets in `resource`'s queue, summed over the nodes (only its home
/// node keeps one).
pub(crate) fn queued(cluster: &Cluster, resource: &str) -> usize {
    cluster
        .nodes
        .iter()
        .map(|n| {
            n.cli(&["LLEN", &queue_key(resource)])
                .parse::<usize>()
                .unwrap_or(0)
        })
        .sum()
}

/// The index of `resource`'s home node: the one that holds its queue.
fn home_of(cluster: &Cluster, resource: &str) -> Option<usize> {
    cluster
        .nodes
        .iter()
        .position(|n| n.cli(&["EXISTS", &queue_key(resource)]).trim() == "1")
}

pub(crate) fn client(cluster: &Cluster, fair: bool) -> Client {
    crate::helpers::builder(cluster.urls())
        .node_timeout(secs(1))
        .fair(fair)
        .build()
        .unwrap()
}

/// Two fair clients of `cluster`, warmed up.
async fn two_fair_clients(cluster: &Cluster) -> (Client, Client) {
    let (a, b) = (client(cluster, true), client(cluster, true));
    warm_up(&a, cluster).await;
    warm_up(&b, cluster).await;
    (a, b)
}

/// A policy whose fallback (10 s) is far beyond the handoffs: a waiter
/// that gets the lock promptly was named by a release, not its timer.
fn patient() -> Retry {
    Retry::new()
        .with_delay(secs(10))
        .with_jitter(Duration::ZERO)
        .with_max_jitter(Duration::ZERO)
        .with_max_wait(secs(60))
}

/// One grant in a history: when its waiter called `acquire`, when it got
/// the lock, when it started its release (all on one clock), its token and
/// who it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Grant {
    arrived: u64,
    granted: u64,
    released: u64,
    token: u64,
    who: u64,
}

/// The grants (in grant order) that overtook a waiter which called
/// `acquire` more than `margin` ns before them and was still waiting:
/// `(grant index, waiters overtaken)`. Arrivals closer than the margin may
/// join the queue in either order (each is a round trip to the home node).
fn overtakes(history: &[Grant], margin: u64) -> Vec<(usize, usize)> {
    let mut grants = history.to_vec();
    grants.sort_by_key(|g| g.granted);
    let mut out = Vec::new();
    for (i, g) in grants.iter().enumerate() {
        let overtaken = grants[i + 1..]
            .iter()
            .filter(|w| w.arrived + margin < g.arrived && w.arrived < g.granted)
            .count();
        if overtaken > 0 {
            out.push((i, overtaken));
        }
    }
    out
}

/// Mutual exclusion (each grant after the previous holder's release) and
/// token order (strictly increasing in grant order): the violations.
fn exclusion_and_order(history: &[Grant]) -> (usize, usize) {
    let mut grants = history.to_vec();
    grants.sort_by_key(|g| g.granted);
    let overlaps = grants
        .windows(2)
        .filter(|w| w[1].granted < w[0].released)
        .count();
    let disorder = grants
        .windows(2)
        .filter(|w| w[1].token <= w[0].token)
        .count();
    (overlaps, disorder)
}

/// The checkers see what they check: a swapped pair of grants, an overlap
/// and a token out of order, in a made-up history.
#[test]
fn the_history_checkers_see_violations() {
    let g = |arrived, granted, released, token| Grant {
        arrived,
        granted,
        released,
        token,
        who: 0,
    };
    let ms = 1_000_000;
    let good = [g(0, 10 * ms, 11 * ms, 1), g(ms, 12 * ms, 13 * ms, 2)];
    assert!(overtakes(&good, 2 * ms).is_empty());
    assert_eq!(exclusion_and_order(&good), (0, 0));
    // The second arrival (50 ms later) is granted first.
    let swapped = [g(0, 12 * ms, 13 * ms, 2), g(50 * ms, 10 * ms, 11 * ms, 1)];
    assert_eq!(overtakes(&swapped, 2 * ms), [(0, 1)]);
    // Within the margin, either order passes.
    let close = [g(0, 12 * ms, 13 * ms, 2), g(ms, 10 * ms, 11 * ms, 1)];
    assert!(overtakes(&close, 2 * ms).is_empty());
    let overlap = [g(0, 10 * ms, 15 * ms, 1), g(ms, 12 * ms, 16 * ms, 2)];
    assert_eq!(exclusion_and_order(&overlap), (1, 0));
    let tokens = [g(0, 10 * ms, 11 * ms, 5), g(ms, 12 * ms, 13 * ms, 5)];
    assert_eq!(exclusion_and_order(&tokens), (0, 1));
}

/// Nanoseconds on `CLOCK_MONOTONIC`, one clock for every process here.
pub(crate) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the struct we pass and nothing else.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// 12 waiters of 4 clients join one after another (each once the previous
/// is in the queue) while the lock is held: with the fair queue they get
/// it exactly in that order. The control: without it (the classic
/// competition between clients' heads), the same arrivals are served out
/// of order in at least one of three runs, so the order check can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_several_clients_get_the_lock_in_arrival_order() {
    let cluster = Cluster::start(3);
    let fair = arrival_order(&cluster, "order-fair", true).await;
    assert_eq!(fair, (0..12).collect::<Vec<_>>(), "grant order (fair)");
    let mut classic = Vec::new();
    for run in 0..3 {
        classic = arrival_order(&cluster, &format!("order-classic-{run}"), false).await;
        if classic != (0..12).collect::<Vec<_>>() {
            break;
        }
    }
    println!("grant order: fair {fair:?}, classic {classic:?}");
    assert_ne!(
        classic,
        (0..12).collect::<Vec<_>>(),
        "the classic competition kept arrival order in three runs: the control shows nothing"
    );
}

/// Joins waiters 0..12 (round robin over 4 clients) in order behind a
/// holder, releases, and returns the order of their grants.
async fn arrival_order(cluster: &Cluster, resource: &str, fair: bool) -> Vec<usize> {
    let clients: Vec<Client> = (0..4).map(|_| client(cluster, fair)).collect();
    for c in &clients {
        warm_up(c, cluster).await;
    }
    let holder = clients[0].acquire(resource, secs(30)).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for w in 0..12 {
        let c = clients[w % 4].clone();
        let (order, name) = (order.clone(), resource.to_owned());
        let before = clients.iter().map(|c| c.stats().attempts).sum::<u64>();
        tasks.push(tokio::spawn(async move {
            let guard = c
                .lock(&name, secs(30))
                .retry(patient())
                .acquire()
                .await
                .expect("every waiter gets the lock");
            order.lock().unwrap().push(w);
            tokio::time::sleep(ms(5)).await;
            guard.release().await;
        }));
        // The next waiter arrives once this one is queued: in the fair
        // queue's list, or (classic) past its first attempt.
        let joined = eventually(secs(10), || {
            if fair {
                queued(cluster, resource) > w
            } else {
                clients.iter().map(|c| c.stats().attempts).sum::<u64>() > before
                    || clients.iter().map(|c| c.stats().waiting).sum::<u64>() > w as u64
            }
        })
        .await;
        assert!(joined, "waiter {w} never joined");
        tokio::time::sleep(ms(20)).await;
    }
    holder.release().await;
    for t in tasks {
        tokio::time::timeout(secs(60), t)
            .await
            .expect("a waiter hung")
            .unwrap();
    }
    let order = order.lock().unwrap().clone();
    order
}

/// 8 clients × 4 tasks each want the lock once while it is held: with the
/// fair queue each release is followed by one attempt, the named waiter's,
/// so the attempts are the grants plus at most one first attempt per
/// client (later tasks of a client join the queue without one) and a
/// couple of races. The classic competition's count is printed beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_costs_one_attempt_however_many_clients_wait() {
    let cluster = Cluster::start(3);
    let (fair_attempts, grants) = attempts_for_one_round(&cluster, "cost-fair", true).await;
    let (classic_attempts, _) = attempts_for_one_round(&cluster, "cost-classic", false).await;
    println!(
        "32 waiters of 8 clients: {fair_attempts} attempts with the fair queue, \
         {classic_attempts} without, for {grants} grants each"
    );
    assert_eq!(grants, 32);
    assert!(
        fair_attempts <= grants + 8 + 2,
        "{fair_attempts} attempts for {grants} grants"
    );
}

async fn attempts_for_one_round(cluster: &Cluster, resource: &str, fair: bool) -> (u64, u64) {
    let clients: Vec<Client> = (0..8).map(|_| client(cluster, fair)).collect();
    for c in &clients {
        warm_up(c, cluster).await;
    }
    let holder = clients[0].acquire(resource, secs(30)).await.unwrap();
    let before: u64 = clients.iter().map(|c| c.stats().attempts).sum();
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for w in 0..32 {
        let c = clients[w % 8].clone();
        let (resource, inside, overlaps) = (resource.to_owned(), inside.clone(), overlaps.clone());
        tasks.push(tokio::spawn(async move {
            take_turn(&c, &resource, &inside, &overlaps, ms(2)).await;
        }));
    }
    assert!(
        eventually(secs(20), || clients
            .iter()
            .map(|c| c.stats().waiting)
            .sum::<u64>()
            == 32)
        .await
    );
    tokio::time::sleep(ms(200)).await;
    holder.release().await;
    for t in tasks {
        tokio::time::timeout(secs(60), t)
            .await
            .expect("a waiter hung")
            .unwrap();
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    let attempts = clients.iter().map(|c| c.stats().attempts).sum::<u64>() - before;
    (attempts, 32)
}

/// One patient waiting acquire of `resource`, held for `hold`; a holder
/// that finds `inside` set counts an overlap.
async fn take_turn(
    c: &Client,
    resource: &str,
    inside: &AtomicBool,
    overlaps: &AtomicUsize,
    hold: Duration,
) {
    let guard = c
        .lock(resource, secs(30))
        .retry(patient())
        .acquire()
        .await
        .expect("every waiter gets the lock");
    if inside.swap(true, Ordering::SeqCst) {
        overlaps.fetch_add(1, Ordering::SeqCst);
    }
    tokio::time::sleep(hold).await;
    inside.store(false, Ordering::SeqCst);
    guard.release().await;
}

/// Two processes taking turns on one lock, one task each: the holder's
/// ticket stays at the head of the queue until its release, so the other
/// one's next join finds it there and waits to be named. When the release
/// popped the named ticket, that join found a list of one, took the lock
/// for free and attempted in vain: two attempts per acquisition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_taking_turns_cost_one_attempt_each() {
    const ROUNDS: u64 = 40;
    let cluster = Cluster::start(3);
    let clients: Vec<Client> = (0..2).map(|_| client(&cluster, true)).collect();
    for c in &clients {
        warm_up(c, &cluster).await;
    }
    let before: u64 = clients.iter().map(|c| c.stats().attempts).sum();
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = clients
        .iter()
        .map(|c| {
            let (c, inside, overlaps) = (c.clone(), inside.clone(), overlaps.clone());
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    take_turn(&c, "turns", &inside, &overlaps, ms(1)).await;
                }
            })
        })
        .collect();
    for t in tasks {
        tokio::time::timeout(secs(120), t)
            .await
            .expect("a turn hung")
            .unwrap();
    }
    let attempts = clients.iter().map(|c| c.stats().attempts).sum::<u64>() - before;
    println!(
        "2 clients x 1 task, {} acquisitions: {attempts} attempts",
        2 * ROUNDS
    );
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    // Each client's first acquire may attempt before it knows the lock is
    // busy; a slow named waiter can cost one more now and then (81–88 on
    // a quiet machine, 93 once in a loaded CI run). The bug this guards
    // against cost two per acquisition (160).
    assert!(
        attempts <= 2 * ROUNDS + 2 + 20,
        "{attempts} attempts for {} acquisitions",
        2 * ROUNDS
    );
}

/// A client's joins leave the queue key's `PEXPIRE` out while its own last
/// one still covers the waiter (a hot lock's join is one command), and a
/// join that finds the key gone (emptied, or the home restarted) gives the
/// key it creates an expiry: a queue whose waiters all died still leaves
/// no key behind. Every join is one script (issue 31: the `RPUSH` and a
/// background `PEXPIRE` were separate commands, and a client that died
/// between them left a queue key with no expiry): `MONITOR` shows each
/// `RPUSH` run by a script, the one that created the key followed by its
/// `PEXPIRE` in the same script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_keep_the_queue_key_alive_with_one_pexpire() {
    let cluster = Cluster::start(3);
    let (h, c) = two_fair_clients(&cluster).await;
    let holder = h.acquire("keep", secs(30)).await.unwrap();
    let wait = |c: &Client| {
        let c = c.clone();
        tokio::spawn(async move { c.lock("keep", secs(30)).retry(patient()).acquire().await })
    };
    let monitors: Vec<_> = cluster.nodes.iter().map(|n| n.monitor()).collect();
    let first = wait(&c);
    assert!(eventually(secs(10), || queued(&cluster, "keep") == 1).await);
    let at = home_of(&cluster, "keep").expect("a home node");
    let (home, monitor) = (&cluster.nodes[at], &monitors[at]);
    let pexpires = || {
        let stats = home.cli(&["INFO", "commandstats"]);
        let line = stats.lines().find(|l| l.starts_with("cmdstat_pexpire:"));
        line.and_then(|l| l.split(['=', ',']).nth(1)?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let ttl = || {
        home.cli(&["PTTL", &queue_key("keep")])
            .trim()
            .parse::<i64>()
            .unwrap_or(-2)
    };
    assert!(ttl() > 0, "the first join keeps the key alive");
    home.cli(&["CONFIG", "RESETSTAT"]);
    let second = wait(&c);
    assert!(eventually(secs(10), || queued(&cluster, "keep") == 2).await);
    assert_eq!(pexpires(), 0, "the second join sent a PEXPIRE");
    // The key gone with its tickets: the next join's RPUSH creates it.
    home.cli(&["DEL", &queue_key("keep")]);
    let third = wait(&c);
    assert!(eventually(secs(10), || queued(&cluster, "keep") == 1).await);
    assert!(
        eventually(secs(5), || ttl() > 0).await,
        "a queue key created by a join without PEXPIRE has no expiry: {}",
        ttl()
    );
    let queue = format!("\"{}\"", queue_key("keep"));
    let lines = monitor.lines();
    let on_queue: Vec<&String> = lines.iter().filter(|l| l.contains(&queue)).collect();
    let pushes: Vec<usize> = on_queue
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains("\"RPUSH\""))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(pushes.len(), 3, "{on_queue:#?}");
    for &i in &pushes {
        assert!(
            on_queue[i].contains(" lua] "),
            "an RPUSH of the queue sent on its own, not in the join script: {}",
            on_queue[i]
        );
    }
    // The first and the third join created the key: their PEXPIRE follows
    // in the same script.
    for &i in [pushes[0], pushes[2]].iter() {
        let next = on_queue.get(i + 1).map_or("", |l| l.as_str());
        assert!(
            next.contains(" lua] ") && next.contains("\"PEXPIRE\""),
            "a join that created the queue key without its PEXPIRE in the same script: {} then {next}",
            on_queue[i]
        );
    }
    for task in [first, second, third] {
        task.abort();
    }
    holder.release().await;
}

/// A waiter that gives up (its future dropped) takes its ticket out of the
/// queue: the release names the waiter behind it, which gets the lock
/// promptly although its own timer is 10 s away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiter_leaves_the_queue() {
    let cluster = Cluster::start(3);
    let (a, b) = two_fair_clients(&cluster).await;
    let holder = a.acquire("leave", secs(30)).await.unwrap();
    let first = tokio::spawn({
        let a = a.clone();
        async move { a.lock("leave", secs(30)).retry(patient()).acquire().await }
    });
    assert!(eventually(secs(10), || queued(&cluster, "leave") == 1).await);
    let second = tokio::spawn({
        let b = b.clone();
        async move {
            let got = b.lock("leave", secs(30)).retry(patient()).acquire().await;
            (got, Instant::now())
        }
    });
    assert!(eventually(secs(10), || queued(&cluster, "leave") == 2).await);
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    assert!(
        eventually(secs(5), || queued(&cluster, "leave") == 1).await,
        "the cancelled waiter's ticket stayed in the queue"
    );
    let (got, after) = release_and_wait(holder, second, secs(30)).await;
    let waited = after;
    println!("the second waiter got the lock {waited:?} after the release");
    assert!(waited < secs(5), "{waited:?}: its timer, not the release");
    got.unwrap().release().await;
}

/// The fair queue's home node paused while a waiter waits: the release is
/// not announced there, so the waiter's timer finds the home silent, and
/// it goes on as a classic waiter (subscribed on every node) and gets the
/// lock on the remaining majority, within its fallback plus a node
/// timeout, not at its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_home_node_widens_the_queue() {
    let mut cluster = Cluster::start(3);
    let (a, b) = (
        crate::helpers::builder(cluster.urls())
            .node_timeout(ms(300))
            .build()
            .unwrap(),
        crate::helpers::builder(cluster.urls())
            .node_timeout(ms(300))
            .build()
            .unwrap(),
    );
    warm_up(&a, &cluster).await;
    warm_up(&b, &cluster).await;
    let holder = a.acquire("paused-home", secs(30)).await.unwrap();
    let waiter = tokio::spawn(async move {
        let got = b
            .lock("paused-home", secs(30))
            .retry(
                Retry::new()
                    .with_delay(secs(2))
                    .with_jitter(Duration::ZERO)
                    .with_max_jitter(Duration::ZERO)
                    .with_max_wait(secs(60)),
            )
            .acquire()
            .await;
        (got, Instant::now())
    });
    assert!(eventually(secs(10), || queued(&cluster, "paused-home") == 1).await);
    let home = home_of(&cluster, "paused-home").expect("a home node");
    cluster.node(home).pause();
    let (got, after) = release_and_wait(holder, waiter, secs(30)).await;
    let waited = after;
    println!("with the home node paused, the waiter got the lock {waited:?} after the release");
    cluster.node(home).resume();
    let guard = got.expect("acquired on the remaining majority");
    assert!(waited < secs(10), "{waited:?}");
    guard.release().await;
}

/// A head whose owner was never told it may go is told, not skipped. The
/// holder's keys vanish without a release (nobody names the head, A's
/// waiter, whose own timer is 10 s away); B's waiter, queued behind it
/// with a 200 ms timer, looks and finds the lock free with A's ticket at
/// the head. Its look tells A (a `p:` notice on A's channel) and A's
/// waiter goes first. Without the notice, B's next look (one node timeout
/// later) dropped A's tickets as a dead client's and took the turn: in
/// `benches/hot.rs` at 32 x 31 that reordered 31 live waiters behind up
/// to 961 (2 of 6 runs), none in 9 runs with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_head_is_told_to_go_before_it_is_skipped() {
    let cluster = Cluster::start(3);
    let (holder_client, a, b) = (
        client(&cluster, true),
        client(&cluster, true),
        client(&cluster, true),
    );
    for c in [&holder_client, &a, &b] {
        warm_up(c, &cluster).await;
    }
    let resource = "told-to-go";
    let holder = holder_client.acquire(resource, secs(30)).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let spawn = |c: Client, name: &'static str, retry: Retry| {
        let order = order.clone();
        tokio::spawn(async move {
            let guard = c
                .lock(resource, secs(30))
                .retry(retry)
                .acquire()
                .await
                .expect("acquired");
            order.lock().unwrap().push((name, Instant::now()));
            tokio::time::sleep(ms(50)).await;
            guard.release().await;
        })
    };
    let first = spawn(a, "a", patient());
    assert!(eventually(secs(10), || queued(&cluster, resource) == 1).await);
    let quick = Retry::new()
        .with_delay(ms(200))
        .with_jitter(Duration::ZERO)
        .with_max_jitter(Duration::ZERO)
        .with_max_wait(secs(60));
    let second = spawn(b, "b", quick);
    assert!(eventually(secs(10), || queued(&cluster, resource) == 2).await);
    // The holder's keys vanish behind its back: no release names anyone.
    let freed = Instant::now();
    let key = crate::helpers::lock_key(resource);
    for node in &cluster.nodes {
        node.cli(&["DEL", &key]);
    }
    for task in [first, second] {
        tokio::time::timeout(secs(30), task)
            .await
            .expect("a waiter hung")
            .unwrap();
    }
    drop(holder);
    let order = order.lock().unwrap().clone();
    let names: Vec<&str> = order.iter().map(|(n, _)| *n).collect();
    let after = order[0].1 - freed;
    println!("grants {names:?}, the first {after:?} after the keys vanished");
    assert_eq!(
        names,
        ["a", "b"],
        "the head that was never told was skipped"
    );
    assert!(
        after < secs(5),
        "a went {after:?} after: at its own timer, not told"
    );
}

/// A waiter's task: its acquire's outcome and when it came.
pub(crate) type Waiting =
    tokio::task::JoinHandle<(Result<redfence::LockGuard, redfence::Error>, Instant)>;

/// A waiter of `client` on `resource` (30 s TTL) whose retry policy
/// sleeps 10 s: well before that, only a release notice wakes it.
pub(crate) fn spawn_notice_waiter(client: Client, resource: String) -> Waiting {
    spawn_notice_waiter_with(client, resource, secs(30))
}

/// [`spawn_notice_waiter`] asking for `ttl`.
pub(crate) fn spawn_notice_waiter_with(client: Client, resource: String, ttl: Duration) -> Waiting {
    tokio::spawn(async move {
        let got = client
            .lock(&resource, ttl)
            .retry(crate::helpers::notice_only_retry())
            .acquire()
            .await;
        (got, Instant::now())
    })
}

/// Releases `holder` and waits (`within` at most) for `waiter`: its
/// outcome and how long after the release it came.
pub(crate) async fn release_and_wait(
    holder: redfence::LockGuard,
    waiter: Waiting,
    within: Duration,
) -> (Result<redfence::LockGuard, redfence::Error>, Duration) {
    let (_, got, after) = release_and_wait_reporting(holder, waiter, within).await;
    (got, after)
}

/// [`release_and_wait`], with what the release reported.
pub(crate) async fn release_and_wait_reporting(
    holder: redfence::LockGuard,
    waiter: Waiting,
    within: Duration,
) -> (
    redfence::Released,
    Result<redfence::LockGuard, redfence::Error>,
    Duration,
) {
    let released_at = Instant::now();
    let released = holder.release().await;
    let (got, at) = tokio::time::timeout(within, waiter)
        .await
        .expect("the waiter hung")
        .unwrap();
    (released, got, at - released_at)
}

/// The first resource named `{prefix}-{i}` whose home is node `home` of
/// `nodes`.
pub(crate) fn homed_at(prefix: &str, home: usize, nodes: usize) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|r| home_index(r, nodes) == home)
        .unwrap_or_default()
}

/// The resource's home index as the client computes it (FNV-1a of the
/// name, its fence bucket, modulo N): a test picks a resource by its home.
fn home_index(resource: &str, nodes: usize) -> usize {
    let hash = resource.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    (hash % u64::from(redfence::limits::FENCE_BUCKETS)) as usize % nodes
}

/// A holder whose acquire never reached the resource's home node (its
/// connection there was down: the CI failure of a waiter over TLS woken
/// 9.7 s late, when the home's connect was still going as the round was
/// decided) still releases there: the home names the queued waiter, which
/// is woken by that notice, not by its 10 s timer. Without the release to
/// the home, nobody would name it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_names_the_next_waiter_on_a_home_its_acquire_missed() {
    use crate::support::proxy::Fault;
    let cluster = Cluster::start(3);
    let resource = homed_at("missed-home", 0, 3);
    // The holder reaches the home (node 0) through a proxy that resets
    // every connection; the waiter reaches every node directly.
    let proxy = crate::helpers::proxy_to(&cluster.nodes[0]);
    proxy.set(Fault::Reset);
    let mut urls = cluster.urls();
    urls[0] = proxy.url();
    let holder_client = crate::helpers::builder(urls)
        .node_timeout(ms(500))
        .reconnect_backoff_max(secs(2))
        .build()
        .unwrap();
    let waiter_client = client(&cluster, true);
    warm_up(&waiter_client, &cluster).await;
    // Failed connects double the pause before the next (25 ms up to 2 s):
    // a few acquires leave node 0 waiting out a long pause, in which the
    // holder's acquire skips it (not sent).
    for i in 0..8 {
        let probe = holder_client.acquire(&format!("probe-{i}"), secs(5)).await;
        drop(probe);
        tokio::time::sleep(ms(10 << i.min(6))).await;
    }
    let holder = holder_client.acquire(&resource, secs(30)).await.unwrap();
    let key = crate::helpers::lock_key(&resource);
    assert_eq!(cluster.nodes[0].cli(&["EXISTS", &key]).trim(), "0");
    proxy.set(Fault::Pass);
    let waiter = spawn_notice_waiter(waiter_client, resource);
    assert!(
        eventually(secs(10), || cluster.nodes[0]
            .cli(&["LLEN", &queue_key(holder.resource())])
            .trim()
            == "1")
        .await,
        "the waiter queued on the home"
    );
    // Past the holder's reconnect pause: its release can reach the home.
    tokio::time::sleep(secs(2)).await;
    let (got, after) = release_and_wait(holder, waiter, secs(30)).await;
    println!("a release to a home its acquire missed woke the waiter {after:?} after it");
    assert!(after < secs(5), "woken {after:?} after the release");
    got.expect("the waiter gets the lock").release().await;
}

/// A named waiter whose holder's release has reached the home node but
/// not yet the others (its requests still queued in the releasing client:
/// in `benches/hot.rs` at 8 × 4, 7 of 4,220 handoffs) is refused by a
/// majority while the home grants. No release will name it again: it
/// tries again within milliseconds instead of waiting for its 10 s timer.
/// The holder reaches nodes 1 and 2 through proxies that delay its release
/// by 30 ms; a round in which the waiter's named attempt came after the
/// release anyway (a loaded machine) proves nothing and is run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_waiter_refused_before_the_release_lands_tries_again_at_once() {
    late_release(false).await;
}

/// The same with node 2 down: the named attempt fails on node 1's late
/// release and on node 2's refused connection, so its reason is
/// `Unavailable`, not `Contended`; it must still try again at once. Before
/// the fix it waited for its 10 s timer (found in
/// `pregrant::a_young_subscription_asks_the_home_for_its_pregranted_vote`
/// on a loaded machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_node_down_a_named_waiter_refused_by_a_late_release_tries_again_at_once() {
    late_release(true).await;
}

/// See the two tests above; `down`: node 2 is killed after the warm-up.
async fn late_release(down: bool) {
    use crate::support::proxy::Fault;
    let mut cluster = Cluster::start(3);
    let resource = homed_at("late-release", 0, 3);
    let proxies = [
        crate::helpers::proxy_to(&cluster.nodes[1]),
        crate::helpers::proxy_to(&cluster.nodes[2]),
    ];
    let mut urls = cluster.urls();
    urls[1] = proxies[0].url();
    urls[2] = proxies[1].url();
    // Without the handover: a holder that hands the lock over sends no
    // release to nodes 1 and 2 at all, so no release can be late there.
    let holder_client = crate::helpers::builder(urls)
        .node_timeout(secs(1))
        .handover(false)
        .build()
        .unwrap();
    let waiter_client = client(&cluster, true);
    warm_up(&waiter_client, &cluster).await;
    for _ in 0..3 {
        holder_client
            .acquire("warm", secs(5))
            .await
            .unwrap()
            .release()
            .await;
    }
    if down {
        cluster.nodes[2].kill();
    }
    let mut raced = 0;
    for round in 0..10 {
        for proxy in &proxies {
            proxy.set(Fault::Pass);
        }
        let holder = holder_client.acquire(&resource, secs(30)).await.unwrap();
        // The holder's own ticket may be in the queue (its client joined:
        // its last release named a waiter).
        let llen = || -> usize {
            cluster.nodes[0]
                .cli(&["LLEN", &queue_key(&resource)])
                .trim()
                .parse()
                .unwrap_or(0)
        };
        let queued_before = llen();
        let before = waiter_client.stats().attempts;
        let waiter = spawn_notice_waiter(waiter_client.clone(), resource.clone());
        assert!(
            eventually(secs(10), || llen() == queued_before + 1).await,
            "the waiter queued on the home"
        );
        for proxy in &proxies {
            proxy.set(Fault::Delay(ms(30)));
        }
        let (got, after) = release_and_wait(holder, waiter, secs(30)).await;
        let guard = got.expect("the waiter gets the lock");
        // Its first attempt (refused: the lock was held), the named one,
        // and any quick retries.
        let attempts = waiter_client.stats().attempts - before;
        println!("round {round}: the waiter got the lock {after:?} after the release, in {attempts} attempts");
        guard.release().await;
        if attempts > 2 {
            raced += 1;
            assert!(
                after < secs(5),
                "a named waiter refused before the release landed waited {after:?}: for its timer"
            );
        }
        if raced == 3 {
            break;
        }
    }
    assert!(raced > 0, "no round raced the release: nothing was shown");
}

/// A holder granted by a majority without the resource's home (its
/// request there lost the race with the waiter's own attempt: the two
/// instances of `benches/once.rs` at an expiry) holds the lock for its
/// whole critical section, while the waiter, whose join found the home
/// free, takes its quick retries. The holder's release names the waiter
/// in the middle of a pause: the waiter attempts then, with the home's
/// vote that the release pre-granted to its ticket, and holds the lock on
/// every node. Before, it slept the pause out (here 1 s; in the bench the
/// non-computing instance ~20 ms behind), and its attempt took a fresh
/// value, which the home refused (it held the pre-grant): a lock on 2
/// nodes of 3 (the negative control, run with the plain sleep: `["0",
/// "1", "1"]`, granted 1.02 s after the release).
/// The waiter's node timeout of 5 s stretches its quick retries to pauses
/// of 1 ms up to 2 s; it is released once the waiter has made 12 attempts
/// (its first, the named one after its join, and 10 quick retries), in
/// the 1 s pause before the next. A round in which the waiter never
/// reached that pause proves nothing and is run again (up to 5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_in_its_quick_retries_hears_the_release_that_names_it() {
    let cluster = Cluster::start(3);
    let holder_client = client(&cluster, true);
    let waiter_client = crate::helpers::builder(cluster.urls())
        .node_timeout(secs(5))
        .fair(true)
        .build()
        .unwrap();
    warm_up(&holder_client, &cluster).await;
    warm_up(&waiter_client, &cluster).await;
    for round in 0..5 {
        let resource = homed_at(&format!("quick-named-{round}"), 0, 3);
        let holder = holder_client.acquire(&resource, secs(30)).await.unwrap();
        // The holder's key gone from the home: it holds nodes 1 and 2.
        let key = crate::helpers::lock_key(&resource);
        assert_eq!(cluster.nodes[0].cli(&["DEL", &key]).trim(), "1");
        let before = waiter_client.stats().attempts;
        let waiter = spawn_notice_waiter(waiter_client.clone(), resource.clone());
        let made = || waiter_client.stats().attempts - before;
        let in_pause = eventually(secs(5), || made() >= 12).await && made() < 14;
        if !in_pause {
            // No quick retries (on a loaded machine the cleanup of the
            // waiter's first attempt can land on the home after its join,
            // which then finds the lock held there), or past them: this
            // round proves nothing.
            println!(
                "round {round}: {} attempts, not in a quick retry's pause",
                made()
            );
            let (got, _) = release_and_wait(holder, waiter, secs(30)).await;
            got.expect("the waiter gets the lock").release().await;
            continue;
        }
        assert_eq!(queued(&cluster, &resource), 1, "the waiter queued");
        let at_release = made();
        let (got, after) = release_and_wait(holder, waiter, secs(30)).await;
        let guard = got.expect("the waiter gets the lock");
        let attempts = made() - at_release;
        println!(
            "round {round}: after {at_release} attempts the release named the waiter: granted {after:?} after it, in {attempts} attempt(s)"
        );
        // Usually 1; 2 when the naming outran the release's deletes on
        // nodes 1 and 2 (a loaded machine): the pre-granted attempt was
        // refused there, its value released everywhere, and a quick retry
        // took all three. Either way the home's vote is the waiter's.
        // The acquire returns at a majority: the last node's grant may
        // land after it.
        let held = || -> Vec<String> {
            cluster
                .nodes
                .iter()
                .map(|n| n.cli(&["EXISTS", &key]).trim().to_owned())
                .collect()
        };
        assert!(
            eventually(secs(5), || held() == ["1", "1", "1"]).await,
            "the waiter's lock on every node: {:?}",
            held()
        );
        guard.release().await;
        return;
    }
    panic!("no round reached the quick retries: nothing was shown");
}

/// A client's first waiter 33 places back looks at the queue once every 8
/// retry pauses, not at every pause: a hot lock's queue holds each
/// client's waiters in runs, and a waiter far back cannot find a dead
/// head (those near the head do). The 32 waiters ahead of it have a 10 s
/// pause and never look; the waiter's default policy pauses 50-150 ms, so
/// unstretched it looks about 40 times in 4 s (each look one `LPOS` on
/// the home node), stretched 5 to 11 times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_waiter_far_back_looks_at_every_eighth_pause() {
    let cluster = Cluster::start(3);
    let resource = "far-back";
    let home = &cluster.nodes[home_index(resource, 3)];
    let (holder_client, ahead, far) = (
        client(&cluster, true),
        client(&cluster, true),
        client(&cluster, true),
    );
    for c in [&holder_client, &ahead, &far] {
        warm_up(c, &cluster).await;
    }
    let holder = holder_client.acquire(resource, secs(30)).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let ahead = ahead.clone();
        tasks.push(tokio::spawn(async move {
            let _ = ahead
                .lock(resource, secs(30))
                .retry(patient())
                .acquire()
                .await;
        }));
    }
    assert!(eventually(secs(20), || queued(&cluster, resource) == 32).await);
    let before = crate::helpers::calls(home, "lpos");
    let waiter = far.clone();
    tasks.push(tokio::spawn(async move {
        let _ = waiter
            .lock(resource, secs(30))
            .retry(Retry::new().with_max_wait(secs(30)))
            .acquire()
            .await;
    }));
    assert!(eventually(secs(10), || queued(&cluster, resource) == 33).await);
    tokio::time::sleep(secs(4)).await;
    let looks = crate::helpers::calls(home, "lpos") - before;
    println!("33rd in the queue, the first waiter of its client looked {looks} times in 4 s");
    for task in &tasks {
        task.abort();
    }
    drop(holder);
    assert!(looks >= 1, "it never looked: the count shows nothing");
    assert!(
        looks <= 15,
        "{looks} looks in 4 s: at every pause, not every eighth"
    );
}

/// The home node restarted empty while 30 waiters of 3 clients queue: the
/// queue is gone, the release names nobody, and the waiters' timers
/// rebuild it (each first waiter puts its ticket back). Every waiter gets
/// the lock, one at a time, with tokens in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_home_restarted_empty_loses_only_the_queue() {
    let mut cluster = Cluster::start(3);
    let clients: Vec<Client> = (0..3).map(|_| client(&cluster, true)).collect();
    for c in &clients {
        warm_up(c, &cluster).await;
    }
    let holder = clients[0].acquire("restart-home", secs(30)).await.unwrap();
    let history = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for w in 0..30 {
        let c = clients[w % 3].clone();
        let history = history.clone();
        tasks.push(tokio::spawn(async move {
            let arrived = now_ns();
            let guard = c
                .lock("restart-home", secs(30))
                .retry(
                    Retry::new()
                        .with_delay(ms(200))
                        .with_jitter(ms(100))
                        .with_max_wait(secs(90)),
                )
                .acquire()
                .await
                .expect("every waiter gets the lock");
            let granted = now_ns();
            tokio::time::sleep(ms(2)).await;
            let token = guard.token().map_or(0, |t| t.get());
            history.lock().unwrap().push(Grant {
                arrived,
                granted,
                released: now_ns(),
                token,
                who: w as u64,
            });
            guard.release().await;
        }));
    }
    assert!(eventually(secs(20), || queued(&cluster, "restart-home") >= 27).await);
    let home = home_of(&cluster, "restart-home").expect("a home node");
    cluster.node(home).restart();
    assert_eq!(queued(&cluster, "restart-home"), 0, "restarted empty");
    // The looks rebuild the queue, and the rebuilt key expires again: the
    // look whose `RPUSH` created it sends its `PEXPIRE` (the clients' last
    // ones went with the old key, and still cover their waiters).
    let pttl = || -> i64 {
        cluster.nodes[home]
            .cli(&["PTTL", &queue_key("restart-home")])
            .trim()
            .parse()
            .unwrap_or(-2)
    };
    assert!(
        eventually(secs(20), || pttl() > 0).await,
        "the rebuilt queue has no expiry (PTTL {})",
        pttl()
    );
    holder.release().await;
    for t in tasks {
        tokio::time::timeout(secs(90), t)
            .await
            .expect("a waiter hung")
            .unwrap();
    }
    let history = history.lock().unwrap().clone();
    assert_eq!(history.len(), 30);
    assert_eq!(exclusion_and_order(&history), (0, 0), "{history:?}");
}

// ---------------------------------------------------------------------------
// Worker processes.

/// What worker processes run: `procs` processes of `tasks` tasks each,
/// looping for `run_for` and holding the lock `hold_ms`, with the fair
/// queue or without, and with the restart guard's window if any.
struct Workers {
    procs: usize,
    tasks: usize,
    fair: bool,
    hold_ms: u64,
    run_for: Duration,
    guard: Option<Duration>,
}

/// Starts the worker processes of `plan` on `resource`.
fn spawn_workers(cluster: &Cluster, resource: &str, plan: Workers) -> Vec<Child> {
    let Workers {
        procs,
        tasks,
        fair,
        hold_ms,
        run_for,
        guard,
    } = plan;
    let exe = std::env::current_exe().expect("the test binary");
    (0..procs)
        .map(|p| {
            Command::new(&exe)
                .args([
                    "fair::worker",
                    "--exact",
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .env("REDFENCE_FAIR_WORKER", "1")
                .env("W_URLS", cluster.urls().join(","))
                .env("W_RESOURCE", resource)
                .env("W_TASKS", tasks.to_string())
                .env("W_FAIR", if fair { "1" } else { "0" })
                .env("W_HOLD_MS", hold_ms.to_string())
                .env("W_MS", run_for.as_millis().to_string())
                .env("W_ID", p.to_string())
                .env("W_GUARD_MS", guard.map_or(0, |g| g.as_millis()).to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawning a worker")
        })
        .collect()
}

/// The grants a worker printed (`GRANT arrived granted released token
/// who`).
fn collect(child: Child) -> Vec<Grant> {
    let out = child.wait_with_output().expect("worker output");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(parse_grant)
        .collect()
}

fn parse_grant(line: &str) -> Option<Grant> {
    let mut f = line
        .strip_prefix("GRANT ")?
        .split(' ')
        .map(|x| x.parse::<u64>());
    Some(Grant {
        arrived: f.next()?.ok()?,
        granted: f.next()?.ok()?,
        released: f.next()?.ok()?,
        token: f.next()?.ok()?,
        who: f.next()?.ok()?,
    })
}

/// A worker process (does nothing unless started by `spawn_workers`):
/// `W_TASKS` tasks loop on the lock for `W_MS`, holding it `W_HOLD_MS`, and
/// print each grant.
#[test]
fn worker() {
    if std::env::var("REDFENCE_FAIR_WORKER").is_err() {
        return;
    }
    let var = |k: &str| std::env::var(k).expect(k);
    let urls: Vec<String> = var("W_URLS").split(',').map(str::to_owned).collect();
    let resource = var("W_RESOURCE");
    let tasks: usize = var("W_TASKS").parse().unwrap();
    let fair = var("W_FAIR") == "1";
    let hold = ms(var("W_HOLD_MS").parse().unwrap());
    let run_for = ms(var("W_MS").parse().unwrap());
    let id: u64 = var("W_ID").parse().unwrap();
    let guard: u64 = var("W_GUARD_MS").parse().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let mut builder = crate::helpers::builder(urls)
            .node_timeout(secs(1))
            .fair(fair);
        if guard > 0 {
            builder = builder.restart_guard(redfence::RestartGuard::new().with_window(ms(guard)));
        }
        let client = builder.build().unwrap();
        // Connect every node before the contention starts.
        for _ in 0..3 {
            let g = client.acquire("warm-up-worker", secs(5)).await.unwrap();
            g.release().await;
        }
        println!("READY");
        let end = Instant::now() + run_for;
        let mut handles = Vec::new();
        for t in 0..tasks {
            let (client, resource) = (client.clone(), resource.clone());
            handles.push(tokio::spawn(async move {
                while Instant::now() < end {
                    let arrived = now_ns();
                    let Ok(guard) = client
                        .lock(&resource, secs(10))
                        .retry(Retry::new().with_max_wait(secs(60)))
                        .acquire()
                        .await
                    else {
                        println!("FAILED");
                        continue;
                    };
                    let granted = now_ns();
                    tokio::time::sleep(hold).await;
                    let token = guard.token().map_or(0, |t| t.get());
                    let released = now_ns();
                    println!(
                        "GRANT {arrived} {granted} {released} {token} {}",
                        id * 100 + t as u64
                    );
                    guard.release().await;
                }
            }));
        }
        for h in handles {
            let _ = h.await;
        }
    });
}

/// 8 worker processes × 4 tasks loop on one lock for a few seconds: the
/// merged history has no overlap, tokens strictly in grant order, and
/// grants in arrival order: at most 5 % of grants overtake a waiter that
/// arrived more than 100 ms before them (on a loaded machine a task can
/// reach the home node tens of milliseconds after it called `acquire`;
/// a queue cycles through the 32 waiters in about 100–250 ms). Measured:
/// 0 of 720 alone, 19 of 676 (2.8 %) beside the rest of the suite on 2
/// cores. The control: the same processes without the fair queue overtake
/// such waiters in more than 20 % of grants (664 of 730 measured), so the
/// order check can fail. The counts at 25 ms are printed beside.
#[test]
fn processes_take_turns_in_arrival_order() {
    let cluster = Cluster::start(3);
    let (tight, margin) = (25_000_000, 100_000_000);
    let run = |fair: bool, resource: &str| {
        let workers = spawn_workers(
            &cluster,
            resource,
            Workers {
                procs: 8,
                tasks: 4,
                fair,
                hold_ms: 2,
                run_for: secs(4),
                guard: None,
            },
        );
        let history: Vec<Grant> = workers.into_iter().flat_map(collect).collect();
        let late = overtakes(&history, margin);
        let tight = overtakes(&history, tight).len();
        (history, late, tight)
    };
    let (fair, fair_late, fair_tight) = run(true, "procs-fair");
    let (classic, classic_late, classic_tight) = run(false, "procs-classic");
    let who = |h: &[Grant]| h.iter().map(|g| g.who).collect::<BTreeSet<_>>().len();
    println!(
        "8 processes x 4 tasks, 4 s: fair {} grants by {} tasks, {} overtaking by 100 ms ({fair_tight} by 25 ms); \
         classic {} grants by {} tasks, {} overtaking by 100 ms ({classic_tight} by 25 ms)",
        fair.len(),
        who(&fair),
        fair_late.len(),
        classic.len(),
        who(&classic),
        classic_late.len()
    );
    assert!(fair.len() >= 100, "only {} grants", fair.len());
    assert_eq!(exclusion_and_order(&fair), (0, 0));
    assert_eq!(exclusion_and_order(&classic), (0, 0));
    assert_eq!(who(&fair), 32, "every task got the lock");
    assert!(
        fair_late.len() * 20 <= fair.len(),
        "{} of {} fair grants overtook a waiter: {:?}",
        fair_late.len(),
        fair.len(),
        &fair_late[..fair_late.len().min(10)]
    );
    assert!(
        classic_late.len() * 5 > classic.len(),
        "the control: the classic competition kept order ({} of {})",
        classic_late.len(),
        classic.len()
    );
}

/// A worker process killed (`SIGKILL`) while its 4 tasks wait in the
/// queue leaves tickets nobody holds: the release that names the first
/// wakes nobody; the live waiter's timer finds the next one idle at the
/// head with the lock free and, a node timeout later, drops it with the
/// rest of that process's tickets. The live waiter gets the lock within a
/// TTL (10 s) of the release: measured 1.5 s (two pauses of its policy,
/// 0.5–0.7 s, and the 1 s node timeout).
#[test]
fn a_killed_waiter_process_holds_the_queue_up_less_than_a_ttl() {
    let cluster = Cluster::start(3);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let holder_client = client(&cluster, true);
    let holder = rt.block_on(async {
        warm_up(&holder_client, &cluster).await;
        holder_client.acquire("killed", secs(30)).await.unwrap()
    });
    // A worker whose 4 tasks queue behind the holder, then is killed.
    let mut doomed = spawn_workers(
        &cluster,
        "killed",
        Workers {
            procs: 1,
            tasks: 4,
            fair: true,
            hold_ms: 1,
            run_for: secs(60),
            guard: None,
        },
    )
    .remove(0);
    let waited = rt.block_on(async {
        assert!(
            eventually(secs(20), || queued(&cluster, "killed") == 4).await,
            "the worker's tasks did not queue"
        );
        doomed.kill().unwrap();
        let _ = doomed.wait();
        let other = client(&cluster, true);
        let waiter = tokio::spawn(async move {
            let got = other
                .lock("killed", secs(10))
                .retry(
                    Retry::new()
                        .with_delay(ms(500))
                        .with_jitter(ms(200))
                        .with_max_wait(secs(60)),
                )
                .acquire()
                .await;
            (got, Instant::now())
        });
        assert!(eventually(secs(10), || queued(&cluster, "killed") == 5).await);
        let (got, after) = release_and_wait(holder, waiter, secs(60)).await;
        got.expect("the live waiter gets the lock").release().await;
        after
    });
    println!("behind 4 dead tickets, the live waiter got the lock {waited:?} after the release");
    assert!(waited < secs(10), "{waited:?}: more than a TTL");
}

/// 4 worker processes × 4 tasks loop on one lock while its home node is
/// restarted empty (the queue, the node's keys and its fences gone) with
/// the restart guard on (a 1 s window): the merged history has no overlap
/// and tokens strictly in grant order, every task gets the lock after the
/// restart, and no acquire fails. The queue is only a hint; the quorum
/// and the guard carry safety through the restart.
#[test]
fn processes_keep_safe_turns_through_a_home_restarted_empty() {
    let mut cluster = Cluster::start(3);
    // Fresh servers sit out the guard's window first.
    std::thread::sleep(ms(1200));
    let resource = "restart-procs";
    let workers = spawn_workers(
        &cluster,
        resource,
        Workers {
            procs: 4,
            tasks: 4,
            fair: true,
            hold_ms: 2,
            run_for: secs(6),
            guard: Some(secs(1)),
        },
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let restarted = rt.block_on(async {
        assert!(
            eventually(secs(20), || queued(&cluster, resource) >= 4).await,
            "the queue never formed"
        );
        tokio::time::sleep(ms(1000)).await;
        let home = home_of(&cluster, resource).expect("a home node");
        cluster.node(home).restart();
        now_ns()
    });
    let mut history = Vec::new();
    let mut failed = 0;
    for child in workers {
        let out = child.wait_with_output().expect("worker output");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        failed += text.lines().filter(|l| *l == "FAILED").count();
        history.extend(text.lines().filter_map(parse_grant));
    }
    let after: BTreeSet<u64> = history
        .iter()
        .filter(|g| g.granted > restarted)
        .map(|g| g.who)
        .collect();
    // Per process (a task's id is process × 100 + task), for a run that
    // misses some: one process's four, or tasks spread over several?
    let per_process: Vec<usize> = (0..4)
        .map(|p| after.iter().filter(|&&who| who / 100 == p).count())
        .collect();
    println!(
        "home restarted empty under 4 processes x 4 tasks: {} grants, {} after the restart by {} tasks ({per_process:?} per process), {failed} failed acquires",
        history.len(),
        history.iter().filter(|g| g.granted > restarted).count(),
        after.len()
    );
    assert_eq!(exclusion_and_order(&history), (0, 0));
    assert_eq!(failed, 0, "acquires failed");
    assert_eq!(after.len(), 16, "every task got the lock after the restart");
}

/// How a client outside the fair queue asks for the lock.
#[derive(Debug, Clone, Copy)]
enum Outside {
    /// `try_acquire` every 25 ms.
    Try,
    /// `acquire` with `wake_on_release(false)`, 25 ms pauses.
    Polling,
    /// `acquire` with `fair(false)`: the classic competition, by notice.
    Classic,
}

/// Two fair clients with two tasks each take turns on `resource` for
/// `run` (each holds 20 ms, so the queue always holds a waiter) while one
/// client outside the queue asks as `how` says, back to back. Returns the
/// grants of the outside client and of the queue's four tasks.
async fn beside_a_busy_queue(cluster: &Cluster, resource: &str, how: Outside) -> (usize, usize) {
    let run = secs(4);
    let fair_clients = [client(cluster, true), client(cluster, true)];
    let outside = match how {
        Outside::Try | Outside::Classic => client(cluster, matches!(how, Outside::Try)),
        Outside::Polling => crate::helpers::builder(cluster.urls())
            .node_timeout(secs(1))
            .wake_on_release(false)
            .build()
            .unwrap(),
    };
    for c in fair_clients.iter().chain([&outside]) {
        warm_up(c, cluster).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let queue_grants = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for c in &fair_clients {
        for _ in 0..2 {
            let (c, r) = (c.clone(), resource.to_owned());
            let (stop, n) = (stop.clone(), queue_grants.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(g) = c.lock(&r, secs(5)).retry(patient()).acquire().await {
                        n.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(ms(20)).await;
                        g.release().await;
                    }
                }
            }));
        }
    }
    // The queue busy before the outside client starts.
    tokio::time::sleep(ms(300)).await;
    let started = Instant::now();
    let mut got = 0;
    while started.elapsed() < run {
        let guard = match how {
            Outside::Try => {
                let g = outside.try_acquire(resource, secs(5)).await.ok().flatten();
                if g.is_none() {
                    tokio::time::sleep(ms(25)).await;
                }
                g
            }
            Outside::Polling | Outside::Classic => {
                let left = run.saturating_sub(started.elapsed());
                let retry = Retry::new().with_delay(ms(25)).with_max_wait(left);
                outside
                    .lock(resource, secs(5))
                    .retry(retry)
                    .acquire()
                    .await
                    .ok()
            }
        };
        if let Some(g) = guard {
            got += 1;
            g.release().await;
        }
    }
    let queue = queue_grants.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = tokio::time::timeout(secs(15), t).await;
    }
    (got, queue)
}

/// Clients outside a fair queue that never empties (DESIGN.md, section 2,
/// fair queue, "Outside turns"). Issue 31: the release pre-granted the
/// home to the queue's next waiter in the script that deleted the
/// holder's key and handed it the other nodes, so the lock was never free
/// between turns: a polling client (`wake_on_release(false)`) got 0
/// grants in 6 s. Now its refused attempt claims a turn on the home, and
/// the next release of a holder from the queue reserves the home's vote
/// for it (the queue and the outside take turns). A client outside the
/// queue by notice (`fair(false)`) races the named waiter for the other
/// nodes, as in the classic competition, and claims turns too. A try does
/// not wait and does not claim: it succeeds when it finds the lock free,
/// which a busy queue never leaves it (printed, not asserted; the bound
/// for a client that must get the lock is waiting for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_outside_a_busy_queue_get_turns() {
    let cluster = Cluster::start(3);
    let (polling, queue_p) = beside_a_busy_queue(&cluster, "outside-poll", Outside::Polling).await;
    let (classic, queue_c) =
        beside_a_busy_queue(&cluster, "outside-classic", Outside::Classic).await;
    let (tries, queue_t) = beside_a_busy_queue(&cluster, "outside-try", Outside::Try).await;
    println!(
        "beside a busy queue for 4 s: polling {polling} (queue {queue_p}), fair(false) {classic} (queue {queue_c}), try_acquire every 25 ms {tries} (queue {queue_t})"
    );
    assert!(
        polling >= 5,
        "a polling client got {polling} grants beside a busy queue"
    );
    assert!(
        classic >= 5,
        "a fair(false) client got {classic} grants beside a busy queue"
    );
    for queue in [queue_p, queue_c, queue_t] {
        assert!(queue >= 5, "the queue itself got {queue} grants");
    }
}

/// An uncontended cycle pays only for what it uses (issue 32): `acquire`
/// (the fair queue's default path) of free resources subscribes to
/// nothing, as `try_acquire` never did, asks for no holder's `PTTL`, and
/// their releases ask nobody whether someone listens. Before, every such
/// acquire sent a `SUBSCRIBE` to the resource's home (and an
/// `UNSUBSCRIBE` a moment later): 1.00 per cycle; and its transaction
/// carried a `PTTL` on every node, 1.00 per node and cycle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_acquire_subscribes_to_nothing() {
    let cluster = Cluster::start(3);
    let (c, other) = two_fair_clients(&cluster).await;
    let subscribes = || -> u64 {
        cluster
            .nodes
            .iter()
            .map(|n| calls(n, "subscribe") + calls(n, "ssubscribe"))
            .sum()
    };
    let numsubs = || -> u64 {
        cluster
            .nodes
            .iter()
            .map(|n| calls(n, "pubsub|numsub") + calls(n, "lindex"))
            .sum()
    };
    // Which release script each release ran: the lean one (issue 32: two
    // keys, the value, nothing else) or the full one.
    let sha = |source: &str| redis::Script::new(source).get_hash().to_owned();
    let (lean, full) = (
        sha(include_str!("../../src/wire/lua/release_lean.lua")),
        sha(include_str!("../../src/wire/lua/release.lua")),
    );
    let monitors: Vec<_> = cluster.nodes.iter().map(|n| n.monitor()).collect();
    let ran = |sha: &str| -> usize {
        monitors
            .iter()
            .map(|m| m.lines().iter().filter(|l| l.contains(sha)).count())
            .sum()
    };
    let pttls = || -> u64 { cluster.nodes.iter().map(|n| calls(n, "pttl")).sum() };
    let (before, looked, probed) = (subscribes(), numsubs(), pttls());
    for i in 0..40 {
        let g = c.acquire(&format!("free-{i}"), secs(5)).await.unwrap();
        g.release().await;
    }
    // Every node of each ran the lean release once, 120 in all, and the
    // full one never (before, the two others of the three nodes ran the
    // full script, whose four arguments cost Redis more). Counted once the
    // background halves of the releases have landed (MONITOR's stream may
    // lag a moment behind the replies).
    assert!(
        eventually(secs(10), || ran(&lean) == 120).await,
        "lean release scripts for 40 releases on 3 nodes: {}",
        ran(&lean)
    );
    assert_eq!(
        ran(&full),
        0,
        "full release scripts for 40 uncontended releases"
    );
    assert_eq!(
        subscribes() - before,
        0,
        "SUBSCRIBEs for 40 uncontended acquires"
    );
    assert_eq!(pttls() - probed, 0, "PTTLs for 40 uncontended acquires");
    // Nobody waits, so no release asks who listens or looks at a queue:
    // its script reads the lock key and the waiting marker in one `MGET`
    // and deletes. Before, every release ran `PUBSUB NUMSUB` on every node
    // (and `LINDEX` on the home once its client had subscribed).
    assert_eq!(
        numsubs() - looked,
        0,
        "PUBSUB NUMSUB and LINDEX calls for 40 uncontended releases"
    );
    // The control: a contended acquire does subscribe.
    let held = c.acquire("held", secs(5)).await.unwrap();
    let waiter = spawn_notice_waiter(other, "held".to_owned());
    assert!(eventually(secs(10), || queued(&cluster, "held") == 1).await);
    assert!(
        subscribes() > before,
        "a waiting acquire subscribed to nothing"
    );
    // (The counter sees a `PTTL` run inside a script: the waiter's join
    // reads the holder's on the home.)
    assert!(pttls() > probed, "a waiter's join read no PTTL");
    let (full_before, lean_before) = (ran(&full), ran(&lean));
    let (got, _) = release_and_wait(held, waiter, secs(20)).await;
    assert!(
        numsubs() > looked,
        "a release with a waiter queued asked nobody who listens"
    );
    // The holder's client knew of no waiter: the lean release went first
    // everywhere; the home found the waiting marker (a fair waiter marks
    // the home only) and the full one followed there.
    assert!(
        eventually(secs(10), || ran(&lean) - lean_before == 3).await,
        "lean releases of the held lock: {} (3 expected, one per node)",
        ran(&lean) - lean_before
    );
    assert!(
        eventually(secs(10), || ran(&full) - full_before == 1).await,
        "full releases of the held lock: {} (1 expected: the home's after the lean one)",
        ran(&full) - full_before
    );
    got.unwrap().release().await;
}

/// A quiet holder's release sends the lean script to every node (issue
/// 32); a node where the resource is marked as waited for answers -1 and
/// gets the full release, which publishes the notice. A waiter outside
/// the queue (`fair(false)`) marks every node; with the resource's home
/// killed, only the other two nodes' notices can wake it, and it gets the
/// lock within seconds of the release, where its retry policy alone would
/// sleep 10 s and the holder's keys, left by a lean script that changed
/// nothing, would live 30 s. The holder's next release then sends the full
/// script at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marked_node_gets_the_full_release_after_the_lean_one() {
    let mut cluster = Cluster::start(3);
    let (holder, waiting) = (client(&cluster, true), client(&cluster, false));
    warm_up(&holder, &cluster).await;
    warm_up(&waiting, &cluster).await;
    let resource = homed_at("marked", 0, 3);
    let sha = |source: &str| redis::Script::new(source).get_hash().to_owned();
    let (lean, full) = (
        sha(include_str!("../../src/wire/lua/release_lean.lua")),
        sha(include_str!("../../src/wire/lua/release.lua")),
    );
    let guard = holder.acquire(&resource, secs(30)).await.unwrap();
    cluster.node(0).kill();
    let monitors: Vec<_> = cluster.nodes[1..].iter().map(|n| n.monitor()).collect();
    // The holder's scripts only: its values begin with its tag (the
    // waiter's refused attempts are cleaned up with scripts of their own).
    let tag = format!("\"{}:", holder.id());
    let ran = |sha: &str| -> Vec<usize> {
        monitors
            .iter()
            .map(|m| {
                m.lines()
                    .iter()
                    .filter(|l| l.contains(sha) && l.contains(&tag))
                    .count()
            })
            .collect()
    };
    let marker = format!("{}wait:{resource}", redfence::limits::DEFAULT_PREFIX);
    let waiter = spawn_notice_waiter(waiting, resource.clone());
    // The waiter was refused, marked both live nodes and subscribed there.
    let ready = eventually(secs(10), || {
        cluster.nodes[1..].iter().all(|n| {
            n.cli(&["EXISTS", &marker]).trim() == "1"
                && n.cli(&["PUBSUB", "NUMSUB", &format!("{}@0", lock_key(&resource))])
                    .lines()
                    .nth(1)
                    .is_some_and(|subs| subs.trim() != "0")
        })
    })
    .await;
    assert!(
        ready,
        "the waiter did not mark and subscribe on nodes 1 and 2"
    );
    let released_at = Instant::now();
    let release = tokio::spawn(guard.release());
    let (got, at) = tokio::time::timeout(secs(20), waiter)
        .await
        .expect("the waiter hung")
        .unwrap();
    let after = at - released_at;
    let second = got.expect("the waiter gets the lock from nodes 1 and 2");
    assert!(
        after < secs(5),
        "the waiter got the lock {after:?} after the release: not by a notice"
    );
    // Each live node ran the lean script, found the marker, then the full
    // one.
    assert!(
        eventually(secs(10), || ran(&lean) == [1, 1] && ran(&full) == [1, 1]).await,
        "the holder's lean {:?} and full {:?} releases on nodes 1 and 2 (one each expected)",
        ran(&lean),
        ran(&full)
    );
    let _ = release.await;
    second.release().await;
    // The holder's client now knows the resource is waited for: its next
    // release within `MARKED_FOR` (5 s) sends the full script at once,
    // without the lean one's round trip (a waiter outside the queue is
    // never named, so nothing else would tell it).
    let again = holder.acquire(&resource, secs(30)).await.unwrap();
    again.release().await;
    assert!(
        eventually(secs(10), || ran(&full) == [2, 2]).await,
        "the holder's full releases on nodes 1 and 2: {:?} (two each expected)",
        ran(&full)
    );
    assert_eq!(
        ran(&lean),
        [1, 1],
        "the holder's lean releases on nodes 1 and 2, the second release included"
    );
}

/// A waiter whose first attempt fails just before the holder's release:
/// it subscribes, waits for the confirmation, then joins, so the release
/// either finds its ticket (and names it) or its join finds the lock free
/// (and it attempts at once). 40 rounds with the release 0–3 ms after the
/// waiter starts: every waiter gets the lock well before its 10 s
/// fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_joining_during_the_release_is_still_woken() {
    let cluster = Cluster::start(3);
    let (a, b) = two_fair_clients(&cluster).await;
    let mut slowest = Duration::ZERO;
    for round in 0..40 {
        let resource = format!("racing-{round}");
        let held = a.acquire(&resource, secs(30)).await.unwrap();
        let waiter = spawn_notice_waiter(b.clone(), resource.clone());
        tokio::time::sleep(Duration::from_micros(rand::random_range(0..3_000))).await;
        let (got, after) = release_and_wait(held, waiter, secs(20)).await;
        got.unwrap_or_else(|e| panic!("round {round}: {e}"))
            .release()
            .await;
        slowest = slowest.max(after);
    }
    println!("a waiter racing the release: the slowest got the lock {slowest:?} after it");
    assert!(
        slowest < secs(2),
        "a waiter got the lock {slowest:?} after the release"
    );
}
