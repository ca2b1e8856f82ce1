//! One hot lock: K clients × T tasks on one resource, with the fair queue
//! (the default) and without it (`fair(false)`: the clients' heads compete
//! for each release), against one task back to back on the same nodes.
//!
//! `cargo bench --bench hot` starts 5 lock nodes and a data node. Every
//! task loops: acquire (fenced, the default), a `GET` and a `SET` on the
//! data node inside the lock, release. Each shape is measured right after
//! its own 1 × 1 row (one task back to back), the base of its ratios; one
//! unreported 1 × 1 row warms the servers up first. Measured per row, in
//! the window only (`REDFENCE_BENCH_SECS`, default 3 s, after 0.5 s of
//! warm-up):
//! - acquisitions per second, and ÷ the 1 × 1 row (target ≥ 0.9×);
//! - Redis commands per acquisition over the 5 lock nodes, from
//!   `INFO commandstats` (every command counted, including those a script
//!   runs), and ÷ the 1 × 1 row (target ≤ 1.1×);
//! - attempts (quorum rounds) per acquisition;
//! - fairness over the K clients (equal demand: T tasks each): Jain's
//!   index of their acquisition counts;
//! - order: a grant *overtook* a waiter that called `acquire` more than
//!   2 ms earlier and still waits (arrivals closer than that may join the
//!   queue in either order); the share of grants that overtook anyone, and
//!   the most waiters one grant overtook;
//! - each acquisition's wait, p50 and p99, against the queue's bound: the
//!   waiters ahead (K × T − 1) × the mean handoff (1 ÷ acquisitions/s);
//! - CPU per acquisition (this process, and the six `redis-server`s), and
//!   the `redis-server`s' `read` + `write` system calls per acquisition:
//!   the messages they took in and sent.
//!
//! Two controls:
//! - `1 x 1 (+31 idle)`, the last row, is one task back to back beside 31
//!   built and warmed clients that send nothing: what many clients in one
//!   process cost while idle.
//! - The `relay` row of each shape runs the same K × T tasks taking turns
//!   through an in-process baton (task w wakes task w + 1, another
//!   client's, after its release): no task asks while another holds, so
//!   each acquisition is the 1 × 1 row's, and the queue is never used. It
//!   measures what handing the turn between these tasks and clients costs
//!   with nothing in Redis to order them: the ceiling for a queue whose
//!   handoff costs one task's release and acquire. `fair ÷ relay` is the
//!   fair queue's own cost below 1, and what the handover saves above 1.
//!
//! Mutual exclusion is checked in every row (an overlap exits 1).
//! `REDFENCE_BENCH_ROWS=smoke` runs two small shapes (CI);
//! `REDFENCE_BENCH_ROWS=32x2,1x1+31` runs the shapes listed (clients x
//! tasks, + idle clients), and `REDFENCE_BENCH_FAIR=only` leaves out the
//! rows without the queue; `REDFENCE_BENCH_HANDOVER=both` adds, to each
//! shape, the fair queue without the handover (`Builder::handover(false)`)
//! in the same alternation.

#[path = "common/mod.rs"]
mod common;
#[path = "../tests/support/process.rs"]
mod process;
#[path = "../tests/support/server.rs"]
mod server;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redfence::{Client, Retry};
use server::RedisServer;

const NODES: usize = 5;
const TTL: Duration = Duration::from_secs(10);
const WARM: Duration = Duration::from_millis(500);
/// The longest warm-up: see `contend`.
const WARM_MAX: Duration = Duration::from_secs(10);
/// Arrivals closer than this may join the queue in either order.
const SAME_ARRIVAL: Duration = Duration::from_millis(2);
/// How long the last releases may take to reach every node, the runtime
/// still alive, before the keys are counted.
const DRAIN_BOUND: Duration = Duration::from_secs(2);

/// How a row's tasks take the lock.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The fair queue (the default).
    Fair,
    /// `fair(false)`: each client's head competes for each release.
    Off,
    /// The control: the tasks take turns through an in-process baton, so
    /// no acquire meets a held lock (fair clients; the queue is not used).
    Relay,
    /// The fair queue with `handover(false)`: a contended release deletes
    /// everywhere (`REDFENCE_BENCH_HANDOVER=both`).
    NoHandover,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Fair => "fair",
            Mode::Off => "off",
            Mode::Relay => "relay",
            Mode::NoHandover => "fair, no handover",
        }
    }
}

struct Row {
    /// The row of the 1 x 1 reference this row's ratios are to.
    base: usize,
    clients: usize,
    /// Clients built and warmed beside the working ones, sending nothing.
    idle: usize,
    tasks: usize,
    mode: Mode,
    secs: f64,
    acquisitions: u64,
    commands: u64,
    attempts: u64,
    per_client: Vec<u64>,
    overtaking: u64,
    most_overtaken: u64,
    waits: Vec<Duration>,
    overlaps: u64,
    errors: u64,
    /// CPU time in the window: this process (every client) and the lock
    /// and data nodes' `redis-server` processes, in ns.
    client_cpu: u64,
    redis_cpu: u64,
    /// The Redis processes' `read` + `write` system calls in the window:
    /// the messages they took in and sent.
    redis_io: u64,
    /// This row's rate over its reference's, round by round (empty for a
    /// reference row).
    by_round: Vec<f64>,
}

impl Row {
    /// Adds another round's window of the same shape and queue.
    fn absorb(&mut self, other: Row) {
        self.secs += other.secs;
        self.acquisitions += other.acquisitions;
        self.commands += other.commands;
        self.attempts += other.attempts;
        for (mine, theirs) in self.per_client.iter_mut().zip(&other.per_client) {
            *mine += theirs;
        }
        self.overtaking += other.overtaking;
        self.most_overtaken = self.most_overtaken.max(other.most_overtaken);
        self.waits.extend(other.waits);
        self.waits.sort();
        self.overlaps += other.overlaps;
        self.errors += other.errors;
        self.client_cpu += other.client_cpu;
        self.redis_cpu += other.redis_cpu;
        self.redis_io += other.redis_io;
        self.by_round.extend(other.by_round);
    }

    fn rate(&self) -> f64 {
        self.acquisitions as f64 / self.secs
    }
    fn per_acq(&self, n: u64) -> f64 {
        n as f64 / self.acquisitions.max(1) as f64
    }
}

fn main() {
    let secs = match common::preflight(3.0) {
        Ok(secs) if secs > 0.0 => secs,
        Ok(_) => {
            eprintln!("REDFENCE_BENCH_SECS=0: this bench needs a window above 0 s (e.g. 0.5)");
            std::process::exit(2);
        }
        Err(code) => std::process::exit(code),
    };
    let smoke = std::env::var("REDFENCE_BENCH_ROWS").is_ok_and(|r| r == "smoke");
    let nodes: Vec<RedisServer> = (0..NODES).map(|_| RedisServer::start()).collect();
    let data = RedisServer::start();
    let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
    let rt = common::runtime();
    let started = Instant::now();
    let shapes: Vec<(usize, usize, usize)> = match std::env::var("REDFENCE_BENCH_ROWS") {
        _ if smoke => vec![(2, 4, 0), (8, 4, 0)],
        Ok(list) if !list.is_empty() => parse_shapes(&list),
        _ => vec![
            (2, 1, 0),
            (2, 4, 0),
            (2, 250, 0),
            (8, 4, 0),
            (8, 125, 0),
            (32, 2, 0),
            (32, 31, 0),
            (1, 1, 31),
        ],
    };
    let both = std::env::var("REDFENCE_BENCH_FAIR").map_or(true, |f| f != "only");
    // `REDFENCE_BENCH_HANDOVER=both`: each shape also runs the fair queue
    // with `handover(false)`, in the same alternation.
    let no_handover = std::env::var("REDFENCE_BENCH_HANDOVER").is_ok_and(|h| h == "both");
    let rounds = if smoke { 1 } else { rounds() };
    let window = secs / rounds as f64;
    let one = |rt: &tokio::runtime::Runtime, secs| {
        rt.block_on(contend(&nodes, &urls, &data, (1, 0), 1, Mode::Fair, secs))
    };
    // Fresh servers and a cold process run the first row slower (up to a
    // third in a run of 2026-12-02): a warm-up row, not reported.
    let _ = one(&rt, secs.min(1.0));
    // Each shape alternates with its own 1 x 1 reference, the base of its
    // ratios, round by round (reference, fair, relay, off; again): the
    // machine's speed drifts by up to 40 % within a run, and alternating
    // short windows puts both sides of a ratio in the same stretch of it.
    let mut rows = Vec::new();
    for &(k, t, idle) in &shapes {
        let classic = both && idle == 0;
        // The relay control where turns pass between tasks (not in smoke
        // runs: CI checks the invariants, not the figures).
        let relay = k * t > 1 && !smoke;
        let modes: Vec<Option<Mode>> = [
            None,
            Some(Mode::Fair),
            Some(Mode::NoHandover),
            Some(Mode::Relay),
            Some(Mode::Off),
        ]
        .into_iter()
        .filter(|m| match m {
            Some(Mode::Off) => classic,
            Some(Mode::Relay) => relay,
            Some(Mode::NoHandover) => no_handover && k * t > 1,
            _ => true,
        })
        .collect();
        let mut merged: Vec<Option<Row>> = modes.iter().map(|_| None).collect();
        // A hot lock's queue serves each client's tasks in a run, so a
        // window must hold several turns of the queue for the clients'
        // shares (Jain) to mean anything: at least K x T / 400 s (about
        // five turns at 2,000 acquisitions/s). 1 s windows gave 0.983 at
        // 32 x 31, with every client served once per turn.
        let window = window.max((k * t) as f64 / 400.0);
        for _ in 0..rounds {
            let mut base_rate = 0.0;
            for (mode, slot) in modes.iter().zip(merged.iter_mut()) {
                let mut row = match mode {
                    None => one(&rt, window),
                    Some(mode) => {
                        rt.block_on(contend(&nodes, &urls, &data, (k, idle), t, *mode, window))
                    }
                };
                match mode {
                    None => base_rate = row.rate(),
                    Some(_) => row.by_round.push(row.rate() / base_rate.max(1e-9)),
                }
                match slot {
                    Some(sum) => sum.absorb(row),
                    None => *slot = Some(row),
                }
            }
        }
        let base = rows.len();
        for (i, mut row) in merged.into_iter().flatten().enumerate() {
            if i > 0 {
                row.base = base;
            }
            rows.push(row);
        }
    }
    // A release returns at the majority and finishes on the other nodes in
    // the background, on this runtime (`Released::pending`); dropping the
    // runtime at once would close connections with releases still queued on
    // them (DESIGN.md, section 2, "A short-lived process must not exit while
    // the library still has releases in the background"), and leave their
    // keys for the TTL: twice in CI, after the last row. So they are waited
    // for while the runtime lives, up to `DRAIN_BOUND`, as `peers` does. A
    // key set after its release (a straggler) lives for the 10 s TTL and is
    // still counted below.
    let lock_keys = || -> usize {
        nodes
            .iter()
            .map(|n| n.count_keys("redfence:lock:*"))
            .fold(0, usize::saturating_add)
    };
    let (at_end, drain) = (lock_keys(), Instant::now());
    while lock_keys() > 0 && drain.elapsed() < DRAIN_BOUND {
        std::thread::sleep(Duration::from_millis(5));
    }
    let drained = drain.elapsed();
    drop(rt);
    report(&rows, secs, rounds);
    let keys = lock_keys();
    println!(
        "\nlock keys at the end of the last row: {at_end} (releases on their way; waited {:.0} ms)",
        drained.as_secs_f64() * 1000.0
    );
    println!("lock keys left on the nodes: {keys}");
    // Which, if any: a key left names its holder (the value starts with
    // the client's tag) and, by its TTL, when it was set.
    for (i, n) in nodes.iter().enumerate() {
        let listed = n.cli(&["KEYS", "redfence:lock:*"]);
        for k in listed.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let (value, pttl) = (n.cli(&["GET", k]), n.cli(&["PTTL", k]));
            println!(
                "  node {i}: {k} = {} (PTTL {} ms)",
                value.trim(),
                pttl.trim()
            );
        }
    }
    println!("load average: {}", common::loadavg());
    println!("bench wall time: {:.1} s", started.elapsed().as_secs_f64());
    if rows.iter().any(|r| r.overlaps > 0 || r.errors > 0) || keys > 0 {
        println!(
            "\nINVARIANT BROKEN: overlapping holders, failed acquisitions or keys left (exit 1)"
        );
        // `exit` runs no destructors: stop the servers first (a broken run
        // of 2026-12-02 left its six behind).
        drop(nodes);
        drop(data);
        std::process::exit(1);
    }
}

/// `REDFENCE_BENCH_ROUNDS=5`: the rounds each row's window is split into
/// (3 by default; `smoke` runs 1).
fn rounds() -> u64 {
    match std::env::var("REDFENCE_BENCH_ROUNDS") {
        Err(_) => 3,
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(n) if (1..=100).contains(&n) => n,
            _ => {
                eprintln!("REDFENCE_BENCH_ROUNDS={text}: expected a whole number from 1 to 100");
                std::process::exit(2);
            }
        },
    }
}

/// `REDFENCE_BENCH_ROWS=32x2,8x4,1x1+31`: the shapes to run (clients x
/// tasks, + idle clients).
fn parse_shapes(list: &str) -> Vec<(usize, usize, usize)> {
    let shape = |s: &str| {
        let (k, rest) = s.trim().split_once('x')?;
        let (t, idle) = rest.split_once('+').unwrap_or((rest, "0"));
        Some((k.parse().ok()?, t.parse().ok()?, idle.parse().ok()?))
    };
    let shapes: Option<Vec<_>> = list.split(',').map(shape).collect();
    shapes.unwrap_or_else(|| {
        eprintln!("REDFENCE_BENCH_ROWS={list}: expected `smoke` or shapes like `32x2,8x4,1x1+31`");
        std::process::exit(2);
    })
}

/// Waiters that called `acquire` and have not got it, by arrival.
type Waiting = Arc<Mutex<BTreeSet<(Instant, usize)>>>;

#[allow(clippy::too_many_arguments)]
async fn contend(
    nodes: &[RedisServer],
    urls: &[String],
    data: &RedisServer,
    (clients, idle): (usize, usize),
    tasks: usize,
    mode: Mode,
    secs: f64,
) -> Row {
    let clients_v: Vec<Client> = (0..clients + idle)
        .map(|_| {
            common::bench_builder(urls)
                .fair(mode != Mode::Off)
                .handover(mode != Mode::NoHandover)
                .build()
                .expect("client")
        })
        .collect();
    let resource = format!("hot-{clients}x{tasks}+{idle}-{}", mode.name());
    for client in &clients_v {
        for warm in ["warm", "warm", "warm"] {
            let g = client.acquire(warm, TTL).await.expect("warm-up");
            g.release().await;
        }
    }
    let data_client = redis::Client::open(data.url()).expect("data url");
    let data_conn = data_client
        .get_multiplexed_async_connection()
        .await
        .expect("data node");
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..clients).map(|_| AtomicU64::new(0)).collect());
    let waiting: Waiting = Arc::default();
    let order = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let waits: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let granted_total = Arc::new(AtomicU64::new(0));
    // The relay's baton: task w waits on `batons[w]` and passes it to
    // `batons[w + 1]` (task 0 starts with it).
    let n = clients * tasks;
    let batons: Arc<Vec<tokio::sync::Notify>> =
        Arc::new((0..n).map(|_| tokio::sync::Notify::new()).collect());
    batons[0].notify_one();
    let relay = mode == Mode::Relay;
    let mut handles = Vec::new();
    for w in 0..n {
        let c = w % clients;
        let baton = relay.then(|| batons.clone());
        let next = baton.clone();
        let pass = move || {
            if let Some(batons) = &next {
                batons[(w + 1) % n].notify_one();
            }
        };
        let client = clients_v[c].clone();
        let mut conn = data_conn.clone();
        let granted_total = granted_total.clone();
        let (resource, inside, overlaps, errors, measuring, stop, counts, waiting, order, waits) = (
            resource.clone(),
            inside.clone(),
            overlaps.clone(),
            errors.clone(),
            measuring.clone(),
            stop.clone(),
            counts.clone(),
            waiting.clone(),
            order.clone(),
            waits.clone(),
        );
        handles.push(tokio::spawn(async move {
            loop {
                if let Some(batons) = &baton {
                    batons[w].notified().await;
                }
                if stop.load(Ordering::Relaxed) {
                    // Passed on, so that every task sees the stop.
                    pass();
                    break;
                }
                let arrived = Instant::now();
                waiting.lock().unwrap().insert((arrived, w));
                let acquired = client
                    .lock(&resource, TTL)
                    .retry(Retry::new().with_max_wait(Duration::from_secs(60)))
                    .acquire()
                    .await;
                let granted = Instant::now();
                let overtaken = {
                    let mut waiting = waiting.lock().unwrap();
                    waiting.remove(&(arrived, w));
                    waiting
                        .iter()
                        .take_while(|(t, _)| *t + SAME_ARRIVAL < arrived)
                        .count() as u64
                };
                let guard = match acquired {
                    Ok(guard) => guard,
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        pass();
                        continue;
                    }
                };
                granted_total.fetch_add(1, Ordering::Relaxed);
                if inside.swap(true, Ordering::SeqCst) {
                    overlaps.fetch_add(1, Ordering::Relaxed);
                }
                if measuring.load(Ordering::Relaxed) {
                    counts[c].fetch_add(1, Ordering::Relaxed);
                    waits.lock().unwrap().push(granted - arrived);
                    if overtaken > 0 {
                        order.0.fetch_add(1, Ordering::Relaxed);
                        order.1.fetch_max(overtaken, Ordering::Relaxed);
                    }
                }
                let stock: Option<i64> = redis::cmd("GET")
                    .arg("stock")
                    .query_async(&mut conn)
                    .await
                    .unwrap_or(None);
                let _: Result<(), _> = redis::cmd("SET")
                    .arg("stock")
                    .arg(stock.unwrap_or(0) + 1)
                    .query_async(&mut conn)
                    .await;
                inside.store(false, Ordering::SeqCst);
                guard.release().await;
                pass();
            }
        }));
    }
    // Warm up until the start's burst has drained: every task called
    // `acquire` at once, and their first attempts (all refused but one)
    // join the queue in the order they fail, not in the order they came.
    // Grants of that burst are not arrivals in order; measured, they made
    // up to 8.5 % of a 1 s window's grants "overtake" at 32 x 31.
    let warm_until = Instant::now() + WARM_MAX;
    tokio::time::sleep(WARM).await;
    while granted_total.load(Ordering::Relaxed) < (clients * tasks) as u64 * 2
        && Instant::now() < warm_until
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats_before: Vec<_> = clients_v.iter().map(Client::stats).collect();
    common::reset_stats(nodes);
    let pids: Vec<String> = nodes
        .iter()
        .chain(std::iter::once(data))
        .filter_map(|n| n.pid())
        .map(|p| p.to_string())
        .collect();
    let redis_cpu = || -> u64 { pids.iter().filter_map(|p| common::proc_cpu_ns(p)).sum() };
    let redis_io = || -> u64 { pids.iter().filter_map(|p| common::proc_syscalls(p)).sum() };
    let (client_before, redis_before, io_before) = (common::self_cpu_ns(), redis_cpu(), redis_io());
    measuring.store(true, Ordering::SeqCst);
    let begun = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    measuring.store(false, Ordering::SeqCst);
    let span = begun.elapsed().as_secs_f64();
    let client_cpu = common::self_cpu_ns().saturating_sub(client_before);
    let redis_cpu = redis_cpu().saturating_sub(redis_before);
    let redis_io = redis_io().saturating_sub(io_before);
    let commands: u64 = nodes.iter().map(common::command_calls).sum();
    let attempts: u64 = clients_v
        .iter()
        .zip(&stats_before)
        .map(|(c, b)| c.stats().attempts - b.attempts)
        .sum();
    stop.store(true, Ordering::SeqCst);
    for h in handles {
        let _ = tokio::time::timeout(Duration::from_secs(90), h).await;
    }
    let per_client: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    let mut waits = std::mem::take(&mut *waits.lock().unwrap());
    waits.sort();
    Row {
        base: usize::MAX,
        clients,
        idle,
        tasks,
        mode,
        secs: span,
        acquisitions: per_client.iter().sum(),
        commands,
        attempts,
        per_client,
        overtaking: order.0.load(Ordering::Relaxed),
        most_overtaken: order.1.load(Ordering::Relaxed),
        waits,
        overlaps: overlaps.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        client_cpu,
        redis_cpu,
        redis_io,
        by_round: Vec::new(),
    }
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn report(rows: &[Row], secs: f64, rounds: u64) {
    println!(
        "\nOne hot lock: K clients x T tasks, each acquire + GET + SET on a data node + release; \
         5 lock nodes, fenced, {rounds} round(s) of {:.2} s windows per row (at least \
         K x T / 400 s), alternating with the 1 x 1 row (one task back to back) above each \
         shape, the base of its ratios (\"/ 1x1\": over all rounds; \"by round\": each \
         round's).",
        secs / rounds as f64
    );
    println!(
        "\n| clients x tasks | queue | acq/s | / 1x1 | by round | fair / relay | cmds/acq | / 1x1 | attempts/acq | Jain (clients) | grants that overtook | most overtaken | wait p50 ms | p99 ms | bound ms | CPU us/acq client + Redis | Redis reads + writes /acq | cores busy | overlaps |"
    );
    println!(
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (i, r) in rows.iter().enumerate() {
        let base = rows.get(r.base).unwrap_or(&rows[i]);
        let (base_rate, base_cmds) = (base.rate(), base.per_acq(base.commands));
        let ahead = (r.clients * r.tasks).saturating_sub(1) as f64;
        let bound = ahead / r.rate().max(1e-9) * 1000.0;
        // A fair row over the relay control of its shape.
        let relay = matches!(r.mode, Mode::Fair | Mode::NoHandover)
            .then(|| {
                rows.iter()
                    .find(|o| o.base == r.base && o.mode == Mode::Relay)
            })
            .flatten();
        println!(
            "| {} x {}{} | {} | {:.0} | {:.2}x | {} | {} | {:.1} | {:.2}x | {:.2} | {:.3} | {:.1} % | {} | {:.2} | {:.2} | {:.1} | {:.0} + {:.0} | {:.1} | {:.2} | {} |",
            r.clients,
            r.tasks,
            if r.idle > 0 { format!(" (+{} idle)", r.idle) } else { String::new() },
            r.mode.name(),
            r.rate(),
            r.rate() / base_rate,
            if r.by_round.is_empty() {
                "-".to_owned()
            } else {
                r.by_round.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(" ")
            },
            relay.map_or("-".to_owned(), |o| format!("{:.2}x", r.rate() / o.rate().max(1e-9))),
            r.per_acq(r.commands),
            r.per_acq(r.commands) / base_cmds,
            r.per_acq(r.attempts),
            common::jain(&r.per_client),
            100.0 * r.per_acq(r.overtaking),
            r.most_overtaken,
            pct(&r.waits, 0.5).as_secs_f64() * 1000.0,
            pct(&r.waits, 0.99).as_secs_f64() * 1000.0,
            bound,
            r.per_acq(r.client_cpu) / 1e3,
            r.per_acq(r.redis_cpu) / 1e3,
            r.per_acq(r.redis_io),
            (r.client_cpu + r.redis_cpu) as f64 / 1e9 / r.secs,
            r.overlaps,
        );
    }
}
