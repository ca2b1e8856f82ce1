//! Waiting by notification versus polling, on one contended resource.
//!
//! `cargo bench --bench waiting` starts 5 `redis-server`s. In every row 200
//! waiter tasks contend for one resource: acquire (fenced, the default),
//! hold 1 ms, release. In `once` rows each waiter does that once, while
//! the others queue (the measured span ends when the last is done); in
//! `loop` rows each goes straight back to acquiring, for a fixed window (a
//! waiter that just released then competes with those already waiting).
//! Rows differ in how a refused waiter
//! waits: `notify` is the default (sleep until a release is heard, the
//! holder's TTL runs out, or the retry policy's jittered delay), `poll` is
//! `wake_on_release(false)` with the default retry policy (50 ms + a jitter
//! window growing from 100 ms to 1 s), `poll tight` the same with 5 ms +
//! 10 ms, a policy tuned for throughput. Each runs with the 200 waiters in
//! one client, and spread over 4 clients (50 each: four service instances,
//! where the clients' heads race for each release).
//!
//! Measured per row, in the window only:
//! - acquisitions per second;
//! - handoff: from the moment a holder starts its release to the moment the
//!   next `acquire` returns (p50, p99);
//! - Redis commands per second summed over the 5 nodes, from
//!   `INFO commandstats` (every command counted, including those a script or
//!   a `MULTI` runs; our own `CONFIG RESETSTAT` is subtracted), and per
//!   acquisition;
//! - attempts (quorum rounds) per acquisition, from `Client::stats()`;
//! - fairness over the 200 waiters: Jain's index of their acquisition counts
//!   (1 = perfectly even), and how many never got the lock.
//!
//! "One round trip" is the p50 of an uncontended acquire on the same 5
//! nodes, measured first in the same run. Mutual exclusion is checked in
//! every row (an overlap exits 1). `REDFENCE_BENCH_SECS` sets the window
//! (default 3 s), `REDFENCE_BENCH_WAITERS` the number of waiters (default
//! 200; CI's smoke run takes 40, since the `once` rows of the polling
//! modes wait out every waiter's backoff one after another).

#[path = "common/mod.rs"]
mod common;
#[path = "../tests/support/process.rs"]
mod process;
#[path = "../tests/support/server.rs"]
mod server;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redfence::{Client, Retry};
use server::RedisServer;

/// The waiters per row: `REDFENCE_BENCH_WAITERS`, default 200.
fn waiters() -> usize {
    static WAITERS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *WAITERS.get_or_init(|| {
        std::env::var("REDFENCE_BENCH_WAITERS")
            .ok()
            .and_then(|s| s.parse().ok())
            .filter(|&n: &usize| n > 0)
            .unwrap_or(200)
    })
}
const NODES: usize = 5;
const HOLD: Duration = Duration::from_millis(1);
const TTL: Duration = Duration::from_secs(10);

#[derive(Clone, Copy)]
enum Mode {
    Notify,
    Poll,
    PollTight,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Notify => "notify",
            Mode::Poll => "poll",
            Mode::PollTight => "poll tight",
        }
    }

    fn retry(self) -> Retry {
        let patient = Retry::new().with_max_wait(Duration::from_secs(600));
        match self {
            Mode::Notify | Mode::Poll => patient,
            Mode::PollTight => patient
                .with_delay(Duration::from_millis(5))
                .with_jitter(Duration::from_millis(10))
                .with_max_jitter(Duration::from_millis(10)),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Once,
    Loop,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Once => "once",
            Scenario::Loop => "loop",
        }
    }
}

struct Row {
    scenario: Scenario,
    mode: Mode,
    clients: usize,
    secs: f64,
    acquisitions: u64,
    handoffs: Vec<Duration>,
    commands: u64,
    attempts: u64,
    jain: f64,
    starved: usize,
    overlaps: u64,
    errors: u64,
}

fn main() {
    // A clear line and exit status 2, not a panic, without redis-server
    // or with a bad REDFENCE_BENCH_SECS.
    let secs = match common::preflight(3.0) {
        Ok(secs) if secs > 0.0 => secs,
        Ok(_) => {
            eprintln!("REDFENCE_BENCH_SECS=0: this bench needs a window above 0 s (e.g. 0.2)");
            std::process::exit(2);
        }
        Err(code) => std::process::exit(code),
    };
    let nodes: Vec<RedisServer> = (0..NODES).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
    let rt = common::runtime();
    let started = Instant::now();
    let rtt = rt.block_on(round_trip(&urls, secs.min(1.0)));
    let mut rows = Vec::new();
    for scenario in [Scenario::Once, Scenario::Loop] {
        for clients in [1, 4] {
            for mode in [Mode::Notify, Mode::Poll, Mode::PollTight] {
                rows.push(rt.block_on(contend(&nodes, &urls, scenario, mode, clients, secs)));
            }
        }
    }
    drop(rt);
    print_report(&rows, rtt, secs);
    let keys: usize = nodes.iter().map(|n| n.count_keys("redfence:lock:*")).sum();
    println!("\nlock keys left on the nodes: {keys}");
    println!("bench wall time: {:.1} s", started.elapsed().as_secs_f64());
    let broken = rows.iter().any(|r| r.overlaps > 0 || r.errors > 0) || keys > 0;
    if broken {
        println!(
            "\nINVARIANT BROKEN: overlapping holders, failed acquisitions or keys left (exit 1)"
        );
        // `exit` runs no destructors: stop the servers first.
        drop(nodes);
        std::process::exit(1);
    }
}

/// p50 of an uncontended acquire on the 5 nodes: the lock's round trip.
async fn round_trip(urls: &[String], secs: f64) -> Duration {
    let client = common::bench_builder(urls).build().expect("client");
    let mut samples = Vec::new();
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut i = 0u64;
    while Instant::now() < end || samples.len() < 50 {
        i += 1;
        let t = Instant::now();
        let guard = client
            .acquire(&format!("rtt-{}", i % 16), TTL)
            .await
            .expect("uncontended acquire");
        if i > 20 {
            samples.push(t.elapsed());
        }
        guard.release().await;
    }
    samples.sort();
    samples[samples.len() / 2]
}

async fn contend(
    nodes: &[RedisServer],
    urls: &[String],
    scenario: Scenario,
    mode: Mode,
    clients: usize,
    secs: f64,
) -> Row {
    let clients: Vec<Client> = (0..clients)
        .map(|_| {
            common::bench_builder(urls)
                .wake_on_release(matches!(mode, Mode::Notify))
                .build()
                .expect("client")
        })
        .collect();
    for client in &clients {
        // Connect every node before the window.
        for _ in 0..3 {
            let g = client.acquire("warm", TTL).await.expect("warm-up");
            g.release().await;
        }
    }
    let resource = format!(
        "sale-{}-{}-{}",
        scenario.name(),
        mode.name().replace(' ', "-"),
        clients.len()
    );
    // The first holder keeps the lock until every waiter is queued.
    let first = clients[0]
        .acquire(&resource, TTL)
        .await
        .expect("first holder");
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let measuring = Arc::new(AtomicBool::new(false));
    let last_release: Arc<Mutex<Option<Instant>>> = Arc::default();
    let handoffs: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..waiters()).map(|_| AtomicU64::new(0)).collect());
    let mut tasks = Vec::new();
    for w in 0..waiters() {
        let client = clients[w % clients.len()].clone();
        let (resource, inside, overlaps, errors, measuring, last_release, handoffs, counts) = (
            resource.clone(),
            inside.clone(),
            overlaps.clone(),
            errors.clone(),
            measuring.clone(),
            last_release.clone(),
            handoffs.clone(),
            counts.clone(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let guard = match client
                    .lock(&resource, TTL)
                    .retry(mode.retry())
                    .acquire()
                    .await
                {
                    Ok(guard) => guard,
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                };
                let granted = Instant::now();
                if inside.swap(true, Ordering::SeqCst) {
                    overlaps.fetch_add(1, Ordering::Relaxed);
                }
                // Declared after the guard: a holder aborted at the end of
                // the window leaves the section before its guard's drop
                // releases, as a release does.
                let section = Section(inside.clone());
                if measuring.load(Ordering::Relaxed) {
                    counts[w].fetch_add(1, Ordering::Relaxed);
                    if let Some(released) = *last_release.lock().unwrap() {
                        handoffs.lock().unwrap().push(granted - released);
                    }
                }
                tokio::time::sleep(HOLD).await;
                drop(section);
                *last_release.lock().unwrap() = Some(Instant::now());
                guard.release().await;
                if scenario == Scenario::Once {
                    return;
                }
            }
        }));
    }
    // Let the queue form, then measure from the first holder's release.
    // Polling waiters have each made their first attempt; notified ones
    // are all queued (those that found others of their client queued
    // joined without an attempt).
    let stats_start: Vec<_> = clients.iter().map(Client::stats).collect();
    let formed = Instant::now() + Duration::from_secs(30);
    while Instant::now() < formed {
        let (made, queued) = clients
            .iter()
            .zip(&stats_start)
            .fold((0, 0), |(m, q), (c, b)| {
                let now = c.stats();
                (m + now.attempts - b.attempts, q + now.waiting)
            });
        let done = match mode {
            Mode::Notify => queued >= waiters() as u64,
            _ => made >= waiters() as u64,
        };
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(Instant::now() < formed, "the queue did not form in 30 s");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stats_before: Vec<_> = clients.iter().map(Client::stats).collect();
    common::reset_stats(nodes);
    measuring.store(true, Ordering::SeqCst);
    let window = Instant::now();
    *last_release.lock().unwrap() = Some(Instant::now());
    first.release().await;
    match scenario {
        Scenario::Loop => tokio::time::sleep(Duration::from_secs_f64(secs)).await,
        Scenario::Once => {
            let limit = Instant::now() + Duration::from_secs(120);
            while tasks.iter().any(|t| !t.is_finished()) && Instant::now() < limit {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }
    measuring.store(false, Ordering::SeqCst);
    let elapsed = window.elapsed().as_secs_f64();
    let commands: u64 = nodes.iter().map(common::command_calls).sum();
    let attempts: u64 = clients
        .iter()
        .zip(&stats_before)
        .map(|(c, b)| c.stats().attempts - b.attempts)
        .sum();
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        let _ = task.await;
    }
    // Aborted holders release in the background; let that finish.
    let deadline = Instant::now() + Duration::from_secs(5);
    while nodes.iter().any(|n| n.count_keys("redfence:lock:*") > 0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let per_waiter: Vec<f64> = counts
        .iter()
        .map(|c| c.load(Ordering::Relaxed) as f64)
        .collect();
    let sum: f64 = per_waiter.iter().sum();
    let squares: f64 = per_waiter.iter().map(|x| x * x).sum();
    let jain = if squares > 0.0 {
        sum * sum / (per_waiter.len() as f64 * squares)
    } else {
        0.0
    };
    let mut handoffs = handoffs.lock().unwrap().clone();
    handoffs.sort();
    Row {
        scenario,
        mode,
        clients: clients.len(),
        secs: elapsed,
        acquisitions: sum as u64,
        handoffs,
        commands,
        attempts,
        jain,
        starved: per_waiter.iter().filter(|x| **x == 0.0).count(),
        overlaps: overlaps.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
    }
}

/// A holder's critical section: cleared when left, also by a task aborted
/// inside it (without this, the abort at the end of a window left it set
/// and the next grant, after the aborted guard's release, counted as an
/// overlap: CI saw one in the `loop notify 4` row; with 3 ms between the
/// aborts, as a preempted thread on a loaded machine makes them, the old
/// count found 1-2 in five of six rows, polling ones included, and this one
/// none).
struct Section(Arc<AtomicBool>);

impl Drop for Section {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

fn pct(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    Some(sorted[i])
}

fn ms(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{:.2}", d.as_secs_f64() * 1e3))
}

fn print_report(rows: &[Row], rtt: Duration, secs: f64) {
    println!(
        "waiting: {} waiters, one resource, {NODES} nodes, hold {HOLD:?}, window {secs} s per row; \
         one round trip (uncontended 5-node acquire p50) = {:.3} ms",
        waiters(),
        rtt.as_secs_f64() * 1e3
    );
    println!();
    println!(
        "| run | wait | clients | span s | acq/s | handoff p50 ms | p99 ms | p50 ÷ RTT | Redis cmds/s | cmds/acq | attempts/acq | Jain | never got it | overlaps |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let acq = r.acquisitions.max(1) as f64;
        let p50 = pct(&r.handoffs, 0.5);
        println!(
            "| {} | {} | {} | {:.2} | {:.0} | {} | {} | {} | {:.0} | {:.1} | {:.2} | {:.3} | {} | {} |",
            r.scenario.name(),
            r.mode.name(),
            r.clients,
            r.secs,
            r.acquisitions as f64 / r.secs,
            ms(p50),
            ms(pct(&r.handoffs, 0.99)),
            p50.map_or("-".into(), |p| format!(
                "{:.2}×",
                p.as_secs_f64() / rtt.as_secs_f64()
            )),
            r.commands as f64 / r.secs,
            r.commands as f64 / acq,
            r.attempts as f64 / acq,
            r.jain,
            r.starved,
            r.overlaps,
        );
    }
    println!();
    for scenario in [Scenario::Once, Scenario::Loop] {
        for clients in [1, 4] {
            let row = |mode: &str| {
                rows.iter().find(|r| {
                    r.scenario == scenario && r.clients == clients && r.mode.name() == mode
                })
            };
            let per = |r: &Row| r.commands as f64 / r.acquisitions.max(1) as f64;
            let rate = |r: &Row| r.acquisitions as f64 / r.secs;
            if let (Some(n), Some(p), Some(t)) = (row("notify"), row("poll"), row("poll tight")) {
                println!(
                    "{} × {clients} client(s): commands per acquisition, poll ÷ notify = {:.1}×, poll tight ÷ notify = {:.1}×; acquisitions/s, notify ÷ poll = {:.1}×, notify ÷ poll tight = {:.1}×",
                    scenario.name(),
                    per(p) / per(n),
                    per(t) / per(n),
                    rate(n) / rate(p),
                    rate(n) / rate(t),
                );
            }
        }
    }
}
