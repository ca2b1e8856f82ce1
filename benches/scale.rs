//! How the cost grows: with the number of nodes, with the number of locks
//! one client holds, with the locks (and fences) a node keeps, and with the
//! number of tasks waiting on one resource. Real `redis-server` processes,
//! started by the test harness on free loopback ports (`--save ""`, no
//! persistence).
//!
//! `cargo bench --bench scale` (a few minutes: the memory table holds a
//! million locks at once) starts 10 servers: 9 for the cluster (an
//! N-node run uses nodes 0..N) and one dedicated to the memory table, so its
//! `used_memory` moves only with what that table does. Four tables:
//!
//! - Cost curves. Acquire+release cycles (`try_acquire` + `release`, each
//!   task its own resource, TTL 10 s) of the default client (fencing on) and
//!   of the raw floor (`SET NX PX` + compare-and-delete `EVALSHA`, fanned
//!   out with `join_all` and awaited on every node) on N = 1, 3, 5, 7, 9
//!   nodes, at concurrency 1 (p50) and 32 (cycles/s). The ten rows of one
//!   concurrency run in round-robin interleaved slices, as in
//!   `benches/lock.rs`. The ideal: p50 at c=1 flat in N (one round trip,
//!   decided at the majority), and 2 requests per node per cycle.
//! - Locks held at once by one client (5 nodes, default client, 64 tasks):
//!   acquire 1k distinct resources holding every guard, release them all;
//!   then the same with 100k. Acquire and release rates at both sizes and
//!   their ratio (the target: 100k within 0.9× of 1k), and the lock keys
//!   left after the release (must be 0).
//! - Memory on the dedicated node (1 node, default client, 128 tasks):
//!   `INFO memory` `used_memory` before, while 1k, 100k and 1M distinct
//!   resources are held at once, and after all were released; bytes per
//!   held lock and bytes retained per resource after the release, with the
//!   keys of each kind (`DBSIZE`, and `SCAN` counts of lock keys, which
//!   must be 0 after the release, and of fence keys, which the protocol
//!   keeps as it does).
//! - Waiting: 1,000 tasks on one resource, 250 in each of 4 clients (5
//!   nodes), each looping: waiting acquire (`lock(..).retry(Retry::new()
//!   .with_max_wait(..)).acquire()`), a tiny critical section that records
//!   the token, release. One run: a warm-up (every task's first attempt
//!   comes at once) and then a fixed window, counted on its own (counters
//!   reset at its start). Acquisitions/s, Redis commands per acquisition
//!   (every `commandstats` call, those inside scripts included, over the
//!   window), and the busiest client's share (25 % when even). Tokens must
//!   strictly increase in grant order and holders never overlap, over the
//!   whole run.
//!
//! The held locks' acquires wait and retry (no delay, 1–8 ms jitter) rather
//! than fail when an attempt misses the node timeout on a loaded machine;
//! attempts per lock show how often that happened.
//!
//! `REDFENCE_BENCH_SECS` (default 2) sets a cost-curve row's measured time,
//! the waiting warm-up (at least 1 s) and window (1.5×, at least 0.5 s).
//! Below 1 s (the CI smoke run uses 0.2) the sizes shrink too: 2 slices per
//! cost-curve row, 1k and 3k held locks, 1k, 3k and 5k in the memory table.
//! The process exits with status 1 when an invariant fails (a cycle or an
//! acquire failed, a lock key was left, a token did not increase, two
//! holders overlapped); performance is only reported.

#[path = "common/mod.rs"]
mod common;
#[path = "../tests/support/process.rs"]
mod process;
#[path = "../tests/support/server.rs"]
mod server;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    contend, count, first_error_text, first_non_increase, floor_conns, keys_text, loadavg, pct,
    preflight, proc_cpu_ns, scan_count, self_cpu_ns, NodeStats, Samples, Subject, RELEASE_LUA,
};
use server::{Cluster, RedisServer};

const CLUSTER: usize = 9;
const NODE_COUNTS: [usize; 5] = [1, 3, 5, 7, 9];
const CONCURRENCY: [usize; 2] = [1, 32];
const MEASURE_DEFAULT: f64 = 2.0;
const WARMUP_MAX: f64 = 0.3;
/// Round-robin slices per cost-curve row (2 in smoke runs).
const SLICES: u32 = 8;
/// After each slice, before reading counters.
const SETTLE: Duration = Duration::from_millis(50);
/// Held locks: nodes of the client, tasks acquiring and releasing.
const HOLD_NODES: usize = 5;
const HOLD_TASKS: usize = 64;
const MEMORY_TASKS: usize = 128;
/// The lease of the held locks: long enough that none expires while the
/// largest set is being acquired.
const HOLD_TTL: Duration = Duration::from_secs(1800);
/// A held lock's acquire retries (a missed node timeout) for up to this.
const HOLD_MAX_WAIT: Duration = Duration::from_secs(30);
const WAIT_CLIENTS: usize = 4;
const WAIT_NODES: usize = 5;
/// No waiting acquire gives up inside the window (its end drops a wait).
const WAIT_MAX: Duration = Duration::from_secs(60);
/// How long lock keys may take to go after releases that returned at the
/// majority (the rest finish in the background) or were dropped.
const DRAIN: Duration = Duration::from_secs(10);

/// The sizes of one run: full, or shrunk for smoke runs.
struct Sizes {
    slices: u32,
    hold: [usize; 2],
    memory: [usize; 3],
    waiters_per_client: usize,
}

fn main() {
    let code = run();
    // `run` has returned, so every server is already killed and reaped.
    std::process::exit(code);
}

fn run() -> i32 {
    let measure = match preflight(MEASURE_DEFAULT) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let sizes = if measure >= 1.0 {
        Sizes {
            slices: SLICES,
            hold: [1_000, 100_000],
            memory: [1_000, 100_000, 1_000_000],
            waiters_per_client: 250,
        }
    } else {
        Sizes {
            slices: 2,
            hold: [1_000, 3_000],
            memory: [1_000, 3_000, 5_000],
            waiters_per_client: 250,
        }
    };
    let warmup = (measure * 0.15).min(WARMUP_MAX);
    let load_before = loadavg();
    let started = Instant::now();
    let bench = Bench::start(
        Duration::from_secs_f64(warmup),
        Duration::from_secs_f64(measure),
        sizes.slices,
    );
    let curves = bench.curves();
    let holds: Vec<Hold> = sizes
        .hold
        .iter()
        .map(|&n| {
            bench.hold(
                &bench.hold_client,
                &bench.cluster.nodes[..HOLD_NODES],
                "held",
                n,
                HOLD_TASKS,
            )
        })
        .collect();
    let memory: Vec<Memory> = sizes.memory.iter().map(|&n| bench.memory(n)).collect();
    let waiting = bench.waiting(sizes.waiters_per_client);
    println!(
        "env: redis-server {}, nproc {}, tokio multi-thread runtime ({} workers), {} cluster \
         nodes + 1 dedicated memory node; cost-curve rows {:.2} s warm-up + {:.2} s measured \
         ({} interleaved slices); TTL 10 s for cycles, {} s for held locks; restart guard \
         off; load average {load_before} before / {} after",
        bench
            .memory_node
            .info_field("server", "redis_version")
            .unwrap_or_else(|| "?".into()),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        bench.rt.metrics().num_workers(),
        CLUSTER,
        warmup,
        measure,
        sizes.slices,
        HOLD_TTL.as_secs(),
        loadavg(),
    );
    println!();
    let mut out = String::new();
    curves_table(&mut out, &curves);
    out.push('\n');
    hold_table(&mut out, &holds);
    out.push('\n');
    memory_table(&mut out, &memory);
    out.push('\n');
    waiting_table(&mut out, &waiting);
    print!("{out}");
    println!("bench wall time: {:.1} s", started.elapsed().as_secs_f64());
    let broken = curves.iter().any(CurveRow::broken)
        || holds.iter().any(Hold::broken)
        || memory.iter().any(Memory::broken)
        || waiting.broken();
    if broken {
        println!(
            "\nINVARIANT BROKEN: a cycle or an acquire failed, a lock key was left behind, or a \
             waiting acquisition broke the token order or overlapped (exit 1)"
        );
        1
    } else {
        0
    }
}

/// `name:value` lines of `INFO <section>`.
trait InfoField {
    fn info_field(&self, section: &str, field: &str) -> Option<String>;
}

impl InfoField for RedisServer {
    fn info_field(&self, section: &str, field: &str) -> Option<String> {
        self.cli(&["INFO", section]).lines().find_map(|l| {
            let (name, value) = l.trim().split_once(':')?;
            (name == field).then(|| value.to_owned())
        })
    }
}

fn used_memory(node: &RedisServer) -> i64 {
    node.info_field("memory", "used_memory")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn default_client(urls: &[String]) -> redfence::Client {
    // The restart guard is off: the servers start a moment before, which
    // the guard would answer by keeping them out of quorums for one TTL.
    redfence::Client::builder(urls.iter().cloned())
        .restart_guard(redfence::RestartGuard::off())
        .build()
        .expect("valid node URLs")
}

struct Bench {
    cluster: Cluster,
    memory_node: RedisServer,
    rt: tokio::runtime::Runtime,
    warmup: Duration,
    measure: Duration,
    slices: u32,
    /// Per N of `NODE_COUNTS`: the default client and the floor on nodes 0..N.
    curve_subjects: Vec<(Arc<Subject>, Arc<Subject>)>,
    hold_client: redfence::Client,
    memory_client: redfence::Client,
}

impl Bench {
    fn start(warmup: Duration, measure: Duration, slices: u32) -> Bench {
        let cluster = Cluster::start(CLUSTER);
        let memory_node = RedisServer::start();
        let rt = common::runtime();
        let urls = cluster.urls();
        let sha = redis::Script::new(RELEASE_LUA).get_hash().to_owned();
        for node in &cluster.nodes {
            // The floors' EVALSHA needs the script cached on every node.
            assert_eq!(node.cli(&["SCRIPT", "LOAD", RELEASE_LUA]), sha);
        }
        let curve_subjects: Vec<(Arc<Subject>, Arc<Subject>)> = rt.block_on(async {
            let mut subjects = Vec::new();
            for n in NODE_COUNTS {
                let client = Arc::new(Subject::Redfence(default_client(&urls[..n])));
                let floor = Arc::new(Subject::Floor {
                    conns: floor_conns(&urls[..n]).await,
                    sha: sha.clone(),
                    fenced: None,
                });
                subjects.push((client, floor));
            }
            subjects
        });
        let hold_client = default_client(&urls[..HOLD_NODES]);
        let memory_client = default_client(&[memory_node.url()]);
        // One cycle per client, outside any measurement: connects every node
        // and caches the scripts.
        rt.block_on(async {
            for (client, floor) in &curve_subjects {
                for subject in [client, floor] {
                    if let Err(e) = subject.cycle("prime", 0, 0).await {
                        panic!("priming a client failed: {e}");
                    }
                }
            }
            for client in [&hold_client, &memory_client] {
                match client.try_acquire("prime", common::TTL).await {
                    Ok(Some(guard)) => {
                        guard.release().await;
                    }
                    other => panic!("priming a client failed: {other:?}"),
                }
            }
        });
        Bench {
            cluster,
            memory_node,
            rt,
            warmup,
            measure,
            slices,
            curve_subjects,
            hold_client,
            memory_client,
        }
    }

    // -----------------------------------------------------------------------
    // Cost curves.

    fn curves(&self) -> Vec<CurveRow> {
        let mut rows = Vec::new();
        for c in CONCURRENCY {
            let mut group: Vec<CurveRow> = Vec::new();
            for (i, &n) in NODE_COUNTS.iter().enumerate() {
                for floor in [false, true] {
                    group.push(CurveRow {
                        nodes: n,
                        floor,
                        concurrency: c,
                        subject: i,
                        tag: format!("curve-c{c}-n{n}-{}", if floor { "floor" } else { "rf" }),
                        samples: Samples::default(),
                        stats: vec![NodeStats::default(); n],
                        client_cpu_ns: 0,
                        redis_cpu_ns: 0,
                        keys: Vec::new(),
                    });
                }
            }
            for row in &group {
                self.rt.block_on(async {
                    common::drive(
                        self.curve_subject(row),
                        format!("{}:warm", row.tag),
                        c,
                        self.warmup,
                    )
                    .await;
                    tokio::time::sleep(SETTLE).await;
                });
            }
            let slice = self.measure / self.slices;
            for round in 0..self.slices as usize {
                for i in 0..group.len() {
                    let len = group.len();
                    self.curve_slice(&mut group[(i + round) % len], slice);
                }
            }
            for row in &mut group {
                row.samples.sort();
                row.keys = self.cluster.nodes[..row.nodes]
                    .iter()
                    .map(|n| {
                        Some(
                            count(n, &format!("redfence:lock:{}*", row.tag))
                                + count(n, &format!("floor:lock:{}*", row.tag)),
                        )
                    })
                    .collect();
                eprintln!(
                    "{:<32} c={:<2} {:>7.0} cycles/s  p50 {:>7.1} µs  keys left {}{}",
                    row.name(),
                    row.concurrency,
                    row.samples.per_sec(),
                    pct(&row.samples.cycle_ns, 0.5),
                    keys_text(&row.keys),
                    first_error_text(&row.samples.first_error)
                );
            }
            rows.extend(group);
        }
        rows
    }

    fn curve_subject(&self, row: &CurveRow) -> Arc<Subject> {
        let (client, floor) = &self.curve_subjects[row.subject];
        Arc::clone(if row.floor { floor } else { client })
    }

    fn curve_slice(&self, row: &mut CurveRow, duration: Duration) {
        let nodes = &self.cluster.nodes[..row.nodes];
        for node in nodes {
            node.cli(&["CONFIG", "RESETSTAT"]);
        }
        let pids: Vec<String> = nodes
            .iter()
            .filter_map(|n| n.pid())
            .map(|p| p.to_string())
            .collect();
        let redis_before: Vec<u64> = pids.iter().map(|p| proc_cpu_ns(p).unwrap_or(0)).collect();
        let client_before = self_cpu_ns();
        let samples = self.rt.block_on(common::drive(
            self.curve_subject(row),
            format!("{}:run", row.tag),
            row.concurrency,
            duration,
        ));
        row.client_cpu_ns += self_cpu_ns().saturating_sub(client_before);
        self.rt.block_on(async { tokio::time::sleep(SETTLE).await });
        row.redis_cpu_ns += pids
            .iter()
            .zip(&redis_before)
            .map(|(p, before)| proc_cpu_ns(p).unwrap_or(*before).saturating_sub(*before))
            .sum::<u64>();
        for (mine, node) in row.stats.iter_mut().zip(nodes) {
            mine.add(&NodeStats::read(node));
        }
        row.samples.merge(samples);
    }

    // -----------------------------------------------------------------------
    // Held locks.

    /// Acquires `count` distinct resources with `tasks` tasks, holding every
    /// guard, then releases them all; counts the lock keys left.
    fn hold(
        &self,
        client: &redfence::Client,
        nodes: &[RedisServer],
        name: &str,
        count: usize,
        tasks: usize,
    ) -> Hold {
        let tag = format!("{name}{count}:");
        let before = client.stats();
        let (guards, acquire, failures) =
            self.rt.block_on(acquire_many(client, &tag, count, tasks));
        let attempts = client.stats().attempts - before.attempts;
        let held = guards.len();
        let (release, short) = self
            .rt
            .block_on(release_many(client.quorum(), guards, tasks));
        let keys = drain(nodes, &format!("redfence:lock:{tag}*"));
        let hold = Hold {
            count,
            attempts,
            held,
            failures: failures + short,
            acquire,
            release,
            keys,
        };
        eprintln!(
            "held {:>9}: acquire {:>8.0} locks/s, release {:>8.0} locks/s, failures {}, lock keys left {}",
            hold.count,
            hold.acquire_rate(),
            hold.release_rate(),
            hold.failures,
            keys_text(&hold.keys)
        );
        hold
    }

    // -----------------------------------------------------------------------
    // Memory.

    fn memory(&self, count: usize) -> Memory {
        let node = &self.memory_node;
        let before = used_memory(node);
        let keys_before = KeyCounts::read(node);
        let tag = format!("mem{count}:");
        let (guards, acquire, failures) =
            self.rt
                .block_on(acquire_many(&self.memory_client, &tag, count, MEMORY_TASKS));
        let held_memory = used_memory(node);
        let keys_held = KeyCounts::read(node);
        let held = guards.len();
        let (_, short) = self.rt.block_on(release_many(
            self.memory_client.quorum(),
            guards,
            MEMORY_TASKS,
        ));
        let left = drain(std::slice::from_ref(node), &format!("redfence:lock:{tag}*"));
        let after = used_memory(node);
        let keys_after = KeyCounts::read(node);
        let m = Memory {
            count,
            held,
            failures: failures + short,
            acquire,
            before,
            held_memory,
            after,
            keys_before,
            keys_held,
            keys_after,
            left: left.iter().flatten().sum(),
        };
        eprintln!(
            "memory {:>9}: {:.0} bytes per held lock, {:.0} bytes retained per resource, keys after {}",
            m.count,
            m.per_held(),
            m.retained(),
            m.keys_after.text()
        );
        m
    }

    // -----------------------------------------------------------------------
    // Waiting.

    fn waiting(&self, per_client: usize) -> Waiting {
        let nodes = &self.cluster.nodes[..WAIT_NODES];
        let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
        let clients: Vec<redfence::Client> =
            (0..WAIT_CLIENTS).map(|_| default_client(&urls)).collect();
        let tasks = |clients: &[redfence::Client]| -> Vec<(usize, redfence::Client)> {
            (0..per_client * WAIT_CLIENTS)
                .map(|i| (i % WAIT_CLIENTS, clients[i % WAIT_CLIENTS].clone()))
                .collect()
        };
        let retry = redfence::Retry::new().with_max_wait(WAIT_MAX);
        // One run: the warm-up absorbs the start, where every task's first
        // attempt collides with all the others, and the window (counted
        // from the warm-up's end, counters reset then) is the steady state.
        let warmup = self.measure.max(Duration::from_secs(1));
        let window = self.measure.mul_f64(1.5).max(Duration::from_millis(500));
        let run = self.rt.spawn(contend(
            tasks(&clients),
            WAIT_CLIENTS,
            "waiting:hot".to_owned(),
            retry,
            warmup,
            window,
        ));
        std::thread::sleep(warmup);
        for node in nodes {
            node.cli(&["CONFIG", "RESETSTAT"]);
        }
        let samples = self.rt.block_on(run).expect("waiting run panicked");
        let stats: Vec<NodeStats> = nodes.iter().map(NodeStats::read).collect();
        // Waits dropped at the window's end release in the background.
        let keys = drain(nodes, "redfence:lock:waiting:*");
        let w = Waiting {
            tasks: per_client * WAIT_CLIENTS,
            warmup,
            non_increase: first_non_increase(&samples.tokens),
            tokens: samples.tokens.len(),
            samples,
            stats,
            keys,
        };
        eprintln!(
            "waiting {} tasks / {WAIT_CLIENTS} clients: {:.0} acquisitions/s, {:.1} commands/acquisition, busiest client {:.0}%, tokens {}{}",
            w.tasks,
            w.per_sec(),
            w.commands_per_acquisition(),
            100.0 * w.busiest_share(),
            w.tokens_text(),
            first_error_text(&w.samples.first_error)
        );
        w
    }
}

/// `count` distinct resources `{tag}{i}`, `tasks` at a time; every guard
/// kept. Returns the guards, the time it took and the failures.
async fn acquire_many(
    client: &redfence::Client,
    tag: &str,
    count: usize,
    tasks: usize,
) -> (Vec<redfence::LockGuard>, Duration, u64) {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let client = client.clone();
            let next = Arc::clone(&next);
            let tag = tag.to_owned();
            tokio::spawn(async move {
                let mut guards = Vec::new();
                let mut failures = 0u64;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        break;
                    }
                    // Waiting, with a short retry: on a loaded machine an
                    // attempt can miss the node timeout; it is retried (and
                    // counted in the attempts) instead of failing.
                    let request = client.lock(format!("{tag}{i}"), HOLD_TTL).retry(
                        redfence::Retry::new()
                            .with_delay(Duration::ZERO)
                            .with_jitter(Duration::from_millis(1))
                            .with_max_jitter(Duration::from_millis(8))
                            .with_max_wait(HOLD_MAX_WAIT),
                    );
                    match request.acquire().await {
                        Ok(guard) => guards.push(guard),
                        Err(_) => failures += 1,
                    }
                }
                (guards, failures)
            })
        })
        .collect();
    let mut guards = Vec::with_capacity(count);
    let mut failures = 0;
    for handle in handles {
        let (g, f) = handle.await.expect("acquire task panicked");
        guards.extend(g);
        failures += f;
    }
    (guards, start.elapsed(), failures)
}

/// Releases every guard, `tasks` at a time. Returns the time it took and
/// the releases neither confirmed nor pending on a quorum of nodes.
async fn release_many(
    quorum: usize,
    guards: Vec<redfence::LockGuard>,
    tasks: usize,
) -> (Duration, u64) {
    let queue = Arc::new(std::sync::Mutex::new(guards));
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let queue = Arc::clone(&queue);
            tokio::spawn(async move {
                let mut short = 0u64;
                loop {
                    let next = queue
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .pop();
                    let Some(guard) = next else { break };
                    let released = guard.release().await;
                    if released.confirmed + released.pending + released.handed_over < quorum {
                        short += 1;
                    }
                }
                short
            })
        })
        .collect();
    let mut short = 0;
    for handle in handles {
        short += handle.await.expect("release task panicked");
    }
    (start.elapsed(), short)
}

/// Waits (up to `DRAIN`) until no key matches `pattern` on any of `nodes`,
/// then returns the count per node.
fn drain(nodes: &[RedisServer], pattern: &str) -> Vec<Option<usize>> {
    let deadline = Instant::now() + DRAIN;
    loop {
        let keys: Vec<usize> = nodes.iter().map(|n| scan_count(n, pattern)).collect();
        if keys.iter().all(|&k| k == 0) || Instant::now() >= deadline {
            return keys.into_iter().map(Some).collect();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

// ---------------------------------------------------------------------------
// Rows.

struct CurveRow {
    nodes: usize,
    floor: bool,
    concurrency: usize,
    /// Index into `Bench::curve_subjects`.
    subject: usize,
    tag: String,
    samples: Samples,
    stats: Vec<NodeStats>,
    client_cpu_ns: u64,
    redis_cpu_ns: u64,
    keys: Vec<Option<usize>>,
}

impl CurveRow {
    fn name(&self) -> String {
        let s = if self.nodes == 1 { "" } else { "s" };
        if self.floor {
            format!("floor (join_all) {} node{s}", self.nodes)
        } else {
            format!("redfence {} node{s}", self.nodes)
        }
    }

    fn cycles(&self) -> f64 {
        self.samples.cycles().max(1) as f64
    }

    fn p50(&self) -> f64 {
        pct(&self.samples.cycle_ns, 0.5)
    }

    /// Requests clients sent per node per cycle (the largest over the
    /// nodes; 2 is one round trip each way).
    fn requests_per_node(&self) -> f64 {
        self.stats
            .iter()
            .map(|s| s.client_commands(!self.floor).0 as f64 / self.cycles())
            .fold(0.0, f64::max)
    }

    fn all_commands(&self) -> f64 {
        let calls: u64 = self
            .stats
            .iter()
            .map(|s| s.calls.values().sum::<u64>())
            .sum();
        calls as f64 / self.cycles()
    }

    fn broken(&self) -> bool {
        self.samples.failed > 0 || self.keys.iter().flatten().sum::<usize>() > 0
    }
}

struct Hold {
    count: usize,
    /// Quorum rounds the acquires took (one each when none was retried).
    attempts: u64,
    held: usize,
    failures: u64,
    acquire: Duration,
    release: Duration,
    keys: Vec<Option<usize>>,
}

impl Hold {
    fn acquire_rate(&self) -> f64 {
        self.held as f64 / self.acquire.as_secs_f64().max(1e-9)
    }

    fn release_rate(&self) -> f64 {
        self.held as f64 / self.release.as_secs_f64().max(1e-9)
    }

    fn broken(&self) -> bool {
        self.failures > 0
            || self.held != self.count
            || self.keys.iter().flatten().sum::<usize>() > 0
    }
}

/// Keys on a node by kind: all (`DBSIZE`), lock keys and fence keys (`SCAN`
/// counts of `redfence:lock:*` and `redfence:fence:*`).
#[derive(Debug, Clone, Copy)]
struct KeyCounts {
    all: usize,
    lock: usize,
    fence: usize,
}

impl KeyCounts {
    fn read(node: &RedisServer) -> KeyCounts {
        KeyCounts {
            all: node.cli(&["DBSIZE"]).trim().parse().unwrap_or(0),
            lock: scan_count(node, "redfence:lock:*"),
            fence: scan_count(node, "redfence:fence:*"),
        }
    }

    fn text(&self) -> String {
        format!(
            "{} lock / {} fence / {} other",
            self.lock,
            self.fence,
            self.all.saturating_sub(self.lock + self.fence)
        )
    }
}

struct Memory {
    count: usize,
    held: usize,
    failures: u64,
    acquire: Duration,
    before: i64,
    held_memory: i64,
    after: i64,
    keys_before: KeyCounts,
    keys_held: KeyCounts,
    keys_after: KeyCounts,
    /// Lock keys of this size left after the release.
    left: usize,
}

impl Memory {
    fn per_held(&self) -> f64 {
        (self.held_memory - self.before) as f64 / self.held.max(1) as f64
    }

    fn retained(&self) -> f64 {
        (self.after - self.before) as f64 / self.held.max(1) as f64
    }

    fn broken(&self) -> bool {
        self.failures > 0 || self.held != self.count || self.left > 0
    }
}

struct Waiting {
    tasks: usize,
    samples: common::ContentionSamples,
    warmup: Duration,
    tokens: usize,
    non_increase: Option<(usize, u64, u64)>,
    stats: Vec<NodeStats>,
    keys: Vec<Option<usize>>,
}

impl Waiting {
    fn acquired(&self) -> f64 {
        self.samples.acquired.max(1) as f64
    }

    fn per_sec(&self) -> f64 {
        self.samples.acquired as f64 / self.samples.wall.as_secs_f64().max(1e-9)
    }

    fn commands_per_acquisition(&self) -> f64 {
        let calls: u64 = self
            .stats
            .iter()
            .map(|s| s.calls.values().sum::<u64>())
            .sum();
        calls as f64 / self.acquired()
    }

    fn requests_per_acquisition(&self) -> f64 {
        let calls: u64 = self.stats.iter().map(|s| s.client_commands(true).0).sum();
        calls as f64 / self.acquired()
    }

    fn busiest_share(&self) -> f64 {
        self.samples.per_group.iter().copied().max().unwrap_or(0) as f64 / self.acquired()
    }

    fn tokens_text(&self) -> String {
        match self.non_increase {
            None => format!("{} strictly increasing", self.tokens),
            Some((i, a, b)) => format!("NOT increasing at #{i}: {a} then {b}"),
        }
    }

    fn broken(&self) -> bool {
        let s = &self.samples;
        self.non_increase.is_some()
            || s.overlaps > 0
            || s.missing_tokens > 0
            || s.errors > 0
            || s.short_releases > 0
            || self.keys.iter().flatten().sum::<usize>() > 0
    }
}

// ---------------------------------------------------------------------------
// Output.

fn curves_table(out: &mut String, rows: &[CurveRow]) {
    out.push_str(
        "Cost curves: acquire+release cycles, each task its own resource, the default client \
         (fencing on) and the raw floor (SET NX PX + compare-and-delete EVALSHA, join_all) on \
         N nodes, interleaved slices; the ideal is a flat c=1 p50 (one round trip, decided at \
         the majority); requests = what the client sent per node per cycle (largest node), \
         commands = every commandstats call incl. those inside scripts, all nodes:\n\n\
         | N | c=1 p50 µs redfence / floor | c=1 p50 ÷ N=1, redfence / floor | c=32 cycles/s redfence / floor | c=32 cycles/s ÷ N=1, redfence / floor | c=32 redfence ÷ floor | requests/node/cycle redfence / floor (c=32) | Redis commands/cycle redfence / floor (c=32) | client CPU µs/cycle redfence / floor (c=32) | Redis CPU µs/cycle redfence / floor (c=32) | keys left |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    let find = |n: usize, floor: bool, c: usize| {
        rows.iter()
            .find(|r| r.nodes == n && r.floor == floor && r.concurrency == c)
    };
    let (Some(base1), Some(fbase1), Some(base32), Some(fbase32)) = (
        find(1, false, 1),
        find(1, true, 1),
        find(1, false, 32),
        find(1, true, 32),
    ) else {
        return;
    };
    for n in NODE_COUNTS {
        let (Some(r1), Some(f1), Some(r32), Some(f32)) = (
            find(n, false, 1),
            find(n, true, 1),
            find(n, false, 32),
            find(n, true, 32),
        ) else {
            continue;
        };
        let cpu = |r: &CurveRow, ns: u64| ns as f64 / 1000.0 / r.cycles();
        let keys: usize = [r1, f1, r32, f32]
            .iter()
            .map(|r| r.keys.iter().flatten().sum::<usize>())
            .sum();
        let _ = writeln!(
            out,
            "| {n} | {:.1} / {:.1} | {:.2}× / {:.2}× | {:.0} / {:.0} | {:.2}× / {:.2}× | {:.2}× | {:.3} / {:.3} | {:.2} / {:.2} | {:.1} / {:.1} | {:.1} / {:.1} | {keys} |",
            r1.p50(),
            f1.p50(),
            r1.p50() / base1.p50(),
            f1.p50() / fbase1.p50(),
            r32.samples.per_sec(),
            f32.samples.per_sec(),
            r32.samples.per_sec() / base32.samples.per_sec(),
            f32.samples.per_sec() / fbase32.samples.per_sec(),
            r32.samples.per_sec() / f32.samples.per_sec(),
            r32.requests_per_node(),
            f32.requests_per_node(),
            r32.all_commands(),
            f32.all_commands(),
            cpu(r32, r32.client_cpu_ns),
            cpu(f32, f32.client_cpu_ns),
            cpu(r32, r32.redis_cpu_ns),
            cpu(f32, f32.redis_cpu_ns),
        );
    }
    for r in rows.iter().filter(|r| r.samples.first_error.is_some()) {
        let _ = writeln!(
            out,
            "\nfirst error in `{}` c={}: {}",
            r.name(),
            r.concurrency,
            r.samples.first_error.as_deref().unwrap_or_default()
        );
    }
}

fn hold_table(out: &mut String, holds: &[Hold]) {
    let _ = write!(
        out,
        "Locks held at once by one client ({HOLD_NODES} nodes, default client, {HOLD_TASKS} \
         tasks, TTL {} s): acquire N distinct resources keeping every guard, then release \
         them all; target: the rate at the larger N within 0.9× of the rate at 1k, acquire \
         and release; lock keys left after the release must be 0:\n\n\
         | locks held | acquired | attempts/lock | acquire s | acquire locks/s | release s | release locks/s | failures | lock keys left per node |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
        HOLD_TTL.as_secs()
    );
    for h in holds {
        let _ = writeln!(
            out,
            "| {} | {} | {:.3} | {:.2} | {:.0} | {:.2} | {:.0} | {} | {} |",
            h.count,
            h.held,
            h.attempts as f64 / h.held.max(1) as f64,
            h.acquire.as_secs_f64(),
            h.acquire_rate(),
            h.release.as_secs_f64(),
            h.release_rate(),
            h.failures,
            keys_text(&h.keys),
        );
    }
    if let [small, large] = holds {
        let a = large.acquire_rate() / small.acquire_rate();
        let r = large.release_rate() / small.release_rate();
        let mark = |x: f64| if x >= 0.9 { "met" } else { "MISSED" };
        let _ = writeln!(
            out,
            "\n- acquire rate at {} ÷ at {}: {a:.2}× (target ≥ 0.9×: {})\n\
             - release rate at {} ÷ at {}: {r:.2}× (target ≥ 0.9×: {})\n\
             - lock keys left after every release: {} (invariant)",
            large.count,
            small.count,
            mark(a),
            large.count,
            small.count,
            mark(r),
            if holds
                .iter()
                .all(|h| h.keys.iter().flatten().sum::<usize>() == 0)
            {
                "0"
            } else {
                "NOT 0"
            }
        );
    }
}

fn memory_table(out: &mut String, rows: &[Memory]) {
    let _ = write!(
        out,
        "Memory on one dedicated node (default client, {MEMORY_TASKS} tasks, TTL {} s; \
         used_memory from INFO memory; each size on distinct resources, so fences kept by \
         earlier sizes are in its \"before\"; keys: lock / fence / other, fence keys being \
         whatever the protocol keeps):\n\n\
         | resources held at once | acquire locks/s | used_memory before | held | after release | bytes per held lock | bytes retained per resource after release | keys before | keys held | keys after release |\n\
         |---:|---:|---:|---:|---:|---:|---:|---|---|---|\n",
        HOLD_TTL.as_secs()
    );
    for m in rows {
        let _ = writeln!(
            out,
            "| {} | {:.0} | {} | {} | {} | {:.0} | {:.0} | {} | {} | {} |",
            m.count,
            m.held as f64 / m.acquire.as_secs_f64().max(1e-9),
            m.before,
            m.held_memory,
            m.after,
            m.per_held(),
            m.retained(),
            m.keys_before.text(),
            m.keys_held.text(),
            m.keys_after.text(),
        );
    }
    for m in rows.iter().filter(|m| m.broken()) {
        let _ = writeln!(
            out,
            "\nmemory {}: {} of {} acquired, {} failures, {} lock keys left (invariant broken)",
            m.count, m.held, m.count, m.failures, m.left
        );
    }
}

fn waiting_table(out: &mut String, w: &Waiting) {
    let s = &w.samples;
    let _ = write!(
        out,
        "Waiting: {} tasks on one resource, {} per client in {WAIT_CLIENTS} clients ({WAIT_NODES} \
         nodes, default client), each looping waiting acquire (Retry::new(), max_wait {} s) → \
         record the token → release; {:.2} s warm-up (every task's first attempt at once), \
         then a {:.2} s window counted; commands = every commandstats call incl. those inside \
         scripts, requests = what clients sent, both over the window; busiest client = its \
         share of the window's acquisitions (25 % when even); tokens and overlaps checked \
         over the whole run:\n\n\
         | tasks | acquisitions | acquisitions/s | Redis commands/acquisition | requests/acquisition | busiest client | acquisitions per client | acquire wait p50 / p99 ms | tokens in grant order (warm-up + window) | overlapping holders | errors | waits cut at the end | lock keys left per node |\n\
         |---:|---:|---:|---:|---:|---:|---|---:|---|---:|---:|---:|---|\n",
        w.tasks,
        w.tasks / WAIT_CLIENTS,
        WAIT_MAX.as_secs(),
        w.warmup.as_secs_f64(),
        s.wall.as_secs_f64(),
    );
    let _ = writeln!(
        out,
        "| {} | {} | {:.0} | {:.1} | {:.2} | {:.0}% | {} | {:.1} / {:.1} | {} | {} | {} | {} | {} |",
        w.tasks,
        s.acquired,
        w.per_sec(),
        w.commands_per_acquisition(),
        w.requests_per_acquisition(),
        100.0 * w.busiest_share(),
        s.per_group
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join("/"),
        pct(&s.wait_ns, 0.5) / 1000.0,
        pct(&s.wait_ns, 0.99) / 1000.0,
        w.tokens_text(),
        s.overlaps,
        s.errors + s.short_releases + s.missing_tokens,
        s.cut,
        keys_text(&w.keys),
    );
    if let Some(e) = &s.first_error {
        let _ = writeln!(out, "\nfirst error: {e}");
    }
}
