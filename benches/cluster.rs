//! Redis Cluster nodes against plain ones: what a cluster costs as one
//! Redlock node, and whether its shards add or take throughput.
//!
//! `cargo bench --bench cluster` starts 3 plain `redis-server`s, a cluster
//! of 1 master and one of 2 (joined by hand, `RedisCluster::start_small`),
//! and three clusters of 3 masters (`RedisCluster::start`, `redis-cli
//! --cluster create`), no replicas: 15 processes on 127.0.0.1, every cluster
//! node configured alike by the harness (`tests/support/cluster.rs`). Every
//! client is the default one (fencing on) with the restart guard off (the
//! servers started a moment ago, which the guard cannot tell from a restart
//! without data) and a node timeout of 1 s instead of 100 ms (the healthy
//! path never waits for it; on a loaded machine a slow reply must not fail
//! a cycle). A cycle is `try_acquire` + `release().await` on a resource of
//! its own task, so nothing contends: what is measured is the protocol's
//! cost on each kind of node.
//!
//! Rows, each at c=32 (32 tasks on distinct resources, one client:
//! throughput) and at c=1 (one task: latency):
//! 1. one Redlock node: a plain server (`redis://`), and one cluster of 1,
//!    2 and 3 masters (`redis+cluster://` seed URL; the client reads the
//!    slot map and sends each key to its slot's master);
//! 2. three Redlock nodes (quorum 2): 3 plain servers, and 3 independent
//!    clusters of 3 masters each (9 masters).
//!
//! Timing. Each row is `REDFENCE_BENCH_SECS` (default 4 s) measured in 20
//! slices (2 with `REDFENCE_BENCH_ROWS=smoke`, the CI smoke run), after a
//! warm-up of 15 % of it (at most 0.3 s). The twelve rows run round-robin,
//! one slice each per round, the order rotating every round, so machine
//! drift hits every row alike; short slices keep the rows compared close in
//! time (a round is about 3 s). Ratios are of the whole rows, and also per
//! round (the two rows' slices of one round) as a median and quartiles: the
//! run's own noise, and a load burst that hit one slice moves the median
//! little. Latency has a finer interleaving too: in every round, one task
//! runs the c=1 clients of a section taking turns cycle by cycle (plain, 1,
//! 2, 3 masters, plain, ...; then 3 plain and 3 clusters likewise), each on
//! its own resource, for one slice each: drift at any time scale hits them
//! alike, so the target's p50 ratio is taken there ("taking turns"; no
//! counters, the servers share the window). A shared machine is not quiet:
//! the tables give how many cores the whole machine kept busy (`/proc/stat`,
//! every process) next to this bench's own, and the progress lines (stderr)
//! each row's per-round range.
//!
//! Counters, per slice, over the row's servers (for a cluster: each of its
//! masters): `CONFIG RESETSTAT` before the slice; after it and a 20 ms
//! settle, `total_reads_processed` of `INFO stats` (socket reads; fewer
//! than the requests when the multiplexed connection delivers requests in
//! batches; less our own two: the reset's closing read and this INFO's),
//! then every `INFO commandstats` call (those inside scripts and
//! transactions included, as `common::command_calls` counts them; less one
//! for that `INFO stats`). CPU: client = this process (getrusage: the
//! client plus the bench's own bookkeeping, alike in every row); Redis =
//! on-CPU time of the row's servers (`/proc/<pid>/task/*/schedstat`), their
//! idle cron and, in clusters, the bus's gossip included.
//!
//! Targets, reported only (`met`/`MISSED`; nothing about timing is
//! asserted): cluster of 1 ÷ plain, c=1 p50 taking turns ≤ 1.10× (a cluster
//! adds no round trip); c=32 cycles/s of 2 and 3 masters ÷ 1 master ≥ 0.95×
//! (does not fall as shards are added, 5 % for noise; on a 2-core machine
//! shards cannot add CPU). The interpretation lines under the tables are
//! computed from the rows, as is every number in them.
//!
//! The process exits 1 when a cycle (taking turns too) failed or a lock key
//! was left on any server at the end (fence keys stay by design).

#[path = "../tests/support/cluster.rs"]
mod cluster;
#[path = "common/mod.rs"]
mod common;
#[path = "../tests/support/process.rs"]
mod process;
#[path = "../tests/support/server.rs"]
mod server;

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::RedisCluster;
use common::{Samples, Subject};
use server::RedisServer;

const MEASURE_DEFAULT: f64 = 4.0;
const WARMUP_MAX: f64 = 0.3;
/// Round-robin slices per row (rounds).
const SLICES: usize = 20;
const SMOKE_SLICES: usize = 2;
/// After each slice, before reading counters: a healthy cycle leaves
/// nothing running in the background for longer than a round trip.
const SETTLE: Duration = Duration::from_millis(20);
const NODE_TIMEOUT: Duration = Duration::from_secs(1);
/// The throughput rows' tasks; the latency rows have one.
const WIDE: usize = 32;
const CONCURRENCY: [usize; 2] = [WIDE, 1];
/// Cluster of 1 ÷ plain, c=1 p50: at most this.
const P50_TARGET: f64 = 1.10;
/// 2 and 3 masters ÷ 1 master, c=32 cycles/s: at least this.
const SHARD_TARGET: f64 = 0.95;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// One plain server.
    Plain,
    /// One cluster of this many masters.
    Cluster(usize),
    /// Three plain servers.
    ThreePlain,
    /// Three clusters of 3 masters.
    ThreeClusters,
}

const KINDS: [Kind; 6] = [
    Kind::Plain,
    Kind::Cluster(1),
    Kind::Cluster(2),
    Kind::Cluster(3),
    Kind::ThreePlain,
    Kind::ThreeClusters,
];

impl Kind {
    fn name(self) -> String {
        match self {
            Kind::Plain => "plain redis-server".to_owned(),
            Kind::Cluster(1) => "cluster of 1 master".to_owned(),
            Kind::Cluster(k) => format!("cluster of {k} masters"),
            Kind::ThreePlain => "3 plain redis-servers".to_owned(),
            Kind::ThreeClusters => "3 clusters of 3 masters".to_owned(),
        }
    }
}

fn main() {
    let code = run();
    // `run` has returned, so every server is already killed and reaped.
    std::process::exit(code);
}

fn run() -> i32 {
    let measure = match common::preflight(MEASURE_DEFAULT) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let smoke = std::env::var("REDFENCE_BENCH_ROWS").is_ok_and(|r| r == "smoke");
    let slices = if smoke { SMOKE_SLICES } else { SLICES };
    let warmup = (measure * 0.15).min(WARMUP_MAX);
    let load_before = common::loadavg();
    let started = Instant::now();
    let bench = Bench::start();
    let setup_secs = started.elapsed().as_secs_f64();
    eprintln!("servers and clusters up in {setup_secs:.1} s");
    let mut rows: Vec<Row> = KINDS
        .iter()
        .flat_map(|&kind| CONCURRENCY.map(|c| (kind, c)))
        .enumerate()
        .map(|(i, (kind, concurrency))| Row::new(kind, concurrency, format!("r{i:02}-")))
        .collect();
    if let Err(e) = bench.prime() {
        eprintln!("{e}");
        return 1;
    }
    for row in &rows {
        bench.warm(row, Duration::from_secs_f64(warmup));
    }
    // The c=1 rows of each section, whose clients also take turns cycle by
    // cycle in one task.
    let alternating: Vec<Vec<usize>> = [&KINDS[..4], &KINDS[4..]]
        .iter()
        .map(|kinds| {
            kinds
                .iter()
                .map(|&k| {
                    rows.iter()
                        .position(|r| r.kind == k && r.concurrency == 1)
                        .expect("every kind has a c=1 row")
                })
                .collect()
        })
        .collect();
    let slice = Duration::from_secs_f64(measure / slices as f64);
    // Per round: every row's slice, then each alternating group's, in an
    // order that rotates.
    let items = rows.len() + alternating.len();
    for round in 0..slices {
        for i in 0..items {
            let item = (i + round) % items;
            if let Some(row) = rows.get_mut(item) {
                let s = bench.slice(row, slice);
                row.absorb(s);
            } else {
                let group = &alternating[item - rows.len()];
                let turns = bench.alternate(&rows, group, slice);
                for (&r, samples) in group.iter().zip(turns) {
                    rows[r].absorb_alternating(samples);
                }
            }
        }
    }
    for row in &mut rows {
        row.samples.sort();
        row.alternating.sort();
        row.keys = bench
            .servers(row.kind)
            .iter()
            .map(|n| common::count(n, &format!("redfence:lock:*{}*", row.tag)))
            .sum();
        row.progress();
    }
    let report = Report { rows: &rows };
    println!(
        "{}, load average {load_before} before / {} after",
        bench.environment(warmup, measure, slices, setup_secs),
        common::loadavg()
    );
    println!();
    print!("{}", report.render());
    let left: Vec<usize> = bench
        .all_servers()
        .iter()
        .map(|n| common::count(n, "redfence:lock:*"))
        .collect();
    let left_total: usize = left.iter().sum();
    println!(
        "\nlock keys on each server at the end (3 plain, then the clusters' masters): {}",
        left.iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join("/")
    );
    println!("bench wall time: {:.1} s", started.elapsed().as_secs_f64());
    let failed = |r: &Row| r.samples.failed > 0 || r.alternating.failed > 0;
    if rows.iter().any(|r| failed(r) || r.keys > 0) || left_total > 0 {
        println!("\nINVARIANT BROKEN: a cycle failed or a lock key was left behind (exit 1)");
        1
    } else {
        0
    }
}

/// Socket reads since the last `CONFIG RESETSTAT` (`total_reads_processed`),
/// less our own: the reset's connection closing, and this `INFO`.
fn reads_processed(node: &RedisServer) -> u64 {
    node.cli(&["INFO", "stats"])
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("total_reads_processed:")?
                .parse()
                .ok()
        })
        .unwrap_or(0u64)
        .saturating_sub(2)
}

/// Busy and total jiffies of the whole machine so far (`/proc/stat`, all
/// processes, this bench's and anyone else's): busy is user, nice, system,
/// irq, softirq and steal; total adds idle and iowait. Zeros where
/// `/proc/stat` is missing.
fn machine_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return (0, 0);
    };
    let f: Vec<u64> = cpu
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    let at = |i: usize| f.get(i).copied().unwrap_or(0);
    let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
    (busy, busy + at(3) + at(4))
}

// ---------------------------------------------------------------------------
// Servers and clients.

struct Bench {
    plain: Vec<RedisServer>,
    /// Clusters of 1 and 2 masters, then the three of 3 masters.
    clusters: Vec<RedisCluster>,
    /// Each cluster's master ports, read once.
    masters: Vec<Vec<u16>>,
    /// One client per kind, in the order of [`KINDS`].
    clients: Vec<Arc<Subject>>,
    rt: tokio::runtime::Runtime,
}

impl Bench {
    fn start() -> Bench {
        let plain: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
        // In parallel: most of a cluster's start is waiting (a master only
        // reports `cluster_state:ok` about 2 s after it started).
        let clusters: Vec<RedisCluster> = std::thread::scope(|s| {
            let starting: Vec<_> = [1, 2, 3, 3, 3]
                .map(|masters| {
                    s.spawn(move || {
                        if masters < 3 {
                            RedisCluster::start_small(masters)
                        } else {
                            RedisCluster::start(masters, 0)
                        }
                    })
                })
                .into_iter()
                .collect();
            starting
                .into_iter()
                .map(|t| t.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        });
        let masters: Vec<Vec<u16>> = clusters.iter().map(RedisCluster::master_ports).collect();
        for (cluster, expected) in masters.iter().zip([1, 2, 3, 3, 3]) {
            assert_eq!(cluster.len(), expected, "masters: {cluster:?}");
        }
        let rt = common::runtime();
        let mut bench = Bench {
            plain,
            clusters,
            masters,
            clients: Vec::new(),
            rt,
        };
        bench.clients = KINDS
            .iter()
            .map(|&kind| {
                let client = common::bench_builder(&bench.urls(kind))
                    .node_timeout(NODE_TIMEOUT)
                    .build()
                    .expect("valid node URLs");
                assert!(client.fencing(), "the default client fences");
                let nodes = if matches!(kind, Kind::ThreePlain | Kind::ThreeClusters) {
                    3
                } else {
                    1
                };
                assert_eq!(client.nodes(), nodes, "{}", kind.name());
                Arc::new(Subject::Redfence(client))
            })
            .collect();
        bench
    }

    fn urls(&self, kind: Kind) -> Vec<String> {
        match kind {
            Kind::Plain => vec![self.plain[0].url()],
            Kind::Cluster(k) => vec![self.clusters[k - 1].seed_url()],
            Kind::ThreePlain => self.plain.iter().map(RedisServer::url).collect(),
            Kind::ThreeClusters => self.clusters[2..]
                .iter()
                .map(RedisCluster::seed_url)
                .collect(),
        }
    }

    fn masters_of(&self, cluster: usize) -> impl Iterator<Item = &RedisServer> {
        let c = &self.clusters[cluster];
        self.masters[cluster].iter().map(move |&p| c.server(p))
    }

    /// The servers doing a row's work.
    fn servers(&self, kind: Kind) -> Vec<&RedisServer> {
        match kind {
            Kind::Plain => vec![&self.plain[0]],
            Kind::Cluster(k) => self.masters_of(k - 1).collect(),
            Kind::ThreePlain => self.plain.iter().collect(),
            Kind::ThreeClusters => (2..5).flat_map(|c| self.masters_of(c)).collect(),
        }
    }

    fn all_servers(&self) -> Vec<&RedisServer> {
        let clusters = (0..self.clusters.len()).flat_map(|c| self.masters_of(c));
        self.plain.iter().chain(clusters).collect()
    }

    fn subject(&self, kind: Kind) -> &Arc<Subject> {
        let i = KINDS.iter().position(|&k| k == kind).expect("a known kind");
        &self.clients[i]
    }

    /// One cycle per client outside any measurement (connects every node
    /// and master, reads the slot maps, caches the scripts).
    fn prime(&self) -> Result<(), String> {
        self.rt.block_on(async {
            for (i, &kind) in KINDS.iter().enumerate() {
                let Subject::Redfence(client) = &**self.subject(kind) else {
                    unreachable!("every client here is the crate's");
                };
                common::prime(client, format!("prime{i}"))
                    .await
                    .map_err(|e| format!("priming the client of {} failed: {e}", kind.name()))?;
            }
            Ok(())
        })
    }

    fn warm(&self, row: &Row, warmup: Duration) {
        let subject = Arc::clone(self.subject(row.kind));
        self.rt.block_on(async {
            common::drive(subject, format!("{}warm", row.tag), row.concurrency, warmup).await;
            tokio::time::sleep(SETTLE).await;
        });
    }

    fn slice(&self, row: &Row, len: Duration) -> Slice {
        let servers = self.servers(row.kind);
        for &node in &servers {
            common::reset_stats(std::slice::from_ref(node));
        }
        let pids: Vec<Option<String>> = servers
            .iter()
            .map(|n| n.pid().map(|p| p.to_string()))
            .collect();
        let cpu = || -> Vec<u64> {
            pids.iter()
                .map(|p| p.as_deref().and_then(common::proc_cpu_ns).unwrap_or(0))
                .collect()
        };
        let redis_before = cpu();
        let machine_before = machine_jiffies();
        let client_before = common::self_cpu_ns();
        let samples = self.rt.block_on(common::drive(
            Arc::clone(self.subject(row.kind)),
            format!("{}run", row.tag),
            row.concurrency,
            len,
        ));
        let client_cpu = common::self_cpu_ns().saturating_sub(client_before);
        let machine_after = machine_jiffies();
        self.rt.block_on(async { tokio::time::sleep(SETTLE).await });
        let redis_cpu = cpu()
            .into_iter()
            .zip(redis_before)
            .map(|(after, before)| after.saturating_sub(before))
            .collect();
        // Reads first: the `INFO stats` is then one more command call.
        let reads = servers.iter().map(|n| reads_processed(n)).collect();
        let cmds = servers
            .iter()
            .map(|n| common::command_calls(n).saturating_sub(1))
            .collect();
        Slice {
            samples,
            cmds,
            reads,
            redis_cpu,
            client_cpu,
            machine: (
                machine_after.0.saturating_sub(machine_before.0),
                machine_after.1.saturating_sub(machine_before.1),
            ),
        }
    }

    /// The c=1 rows `group` in one task, taking turns cycle by cycle (each
    /// on its row's own resource) for `len`: whatever drift there is hits
    /// each of them alike, at any time scale. Each row's cycle times, in
    /// `group` order (no counters: their servers share the window).
    fn alternate(&self, rows: &[Row], group: &[usize], len: Duration) -> Vec<Samples> {
        let turns: Vec<(Arc<Subject>, String)> = group
            .iter()
            .map(|&r| {
                let row = &rows[r];
                (
                    Arc::clone(self.subject(row.kind)),
                    format!("{}alt", row.tag),
                )
            })
            .collect();
        let task = self.rt.spawn(async move {
            let end = Instant::now() + len;
            let mut all: Vec<Samples> = turns.iter().map(|_| Samples::default()).collect();
            for seq in 1u64.. {
                for ((subject, resource), s) in turns.iter().zip(&mut all) {
                    let t0 = Instant::now();
                    let outcome = subject.cycle(resource, 0, seq).await;
                    let took = t0.elapsed();
                    s.cycle_ns.push(common::nanos(took));
                    s.wall += took;
                    match outcome {
                        Ok(_) => s.ok += 1,
                        Err(e) => {
                            s.failed += 1;
                            s.first_error.get_or_insert(e);
                        }
                    }
                }
                if Instant::now() >= end {
                    break;
                }
            }
            all
        });
        self.rt
            .block_on(task)
            .expect("the alternating task panicked")
    }

    fn environment(&self, warmup: f64, measure: f64, slices: usize, setup: f64) -> String {
        let version = self.plain[0]
            .cli(&["INFO", "server"])
            .lines()
            .find_map(|l| l.trim().strip_prefix("redis_version:").map(str::to_owned))
            .unwrap_or_else(|| "?".to_owned());
        format!(
            "env: redis-server {version}, nproc {}, tokio multi-thread runtime ({} workers), {} \
             redis-server processes (3 plain; clusters of 1, 2, 3, 3 and 3 masters, no \
             replicas; up in {setup:.1} s); each row {warmup:.2} s warm-up + {measure:.2} s \
             measured in {slices} interleaved slices; TTL {} s; default client (fencing on, {} \
             fence buckets), restart guard off, node timeout {} s",
            nproc(),
            self.rt.metrics().num_workers(),
            self.all_servers().len(),
            common::TTL.as_secs(),
            redfence::limits::FENCE_BUCKETS,
            NODE_TIMEOUT.as_secs()
        )
    }
}

fn nproc() -> usize {
    std::thread::available_parallelism().map_or(0, |n| n.get())
}

// ---------------------------------------------------------------------------
// Rows.

/// One measured slice of a row; per-server vectors in `Bench::servers`
/// order.
struct Slice {
    samples: Samples,
    cmds: Vec<u64>,
    reads: Vec<u64>,
    redis_cpu: Vec<u64>,
    client_cpu: u64,
    /// The whole machine's busy and total jiffies over the slice.
    machine: (u64, u64),
}

struct Row {
    kind: Kind,
    concurrency: usize,
    tag: String,
    samples: Samples,
    /// Per server, summed over the slices.
    cmds: Vec<u64>,
    reads: Vec<u64>,
    redis_cpu: Vec<u64>,
    client_cpu: u64,
    /// The whole machine's busy and total jiffies over the slices.
    machine: (u64, u64),
    /// Per round (slice): cycles/s and cycle p50 (µs).
    round_rate: Vec<f64>,
    round_p50: Vec<f64>,
    /// c=1 rows: the cycles run taking turns with the other c=1 rows of
    /// the section (`Bench::alternate`), and their p50 per round.
    alternating: Samples,
    round_alternating_p50: Vec<f64>,
    /// This row's lock keys left on its servers after the run.
    keys: usize,
}

impl Row {
    fn new(kind: Kind, concurrency: usize, tag: String) -> Row {
        Row {
            kind,
            concurrency,
            tag,
            samples: Samples::default(),
            cmds: Vec::new(),
            reads: Vec::new(),
            redis_cpu: Vec::new(),
            client_cpu: 0,
            machine: (0, 0),
            round_rate: Vec::new(),
            round_p50: Vec::new(),
            alternating: Samples::default(),
            round_alternating_p50: Vec::new(),
            keys: 0,
        }
    }

    fn absorb(&mut self, s: Slice) {
        let add = |mine: &mut Vec<u64>, theirs: Vec<u64>| {
            mine.resize(theirs.len().max(mine.len()), 0);
            for (m, t) in mine.iter_mut().zip(theirs) {
                *m += t;
            }
        };
        add(&mut self.cmds, s.cmds);
        add(&mut self.reads, s.reads);
        add(&mut self.redis_cpu, s.redis_cpu);
        self.client_cpu += s.client_cpu;
        self.machine.0 += s.machine.0;
        self.machine.1 += s.machine.1;
        let mut sorted = s.samples.cycle_ns.clone();
        sorted.sort_unstable();
        self.round_rate.push(s.samples.per_sec());
        self.round_p50.push(common::pct(&sorted, 0.5));
        self.samples.merge(s.samples);
    }

    fn absorb_alternating(&mut self, s: Samples) {
        let mut sorted = s.cycle_ns.clone();
        sorted.sort_unstable();
        self.round_alternating_p50.push(common::pct(&sorted, 0.5));
        self.alternating.merge(s);
    }

    /// p50 of the cycles run taking turns (c=1 rows).
    fn alternating_p50(&self) -> f64 {
        common::pct(&self.alternating.cycle_ns, 0.5)
    }

    fn cycles(&self) -> f64 {
        self.samples.cycles().max(1) as f64
    }

    fn wall_ns(&self) -> f64 {
        self.samples.wall.as_nanos().max(1) as f64
    }

    fn rate(&self) -> f64 {
        self.samples.per_sec()
    }

    fn p50(&self) -> f64 {
        common::pct(&self.samples.cycle_ns, 0.5)
    }

    fn p99(&self) -> f64 {
        common::pct(&self.samples.cycle_ns, 0.99)
    }

    fn per_cycle(&self, total: u64) -> f64 {
        total as f64 / self.cycles()
    }

    fn cmds_per_cycle(&self) -> f64 {
        self.per_cycle(self.cmds.iter().sum())
    }

    fn reads_per_cycle(&self) -> f64 {
        self.per_cycle(self.reads.iter().sum())
    }

    fn client_us(&self) -> f64 {
        self.per_cycle(self.client_cpu) / 1e3
    }

    fn redis_us(&self) -> f64 {
        self.per_cycle(self.redis_cpu.iter().sum()) / 1e3
    }

    /// Cores kept busy over the row's measured time (client + Redis).
    fn cores_busy(&self) -> f64 {
        (self.client_cpu + self.redis_cpu.iter().sum::<u64>()) as f64 / self.wall_ns()
    }

    /// Cores busy on the whole machine over the row's slices: every
    /// process, this bench's and anyone else's.
    fn machine_busy(&self) -> f64 {
        self.machine.0 as f64 / self.machine.1.max(1) as f64 * nproc() as f64
    }

    /// Each server's share of the commands, in %.
    fn shares(&self) -> String {
        let total = self.cmds.iter().sum::<u64>().max(1) as f64;
        self.cmds
            .iter()
            .map(|&c| format!("{:.0}", 100.0 * c as f64 / total))
            .collect::<Vec<_>>()
            .join("/")
    }

    /// The busiest server: its share of one core (%) and its commands/s.
    fn busiest(&self) -> (f64, f64) {
        let busy = self.redis_cpu.iter().copied().max().unwrap_or(0) as f64 / self.wall_ns();
        let cmds = self.cmds.iter().copied().max().unwrap_or(0) as f64 / self.wall_ns() * 1e9;
        (100.0 * busy, cmds)
    }

    fn progress(&self) {
        eprintln!(
            "{:<26} c={:<2} {:>7.0} cycles/s ({:.0}–{:.0} per round)  p50 {:>6.1} µs ({:.1}–{:.1})  p99 {:>7.1} µs  machine {:.2} cores busy  success {:.4}  cmds/cycle {:.2}  keys left {}{}",
            self.kind.name(),
            self.concurrency,
            self.rate(),
            min(&self.round_rate),
            max(&self.round_rate),
            self.p50(),
            min(&self.round_p50),
            max(&self.round_p50),
            self.p99(),
            self.machine_busy(),
            self.samples.success(),
            self.cmds_per_cycle(),
            self.keys,
            common::first_error_text(&self.samples.first_error)
        );
        if self.alternating.cycles() > 0 {
            eprintln!(
                "{:<26} c=1  taking turns: {} cycles  p50 {:>6.1} µs ({:.1}–{:.1} per round)  success {:.4}{}",
                self.kind.name(),
                self.alternating.cycles(),
                self.alternating_p50(),
                min(&self.round_alternating_p50),
                max(&self.round_alternating_p50),
                self.alternating.success(),
                common::first_error_text(&self.alternating.first_error)
            );
        }
    }
}

/// What a ratio compares.
#[derive(Clone, Copy)]
enum Measure {
    /// c=32 rows' cycles/s.
    Rate,
    /// c=1 rows' p50, over their own slices.
    P50,
    /// c=1 rows' p50, over the cycles taking turns.
    TurnsP50,
}

// ---------------------------------------------------------------------------
// Output.

struct Report<'a> {
    rows: &'a [Row],
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

/// As printed (2 decimals), so that a verdict never contradicts the
/// ratio shown next to it.
fn shown(ratio: f64) -> f64 {
    (ratio * 100.0).round() / 100.0
}

/// `a ÷ b` per round (the two rows' slices of one round): the median and
/// the quartiles, nearest rank.
fn round_ratios(a: &[f64], b: &[f64]) -> [f64; 3] {
    let mut r: Vec<f64> = a
        .iter()
        .zip(b)
        .map(|(a, b)| a / b)
        .filter(|r| r.is_finite())
        .collect();
    if r.is_empty() {
        return [f64::NAN; 3];
    }
    r.sort_by(f64::total_cmp);
    let at = |p: f64| r[((p * r.len() as f64).ceil() as usize).clamp(1, r.len()) - 1];
    [at(0.5), at(0.25), at(0.75)]
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "MISSED"
    }
}

impl Report<'_> {
    fn row(&self, kind: Kind, concurrency: usize) -> &Row {
        self.rows
            .iter()
            .find(|r| r.kind == kind && r.concurrency == concurrency)
            .expect("every kind runs at every concurrency")
    }

    /// `a ÷ b` over the whole rows, and the text with its per-round
    /// median and quartiles.
    fn ratio(&self, a: &Row, b: &Row, measure: Measure) -> (f64, String) {
        let (total, [median, q1, q3]) = match measure {
            Measure::Rate => (
                a.rate() / b.rate(),
                round_ratios(&a.round_rate, &b.round_rate),
            ),
            Measure::P50 => (a.p50() / b.p50(), round_ratios(&a.round_p50, &b.round_p50)),
            Measure::TurnsP50 => (
                a.alternating_p50() / b.alternating_p50(),
                round_ratios(&a.round_alternating_p50, &b.round_alternating_p50),
            ),
        };
        (
            total,
            format!("{total:.2}x (per round: median {median:.2}, quartiles {q1:.2}–{q3:.2})"),
        )
    }

    fn render(&self) -> String {
        let mut out = String::new();
        out.push_str(
            "## 1. One Redlock node: a plain server against one Redis Cluster of 1, 2 and 3 masters\n\n",
        );
        self.table(
            &mut out,
            &[
                Kind::Plain,
                Kind::Cluster(1),
                Kind::Cluster(2),
                Kind::Cluster(3),
            ],
            &[Kind::Plain, Kind::Cluster(1)],
        );
        self.section1_ratios(&mut out);
        out.push_str(
            "\n## 2. Three Redlock nodes (quorum 2): 3 plain servers against 3 clusters of 3 masters\n\n",
        );
        self.table(
            &mut out,
            &[Kind::ThreePlain, Kind::ThreeClusters],
            &[Kind::ThreePlain],
        );
        self.section2_ratios(&mut out);
        out
    }

    /// One table: a line per kind, its c=32 and c=1 rows side by side;
    /// cycles/s and p50 also ÷ each of `bases`.
    fn table(&self, out: &mut String, kinds: &[Kind], bases: &[Kind]) {
        let base_cols = |what: &str| -> String {
            bases
                .iter()
                .map(|b| format!(" {what} ÷ {} |", b.name()))
                .collect()
        };
        let (rate_cols, p50_cols) = (base_cols("cycles/s"), base_cols("p50"));
        let _ = writeln!(
            out,
            "| node | c={WIDE} cycles/s |{rate_cols} c=1 p50 µs | c=1 p99 µs |{p50_cols} c=1 p50 µs taking turns (÷ {}) | c={WIDE} p50 µs | c={WIDE} p99 µs | Redis cmds/cycle c={WIDE} · c=1 | socket reads/cycle c={WIDE} · c=1 | CPU µs/cycle c={WIDE} client + Redis | CPU µs/cycle c=1 client + Redis | cores busy c={WIDE}: this bench · whole machine | commands per server c={WIDE} % | busiest server c={WIDE}: % of a core, cmds/s |",
            bases[0].name()
        );
        let _ = writeln!(
            out,
            "|---|---:|{}---:|---:|{}---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
            "---:|".repeat(bases.len()),
            "---:|".repeat(bases.len())
        );
        for &kind in kinds {
            let (wide, one) = (self.row(kind, WIDE), self.row(kind, 1));
            let rate_ratios: String = bases
                .iter()
                .map(|&b| format!(" {:.2}x |", wide.rate() / self.row(b, WIDE).rate()))
                .collect();
            let p50_ratios: String = bases
                .iter()
                .map(|&b| format!(" {:.2}x |", one.p50() / self.row(b, 1).p50()))
                .collect();
            let (busy, busy_cmds) = wide.busiest();
            let _ = writeln!(
                out,
                "| {} | {:.0} |{rate_ratios} {:.1} | {:.1} |{p50_ratios} {:.1} ({:.2}x) | {:.1} | {:.1} | {:.2} · {:.2} | {:.2} · {:.2} | {:.1} + {:.1} | {:.1} + {:.1} | {:.2} · {:.2} | {} | {:.0} %, {:.0} |",
                kind.name(),
                wide.rate(),
                one.p50(),
                one.p99(),
                one.alternating_p50(),
                one.alternating_p50() / self.row(bases[0], 1).alternating_p50(),
                wide.p50(),
                wide.p99(),
                wide.cmds_per_cycle(),
                one.cmds_per_cycle(),
                wide.reads_per_cycle(),
                one.reads_per_cycle(),
                wide.client_us(),
                wide.redis_us(),
                one.client_us(),
                one.redis_us(),
                wide.cores_busy(),
                wide.machine_busy(),
                wide.shares(),
                busy,
                busy_cmds,
            );
        }
    }

    fn section1_ratios(&self, out: &mut String) {
        let (plain1, c1_1) = (self.row(Kind::Plain, 1), self.row(Kind::Cluster(1), 1));
        let (turns, turns_text) = self.ratio(c1_1, plain1, Measure::TurnsP50);
        let (_, p50_text) = self.ratio(c1_1, plain1, Measure::P50);
        let _ = writeln!(
            out,
            "\nRatio, cluster of 1 master ÷ plain server, c=1 p50: {turns_text} on cycles taking turns, {p50_text} over the rows' own slices; target ≤ {P50_TARGET:.2}x on cycles taking turns (a cluster adds no round trip): {}",
            verdict(shown(turns) <= P50_TARGET)
        );
        let c1 = self.row(Kind::Cluster(1), WIDE);
        let (r2, r2_text) = self.ratio(self.row(Kind::Cluster(2), WIDE), c1, Measure::Rate);
        let (r3, r3_text) = self.ratio(self.row(Kind::Cluster(3), WIDE), c1, Measure::Rate);
        let _ = writeln!(
            out,
            "Ratio, c={WIDE} cycles/s ÷ cluster of 1 master: 2 masters {r2_text}, 3 masters {r3_text}; target ≥ {SHARD_TARGET:.2}x each (does not fall as shards are added; 5 % for noise): {}",
            verdict(shown(r2) >= SHARD_TARGET && shown(r3) >= SHARD_TARGET)
        );
        let _ = writeln!(out, "\n{}", self.interpretation());
    }

    /// Computed from the c=32 rows of the clusters of 1 and 3 masters.
    fn interpretation(&self) -> String {
        let one = self.row(Kind::Cluster(1), WIDE);
        let three = self.row(Kind::Cluster(3), WIDE);
        let cores = nproc().max(1) as f64;
        let (busy1, cmds1) = one.busiest();
        let (busy3, cmds3) = three.busiest();
        let cpu = |r: &Row| r.client_us() + r.redis_us();
        let mut s = format!(
            "Interpretation (computed from the c={WIDE} rows): per-shard throughput was {:.0} \
             cycles/s per master at 3 masters ({:.0} in all, {:.2}x the cluster of 1's {:.0}); \
             the 3 masters took {} % of the commands, the busiest {cmds3:.0} commands/s at \
             {busy3:.0} % of a core, where the single master took {cmds1:.0} commands/s at \
             {busy1:.0} %. ",
            three.rate() / 3.0,
            three.rate(),
            three.rate() / one.rate(),
            one.rate(),
            three.shares(),
        );
        let machine = one.machine_busy().min(three.machine_busy());
        if machine >= 0.85 * cores {
            let _ = write!(
                s,
                "No core was idle (the whole machine, other processes included, kept {:.2} and \
                 {:.2} of its {cores:.0} busy), so shards could not add CPU here: the 3 masters' \
                 throughput came with {:.2}x the CPU this bench got ({:.2} cores against {:.2}). ",
                one.machine_busy(),
                three.machine_busy(),
                three.cores_busy() / one.cores_busy(),
                three.cores_busy(),
                one.cores_busy(),
            );
        } else if busy1 >= 85.0 {
            s.push_str(
                "The single master's core was the bound of the cluster of 1, which shards \
                 relieve. ",
            );
        } else {
            let _ = write!(
                s,
                "Neither the {cores:.0} cores (the whole machine kept {:.2} and {:.2} busy) nor \
                 one master was saturated: cycles/s is bound by round trips ({WIDE} tasks, \
                 each waiting on its own cycle). ",
                one.machine_busy(),
                three.machine_busy(),
            );
        }
        let _ = write!(
            s,
            "A cycle cost {:.1} µs of CPU (client + Redis) at 3 masters against {:.1} at 1 \
             ({:+.0} %): Redis {:.1} against {:.1} µs over all masters, client {:.1} against \
             {:.1} µs, and {:.2} socket reads against {:.2} (a cycle is 2 requests; fewer \
             reads means batched delivery, and a cycle's requests spread over more connections \
             batch less). On real hosts each master has its own cores: a master of the cluster \
             of 3 carried {:.2}x the commands/s of the single master here, the share of the \
             load each added master takes off the others.",
            cpu(three),
            cpu(one),
            100.0 * (cpu(three) / cpu(one) - 1.0),
            three.redis_us(),
            one.redis_us(),
            three.client_us(),
            one.client_us(),
            three.reads_per_cycle(),
            one.reads_per_cycle(),
            cmds3 / cmds1.max(1e-9),
        );
        s
    }

    fn section2_ratios(&self, out: &mut String) {
        let (plain, clusters) = (Kind::ThreePlain, Kind::ThreeClusters);
        let (_, rate) = self.ratio(
            self.row(clusters, WIDE),
            self.row(plain, WIDE),
            Measure::Rate,
        );
        let (clusters1, plain1) = (self.row(clusters, 1), self.row(plain, 1));
        let (_, turns) = self.ratio(clusters1, plain1, Measure::TurnsP50);
        let (_, p50) = self.ratio(clusters1, plain1, Measure::P50);
        let _ = writeln!(
            out,
            "\nRatio, 3 clusters of 3 masters ÷ 3 plain servers: c={WIDE} cycles/s {rate}; c=1 p50 {turns} on cycles taking turns, {p50} over the rows' own slices."
        );
        let (p, c) = (self.row(plain, WIDE), self.row(clusters, WIDE));
        let _ = writeln!(
            out,
            "\nInterpretation (computed from the c={WIDE} rows): per cycle the 3 clusters ran {:.2} \
             Redis commands against {:.2} on 3 plain servers, over {} masters instead of 3; \
             Redis CPU {:.1} against {:.1} µs, client CPU {:.1} against {:.1} µs, socket reads \
             {:.2} against {:.2}; this bench kept {:.2} and {:.2} of the {} cores busy, the whole \
             machine {:.2} and {:.2}.",
            c.cmds_per_cycle(),
            p.cmds_per_cycle(),
            c.cmds.len(),
            c.redis_us(),
            p.redis_us(),
            c.client_us(),
            p.client_us(),
            c.reads_per_cycle(),
            p.reads_per_cycle(),
            c.cores_busy(),
            p.cores_busy(),
            nproc(),
            c.machine_busy(),
            p.machine_busy(),
        );
    }
}
