//! Acquire+release cycles against real `redis-server` processes, next to
//! raw-redis floors and a peer (rslock 0.10) measured in the same run, the
//! cost of fencing tokens, and one contended resource.
//!
//! `cargo bench --bench lock` starts 6 servers: 5 for the cluster (3-node
//! runs use nodes 0..3; 5-node runs and floor 2 all of them) and a separate
//! one for the single-node runs and floor 1, so single-node numbers never
//! share a server, a script cache or a stats counter with the cluster. In
//! the main and fault rows each task locks its own resource, so there is no
//! contention: what is measured is the cost of the protocol. A cycle is
//! acquire + `release().await`.
//!
//! Clients. `redfence N nodes` is the default client, so fencing is on: the
//! fenced acquire is one round trip per node, a transaction or a script
//! (the lock's `SET NX PX` and the fence's increment), and when fewer than
//! a quorum of the granting nodes report the largest fence a second round
//! (the write-back script) runs before the guard is handed out.
//! `redfence plain N nodes` is `fencing(false)`: its acquire is a plain
//! `SET NX PX`, like floors 1 and 2'. Floor 3 (1 and 5 nodes) runs the
//! crate's own `ACQUIRE` and `RELEASE` scripts by `EVALSHA`, fanned out raw
//! with `join_all`: what the fenced design costs with no library around it. `rslock N nodes` is the peer, rslock 0.10
//! (`LockManager::lock`: `SET NX PX` on every node with `join_all`, then
//! `unlock`: a compare-and-delete `EVALSHA` on every node; its own `redis`
//! connections, one multiplexed connection per node). Fenced, plain, rslock
//! and floor rows run in the same interleaved slices; the "tokens cost"
//! table compares fenced and plain, the peer table the four clients.
//! Attempts, grants and write-back rounds come from `Client::stats()`
//! deltas taken around each measured slice (warm-ups excluded).
//!
//! Timing. A row is 2 s measured after a 0.3 s warm-up (`REDFENCE_BENCH_SECS`
//! sets the measured part; the warm-up is 15 % of it, at most 0.3 s). Shared
//! machines drift, so rows that are compared are interleaved: the eleven
//! healthy rows of one concurrency run in 8 round-robin slices each, and
//! every fault row is bracketed by healthy 5-node slices (half its length
//! before, half after) that serve as its reference.
//!
//! Counters, per slice, on every node in use:
//! - `CONFIG RESETSTAT` before the slice, `INFO stats commandstats` once after
//!   it (and after a paused node was resumed). Our own traffic in that window
//!   is exactly that `CONFIG RESETSTAT` and one connection (the INFO's; an
//!   INFO is not in its own output), and both are subtracted.
//! - Requests per cycle count what clients sent, a `MULTI`/`EXEC`
//!   transaction as one request (one round trip): `commandstats` also counts
//!   the calls a Lua script or a transaction makes, so those are left out,
//!   per kind of row. GET, DEL, PTTL and PEXPIRE run only inside scripts
//!   (release, extend, write-back) or the fenced acquire; in fenced rows
//!   SET, INCR and INCRBY do too, and the fenced acquire counts as its one
//!   request, an `EXEC` or an `EVALSHA` (a `MULTI`, where there is one, is
//!   not counted); in plain, rslock and floor rows SET is the acquire
//!   itself. The raw per-command counts are printed as well.
//! - Redis commands per cycle (the main and peer tables) is the other view:
//!   every `commandstats` call, those inside scripts and transactions
//!   included, summed over the nodes in use.
//! - Server time per cycle is the `commandstats` usec of the requests: an
//!   `EXEC`'s and an `EVALSHA`'s usec already include the commands they ran,
//!   so adding theirs would count them twice (`MULTI`'s is added).
//! - ACQUIREs that reached a node (to count those never sent: skipped as
//!   stalled, or settled): one SET each in plain rows; in fenced rows the
//!   `EXEC`s plus the `EVALSHA`s that were not releases (the release script
//!   runs one GET per call, a scripted acquire none).
//! - New connections per cycle is the `total_connections_received` delta.
//!   Connections are made before the window (setup, warm-up), so the steady
//!   state is what is measured.
//!
//! CPU, per slice: client CPU is this process's user + system time
//! (`getrusage(RUSAGE_SELF)`, µs resolution: the client's work plus the
//! bench's own bookkeeping, the same in every row); Redis CPU is the on-CPU
//! time of the redis-servers in use (`/proc/<pid>/task/*/schedstat`, ns;
//! `/proc/<pid>/stat` ticks where schedstat is missing), summed over them.
//!
//! Faults hit node 4 at the start of the measured window, so the window
//! includes the transition. A paused (SIGSTOP) node is resumed after the
//! window; its backlog then runs and keys are counted 500 ms later. A killed
//! (SIGKILL) node's keys are not counted (they died with it); it is restarted
//! empty before the trailing reference slice (the faults use the fenced
//! client; a node restarted empty forgets its fences, so the first
//! acquisitions of the bracketing reference's resources after the restart
//! may need write-backs).
//!
//! Contention. One resource on the 5 nodes, K tasks, each with its own
//! fenced client (as K processes would have), looping: a waiting acquire
//! (`lock().retry(..).acquire()`), a critical section that records the
//! token, release. Rows use the default retry pacing (`Retry::new()`, which
//! lets the task that just released win again while the others back off)
//! or a tight one (no fixed delay, 1–8 ms jitter), under which waiters keep
//! colliding, split votes are common and the partial grants of failed
//! attempts move some nodes' fences but not others': that divergence is
//! what the write-back round repairs. Each row has a warm-up (the
//! resource's first acquisitions seed its fence) and a measured window of
//! 75 % of the row time (1.5 s by default). A wait still running when the
//! window ends is dropped (the crate then releases whatever the attempt
//! took, in the background). Tokens must strictly increase in grant order
//! and holders must never overlap. The paused row SIGSTOPs node 4 from
//! 20 % to 60 % of its window: node 4 misses the grants in between, so
//! afterwards its fence lags and the write-back runs when it is among the
//! granting nodes. Fences are never reset here (the contention rows run
//! before the kill row, and no node restarts empty during them), which the
//! token order relies on.
//!
//! The process exits with status 1 when an invariant fails (a cycle failed,
//! a lock key was left behind, a token did not increase, two holders
//! overlapped, a contended acquire failed); performance targets are only
//! reported, in the closing targets table (`met`/`MISSED`). Fence keys
//! (`redfence:fence:*`) stay by design and are not counted as left behind.

#[path = "common/mod.rs"]
mod common;
#[path = "../tests/support/process.rs"]
mod process;
#[path = "../tests/support/server.rs"]
mod server;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use futures::future::join_all;
use server::{Cluster, RedisServer};

const MEASURE_DEFAULT: f64 = 2.0;
const WARMUP_MAX: f64 = 0.3;
/// Round-robin slices per healthy row.
const SLICES: u32 = 8;
/// After each healthy slice, before reading counters: the background work
/// of a cycle (stragglers, releases) on a healthy node is one round trip.
const SETTLE: Duration = Duration::from_millis(50);
/// After a fault slice: longer than the default node timeout (100 ms).
const SETTLE_FAULT: Duration = Duration::from_millis(150);
/// After resuming a paused node: time for its backlog to run.
const RESUME_WAIT: Duration = Duration::from_millis(500);
/// Node that the fault rows pause or kill.
const FAULT_NODE: usize = 4;
const CONCURRENCY: [usize; 2] = [1, 32];

/// Contention rows: tasks (one fenced client each) on one resource, the
/// retry pacing, and whether node 4 is paused for part of the window.
const CONTENTION: [(usize, Pacing, bool); 4] = [
    (8, Pacing::Default, false),
    (32, Pacing::Default, false),
    (32, Pacing::Default, true),
    (8, Pacing::Tight, false),
];
/// A contention row's measured window, as a share of the row time (keeps
/// the default run near 70 s).
const CONTENTION_WINDOW: f64 = 0.75;
/// Where in a paused contention row's window node 4 is paused and resumed.
const CONTENTION_PAUSE: (f64, f64) = (0.2, 0.6);
/// No contended acquire gives up inside a window (the window's end drops
/// a wait instead).
const CONTENTION_MAX_WAIT: Duration = Duration::from_secs(30);

/// How a contended acquire waits between attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pacing {
    /// `Retry::new()`: 50 ms + jitter from 100 ms doubling to 1 s. A task
    /// that just released retries at once, the others sleep: few attempts
    /// ever collide.
    Default,
    /// No fixed delay, jitter from 1 ms doubling to 8 ms: waiters keep
    /// colliding with each other and with the holder's next attempt, so
    /// split votes (and the fence divergence they leave) are frequent.
    Tight,
}

impl Pacing {
    fn retry(self) -> redfence::Retry {
        let retry = redfence::Retry::new().with_max_wait(CONTENTION_MAX_WAIT);
        match self {
            Pacing::Default => retry,
            Pacing::Tight => retry
                .with_delay(Duration::ZERO)
                .with_jitter(Duration::from_millis(1))
                .with_max_jitter(Duration::from_millis(8)),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Pacing::Default => "default",
            Pacing::Tight => "tight",
        }
    }
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
    let warmup = (measure * 0.15).min(WARMUP_MAX);
    let load_before = loadavg();
    let started = Instant::now();
    let mut bench = Bench::start(
        Duration::from_secs_f64(warmup),
        Duration::from_secs_f64(measure),
    );
    let (rows, contention) = bench.run_all();
    let report = Report {
        rows: &rows,
        contention: &contention,
    };
    println!(
        "{}, load average {load_before} before / {} after",
        bench.environment(warmup, measure),
        loadavg()
    );
    println!();
    print!("{}", report.render());
    let leftover = bench.final_key_count();
    println!("\nlock keys on each node at the end (nodes 0-4 | single): {leftover}");
    println!("bench wall time: {:.1} s", started.elapsed().as_secs_f64());
    if report.invariants_broken() || !leftover.clean {
        println!(
            "\nINVARIANT BROKEN: a cycle failed, a lock key was left behind, or a contended \
             acquisition broke the token order, overlapped or failed (exit 1)"
        );
        1
    } else {
        0
    }
}

struct ContentionRow {
    tasks: usize,
    pacing: Pacing,
    paused: bool,
    /// The measured window.
    samples: ContentionSamples,
    /// Warm-up and measured tokens, in grant order.
    tokens: usize,
    non_increase: Option<(usize, u64, u64)>,
    /// Acquisitions in the warm-up (checked like the measured ones).
    warm_acquired: u64,
    warm_broken: bool,
    counts: Counts,
    stats: Vec<Option<NodeStats>>,
    keys: Vec<Option<usize>>,
    /// The resource's fence on each node after the row.
    fences: Vec<Option<u64>>,
}

impl ContentionRow {
    fn name(&self) -> String {
        let pacing = self.pacing.name();
        if self.paused {
            format!(
                "{pacing} pacing, node {FAULT_NODE} paused {:.0}–{:.0} % of the window",
                100.0 * CONTENTION_PAUSE.0,
                100.0 * CONTENTION_PAUSE.1
            )
        } else {
            format!("{pacing} pacing, healthy")
        }
    }

    /// The busiest task's share of the acquisitions (1/K when fair).
    fn busiest_share(&self) -> f64 {
        self.samples.per_group.iter().copied().max().unwrap_or(0) as f64 / self.acquired()
    }

    fn acquired(&self) -> f64 {
        self.samples.acquired.max(1) as f64
    }

    fn per_sec(&self) -> f64 {
        self.samples.acquired as f64 / self.samples.wall.as_secs_f64().max(1e-9)
    }

    fn attempts_per_acquisition(&self) -> f64 {
        self.counts.attempts as f64 / self.acquired()
    }

    fn write_backs_per_acquisition(&self) -> f64 {
        self.counts.write_backs as f64 / self.acquired()
    }

    /// Mean token step between consecutive grants of the window: 1 when
    /// only winners moved the fences, more when partial grants of failed
    /// attempts moved them too.
    fn token_step(&self) -> f64 {
        match self.samples.tokens.as_slice() {
            [first, .., last] => (last - first) as f64 / (self.samples.tokens.len() - 1) as f64,
            _ => f64::NAN,
        }
    }

    /// Commands clients sent (`EVALSHA`/`EVAL`: acquire, write-back and
    /// release scripts), all nodes, per acquisition.
    fn cmds_per_acquisition(&self) -> f64 {
        let calls: u64 = self
            .stats
            .iter()
            .flatten()
            .map(|s| s.client_commands(true).0)
            .sum();
        calls as f64 / self.acquired()
    }

    fn keys_left(&self) -> usize {
        keys_left(&self.keys)
    }

    fn keys_text(&self) -> String {
        keys_text(&self.keys)
    }

    fn broken(&self) -> bool {
        let s = &self.samples;
        self.non_increase.is_some()
            || self.warm_broken
            || s.overlaps > 0
            || s.missing_tokens > 0
            || s.errors > 0
            || s.short_releases > 0
            || self.keys_left() > 0
    }

    /// Each node's fence relative to the largest (0 = at the max), after
    /// the row: how far apart the nodes were left.
    fn fences_text(&self) -> String {
        let max = self.fences.iter().flatten().max().copied().unwrap_or(0);
        self.fences
            .iter()
            .map(|f| {
                f.map_or_else(
                    || "-".to_owned(),
                    |f| format!("{}", f as i128 - max as i128),
                )
            })
            .collect::<Vec<_>>()
            .join("/")
    }

    fn tokens_text(&self) -> String {
        match self.non_increase {
            None => format!("{} strictly increasing", self.tokens),
            Some((i, a, b)) => format!("NOT increasing at #{i}: {a} then {b}"),
        }
    }
}

// ---------------------------------------------------------------------------
// Rows.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Floor1,
    Floor2,
    /// Floor 3 on 1 or 5 nodes: the crate's fenced `ACQUIRE` script and its
    /// release, raw (`join_all`): what the fenced design costs with no
    /// library around it.
    Floor3(usize),
    /// The default client: fencing on.
    Redfence(usize),
    /// `fencing(false)`: a plain `SET NX PX` acquire, no token.
    Plain(usize),
    /// rslock 0.10, the peer.
    Rslock(usize),
    Paused,
    Killed,
    /// Healthy 5-node slices bracketing the paused or killed row.
    Reference(Fault),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    Pause,
    Kill,
}

impl Kind {
    fn name(self) -> String {
        match self {
            Kind::Floor1 => "floor 1 (SET NX + EVALSHA, 1 node)".to_owned(),
            Kind::Floor2 => "floor 2 (same, join_all 5 nodes)".to_owned(),
            Kind::Floor3(n) => format!(
                "floor 3 (ACQUIRE script + EVALSHA, {n} node{})",
                if n == 1 { "" } else { "s" }
            ),
            Kind::Redfence(n) => format!("redfence {n} node{}", if n == 1 { "" } else { "s" }),
            Kind::Plain(n) => format!("redfence plain {n} node{}", if n == 1 { "" } else { "s" }),
            Kind::Rslock(n) => format!("rslock {n} node{}", if n == 1 { "" } else { "s" }),
            Kind::Paused => format!("redfence 5 nodes, node {FAULT_NODE} paused"),
            Kind::Killed => format!("redfence 5 nodes, node {FAULT_NODE} killed"),
            Kind::Reference(Fault::Pause) => {
                "redfence 5 nodes, healthy, brackets paused".to_owned()
            }
            Kind::Reference(_) => "redfence 5 nodes, healthy, brackets killed".to_owned(),
        }
    }

    /// The rows of the main table: healthy, interleaved.
    fn healthy_main(self) -> bool {
        matches!(
            self,
            Kind::Floor1
                | Kind::Floor2
                | Kind::Floor3(_)
                | Kind::Redfence(_)
                | Kind::Plain(_)
                | Kind::Rslock(_)
        )
    }

    fn is_redfence(self) -> bool {
        !matches!(
            self,
            Kind::Floor1 | Kind::Floor2 | Kind::Floor3(_) | Kind::Rslock(_)
        )
    }

    /// Whether the row's client acquires with the fenced script.
    fn fenced(self) -> bool {
        matches!(self, Kind::Floor3(_)) || (self.is_redfence() && !matches!(self, Kind::Plain(_)))
    }

    fn nodes(self) -> usize {
        match self {
            Kind::Floor1 => 1,
            Kind::Floor3(n) | Kind::Redfence(n) | Kind::Plain(n) | Kind::Rslock(n) => n,
            _ => 5,
        }
    }
}

/// One measured slice: samples plus the counters read around it.
struct Slice {
    samples: Samples,
    /// Per node in use; `None` for a node that was not running at the read.
    stats: Vec<Option<NodeStats>>,
    /// This process's CPU (user + system, getrusage) over the slice, ns.
    bench_cpu_ns: u64,
    /// The CPU of the redis-servers in use over the slice, summed, ns.
    redis_cpu_ns: u64,
    /// Crate rows: the client's counters over the slice.
    counts: Counts,
}

struct Row {
    kind: Kind,
    concurrency: usize,
    /// Prefix of every resource of this row, so its keys can be counted.
    tag: String,
    samples: Samples,
    stats: Vec<Option<NodeStats>>,
    /// Lock keys of this row (warm-up included) left per node; `None` for a
    /// node that is not running.
    keys: Vec<Option<usize>>,
    bench_cpu_ns: u64,
    redis_cpu_ns: u64,
    counts: Counts,
}

impl Row {
    fn new(kind: Kind, concurrency: usize, tag: String) -> Row {
        Row {
            kind,
            concurrency,
            tag,
            samples: Samples::default(),
            stats: vec![None; kind.nodes()],
            keys: Vec::new(),
            bench_cpu_ns: 0,
            redis_cpu_ns: 0,
            counts: Counts::default(),
        }
    }

    fn absorb(&mut self, slice: Slice) {
        self.samples.merge(slice.samples);
        self.samples.sort();
        for (mine, theirs) in self.stats.iter_mut().zip(slice.stats) {
            if let Some(theirs) = theirs {
                mine.get_or_insert_with(NodeStats::default).add(&theirs);
            }
        }
        self.bench_cpu_ns += slice.bench_cpu_ns;
        self.redis_cpu_ns += slice.redis_cpu_ns;
        self.counts.add(slice.counts);
    }

    fn cycles(&self) -> f64 {
        self.samples.cycles().max(1) as f64
    }

    fn per_node_cmds(&self) -> Vec<Option<f64>> {
        self.stats
            .iter()
            .map(|s| {
                s.as_ref()
                    .map(|s| s.client_commands(self.kind.fenced()).0 as f64 / self.cycles())
            })
            .collect()
    }

    fn cmds_per_cycle(&self) -> f64 {
        self.per_node_cmds().iter().flatten().sum()
    }

    fn exactly_two_per_node(&self) -> bool {
        self.stats
            .iter()
            .flatten()
            .all(|s| s.client_commands(self.kind.fenced()).0 == 2 * self.samples.cycles())
    }

    /// Share of (node, attempt) pairs whose ACQUIRE never reached the node,
    /// over the nodes that were running; crate rows only.
    fn acquire_not_sent(&self) -> Option<f64> {
        if !self.kind.is_redfence() {
            return None;
        }
        let running: Vec<&NodeStats> = self.stats.iter().flatten().collect();
        let expected = running.len() as f64 * self.cycles();
        let delivered: u64 = running
            .iter()
            .map(|s| {
                // Plain: one SET per ACQUIRE that reached the node. Fenced:
                // one request, a transaction (its EXEC) or a script (an
                // EVALSHA beside the release's; the release script runs one
                // GET per call, the acquire none, and a write-back two, so
                // EVALSHA − GET, floored at 0, counts acquires).
                if self.kind.fenced() {
                    s.calls_of("exec")
                        + (s.calls_of("evalsha") + s.calls_of("eval"))
                            .saturating_sub(s.calls_of("get"))
                } else {
                    s.calls_of("set")
                }
            })
            .sum();
        Some(1.0 - delivered as f64 / expected)
    }

    fn redis_usec_per_cycle(&self) -> f64 {
        let usec: u64 = self
            .stats
            .iter()
            .flatten()
            .map(|s| s.client_commands(self.kind.fenced()).1)
            .sum();
        usec as f64 / self.cycles()
    }

    /// Write-back rounds per successful cycle (acquisition).
    fn write_backs_per_cycle(&self) -> f64 {
        self.counts.write_backs as f64 / self.samples.ok.max(1) as f64
    }

    fn acquire_p50(&self) -> f64 {
        pct(&self.samples.acquire_ns, 0.5)
    }

    fn new_conns(&self) -> u64 {
        self.stats.iter().flatten().map(|s| s.conns).sum()
    }

    fn conns_per_cycle(&self) -> f64 {
        self.new_conns() as f64 / self.cycles()
    }

    fn keys_left(&self) -> usize {
        keys_left(&self.keys)
    }

    fn keys_text(&self) -> String {
        keys_text(&self.keys)
    }

    /// All commands the nodes ran per cycle, Lua-internal ones included,
    /// with their mean server time per call.
    fn raw_commands(&self) -> String {
        let mut total: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for s in self.stats.iter().flatten() {
            for (name, c) in &s.calls {
                let e = total.entry(name).or_default();
                e.0 += c;
                e.1 += s.usec.get(name).copied().unwrap_or(0);
            }
        }
        total
            .iter()
            .map(|(name, (c, u))| {
                format!(
                    "{name} {:.3} ({:.1} µs)",
                    *c as f64 / self.cycles(),
                    *u as f64 / (*c).max(1) as f64
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// CPU time (ns, summed over a row's slices) per cycle, in µs.
    fn cpu_us_per_cycle(&self, ns: u64) -> f64 {
        ns as f64 / 1000.0 / self.cycles()
    }

    /// This process's CPU per cycle, µs: the client's work plus the
    /// bench's own bookkeeping (the same in every row).
    fn client_cpu(&self) -> f64 {
        self.cpu_us_per_cycle(self.bench_cpu_ns)
    }

    /// The CPU of the redis-servers in use per cycle, µs.
    fn redis_cpu(&self) -> f64 {
        self.cpu_us_per_cycle(self.redis_cpu_ns)
    }

    /// Every command the nodes ran per cycle, all nodes, the calls made by
    /// scripts and transactions included (our own traffic excluded).
    fn all_cmds_per_cycle(&self) -> f64 {
        let calls: u64 = self
            .stats
            .iter()
            .flatten()
            .map(|s| s.calls.values().sum::<u64>())
            .sum();
        calls as f64 / self.cycles()
    }

    fn p50(&self) -> f64 {
        pct(&self.samples.cycle_ns, 0.50)
    }

    fn p99(&self) -> f64 {
        pct(&self.samples.cycle_ns, 0.99)
    }
}

struct Bench {
    cluster: Cluster,
    single: RedisServer,
    rt: tokio::runtime::Runtime,
    warmup: Duration,
    measure: Duration,
    floor1: Arc<Subject>,
    floor2: Arc<Subject>,
    floor3_1: Arc<Subject>,
    floor3_5: Arc<Subject>,
    rf1: Arc<Subject>,
    rf3: Arc<Subject>,
    rf5: Arc<Subject>,
    plain1: Arc<Subject>,
    plain5: Arc<Subject>,
    rslock1: Arc<Subject>,
    rslock5: Arc<Subject>,
    next_tag: usize,
}

impl Bench {
    fn start(warmup: Duration, measure: Duration) -> Bench {
        let single = RedisServer::start();
        let cluster = Cluster::start(5);
        let rt = common::runtime();
        let urls = cluster.urls();
        let client = |urls: &[String], fencing: bool| {
            // The restart guard is off in every client of this bench: the
            // servers start a moment before (and node 4 is restarted empty
            // by the kill rows), which the guard would answer by keeping
            // them out of quorums for one TTL. The fault suite (`chaos`)
            // measures the guard.
            let client = redfence::Client::builder(urls.iter().cloned())
                .restart_guard(redfence::RestartGuard::off())
                .fencing(fencing)
                .build()
                .expect("valid node URLs");
            assert_eq!(client.fencing(), fencing);
            Arc::new(Subject::Redfence(client))
        };
        let rf1 = client(&[single.url()], true);
        let rf3 = client(&urls[..3], true);
        let rf5 = client(&urls, true);
        let plain1 = client(&[single.url()], false);
        let plain5 = client(&urls, false);
        // rslock's defaults (3 tries 200 ms apart when refused: never, here).
        let rslock1 = Arc::new(Subject::Rslock(rslock::LockManager::new(
            vec![single.url()],
        )));
        let rslock5 = Arc::new(Subject::Rslock(rslock::LockManager::new(urls.clone())));
        // One cycle per client: connects every node and caches the scripts.
        rt.block_on(async {
            for subject in [&rf1, &rf3, &rf5, &plain1, &plain5, &rslock1, &rslock5] {
                if let Err(e) = subject.cycle("prime", 0, 0).await {
                    panic!("priming a client failed: {e}");
                }
            }
        });
        let sha = redis::Script::new(RELEASE_LUA).get_hash().to_owned();
        let acquire_sha = redis::Script::new(ACQUIRE_LUA).get_hash().to_owned();
        for node in std::iter::once(&single).chain(&cluster.nodes) {
            // Only the crate has run scripts so far: a hit proves the floor
            // runs the very same Lua.
            for (sha, file) in [(&sha, "release"), (&acquire_sha, "acquire")] {
                assert_eq!(
                    node.cli(&["SCRIPT", "EXISTS", sha]),
                    "1",
                    "the floor's {file} script differs from src/wire/lua/{file}.lua"
                );
            }
        }
        let conns = rt.block_on(async {
            let mut conns = Vec::new();
            for urls in [&[single.url()][..], &urls, &[single.url()][..], &urls] {
                conns.push(floor_conns(urls).await);
            }
            conns
        });
        let mut conns = conns.into_iter();
        let mut floor = |fenced: bool| {
            Arc::new(Subject::Floor {
                conns: conns.next().expect("four sets of connections"),
                sha: sha.clone(),
                fenced: fenced.then(|| acquire_sha.clone()),
            })
        };
        Bench {
            floor1: floor(false),
            floor2: floor(false),
            floor3_1: floor(true),
            floor3_5: floor(true),
            rf1,
            rf3,
            rf5,
            plain1,
            plain5,
            rslock1,
            rslock5,
            cluster,
            single,
            rt,
            warmup,
            measure,
            next_tag: 0,
        }
    }

    /// Healthy rows first (floor 2's connections do not survive the kill),
    /// then contention (before the kill, so that no node it uses has ever
    /// restarted empty), then pause, then kill.
    fn run_all(&mut self) -> (Vec<Row>, Vec<ContentionRow>) {
        let mut rows = Vec::new();
        for c in CONCURRENCY {
            rows.extend(self.healthy_group(c));
        }
        let contention = self.contention();
        for fault in [Fault::Pause, Fault::Kill] {
            for c in CONCURRENCY {
                rows.extend(self.fault_row(fault, c));
            }
        }
        (rows, contention)
    }

    /// The contention rows, on fenced 5-node clients made (and connected)
    /// for them.
    fn contention(&mut self) -> Vec<ContentionRow> {
        let most = CONTENTION.iter().map(|&(k, _, _)| k).max().unwrap_or(0);
        let urls = self.cluster.urls();
        let clients: Vec<redfence::Client> = (0..most)
            .map(|_| {
                redfence::Client::builder(urls.iter().cloned())
                    .restart_guard(redfence::RestartGuard::off())
                    .build()
                    .expect("valid node URLs")
            })
            .collect();
        // One cycle each, outside the windows: connects every node and
        // caches the scripts.
        self.rt.block_on(async {
            let primes = clients
                .iter()
                .enumerate()
                .map(|(i, client)| prime(client, format!("prime-contention:{i}")));
            for outcome in join_all(primes).await {
                if let Err(e) = outcome {
                    panic!("priming a contention client failed: {e}");
                }
            }
        });
        CONTENTION
            .iter()
            .map(|&(tasks, pacing, paused)| {
                let row = self.contention_row(&clients[..tasks], pacing, paused);
                self.contention_progress(&row);
                row
            })
            .collect()
    }

    fn contention_row(
        &mut self,
        clients: &[redfence::Client],
        pacing: Pacing,
        paused: bool,
    ) -> ContentionRow {
        let tag = format!("row{:02}-", self.next_tag);
        self.next_tag += 1;
        let resource = format!("{tag}hot");
        let tasks = || clients.iter().cloned().enumerate().collect::<Vec<_>>();
        let warm = self.rt.block_on(contend(
            tasks(),
            clients.len(),
            resource.clone(),
            pacing.retry(),
            Duration::ZERO,
            self.warmup,
        ));
        // Waits dropped at the warm-up's end release in the background.
        self.rt.block_on(async { tokio::time::sleep(SETTLE).await });
        let window = self.measure.mul_f64(CONTENTION_WINDOW);
        for node in &self.cluster.nodes {
            node.cli(&["CONFIG", "RESETSTAT"]);
        }
        let before: Vec<redfence::Stats> = clients.iter().map(redfence::Client::stats).collect();
        let run = self.rt.spawn(contend(
            tasks(),
            clients.len(),
            resource.clone(),
            pacing.retry(),
            Duration::ZERO,
            window,
        ));
        if paused {
            let (from, to) = CONTENTION_PAUSE;
            std::thread::sleep(window.mul_f64(from));
            self.cluster.node(FAULT_NODE).pause();
            std::thread::sleep(window.mul_f64(to - from));
            self.cluster.node(FAULT_NODE).resume();
        }
        let samples = self.rt.block_on(run).expect("contention run panicked");
        self.rt
            .block_on(async { tokio::time::sleep(SETTLE_FAULT).await });
        let mut counts = Counts::default();
        for (client, before) in clients.iter().zip(before) {
            counts.add(Counts::between(before, client.stats()));
        }
        let stats = self
            .cluster
            .nodes
            .iter()
            .map(|n| n.is_running().then(|| NodeStats::read(n)))
            .collect();
        let all_tokens: Vec<u64> = warm.tokens.iter().chain(&samples.tokens).copied().collect();
        let warm_broken = warm.overlaps > 0
            || warm.missing_tokens > 0
            || warm.errors > 0
            || warm.short_releases > 0;
        // The fence of the resource's bucket: shared with the other
        // resources of the bucket, which earlier rows moved on every node.
        let fence_key = clients[0].fence_key(&resource);
        let fences = self
            .cluster
            .nodes
            .iter()
            .map(|n| n.cli(&["GET", &fence_key]).parse().ok())
            .collect();
        ContentionRow {
            fences,
            tasks: clients.len(),
            pacing,
            paused,
            tokens: all_tokens.len(),
            non_increase: first_non_increase(&all_tokens),
            warm_acquired: warm.acquired,
            warm_broken,
            samples,
            counts,
            stats,
            keys: self.count_keys(Kind::Redfence(5), &tag),
        }
    }

    fn contention_progress(&self, row: &ContentionRow) {
        eprintln!(
            "contention K={:<2} {:<32} {:>6.0} acq/s  attempts/acq {:>5.2}  write-backs/acq {:.3}  tokens {}  keys left {}{}",
            row.tasks,
            row.name(),
            row.per_sec(),
            row.attempts_per_acquisition(),
            row.write_backs_per_acquisition(),
            row.tokens_text(),
            row.keys_text(),
            first_error_text(&row.samples.first_error)
        );
    }

    fn new_row(&mut self, kind: Kind, concurrency: usize) -> Row {
        let tag = format!("row{:02}-", self.next_tag);
        self.next_tag += 1;
        Row::new(kind, concurrency, tag)
    }

    /// The eleven healthy rows of one concurrency, interleaved slice by slice
    /// (rotating the order) so that they see the same machine.
    fn healthy_group(&mut self, concurrency: usize) -> Vec<Row> {
        let kinds = [
            Kind::Floor1,
            Kind::Floor2,
            Kind::Floor3(1),
            Kind::Floor3(5),
            Kind::Redfence(1),
            Kind::Plain(1),
            Kind::Redfence(3),
            Kind::Redfence(5),
            Kind::Plain(5),
            Kind::Rslock(1),
            Kind::Rslock(5),
        ];
        let mut rows: Vec<Row> = kinds
            .iter()
            .map(|&k| self.new_row(k, concurrency))
            .collect();
        for row in &rows {
            self.warm(row);
        }
        let slice = self.measure / SLICES;
        for round in 0..SLICES as usize {
            for i in 0..rows.len() {
                let row = &mut rows[(i + round) % kinds.len()];
                let s = self.slice(row.kind, concurrency, &row.tag, slice, Fault::None);
                row.absorb(s);
            }
        }
        for row in &mut rows {
            row.keys = self.count_keys(row.kind, &row.tag);
            self.progress(row);
        }
        rows
    }

    /// A fault row between two healthy 5-node reference slices.
    fn fault_row(&mut self, fault: Fault, concurrency: usize) -> [Row; 2] {
        let kind = if fault == Fault::Pause {
            Kind::Paused
        } else {
            Kind::Killed
        };
        let mut reference = self.new_row(Kind::Reference(fault), concurrency);
        let mut row = self.new_row(kind, concurrency);
        self.warm(&reference);
        let half = self.measure / 2;
        self.reference_half(&mut reference, concurrency, half);
        let s = self.slice(kind, concurrency, &row.tag, self.measure, fault);
        row.absorb(s);
        row.keys = self.count_keys(kind, &row.tag);
        if fault == Fault::Kill {
            self.cluster.node(FAULT_NODE).restart();
            self.wait_for_all_nodes();
        }
        self.reference_half(&mut reference, concurrency, half);
        reference.keys = self.count_keys(reference.kind, &reference.tag);
        self.progress(&reference);
        self.progress(&row);
        [reference, row]
    }

    /// One healthy half of a fault row's bracketing reference.
    fn reference_half(&mut self, reference: &mut Row, concurrency: usize, half: Duration) {
        let s = self.slice(
            reference.kind,
            concurrency,
            &reference.tag,
            half,
            Fault::None,
        );
        reference.absorb(s);
    }

    fn subject(&self, kind: Kind) -> Arc<Subject> {
        Arc::clone(match kind {
            Kind::Floor1 => &self.floor1,
            Kind::Floor2 => &self.floor2,
            Kind::Floor3(1) => &self.floor3_1,
            Kind::Floor3(_) => &self.floor3_5,
            Kind::Redfence(1) => &self.rf1,
            Kind::Redfence(3) => &self.rf3,
            Kind::Plain(1) => &self.plain1,
            Kind::Plain(_) => &self.plain5,
            Kind::Rslock(1) => &self.rslock1,
            Kind::Rslock(_) => &self.rslock5,
            _ => &self.rf5,
        })
    }

    fn servers(&self, kind: Kind) -> Vec<&RedisServer> {
        match kind {
            Kind::Floor1
            | Kind::Floor3(1)
            | Kind::Redfence(1)
            | Kind::Plain(1)
            | Kind::Rslock(1) => {
                vec![&self.single]
            }
            _ => self.cluster.nodes[..kind.nodes()].iter().collect(),
        }
    }

    fn warm(&self, row: &Row) {
        let subject = self.subject(row.kind);
        self.rt.block_on(async {
            drive(
                subject,
                format!("{}warm", row.tag),
                row.concurrency,
                self.warmup,
            )
            .await;
            tokio::time::sleep(SETTLE).await;
        });
    }

    /// After a restart: cycles until the client is connected to the
    /// restarted node again and has re-cached the scripts there, so the
    /// trailing reference slice is healthy from its start.
    /// The floors' connections to it stay dead: floors run before the faults.
    fn wait_for_all_nodes(&self) {
        let subject = self.subject(Kind::Redfence(5));
        let sha = redis::Script::new(RELEASE_LUA).get_hash().to_owned();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            self.rt.block_on(async {
                let _ = subject.cycle("reconnect", 0, 0).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            });
            let node = &self.cluster.nodes[FAULT_NODE];
            let clients = node
                .cli(&["INFO", "clients"])
                .lines()
                .find_map(|l| {
                    l.trim()
                        .strip_prefix("connected_clients:")?
                        .parse::<u32>()
                        .ok()
                })
                .unwrap_or(0);
            // Ours (this INFO) plus the client's.
            if clients >= 2 && node.cli(&["SCRIPT", "EXISTS", &sha]) == "1" {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the client did not reconnect to the restarted node within 10 s"
            );
        }
        // A little more, so the restarted node is in steady state (its
        // release script re-cached) before the next measured slice.
        self.rt.block_on(async {
            drive(
                subject,
                "reconnect".to_owned(),
                1,
                Duration::from_millis(50),
            )
            .await;
            tokio::time::sleep(SETTLE).await;
        });
    }

    fn slice(
        &mut self,
        kind: Kind,
        concurrency: usize,
        tag: &str,
        duration: Duration,
        fault: Fault,
    ) -> Slice {
        for node in self.servers(kind) {
            if node.is_running() {
                node.cli(&["CONFIG", "RESETSTAT"]);
            }
        }
        let redis_pids: Vec<String> = self
            .servers(kind)
            .iter()
            .filter_map(|n| n.pid())
            .map(|p| p.to_string())
            .collect();
        let redis_before: Vec<u64> = redis_pids
            .iter()
            .map(|p| proc_cpu_ns(p).unwrap_or(0))
            .collect();
        let bench_before = self_cpu_ns();
        match fault {
            Fault::None => {}
            Fault::Pause => self.cluster.node(FAULT_NODE).pause(),
            Fault::Kill => self.cluster.node(FAULT_NODE).kill(),
        }
        let subject = self.subject(kind);
        let stats_before = subject.stats();
        let samples = self.rt.block_on(drive(
            Arc::clone(&subject),
            format!("{tag}run"),
            concurrency,
            duration,
        ));
        let bench_after = self_cpu_ns();
        // Attempts run inside `drive`: nothing counts after it returned.
        let counts = match (stats_before, subject.stats()) {
            (Some(before), Some(after)) => Counts::between(before, after),
            _ => Counts::default(),
        };
        let settle = if fault == Fault::None {
            SETTLE
        } else {
            SETTLE_FAULT
        };
        self.rt.block_on(async { tokio::time::sleep(settle).await });
        if fault == Fault::Pause {
            self.cluster.node(FAULT_NODE).resume();
            std::thread::sleep(RESUME_WAIT);
        }
        let stats = self
            .servers(kind)
            .iter()
            .map(|n| n.is_running().then(|| NodeStats::read(n)))
            .collect();
        // A killed server's pid is gone, and its CPU time with it.
        let redis_cpu_ns = redis_pids
            .iter()
            .zip(&redis_before)
            .map(|(p, before)| proc_cpu_ns(p).unwrap_or(*before).saturating_sub(*before))
            .sum();
        Slice {
            samples,
            stats,
            bench_cpu_ns: bench_after.saturating_sub(bench_before),
            redis_cpu_ns,
            counts,
        }
    }

    /// This row's lock keys (warm-up included) on each node in use.
    fn count_keys(&self, kind: Kind, tag: &str) -> Vec<Option<usize>> {
        self.servers(kind)
            .iter()
            .map(|n| {
                n.is_running().then(|| {
                    count(n, &format!("redfence:lock:{tag}*"))
                        + count(n, &format!("floor:lock:{tag}*"))
                        + count(n, &format!("rslock:lock:{tag}*"))
                })
            })
            .collect()
    }

    fn progress(&self, row: &Row) {
        eprintln!(
            "{:<46} c={:<2} {:>7.0} cycles/s  p50 {:>7.1} µs  p99 {:>8.1} µs  success {:.4}  write-backs {}  keys left {}{}",
            row.kind.name(),
            row.concurrency,
            row.samples.per_sec(),
            row.p50(),
            row.p99(),
            row.samples.success(),
            row.counts.write_backs,
            row.keys_text(),
            first_error_text(&row.samples.first_error)
        );
    }

    fn environment(&self, warmup: f64, measure: f64) -> String {
        let version = self
            .single
            .cli(&["INFO", "server"])
            .lines()
            .find_map(|l| l.trim().strip_prefix("redis_version:").map(str::to_owned))
            .unwrap_or_else(|| "?".to_owned());
        let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
        format!(
            "env: redis-server {version}, nproc {nproc}, tokio multi-thread runtime ({} workers), \
             6 redis-server processes (nodes 0-4 for the 3- and 5-node runs and floor 2; a \
             separate one for the 1-node runs and floor 1); each row {warmup:.2} s warm-up + \
             {measure:.2} s measured ({SLICES} interleaved slices for healthy rows); TTL {} s; \
             node_timeout 100 ms (default); `redfence N nodes` = default client (fencing on, \
             {} fence buckets), `redfence plain N nodes` = fencing(false), `rslock N nodes` = \
             rslock 0.10 with its defaults; contention: one fenced client per task, max_wait {} s",
            self.rt.metrics().num_workers(),
            TTL.as_secs(),
            redfence::limits::FENCE_BUCKETS,
            CONTENTION_MAX_WAIT.as_secs()
        )
    }

    /// Every lock key of the whole run, on every node still running.
    fn final_key_count(&self) -> FinalKeys {
        let keys = |n: &RedisServer| {
            n.is_running().then(|| {
                count(n, "redfence:lock:*") + count(n, "floor:lock:*") + count(n, "rslock:lock:*")
            })
        };
        let text = |k: Option<usize>| k.map_or_else(|| "-".to_owned(), |k| k.to_string());
        let cluster: Vec<Option<usize>> = self.cluster.nodes.iter().map(keys).collect();
        let single = keys(&self.single);
        FinalKeys {
            clean: cluster
                .iter()
                .chain(std::iter::once(&single))
                .all(|k| k.unwrap_or(0) == 0),
            text: format!(
                "{} | {}",
                cluster
                    .iter()
                    .map(|k| text(*k))
                    .collect::<Vec<_>>()
                    .join("/"),
                text(single)
            ),
        }
    }
}

struct FinalKeys {
    clean: bool,
    text: String,
}

impl std::fmt::Display for FinalKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

// ---------------------------------------------------------------------------
// Output.

struct Report<'a> {
    rows: &'a [Row],
    contention: &'a [ContentionRow],
}

impl Report<'_> {
    fn find(&self, kind: Kind, concurrency: usize) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.kind == kind && r.concurrency == concurrency)
    }

    fn reference(&self, r: &Row) -> Option<&Row> {
        let fault = match r.kind {
            Kind::Paused => Fault::Pause,
            Kind::Killed => Fault::Kill,
            _ => return None,
        };
        self.find(Kind::Reference(fault), r.concurrency)
    }

    fn invariants_broken(&self) -> bool {
        self.rows
            .iter()
            .any(|r| r.samples.failed > 0 || r.keys_left() > 0)
            || self.contention.iter().any(ContentionRow::broken)
    }

    fn render(&self) -> String {
        let mut out = String::new();
        self.main_table(&mut out);
        out.push('\n');
        self.peer_table(&mut out);
        out.push('\n');
        self.tokens_table(&mut out);
        out.push('\n');
        self.contention_table(&mut out);
        out.push('\n');
        self.fault_table(&mut out);
        out.push('\n');
        self.cost_table(&mut out);
        out.push('\n');
        self.targets(&mut out);
        out
    }

    fn main_table(&self, out: &mut String) {
        out.push_str(
            "| run | conc | cycles/s | p50 µs | p99 µs | requests/cycle | new conns/cycle | success | keys left per node | p50 ÷ floor 1 | p50 ÷ floor 2 | cycles/s ÷ floor 2 | client CPU µs/cycle | Redis CPU µs/cycle | Redis commands/cycle (incl. Lua) |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|\n",
        );
        let healthy = self.rows.iter().filter(|r| r.kind.healthy_main());
        for r in healthy {
            let f1 = self.find(Kind::Floor1, r.concurrency);
            let f2 = self.find(Kind::Floor2, r.concurrency);
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} | {:.1} | {:.1} | {:.3} | {:.4} | {:.2}% | {} | {} | {} | {} | {:.1} | {:.1} | {:.2} |",
                r.kind.name(),
                r.concurrency,
                r.samples.per_sec(),
                r.p50(),
                r.p99(),
                r.cmds_per_cycle(),
                r.conns_per_cycle(),
                100.0 * r.samples.success(),
                r.keys_text(),
                ratio(f1.map(|f| r.p50() / f.p50())),
                ratio(f2.map(|f| r.p50() / f.p50())),
                ratio(f2.map(|f| r.samples.per_sec() / f.samples.per_sec())),
                r.client_cpu(),
                r.redis_cpu(),
                r.all_cmds_per_cycle(),
            );
        }
    }

    /// The reference table: the floors, the two redfence clients
    /// and the peer, one line each.
    fn peer_table(&self, out: &mut String) {
        out.push_str(
            "Against the peer (rslock 0.10) and the raw floors, from the rows above (floor: \
             floor 2 on 5 nodes, floor 1 on 1 node; CPU and commands at 5 nodes, c=32; client \
             CPU = this process, getrusage; Redis CPU = the nodes' on-CPU time from /proc; \
             commands = every commandstats call, those inside scripts and transactions \
             included):\n\n\
             | client | 5 nodes c=1 cycles/s (p50 µs) | 5 nodes c=32 cycles/s | 1 node c=32 cycles/s | client CPU µs/cycle (5n c=32) | Redis CPU µs/cycle (5n c=32) | Redis commands/cycle (5n, incl. Lua) |\n\
             |---|---:|---:|---:|---:|---:|---:|\n",
        );
        let lines: [(&str, Kind, Kind); 5] = [
            (
                "raw floor (SET NX + EVALSHA, join_all)",
                Kind::Floor2,
                Kind::Floor1,
            ),
            (
                "raw fenced floor (the crate's ACQUIRE script + EVALSHA, join_all)",
                Kind::Floor3(5),
                Kind::Floor3(1),
            ),
            (
                "redfence (default, fencing on)",
                Kind::Redfence(5),
                Kind::Redfence(1),
            ),
            ("redfence fencing(false)", Kind::Plain(5), Kind::Plain(1)),
            ("rslock 0.10", Kind::Rslock(5), Kind::Rslock(1)),
        ];
        for (name, five, one) in lines {
            let f1 = self.find(five, 1);
            let f32 = self.find(five, 32);
            let o32 = self.find(one, 32);
            let _ = writeln!(
                out,
                "| {name} | {} | {} | {} | {} | {} | {} |",
                f1.map_or_else(
                    || "-".to_owned(),
                    |r| format!("{:.0} ({:.1})", r.samples.per_sec(), r.p50())
                ),
                num(f32.map(|r| r.samples.per_sec()), 0),
                num(o32.map(|r| r.samples.per_sec()), 0),
                num(f32.map(Row::client_cpu), 1),
                num(f32.map(Row::redis_cpu), 1),
                num(f32.map(Row::all_cmds_per_cycle), 2),
            );
        }
        // What an atomic fenced acquire allows at all on this machine: the
        // raw script fan-out against the peer, and the crate against it.
        for (n, peer) in [(5, Kind::Rslock(5)), (1, Kind::Floor1)] {
            let (Some(f3), Some(p), Some(rf)) = (
                self.find(Kind::Floor3(n), 32),
                self.find(peer, 32),
                self.find(Kind::Redfence(n), 32),
            ) else {
                continue;
            };
            let _ = writeln!(
                out,
                "\n{n} node{} c=32: the raw fenced floor runs at {:.2}× {}'s cycles/s (Redis CPU \
                 {:.1} vs {:.1} µs/cycle); the default client at {:.2}× the raw fenced floor \
                 (client CPU {:.1} vs {:.1} µs/cycle).",
                if n == 1 { "" } else { "s" },
                f3.samples.per_sec() / p.samples.per_sec(),
                if n == 1 { "floor 1" } else { "rslock" },
                f3.redis_cpu(),
                p.redis_cpu(),
                rf.samples.per_sec() / f3.samples.per_sec(),
                rf.client_cpu(),
                f3.client_cpu(),
            );
        }
    }

    /// Fenced (default) against plain (`fencing(false)`) clients, row pairs
    /// measured in the same slices.
    fn tokens_table(&self, out: &mut String) {
        out.push_str(
            "Tokens cost: fenced (default) ÷ plain (fencing(false)), measured in the same \
             interleaved slices; server µs = commandstats usec of the requests \
             (EVALSHA includes its Lua internals):\n\n\
             | nodes | conc | acquire p50 µs fenced / plain | acquire p50 ÷ | cycles/s fenced / plain | cycles/s ÷ | requests/node/cycle fenced / plain | server µs/cycle fenced / plain | server µs ÷ | server µs more per acquire per node | redis CPU µs/cycle fenced / plain | attempts/cycle fenced | write-back rounds/acquisition fenced |\n\
             |---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in self
            .rows
            .iter()
            .filter(|r| matches!(r.kind, Kind::Redfence(_)))
        {
            let n = r.kind.nodes();
            let Some(p) = self.find(Kind::Plain(n), r.concurrency) else {
                continue;
            };
            let (rs, ps) = (r.redis_usec_per_cycle(), p.redis_usec_per_cycle());
            let _ = writeln!(
                out,
                "| {n} | {} | {:.1} / {:.1} | {:.2}× | {:.0} / {:.0} | {:.2}× | {} / {} | {:.1} / {:.1} | {:.2}× | {:+.1} | {:.1} / {:.1} | {:.3} | {:.4} ({} in {}) |",
                r.concurrency,
                r.acquire_p50(),
                p.acquire_p50(),
                r.acquire_p50() / p.acquire_p50(),
                r.samples.per_sec(),
                p.samples.per_sec(),
                r.samples.per_sec() / p.samples.per_sec(),
                per_node_short(r),
                per_node_short(p),
                rs,
                ps,
                rs / ps,
                (rs - ps) / n as f64,
                r.redis_cpu(),
                p.redis_cpu(),
                r.counts.attempts as f64 / r.cycles(),
                r.write_backs_per_cycle(),
                r.counts.write_backs,
                r.samples.ok,
            );
        }
    }

    fn contention_table(&self, out: &mut String) {
        let _ = write!(
            out,
            "Contention: one resource, 5 nodes, K tasks with one fenced client each, looping \
             acquire (waiting, max_wait {} s; default pacing = Retry::new(): 50 ms + jitter \
             100 ms doubling to 1 s; tight = no delay, jitter 1 ms doubling to 8 ms) → record \
             the token → release; write-back rounds from Client::stats() deltas; token step = \
             mean difference between consecutive tokens (1 when only winners moved the \
             fences); busiest task = its share of the acquisitions (1/K when fair); fences \
             at the end = each node's fence for the resource minus the largest:\n\n\
             | run | K | acquisitions/s | busiest task | attempts/acquisition | write-back rounds/acquisition | write-backs failed | token step | acquire wait p50 / p99 ms | requests/acquisition, all nodes | tokens in grant order (warm-up + window) | overlapping holders | errors | waits cut at the end | lock keys left per node | fences at the end, nodes 0-4 |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---|\n",
            CONTENTION_MAX_WAIT.as_secs()
        );
        for r in self.contention {
            let s = &r.samples;
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} | {:.0}% | {:.2} | {:.4} ({} in {}) | {} | {:.2} | {:.1} / {:.1} | {:.2} | {} | {} | {} | {} | {} | {} |",
                r.name(),
                r.tasks,
                r.per_sec(),
                100.0 * r.busiest_share(),
                r.attempts_per_acquisition(),
                r.write_backs_per_acquisition(),
                r.counts.write_backs,
                s.acquired,
                r.counts.write_backs_failed,
                r.token_step(),
                pct(&s.wait_ns, 0.5) / 1000.0,
                pct(&s.wait_ns, 0.99) / 1000.0,
                r.cmds_per_acquisition(),
                r.tokens_text(),
                s.overlaps,
                s.errors + s.short_releases + s.missing_tokens,
                s.cut,
                r.keys_text(),
                r.fences_text(),
            );
        }
        for r in self.contention.iter().filter(|r| r.warm_broken) {
            let _ = writeln!(
                out,
                "\ncontention K={} {}: the warm-up ({} acquisitions) broke an invariant",
                r.tasks,
                r.name(),
                r.warm_acquired
            );
        }
        for r in self
            .contention
            .iter()
            .filter(|r| r.samples.first_error.is_some())
        {
            let _ = writeln!(
                out,
                "\nfirst error in contention K={} {}: {}",
                r.tasks,
                r.name(),
                r.samples.first_error.as_deref().unwrap_or_default()
            );
        }
    }

    fn fault_table(&self, out: &mut String) {
        out.push_str(
            "| fault (5 nodes) | conc | success | cycles/s | p50 µs | p99 µs | healthy p50 µs: bracketing / main table | p50 ÷ healthy: bracketing / main table | release p50 µs (bracketing healthy) | requests/node/cycle, nodes 0-4 | new conns/cycle | keys left per node |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|\n",
        );
        for r in self
            .rows
            .iter()
            .filter(|r| matches!(r.kind, Kind::Paused | Kind::Killed))
        {
            let bracket = self.reference(r);
            let main = self.find(Kind::Redfence(5), r.concurrency);
            let _ = writeln!(
                out,
                "| node {FAULT_NODE} {} | {} | {:.2}% ({} of {}) | {:.0} | {:.1} | {:.1} | {} / {} | {} / {} | {:.1} ({}) | {} | {:.4} | {} |",
                if r.kind == Kind::Paused {
                    "paused (SIGSTOP)"
                } else {
                    "killed (SIGKILL)"
                },
                r.concurrency,
                100.0 * r.samples.success(),
                r.samples.ok,
                r.samples.cycles(),
                r.samples.per_sec(),
                r.p50(),
                r.p99(),
                micros(bracket.map(Row::p50)),
                micros(main.map(Row::p50)),
                ratio(bracket.map(|h| r.p50() / h.p50())),
                ratio(main.map(|h| r.p50() / h.p50())),
                pct(&r.samples.release_ns, 0.5),
                micros(bracket.map(|h| pct(&h.samples.release_ns, 0.5))),
                per_node_text(r),
                r.conns_per_cycle(),
                r.keys_text(),
            );
        }
        for r in self.rows.iter().filter(|r| r.samples.first_error.is_some()) {
            let _ = writeln!(
                out,
                "\nfirst error in `{}` c={}: {}",
                r.kind.name(),
                r.concurrency,
                r.samples.first_error.as_deref().unwrap_or_default()
            );
        }
    }

    fn cost_table(&self, out: &mut String) {
        out.push_str(
            "Where the time goes (acquire and release timed separately inside each cycle; \
             Redis CPU from /proc, client CPU from getrusage):\n\n\
             | run | conc | acquire p50 µs | release p50 µs | nodes pending when release returned | ACQUIRE never sent | attempts/cycle | write-back rounds | requests/node/cycle | redis usec/cycle (commandstats, requests) | redis CPU µs/cycle | bench CPU µs/cycle | raw commandstats calls/cycle (µs/call), all nodes, commands inside scripts and transactions included |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|\n",
        );
        for r in self.rows {
            let _ = writeln!(
                out,
                "| {} | {} | {:.1} | {:.1} | {:.2} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {} |",
                r.kind.name(),
                r.concurrency,
                pct(&r.samples.acquire_ns, 0.5),
                pct(&r.samples.release_ns, 0.5),
                r.samples.release_pending as f64 / r.cycles(),
                r.acquire_not_sent().map_or_else(
                    || "-".to_owned(),
                    |x| {
                        // Write-backs run GET and SET too (module docs).
                        format!("{:.2}%", 100.0 * x)
                    }
                ),
                if r.kind.is_redfence() {
                    format!("{:.3}", r.counts.attempts as f64 / r.cycles())
                } else {
                    "-".to_owned()
                },
                if r.kind.fenced() {
                    r.counts.write_backs.to_string()
                } else {
                    "-".to_owned()
                },
                per_node_text(r),
                r.redis_usec_per_cycle(),
                r.redis_cpu(),
                r.client_cpu(),
                r.raw_commands(),
            );
        }
    }

    /// Every target with what was measured, the ratio and `met`/`MISSED`.
    /// Performance targets are shown, not asserted (a miss does not change
    /// the exit status); the invariant lines repeat what fails the run.
    fn targets(&self, out: &mut String) {
        let mut t = Targets::default();
        let per_sec = |r: &Row| r.samples.per_sec();
        // Throughput at concurrency 32: (target, row, reference, at least).
        let throughput: [(&str, Kind, Kind, f64); 5] = [
            (
                "5 nodes c=32: default cycles/s ≥ 1.0× rslock's",
                Kind::Redfence(5),
                Kind::Rslock(5),
                1.0,
            ),
            (
                "5 nodes c=32: fencing(false) cycles/s ≥ 1.1× rslock's",
                Kind::Plain(5),
                Kind::Rslock(5),
                1.1,
            ),
            (
                "5 nodes c=32: fencing(false) cycles/s ≥ 1.0× floor 2 (raw join_all)",
                Kind::Plain(5),
                Kind::Floor2,
                1.0,
            ),
            (
                "5 nodes c=32: default cycles/s ≥ 1.0× floor 2 (raw join_all)",
                Kind::Redfence(5),
                Kind::Floor2,
                1.0,
            ),
            (
                "1 node c=32: default cycles/s ≥ 0.9× floor 1",
                Kind::Redfence(1),
                Kind::Floor1,
                0.9,
            ),
        ];
        for (what, kind, reference, least) in throughput {
            if let (Some(r), Some(f)) = (self.find(kind, 32), self.find(reference, 32)) {
                let x = per_sec(r) / per_sec(f);
                t.add(
                    what,
                    format!("{:.0} vs {:.0} cycles/s", per_sec(r), per_sec(f)),
                    x,
                    x >= least,
                );
            }
        }
        for c in CONCURRENCY {
            for n in [5, 1] {
                let s = if n == 1 { "" } else { "s" };
                if let (Some(r), Some(p)) = (
                    self.find(Kind::Redfence(n), c),
                    self.find(Kind::Rslock(n), c),
                ) {
                    let x = r.client_cpu() / p.client_cpu();
                    t.add(
                        &format!(
                            "{n} node{s} c={c}: client CPU/cycle (getrusage), default ≤ rslock's"
                        ),
                        format!("{:.1} vs {:.1} µs", r.client_cpu(), p.client_cpu()),
                        x,
                        x <= 1.0,
                    );
                }
                let floor = if n == 1 { Kind::Floor1 } else { Kind::Floor2 };
                if let (Some(r), Some(f)) = (self.find(Kind::Redfence(n), c), self.find(floor, c)) {
                    let x = r.redis_cpu() / f.redis_cpu();
                    t.add(
                        &format!(
                            "{n} node{s} c={c}: Redis CPU/cycle, default (fencing) ≤ 1.25× {}'s",
                            if n == 1 { "floor 1" } else { "floor 2" }
                        ),
                        format!("{:.1} vs {:.1} µs", r.redis_cpu(), f.redis_cpu()),
                        x,
                        x <= 1.25,
                    );
                }
            }
        }
        if let (Some(f1), Some(f2), Some(r5)) = (
            self.find(Kind::Floor1, 1),
            self.find(Kind::Floor2, 1),
            self.find(Kind::Redfence(5), 1),
        ) {
            let x = r5.p50() / f1.p50();
            t.add(
                "c=1: 5-node p50 ≤ 1.15× floor 1's (single node)",
                format!(
                    "{:.1} vs {:.1} µs (floor 2, the raw 5-node fan-out: {:.2}× floor 1)",
                    r5.p50(),
                    f1.p50(),
                    f2.p50() / f1.p50()
                ),
                x,
                x <= 1.15,
            );
        }
        if let (Some(r5), Some(p5)) = (
            self.find(Kind::Redfence(5), 1),
            self.find(Kind::Rslock(5), 1),
        ) {
            let x = r5.p50() / p5.p50();
            t.add(
                "c=1: 5-node p50 ahead of rslock's (< 1.0×)",
                format!("{:.1} vs {:.1} µs", r5.p50(), p5.p50()),
                x,
                x < 1.0,
            );
        }
        for r in self
            .rows
            .iter()
            .filter(|r| matches!(r.kind, Kind::Paused | Kind::Killed))
        {
            let bracket = self.reference(r).map_or(f64::NAN, |h| r.p50() / h.p50());
            let main = self
                .find(Kind::Redfence(5), r.concurrency)
                .map_or(f64::NAN, |h| r.p50() / h.p50());
            t.add(
                &format!(
                    "{} c={}: p50 ≤ 1.2× the bracketing healthy p50, 100 % success",
                    r.kind.name(),
                    r.concurrency
                ),
                format!(
                    "p50 {:.1} µs ({main:.2}× the main table's); success {:.2}% ({} of {})",
                    r.p50(),
                    100.0 * r.samples.success(),
                    r.samples.ok,
                    r.samples.cycles()
                ),
                bracket,
                r.samples.failed == 0 && bracket <= 1.2,
            );
        }
        for r in self
            .rows
            .iter()
            .filter(|r| matches!(r.kind, Kind::Redfence(_)))
        {
            let n = r.kind.nodes();
            if let Some(p) = self.find(Kind::Plain(n), r.concurrency) {
                let x = r.acquire_p50() / p.acquire_p50();
                t.add(
                    &format!(
                        "tokens, {n} node{} c={}: fenced acquire p50 ≤ 1.1× plain's (one round trip)",
                        if n == 1 { "" } else { "s" },
                        r.concurrency
                    ),
                    format!("{:.1} vs {:.1} µs", r.acquire_p50(), p.acquire_p50()),
                    x,
                    x <= 1.1,
                );
            }
        }
        let healthy_fenced: Vec<&Row> = self
            .rows
            .iter()
            .filter(|r| matches!(r.kind, Kind::Redfence(_)))
            .collect();
        let write_backs: u64 = healthy_fenced.iter().map(|r| r.counts.write_backs).sum();
        let acquisitions: u64 = healthy_fenced.iter().map(|r| r.samples.ok).sum();
        t.check(
            "no write-back round in the uncontended steady state",
            format!("{write_backs} in {acquisitions} acquisitions of the healthy fenced rows"),
            write_backs == 0,
        );
        for r in self.contention {
            t.check(
                &format!(
                    "contention K={} {}: tokens increase, no overlap, no failure, 0 keys (invariant)",
                    r.tasks,
                    r.name()
                ),
                format!(
                    "{}; {} overlapping; {} failed; keys {}; write-back rounds/acquisition {:.4}",
                    r.tokens_text(),
                    r.samples.overlaps,
                    r.samples.errors + r.samples.short_releases + r.samples.missing_tokens,
                    r.keys_text(),
                    r.write_backs_per_acquisition()
                ),
                !r.broken(),
            );
        }
        let rf: Vec<&Row> = self.rows.iter().filter(|r| r.kind.is_redfence()).collect();
        let conns: u64 = rf.iter().map(|r| r.new_conns()).sum();
        t.check(
            "0 new connections per cycle (redfence rows)",
            format!(
                "{conns} in all redfence windows (the reconnect after the restart is outside them)"
            ),
            conns == 0,
        );
        let off: Vec<String> = rf
            .iter()
            .filter(|r| matches!(r.kind, Kind::Redfence(_) | Kind::Plain(_)))
            .filter(|r| !r.exactly_two_per_node())
            .map(|r| {
                format!(
                    "{} c={}: {} (ACQUIRE never sent {:.2}%)",
                    r.kind.name(),
                    r.concurrency,
                    per_node_text(r),
                    100.0 * r.acquire_not_sent().unwrap_or(0.0)
                )
            })
            .collect();
        t.check(
            "exactly 2 requests (round trips) per node per cycle, healthy redfence rows",
            if off.is_empty() {
                "2 in every row, fenced and plain".to_owned()
            } else {
                format!("off in: {}", off.join("; "))
            },
            off.is_empty(),
        );
        let leaks: Vec<String> = self
            .rows
            .iter()
            .filter(|r| r.keys_left() > 0)
            .map(|r| format!("{} c={}: {}", r.kind.name(), r.concurrency, r.keys_text()))
            .collect();
        t.check(
            "0 lock keys left after every row (invariant)",
            if leaks.is_empty() {
                "0 everywhere".to_owned()
            } else {
                format!("left in: {}", leaks.join("; "))
            },
            leaks.is_empty(),
        );
        out.push_str("Targets (performance is shown, not asserted):\n\n");
        out.push_str(&t.render());
    }
}

/// The closing targets table.
#[derive(Default)]
struct Targets {
    lines: Vec<(String, String, String, bool)>,
}

impl Targets {
    /// A target with a ratio.
    fn add(&mut self, what: &str, measured: String, ratio: f64, met: bool) {
        self.lines
            .push((what.to_owned(), measured, format!("{ratio:.2}×"), met));
    }

    /// A target without a ratio (a count that must be 0, an invariant).
    fn check(&mut self, what: &str, measured: String, met: bool) {
        self.lines
            .push((what.to_owned(), measured, "-".to_owned(), met));
    }

    fn render(&self) -> String {
        let mut out = String::from("| target | measured | ratio | result |\n|---|---|---:|---|\n");
        for (what, measured, ratio, met) in &self.lines {
            let _ = writeln!(
                out,
                "| {what} | {measured} | {ratio} | {} |",
                if *met { "met" } else { "MISSED" }
            );
        }
        let missed = self.lines.iter().filter(|l| !l.3).count();
        let _ = writeln!(
            out,
            "\n{} of {} met, {missed} missed",
            self.lines.len() - missed,
            self.lines.len()
        );
        out
    }
}

fn ratio(x: Option<f64>) -> String {
    x.map_or_else(|| "-".to_owned(), |x| format!("{x:.2}×"))
}

fn num(x: Option<f64>, decimals: usize) -> String {
    x.map_or_else(|| "-".to_owned(), |x| format!("{x:.decimals$}"))
}

fn micros(x: Option<f64>) -> String {
    x.map_or_else(|| "-".to_owned(), |x| format!("{x:.1}"))
}

/// The per-node commands per cycle, once when every node has the same.
fn per_node_short(r: &Row) -> String {
    let text: Vec<String> = r
        .per_node_cmds()
        .iter()
        .map(|c| c.map_or_else(|| "-".to_owned(), |c| format!("{c:.3}")))
        .collect();
    if text.windows(2).all(|w| w[0] == w[1]) {
        text.first().cloned().unwrap_or_default()
    } else {
        text.join("/")
    }
}

fn per_node_text(r: &Row) -> String {
    r.per_node_cmds()
        .iter()
        .map(|c| c.map_or_else(|| "-".to_owned(), |c| format!("{c:.3}")))
        .collect::<Vec<_>>()
        .join(" / ")
}
