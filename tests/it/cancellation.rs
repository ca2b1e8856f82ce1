//! Futures dropped at arbitrary points: an acquire cut off mid-flight, a
//! release cut off, a `with_lock` cut off while its closure runs, guards
//! dropped instead of released. Afterwards the resource must be free and no
//! key may be left behind. The TTL is long (30 s) so that a leaked key is
//! still there when the test looks, instead of quietly expiring.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::FutureExt;
use redfence::{AutoExtend, Client};
use tokio::time::timeout;

use crate::helpers::{
    client_with_timeout, eventually, ms, new_client, pttl, secs, warm_up, LOCK_KEYS,
};
use crate::support::server::Monitor;
use crate::support::Cluster;

const TTL: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
struct Outcomes {
    cut_off: usize,
    acquired: usize,
}

/// A random budget of 0..2 ms, with every tenth one long enough to let the
/// acquire through, so both "dropped mid-flight" and "acquired, then dropped
/// or released" happen on any machine (and `chaos` drops every tenth acquire
/// after its first poll).
fn budget(i: usize) -> Duration {
    if i % 10 == 9 {
        ms(200)
    } else {
        Duration::from_micros(rand::random_range(0..2_000))
    }
}

/// Runs `rounds` acquires under random deadlines; whatever got through is
/// dropped, released under a random deadline, or released in full.
async fn chaos(client: &Client, resource: &str, rounds: usize) -> Outcomes {
    let mut outcomes = Outcomes::default();
    for i in 0..rounds {
        let acquired = if i % 10 == 4 {
            // Polled once (its requests on their way), then dropped: a
            // cut-off in every run, however fast the nodes answer. (A zero
            // `timeout` is not one: tokio's timer rounds it up to the next
            // millisecond, time enough for an idle machine to answer.)
            client.acquire(resource, TTL).now_or_never().ok_or(())
        } else {
            timeout(budget(i), client.acquire(resource, TTL))
                .await
                .map_err(|_| ())
        };
        match acquired {
            Err(()) => outcomes.cut_off += 1,
            Ok(Ok(guard)) => {
                outcomes.acquired += 1;
                match i % 3 {
                    0 => drop(guard),
                    1 => {
                        let _ = timeout(budget(i + 1), guard.release()).await;
                    }
                    _ => {
                        guard.release().await;
                    }
                }
            }
            Ok(Err(e)) => panic!("round {i}: {e}"),
        }
    }
    outcomes
}

/// Nothing left on any node, and the lock is free right away.
async fn assert_free(cluster: &Cluster, client: &Client, resource: &str) {
    let n = cluster.nodes.len();
    let clean = eventually(secs(3), || cluster.count_keys(LOCK_KEYS) == vec![0; n]).await;
    if !clean {
        let key = crate::helpers::lock_key(resource);
        let ttls: Vec<i64> = cluster.nodes.iter().map(|node| pttl(node, &key)).collect();
        panic!(
            "lock keys leaked: {:?}, pttl {ttls:?}",
            cluster.count_keys(LOCK_KEYS)
        );
    }
    let started = Instant::now();
    let guard = client.try_acquire(resource, TTL).await.unwrap();
    assert!(guard.is_some(), "resource still locked");
    assert!(started.elapsed() < secs(2));
    guard.unwrap().release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_acquires_leave_no_lock() {
    let cluster = Cluster::start(3);
    let client = client_with_timeout(cluster.urls(), ms(300));
    warm_up(&client, &cluster).await;
    let outcomes = chaos(&client, "chaos", 200).await;
    assert!(outcomes.cut_off > 0, "{outcomes:?}");
    assert!(outcomes.acquired > 0, "{outcomes:?}");
    assert_free(&cluster, &client, "chaos").await;
}

/// The first calls of a fresh client are cut off while it is still
/// connecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_while_connecting_leaves_no_lock() {
    let cluster = Cluster::start(3);
    for _ in 0..20 {
        let client = crate::helpers::client(cluster.urls()).unwrap();
        let budget = Duration::from_micros(rand::random_range(0..3_000));
        if let Ok(result) = timeout(budget, client.acquire("connecting", TTL)).await {
            drop(result.unwrap());
        }
        // The client itself goes away too; its background releases must not
        // depend on it.
        drop(client);
    }
    assert_free(&cluster, &new_client(&cluster), "connecting").await;
}

/// `with_lock` cut off while its closure runs: the closure's future is
/// dropped first, then the lock is released in the background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_with_lock_releases() {
    let cluster = Cluster::start(3);
    let client = new_client(&cluster);
    warm_up(&client, &cluster).await;
    for round in 0..20 {
        let cut = timeout(
            ms(50),
            client.with_lock("scoped-chaos", TTL, |_| tokio::time::sleep(secs(10))),
        )
        .await;
        assert!(
            cut.is_err(),
            "round {round}: the closure cannot finish in time"
        );
        // Freed long before the TTL.
        assert!(
            eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await,
            "round {round}: {:?}",
            cluster.count_keys(LOCK_KEYS)
        );
    }
    assert_free(&cluster, &client, "scoped-chaos").await;
}

/// With a frozen node every request to it queues up in its socket; when it
/// thaws it runs our SETs and our releases in order, leaving nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_acquires_with_a_frozen_node_leave_no_lock() {
    let mut cluster = Cluster::start(3);
    let client = client_with_timeout(cluster.urls(), ms(300));
    warm_up(&client, &cluster).await;
    cluster.node(1).pause();
    let outcomes = chaos(&client, "frozen-chaos", 60).await;
    assert!(outcomes.cut_off > 0, "{outcomes:?}");
    cluster.node(1).resume();
    assert_free(&cluster, &client, "frozen-chaos").await;
}

/// Polls a future until it has returned `Pending` `cuts` times, then drops
/// it: a cancellation at its `cuts`-th await point (0: dropped before its
/// first poll). `Some` when the future finished first.
struct Cut<F: Future> {
    fut: Pin<Box<F>>,
    left: usize,
}

impl<F: Future> Cut<F> {
    fn new(fut: F, cuts: usize) -> Self {
        Self {
            fut: Box::pin(fut),
            left: cuts,
        }
    }
}

impl<F: Future> Future for Cut<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        match self.fut.as_mut().poll(cx) {
            Poll::Ready(out) => Poll::Ready(Some(out)),
            Poll::Pending => {
                self.left -= 1;
                if self.left == 0 {
                    Poll::Ready(None)
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

/// The lock's TTL in the every-await tests: long beside the checks' 2 s,
/// so a key nobody released is still there when they look.
const CUT_TTL: Duration = Duration::from_secs(8);
/// The auto-extension's period at [`CUT_TTL`]: a watchdog still running
/// extends within it.
const CUT_EXTEND_EVERY: Duration = Duration::from_secs(1);

/// The SHA1 of the extend script, as `EVALSHA` names it in `MONITOR`.
fn extend_sha() -> String {
    let script = include_str!("../../src/wire/lua/extend.lua");
    sha1_smol::Sha1::from(script).digest().to_string()
}

/// A client of its own for each cut (its watchdog gauge counts that
/// case's tasks alone), with a 300 ms node timeout, connected to every
/// node: its warm-up lock (a resource of its own, as the cases run side by
/// side) reached all of them.
async fn cut_client(cluster: &Cluster, resource: &str) -> Client {
    warmed(
        client_with_timeout(cluster.urls(), ms(300)),
        cluster,
        resource,
    )
    .await
}

/// [`cut_client`]'s warm-up, of `client`.
async fn warmed(client: Client, cluster: &Cluster, resource: &str) -> Client {
    let key = crate::helpers::lock_key(&format!("{resource}-warm"));
    let on_every_node = || {
        cluster
            .nodes
            .iter()
            .all(|n| n.cli(&["EXISTS", &key]).trim() == "1")
    };
    for _ in 0..50 {
        let guard = client
            .acquire(&format!("{resource}-warm"), secs(5))
            .await
            .unwrap();
        let all = on_every_node();
        guard.release().await;
        if all {
            return client;
        }
    }
    panic!("{resource}: the nodes were never all reached");
}

fn auto() -> AutoExtend {
    AutoExtend::new().with_interval(CUT_EXTEND_EVERY)
}

/// What one cut left behind, if anything: a lock key still on a node
/// 2 s after the cut, a watchdog task of `client` still alive once the key
/// is gone, or an extend of the key sent after it was gone.
async fn left_behind(
    cluster: &Cluster,
    client: &Client,
    monitors: &[Monitor],
    resource: &str,
    cut: usize,
) -> Option<String> {
    let key = crate::helpers::lock_key(resource);
    let gone = eventually(secs(2), || {
        cluster
            .nodes
            .iter()
            .all(|n| n.cli(&["EXISTS", &key]).trim() == "0")
    })
    .await;
    if !gone {
        let ttls: Vec<i64> = cluster.nodes.iter().map(|n| pttl(n, &key)).collect();
        return Some(format!(
            "cut at await {cut}: the lock key outlived the cut by 2 s (pttl {ttls:?})"
        ));
    }
    // An aborted task ends at once; a leaked one would sleep until its
    // next extension, a second away.
    if !eventually(ms(500), || client.stats().watchdogs == 0).await {
        return Some(format!(
            "cut at await {cut}: {} watchdog task(s) alive after the lock was freed",
            client.stats().watchdogs
        ));
    }
    let seen: Vec<usize> = monitors.iter().map(|m| m.lines().len()).collect();
    tokio::time::sleep(CUT_EXTEND_EVERY * 2 + ms(500)).await;
    let (sha, quoted) = (extend_sha(), format!("\"{key}\""));
    for (m, from) in monitors.iter().zip(seen) {
        let lines = m.lines();
        if let Some(line) = lines[from.min(lines.len())..]
            .iter()
            .find(|l| l.contains(&quoted) && l.contains(&sha))
        {
            return Some(format!(
                "cut at await {cut}: an extend after the key was gone: {line}"
            ));
        }
    }
    None
}

/// Runs `case` with cuts at 0, 1, 2, … awaits, a few at a time on
/// resources of their own, until one finishes before its cut (every await
/// point it reached was cut in some case). Returns the number of cuts.
async fn at_every_await<C, Fut>(case: C) -> usize
where
    C: Fn(usize) -> Fut,
    Fut: Future<Output = Option<String>>,
{
    const BATCH: usize = 6;
    let mut from = 0;
    loop {
        assert!(from < 120, "no case finished within 120 awaits");
        let results = futures::future::join_all((from..from + BATCH).map(&case)).await;
        let problems: Vec<String> = results.into_iter().flatten().collect();
        let finished: Vec<&String> = problems
            .iter()
            .filter(|p| p.starts_with("finished"))
            .collect();
        let real: Vec<&String> = problems
            .iter()
            .filter(|p| !p.starts_with("finished"))
            .collect();
        assert!(real.is_empty(), "{real:#?}");
        if !finished.is_empty() {
            return from + BATCH;
        }
        from += BATCH;
    }
}

/// `release()` of an auto-extended guard cut at every await point: the
/// lock is freed (by the release or in the background) and the watchdog is
/// gone. Issue 31: a cut at the first await (stopping the watchdog) marked
/// the guard released before anything was sent, so its drop did nothing
/// and the lock stayed for its whole TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_cut_at_every_await_frees_the_lock() {
    let cluster = Cluster::start(3);
    let monitors: Vec<Monitor> = cluster.nodes.iter().map(|n| n.monitor()).collect();
    let cuts = at_every_await(|cut| {
        let (cluster, monitors) = (&cluster, &monitors);
        async move {
            let resource = format!("cut-release-{cut}");
            let client = &cut_client(cluster, &resource).await;
            let guard = client
                .lock(resource.clone(), CUT_TTL)
                .auto_extend(auto())
                .acquire()
                .await
                .unwrap();
            let finished = Cut::new(guard.release(), cut).await.is_some();
            if let Some(problem) = left_behind(cluster, client, monitors, &resource, cut).await {
                return Some(problem);
            }
            finished.then(|| "finished".to_owned())
        }
    })
    .await;
    println!("release: cut at every await up to {cuts}");
}

/// `release()` cut at every await point while a waiter of another client,
/// outside the fair queue (`fair(false)`), has marked every node as waited
/// for: each node answers the lean release with -1 and needs the full
/// release after it (issue 32), so a cut can fall between the two. Whatever
/// the cut, the holder's value is gone from every node within 2 s (by the
/// release or in the background), and the waiter, which retries only on a
/// notice (its fallback 10 s away), gets the lock within 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_cut_at_every_await_frees_a_lock_waited_for() {
    let cluster = Cluster::start(3);
    let cuts = at_every_await(|cut| {
        let cluster = &cluster;
        async move {
            let resource = format!("cut-marked-{cut}");
            let holder = cut_client(cluster, &resource).await;
            let waiting = crate::helpers::builder(cluster.urls())
                .node_timeout(ms(300))
                .fair(false)
                .build()
                .unwrap();
            let waiting = warmed(waiting, cluster, &format!("{resource}-waiter")).await;
            let key = crate::helpers::lock_key(&resource);
            let marker = format!("{}wait:{resource}", redfence::limits::DEFAULT_PREFIX);
            let guard = holder.acquire(&resource, CUT_TTL).await.unwrap();
            let value = cluster
                .nodes
                .iter()
                .map(|n| n.cli(&["GET", &key]).trim().to_owned())
                .find(|v| !v.is_empty())
                .expect("the holder's key on some node");
            let waiter = tokio::spawn({
                let resource = resource.clone();
                async move {
                    waiting
                        .lock(&resource, secs(5))
                        .retry(crate::helpers::notice_only_retry())
                        .acquire()
                        .await
                }
            });
            let marked = eventually(secs(10), || {
                cluster
                    .nodes
                    .iter()
                    .all(|n| n.cli(&["EXISTS", &marker]).trim() == "1")
            })
            .await;
            if !marked {
                return Some(format!(
                    "cut at await {cut}: the waiter never marked every node"
                ));
            }
            let finished = Cut::new(guard.release(), cut).await.is_some();
            let gone = eventually(secs(2), || {
                cluster
                    .nodes
                    .iter()
                    .all(|n| n.cli(&["GET", &key]).trim() != value)
            })
            .await;
            if !gone {
                let ttls: Vec<i64> = cluster.nodes.iter().map(|n| pttl(n, &key)).collect();
                return Some(format!(
                    "cut at await {cut}: the holder's key outlived the cut by 2 s (pttl {ttls:?})"
                ));
            }
            match timeout(secs(5), waiter).await {
                Ok(Ok(Ok(second))) => {
                    second.release().await;
                }
                Ok(Ok(Err(e))) => {
                    return Some(format!("cut at await {cut}: the waiter failed: {e}"))
                }
                Ok(Err(e)) => return Some(format!("cut at await {cut}: the waiter panicked: {e}")),
                Err(_) => {
                    return Some(format!(
                        "cut at await {cut}: the waiter did not get the lock within 5 s"
                    ))
                }
            }
            finished.then(|| "finished".to_owned())
        }
    })
    .await;
    println!("release of a lock waited for: cut at every await up to {cuts}");
}

/// A multi-resource set's `release()` (auto-extended, so its first await
/// stops the set's watchdog) cut at every await point: every key of the
/// set is gone from every node within 2 s (by the release or in the
/// background: `MultiGuard::release` promises it is cancel-safe as the
/// mutex's is), and no watchdog is left. Two nets catch a cut: the set's
/// drop and, under it, its guards' drops; with both skipping their
/// release, cuts 0 and 1 (the latter while the watchdog stops) left the
/// three keys on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_release_cut_at_every_await_frees_every_key() {
    let cluster = Cluster::start(3);
    let cuts = at_every_await(|cut| {
        let cluster = &cluster;
        async move {
            let names: Vec<String> = (0..3).map(|i| format!("cut-set-{cut}-{i}")).collect();
            let client = &cut_client(cluster, &names[0]).await;
            let guard = client
                .lock_set(names.clone(), CUT_TTL)
                .auto_extend(auto())
                .acquire()
                .await
                .unwrap();
            let finished = Cut::new(guard.release(), cut).await.is_some();
            let keys: Vec<String> = names.iter().map(|n| crate::helpers::lock_key(n)).collect();
            let left = || -> Vec<usize> {
                cluster
                    .nodes
                    .iter()
                    .map(|n| {
                        keys.iter()
                            .filter(|k| n.cli(&["EXISTS", k]).trim() == "1")
                            .count()
                    })
                    .collect()
            };
            if !eventually(secs(2), || left() == [0, 0, 0]).await {
                return Some(format!(
                    "cut at await {cut}: keys of the set outlived the cut by 2 s, per node {:?}",
                    left()
                ));
            }
            if !eventually(ms(500), || client.stats().watchdogs == 0).await {
                return Some(format!(
                    "cut at await {cut}: {} watchdog task(s) alive after the set was freed",
                    client.stats().watchdogs
                ));
            }
            finished.then(|| "finished".to_owned())
        }
    })
    .await;
    println!("set release: cut at every await up to {cuts}");
}

/// `extend()` cut at every await point: the guard still releases the lock
/// at once, everywhere the extend may have reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_cut_at_every_await_leaves_the_release_intact() {
    let cluster = Cluster::start(3);
    let monitors: Vec<Monitor> = cluster.nodes.iter().map(|n| n.monitor()).collect();
    let cuts = at_every_await(|cut| {
        let (cluster, monitors) = (&cluster, &monitors);
        async move {
            let resource = format!("cut-extend-{cut}");
            let client = &cut_client(cluster, &resource).await;
            let guard = client.acquire(&resource, CUT_TTL).await.unwrap();
            let finished = Cut::new(guard.extend(CUT_TTL * 2), cut).await.is_some();
            guard.release().await;
            if let Some(problem) = left_behind(cluster, client, monitors, &resource, cut).await {
                return Some(problem);
            }
            finished.then(|| "finished".to_owned())
        }
    })
    .await;
    println!("extend: cut at every await up to {cuts}");
}

/// An auto-extended `acquire()` cut at every await point: whatever it set
/// is released, and no watchdog outlives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_cut_at_every_await_leaves_nothing() {
    let cluster = Cluster::start(3);
    let monitors: Vec<Monitor> = cluster.nodes.iter().map(|n| n.monitor()).collect();
    let cuts = at_every_await(|cut| {
        let (cluster, monitors) = (&cluster, &monitors);
        async move {
            let resource = format!("cut-acquire-{cut}");
            let client = &cut_client(cluster, &resource).await;
            let request = client
                .lock(resource.clone(), CUT_TTL)
                .auto_extend(auto())
                .acquire();
            let got = Cut::new(request, cut).await;
            let finished = got.is_some();
            if let Some(guard) = got {
                guard.unwrap().release().await;
            }
            if let Some(problem) = left_behind(cluster, client, monitors, &resource, cut).await {
                return Some(problem);
            }
            finished.then(|| "finished".to_owned())
        }
    })
    .await;
    println!("acquire: cut at every await up to {cuts}");
}

/// An auto-extended `with_lock` whose closure awaits twice, cut at every
/// await point (the acquire's, the closure's, the release's): the lock is
/// freed and no watchdog outlives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_with_lock_cut_at_every_await_frees_the_lock() {
    let cluster = Cluster::start(3);
    let monitors: Vec<Monitor> = cluster.nodes.iter().map(|n| n.monitor()).collect();
    let cuts = at_every_await(|cut| {
        let (cluster, monitors) = (&cluster, &monitors);
        async move {
            let resource = format!("cut-with-lock-{cut}");
            let client = &cut_client(cluster, &resource).await;
            let run = client
                .lock(resource.clone(), CUT_TTL)
                .auto_extend(auto())
                .run(|_lease| async {
                    tokio::task::yield_now().await;
                    tokio::time::sleep(ms(5)).await;
                });
            let finished = Cut::new(run, cut).await.is_some();
            if let Some(problem) = left_behind(cluster, client, monitors, &resource, cut).await {
                return Some(problem);
            }
            finished.then(|| "finished".to_owned())
        }
    })
    .await;
    println!("with_lock: cut at every await up to {cuts}");
}

/// A waiting acquire (the fair queue: join, look, named attempt) cut at
/// every await point while another client holds the lock: its ticket
/// leaves the queue, and once the holder releases nothing is left. Issue
/// 31: cut while its first join was in flight, the waiter had not yet
/// armed its leave, and the ticket stayed queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_cut_at_every_await_leaves_the_queue() {
    let cluster = Cluster::start(3);
    let holder = client_with_timeout(cluster.urls(), ms(300));
    warm_up(&holder, &cluster).await;
    let monitors: Vec<Monitor> = cluster.nodes.iter().map(|n| n.monitor()).collect();
    let cuts = at_every_await(|cut| {
        let (cluster, monitors, holder) = (&cluster, &monitors, &holder);
        async move {
            let resource = format!("cut-wait-{cut}");
            let client = &cut_client(cluster, &resource).await;
            let held = holder.acquire(&resource, CUT_TTL).await.unwrap();
            let queue = format!("{}queue:{resource}", redfence::limits::DEFAULT_PREFIX);
            let queued = || -> usize {
                cluster
                    .nodes
                    .iter()
                    .map(|n| {
                        n.cli(&["LLEN", &queue])
                            .trim()
                            .parse::<usize>()
                            .unwrap_or(0)
                    })
                    .sum()
            };
            // A first waiter of the same client, queued: the cut one then
            // finds the resource busy and joins the queue at once (its
            // first await is the join).
            let first = {
                let (client, resource) = (client.clone(), resource.clone());
                tokio::spawn(async move {
                    let retry = redfence::Retry::new().with_max_wait(secs(20));
                    let _ = client.lock(resource, CUT_TTL).retry(retry).acquire().await;
                })
            };
            assert!(eventually(secs(10), || queued() == 1).await);
            tokio::time::sleep(ms(200)).await;
            let wait = client
                .lock(resource.clone(), CUT_TTL)
                .auto_extend(auto())
                .retry(redfence::Retry::new().with_max_wait(ms(800)))
                .acquire();
            let finished = Cut::new(wait, cut).await.is_some();
            first.abort();
            let emptied = eventually(secs(2), || queued() == 0).await;
            if !emptied {
                let lens: Vec<String> = cluster
                    .nodes
                    .iter()
                    .map(|n| n.cli(&["LLEN", &queue]))
                    .collect();
                return Some(format!(
                    "cut at await {cut}: the ticket stayed queued ({lens:?})"
                ));
            }
            held.release().await;
            if let Some(problem) = left_behind(cluster, client, monitors, &resource, cut).await {
                return Some(problem);
            }
            finished.then(|| "finished".to_owned())
        }
    })
    .await;
    println!("waiting acquire: cut at every await up to {cuts}");
}
