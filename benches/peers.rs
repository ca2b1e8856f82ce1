//! redfence against its peer (rslock 0.10) and the raw floors, each client
//! in a process of its own.
//!
//! Why out of process. `benches/lock.rs` runs every subject in one process,
//! on one tokio runtime: what a row's `getrusage(RUSAGE_SELF)` delta
//! charges to its client includes whatever the other subjects' clients do
//! in the background meanwhile (health probes, reconnect timers,
//! subscription readers, stragglers' replies), and every client shares one
//! allocator and one set of worker threads. In the `lock.rs` run that
//! BENCHMARKS.md documents, rslock was charged 90.8 µs of client CPU per
//! cycle (5 nodes, c=32); alone in a process it costs 32–37 µs (this
//! bench), and a fresh `lock.rs` run charged it 35.9 µs: what one process
//! charges a client depends on what the others happen to be doing. Here
//! each client runs alone in a child process, started the same way,
//! against the same servers.
//!
//! Method. `cargo bench --bench peers` starts 5 `redis-server` processes
//! once (the 1-node rows use node 0). For every row (a subject at 1 or 5
//! nodes and at concurrency 1 or 32) and every repetition, this binary
//! re-executes itself (`std::env::current_exe()` with `--peers-child`,
//! the subject, the concurrency, the warm-up and window lengths, a key
//! prefix of its own and the node URLs as arguments). The child builds
//! the subject's client on a tokio multi-thread runtime (one worker per
//! core, as in the other benches), runs one cycle to connect every node
//! and cache the scripts, warms up (15 % of the window, at most 0.3 s),
//! prints `ready` and waits. The parent resets the counters, takes the
//! CPU snapshots and answers `go`; the child runs its window, lets its
//! background work finish (50 ms, and the quorum floor's last replies),
//! prints its samples and `done`, and waits again, so that the parent
//! reads the counters and the child's CPU while the child still lives;
//! then `exit`. The parent does nothing while a child measures (it is
//! blocked on the child's pipe), and runs no async runtime at all.
//! Repetitions are interleaved round-robin (every row once, in a rotated
//! order, then every row again), and a row shows the median over its
//! repetitions (`REDFENCE_BENCH_REPS`, default 3), with the range of its
//! cycles/s. A cycle is acquire then release, each of the c tasks on its
//! own resource (uncontended), TTL 10 s.
//!
//! Subjects:
//! - `floor`: `SET NX PX`, then the crate's compare-and-delete `RELEASE`
//!   script by `EVALSHA`, each fanned out with `join_all` over one
//!   multiplexed connection per node; a phase is over when every node
//!   answered.
//! - `floor at quorum` (5 nodes): the same commands deciding at the
//!   majority, as Redlock should: once a majority granted, the release
//!   goes to the nodes that granted, and the cycle is over once a majority
//!   confirmed it; the other replies are heard by a task of their own,
//!   which releases a late grant as soon as it answers (never before: its
//!   `SET` may not be written yet; an earlier version that sent the
//!   release to every node at once saw a release overtake its node's `SET`
//!   at c=32, and failed cycles and keys left behind). Each cycle locks a
//!   key of its own (`floor:lock:{resource}:{seq}`), since a late release
//!   may still be on its way when the task's next cycle starts. Its c=1
//!   latency is the floor a quorum client can reach.
//! - `rslock 0.10`: `LockManager::lock` + `unlock`, its defaults (one
//!   multiplexed connection per node, `join_all`, every node awaited).
//! - `redfence acquire`: the default client (fencing on) through
//!   `client.acquire(..)` + `guard.release()`, the API the README leads
//!   with (a waiting acquire: it may subscribe for release notices and
//!   look at the fair queue before its first attempt; that is measured).
//! - `redfence try_acquire`: the same client through `try_acquire`.
//! - `redfence fencing(false)`: `acquire` + `release` with fencing off, so
//!   that it differs from `redfence acquire` in fencing alone.
//!
//! Every redfence client here has the restart guard off
//! (`RestartGuard::off()`, as in the other benches): the servers started a
//! moment ago, which the guard cannot tell from a restart without data and
//! would answer by keeping them out of quorums for one TTL.
//!
//! Counters, per child, on the nodes in use (node 0, or nodes 0-4):
//! - Redis commands per cycle: `CONFIG RESETSTAT` before `go`, `INFO stats
//!   commandstats` after `done`; every `commandstats` call, the commands a
//!   Lua script or a transaction ran included, summed over the nodes in
//!   use, divided by the window's cycles (our own `CONFIG RESETSTAT` and
//!   the INFO's connection are subtracted). The per-command breakdown is
//!   printed under the table.
//! - SUBSCRIBE per cycle: `subscribe` + `ssubscribe` + `psubscribe` calls
//!   of `commandstats`, the same way.
//! - New connections per cycle: the `total_connections_received` delta
//!   (connections are made before the window).
//!
//! CPU, per child:
//! - Client CPU is the child's on-CPU time over the window, read by the
//!   parent from `/proc/<child>/task/*/schedstat` (ns) at `ready` and at
//!   `done`: every thread of the child, its runtime's workers included,
//!   and nothing else. Cross-checks, printed under the table: the child's
//!   own `getrusage(RUSAGE_SELF)` delta from `go` to `done`, and its whole
//!   life (start, connects, warm-up, window, exit) from the rusage that
//!   `wait4` returns for that one child.
//! - Redis CPU is the on-CPU time of the `redis-server`s in use over the
//!   same interval (`/proc/<pid>/task/*/schedstat`), summed over them.
//!
//! Invariants (exit 1 when broken): every cycle succeeds (the resources
//! are uncontended), every child exits cleanly, and after each child no
//! key is left on any node but the crate's fence keys (`redfence:fence:*`,
//! kept by design): none of its `redfence:lock:*`, `rslock:lock:*` or
//! `floor:lock:*` keys (by its prefix) and nothing else. A child's lock
//! keys still there at `done` (a release on its way to a node slower than
//! the 50 ms of settling: releases return at the majority) are waited for
//! while the child still runs, up to 2 s, and shown in the checks table;
//! what counts is what is left once the child has ended (a process that
//! exits with releases in flight leaves their keys for the TTL).
//!
//! `REDFENCE_BENCH_SECS` sets each window (default 2 s) and
//! `REDFENCE_BENCH_REPS` the repetitions (default 3);
//! `REDFENCE_BENCH_SECS=0.2 REDFENCE_BENCH_REPS=1` is the smoke run of
//! `.ci/run` (about 8 s), not a measurement. `REDFENCE_BENCH_ROWS=1x32,5x1`
//! runs only the groups listed (nodes x concurrency), every subject in
//! each; `REDFENCE_BENCH_KINDS=rslock,redfence-acquire` only the subjects
//! listed (by their child argument), for an A/B with more repetitions.
//! Under the main table, the ratios to rslock are also taken per
//! repetition (paired: the two children ran seconds apart) and their
//! median shown: the machine's speed drifts by tens of per cent over a
//! run, which a ratio of medians over 3 repetitions does not cancel.
//!
//! `cargo bench --bench peers -- --instructions` counts the client's
//! instructions per cycle with callgrind instead (`peers/instructions.rs`).

#[path = "common/mod.rs"]
mod common;
#[path = "../tests/support/process.rs"]
mod process;
#[path = "../tests/support/server.rs"]
mod server;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use server::{Cluster, RedisServer};

const MEASURE_DEFAULT: f64 = 2.0;
const WARMUP_MAX: f64 = 0.3;
const REPS_DEFAULT: usize = 3;
const NODES: [usize; 2] = [1, 5];
const CONCURRENCY: [usize; 2] = [1, 32];
/// After a window, before `done`: the background part of a cycle on a
/// healthy node (a release heard after the majority) is one round trip.
const SETTLE: Duration = Duration::from_millis(50);
/// The quorum floor's last replies, at most.
const STRAGGLERS_BOUND: Duration = Duration::from_secs(5);
/// How long the parent waits for a child's `ready` (start, connects,
/// warm-up) and, beyond its window, for its `done`.
const CHILD_TIMEOUT: Duration = Duration::from_secs(60);
/// From `exit` to the child's end.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a child's lock keys found at `done` may take to go, while the
/// child still runs (its releases on their way to a slow node).
const DRAIN_BOUND: Duration = Duration::from_secs(2);
/// The first argument of a child.
const CHILD_ARG: &str = "--peers-child";
/// A child with a fixed number of cycles (under callgrind).
const COUNT_ARG: &str = "--peers-count";

#[path = "peers/instructions.rs"]
mod instructions;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Floor,
    FloorQuorum,
    Rslock,
    Acquire,
    TryAcquire,
    Plain,
}

impl Kind {
    const ALL: [Kind; 6] = [
        Kind::Floor,
        Kind::FloorQuorum,
        Kind::Rslock,
        Kind::Acquire,
        Kind::TryAcquire,
        Kind::Plain,
    ];

    /// The child's argument.
    fn arg(self) -> &'static str {
        match self {
            Kind::Floor => "floor",
            Kind::FloorQuorum => "floor-quorum",
            Kind::Rslock => "rslock",
            Kind::Acquire => "redfence-acquire",
            Kind::TryAcquire => "redfence-try",
            Kind::Plain => "redfence-plain",
        }
    }

    fn from_arg(arg: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.arg() == arg)
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Floor => "floor (SET NX + EVALSHA, join_all, all answer)",
            Kind::FloorQuorum => "floor at quorum (same, decides at the majority)",
            Kind::Rslock => "rslock 0.10 (lock + unlock)",
            Kind::Acquire => "redfence acquire (default, fencing on)",
            Kind::TryAcquire => "redfence try_acquire (default, fencing on)",
            Kind::Plain => "redfence fencing(false) (acquire)",
        }
    }

    /// At one node the majority is every node: the quorum floor is the
    /// floor.
    fn runs_on(self, nodes: usize) -> bool {
        self != Kind::FloorQuorum || nodes > 1
    }

    fn is_floor(self) -> bool {
        matches!(self, Kind::Floor | Kind::FloorQuorum)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let code = match args.get(1).map(String::as_str) {
        Some(CHILD_ARG) => child::run(&args[2..]),
        Some(COUNT_ARG) => match instructions::count_child(&args[2..]) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("peers count child: {e}");
                1
            }
        },
        _ if args.iter().any(|a| a == "--instructions") => instructions::parent(),
        _ => parent(),
    };
    // Every server is already killed and reaped (`parent` has returned).
    std::process::exit(code);
}

// ---------------------------------------------------------------------------
// The child: one subject, one window.

mod child {
    use super::*;

    pub fn run(args: &[String]) -> i32 {
        match run_inner(args) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("peers child: {e}");
                1
            }
        }
    }

    struct Args {
        kind: Kind,
        concurrency: usize,
        warmup: Duration,
        window: Duration,
        tag: String,
        urls: Vec<String>,
    }

    fn parse(args: &[String]) -> Result<Args, String> {
        let [kind, concurrency, warmup, window, tag, urls @ ..] = args else {
            return Err(format!(
                "expected: kind concurrency warmup window tag url..., got {args:?}"
            ));
        };
        let secs = |s: &str| {
            s.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| format!("{s:?}: not seconds"))
        };
        Ok(Args {
            kind: Kind::from_arg(kind).ok_or_else(|| format!("{kind:?}: no such subject"))?,
            concurrency: concurrency
                .parse()
                .map_err(|_| format!("{concurrency:?}: not a concurrency"))?,
            warmup: secs(warmup)?,
            window: secs(window)?,
            tag: tag.clone(),
            urls: urls.to_vec(),
        })
    }

    pub(super) async fn subject(kind: Kind, urls: &[String]) -> Result<Subject, String> {
        let sha = redis::Script::new(RELEASE_LUA).get_hash().to_owned();
        let client = |fencing: bool| {
            bench_builder(urls)
                .fencing(fencing)
                .build()
                .map_err(|e| e.to_string())
        };
        Ok(match kind {
            Kind::Floor => Subject::Floor {
                conns: floor_conns(urls).await,
                sha,
                fenced: None,
            },
            Kind::FloorQuorum => Subject::FloorQuorum {
                conns: floor_conns(urls).await,
                sha: sha.into(),
                stragglers: Arc::default(),
            },
            Kind::Rslock => Subject::Rslock(rslock::LockManager::new(urls.to_vec())),
            Kind::Acquire => Subject::RedfenceAcquire(client(true)?),
            Kind::TryAcquire => Subject::Redfence(client(true)?),
            Kind::Plain => Subject::RedfenceAcquire(client(false)?),
        })
    }

    /// The background part of the cycles run so far: one round trip on a
    /// healthy node, and the quorum floor's stragglers.
    pub(super) async fn settle(subject: &Subject) -> Result<(), String> {
        tokio::time::sleep(SETTLE).await;
        if let Subject::FloorQuorum { stragglers, .. } = subject {
            if !stragglers.settle(STRAGGLERS_BOUND).await {
                return Err(format!(
                    "the quorum floor's late replies still pending after {STRAGGLERS_BOUND:?}"
                ));
            }
        }
        Ok(())
    }

    fn say(line: &str) -> Result<(), String> {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}")
            .and_then(|()| out.flush())
            .map_err(|e| format!("writing to the parent: {e}"))
    }

    /// The parent's next line (`None` at end of input: the parent is gone).
    fn hear() -> Option<String> {
        let mut line = String::new();
        match std::io::stdin().lock().read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(line.trim().to_owned()),
        }
    }

    fn run_inner(args: &[String]) -> Result<(), String> {
        let a = parse(args)?;
        let rt = runtime();
        let subject = Arc::new(rt.block_on(subject(a.kind, &a.urls))?);
        // One cycle outside any measurement: connects every node, caches
        // the scripts.
        rt.block_on(subject.cycle(&format!("{}prime", a.tag), 0, 0))
            .map_err(|e| format!("priming failed: {e}"))?;
        let warm = rt.block_on(async {
            let warm = drive(
                Arc::clone(&subject),
                format!("{}warm", a.tag),
                a.concurrency,
                a.warmup,
            )
            .await;
            settle(&subject).await.map(|()| warm)
        })?;
        if warm.failed > 0 {
            return Err(format!(
                "the warm-up failed {} cycles: {}",
                warm.failed,
                warm.first_error.unwrap_or_default()
            ));
        }
        say("ready")?;
        match hear().as_deref() {
            Some("go") => {}
            other => return Err(format!("expected go from the parent, got {other:?}")),
        }
        let cpu_before = self_cpu_ns();
        let stats_before = subject.stats();
        let mut samples = rt.block_on(drive(
            Arc::clone(&subject),
            format!("{}run", a.tag),
            a.concurrency,
            a.window,
        ));
        let counts = match (stats_before, subject.stats()) {
            (Some(before), Some(after)) => Counts::between(before, after),
            _ => Counts::default(),
        };
        let settled = rt.block_on(settle(&subject));
        let cpu = self_cpu_ns().saturating_sub(cpu_before);
        samples.sort();
        let (late_failed, late_error) = match &*subject {
            Subject::FloorQuorum { stragglers, .. } => (
                stragglers.failed.load(std::sync::atomic::Ordering::SeqCst),
                stragglers
                    .first_error
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone(),
            ),
            _ => (0, None),
        };
        say(&format!(
            "result cycles={} ok={} failed={} wall_ns={} p50={} p99={} acquire_p50={} \
             release_p50={} pending={} attempts={} acquired={} write_backs={} cpu_ns={cpu}",
            samples.cycles(),
            samples.ok,
            samples.failed + late_failed,
            nanos(samples.wall),
            pct(&samples.cycle_ns, 0.50),
            pct(&samples.cycle_ns, 0.99),
            pct(&samples.acquire_ns, 0.50),
            pct(&samples.release_ns, 0.50),
            samples.release_pending,
            counts.attempts,
            counts.acquired,
            counts.write_backs,
        ))?;
        let error = samples.first_error.or(late_error).or_else(|| settled.err());
        if let Some(e) = error {
            say(&format!("error {}", e.replace('\n', " ")))?;
        }
        say("done")?;
        // Until the parent has read the counters and this process's CPU.
        let _ = hear();
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The parent: servers, children, counters.

/// `REDFENCE_BENCH_REPS`, or the default.
fn reps() -> Result<usize, String> {
    match std::env::var("REDFENCE_BENCH_REPS") {
        Err(_) => Ok(REPS_DEFAULT),
        Ok(s) => match s.trim().parse::<usize>() {
            Ok(v) if (1..=20).contains(&v) => Ok(v),
            _ => Err(format!(
                "REDFENCE_BENCH_REPS={s:?}: expected repetitions per row, 1 to 20"
            )),
        },
    }
}

/// `REDFENCE_BENCH_KINDS`: the subjects to run (their child arguments),
/// `None` for all of them.
fn kinds() -> Result<Option<Vec<Kind>>, String> {
    let Ok(list) = std::env::var("REDFENCE_BENCH_KINDS") else {
        return Ok(None);
    };
    list.split(',')
        .map(|k| {
            Kind::from_arg(k.trim()).ok_or_else(|| {
                let names: Vec<&str> = Kind::ALL.iter().map(|k| k.arg()).collect();
                format!(
                    "REDFENCE_BENCH_KINDS={list:?}: expected subjects like rslock,redfence-acquire \
                     (any of {})",
                    names.join(", ")
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// `REDFENCE_BENCH_ROWS`: the groups to run, `None` for all of them.
fn groups() -> Result<Option<Vec<(usize, usize)>>, String> {
    let Ok(list) = std::env::var("REDFENCE_BENCH_ROWS") else {
        return Ok(None);
    };
    list.split(',')
        .map(|g| {
            let (n, c) = g.trim().split_once('x').unwrap_or(("", ""));
            match (n.parse(), c.parse()) {
                (Ok(n), Ok(c)) if NODES.contains(&n) && CONCURRENCY.contains(&c) => Ok((n, c)),
                _ => Err(format!(
                    "REDFENCE_BENCH_ROWS={list:?}: expected groups like 1x32,5x1 \
                     (nodes {NODES:?} x concurrency {CONCURRENCY:?})"
                )),
            }
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn parent() -> i32 {
    let measure = match preflight(MEASURE_DEFAULT) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let reps = match reps() {
        Ok(r) => r,
        Err(msg) => {
            eprintln!("{msg}");
            return 2;
        }
    };
    let warmup = (measure * 0.15).min(WARMUP_MAX);
    let load_before = loadavg();
    let started = Instant::now();
    let bench = match Bench::start(warmup, measure) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    let (groups, kinds) = match (groups(), kinds()) {
        (Ok(g), Ok(k)) => (g, k),
        (Err(msg), _) | (_, Err(msg)) => {
            eprintln!("{msg}");
            return 2;
        }
    };
    let mut rows: Vec<Row> = Vec::new();
    for concurrency in CONCURRENCY {
        for nodes in NODES {
            if !groups
                .as_ref()
                .is_none_or(|g| g.contains(&(nodes, concurrency)))
            {
                continue;
            }
            let chosen = |k: &Kind| kinds.as_ref().is_none_or(|list| list.contains(k));
            for kind in Kind::ALL
                .into_iter()
                .filter(|k| k.runs_on(nodes))
                .filter(chosen)
            {
                rows.push(Row {
                    kind,
                    nodes,
                    concurrency,
                    runs: Vec::new(),
                });
            }
        }
    }
    // Round-robin: every row once per repetition, each group of rows (one
    // node count and concurrency) in an order rotated by the repetition.
    for rep in 0..reps {
        let mut start = 0;
        while start < rows.len() {
            let (nodes, concurrency) = (rows[start].nodes, rows[start].concurrency);
            let len = rows[start..]
                .iter()
                .take_while(|r| r.nodes == nodes && r.concurrency == concurrency)
                .count();
            for i in 0..len {
                let index = start + (i + rep) % len;
                let row = &rows[index];
                let run = bench.run_child(row, &format!("r{index:02}s{rep}-"));
                progress(row, rep, reps, &run);
                rows[index].runs.push(run);
            }
            start += len;
        }
    }
    let report = Report { rows: &rows };
    println!(
        "{}, load average {load_before} before / {} after",
        bench.environment(warmup, measure, reps),
        loadavg()
    );
    println!();
    print!("{}", report.render());
    println!("bench wall time: {:.1} s", started.elapsed().as_secs_f64());
    if report.broken() {
        println!(
            "\nINVARIANT BROKEN: a cycle failed, a child did not finish cleanly, or a key was \
             left behind (exit 1)"
        );
        1
    } else {
        0
    }
}

struct Bench {
    cluster: Cluster,
    exe: std::path::PathBuf,
    warmup: f64,
    measure: f64,
}

impl Bench {
    fn start(warmup: f64, measure: f64) -> Result<Bench, String> {
        let exe =
            std::env::current_exe().map_err(|e| format!("finding this bench's binary: {e}"))?;
        let cluster = Cluster::start(5);
        // The floors run the crate's RELEASE script by EVALSHA without a
        // fallback, and may run before any client loaded it.
        let sha = redis::Script::new(RELEASE_LUA).get_hash().to_owned();
        for node in &cluster.nodes {
            let loaded = node.cli(&["SCRIPT", "LOAD", RELEASE_LUA]);
            if loaded != sha {
                return Err(format!(
                    "SCRIPT LOAD of the release script gave {loaded:?}, not {sha}"
                ));
            }
        }
        Ok(Bench {
            cluster,
            exe,
            warmup,
            measure,
        })
    }

    fn nodes(&self, n: usize) -> &[RedisServer] {
        &self.cluster.nodes[..n]
    }

    /// One child: `row`'s subject for one window, its keys prefixed `tag`.
    fn run_child(&self, row: &Row, tag: &str) -> Run {
        let nodes = self.nodes(row.nodes);
        let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
        let mut run = Run::default();
        let spawned = Command::new(&self.exe)
            .arg(CHILD_ARG)
            .arg(row.kind.arg())
            .arg(row.concurrency.to_string())
            .arg(format!("{}", self.warmup))
            .arg(format!("{}", self.measure))
            .arg(tag)
            .args(&urls)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => {
                run.error = Some(format!("starting the child: {e}"));
                return run;
            }
        };
        let pid = child.id();
        let mut talk = Talk::new(&mut child);
        if let Err(e) = self.measure_child(&mut talk, &mut run, nodes, pid, tag) {
            run.error.get_or_insert(e);
            let _ = child.kill();
        }
        drop(talk);
        match reap(&mut child) {
            Ok((code, cpu_ns)) => {
                run.life_cpu_ns = cpu_ns;
                run.exited_cleanly = code == Some(0);
                if code != Some(0) {
                    run.error
                        .get_or_insert_with(|| format!("the child exited with {code:?}"));
                }
            }
            Err(e) => {
                run.error.get_or_insert(e);
            }
        }
        // After the child's end: nothing of it can still be on its way.
        run.keys = self
            .cluster
            .nodes
            .iter()
            .map(|n| Keys::count(n, tag))
            .collect();
        run
    }

    fn measure_child(
        &self,
        talk: &mut Talk,
        run: &mut Run,
        nodes: &[RedisServer],
        pid: u32,
        tag: &str,
    ) -> Result<(), String> {
        talk.expect("ready", CHILD_TIMEOUT)?;
        let pid = pid.to_string();
        let redis_pids: Vec<String> = nodes
            .iter()
            .filter_map(RedisServer::pid)
            .map(|p| p.to_string())
            .collect();
        for node in nodes {
            node.cli(&["CONFIG", "RESETSTAT"]);
        }
        let redis_before: Vec<u64> = redis_pids
            .iter()
            .map(|p| proc_cpu_ns(p).unwrap_or(0))
            .collect();
        let child_before = proc_cpu_ns(&pid).ok_or("reading the child's CPU time")?;
        talk.say("go")?;
        let window = Duration::from_secs_f64(self.measure);
        let lines = talk.expect("done", window + CHILD_TIMEOUT)?;
        let child_after = proc_cpu_ns(&pid).ok_or("reading the child's CPU time")?;
        run.redis_cpu_ns = redis_pids
            .iter()
            .zip(&redis_before)
            .map(|(p, before)| proc_cpu_ns(p).unwrap_or(*before).saturating_sub(*before))
            .sum();
        run.child_cpu_ns = child_after.saturating_sub(child_before);
        for node in nodes {
            run.stats.add(&NodeStats::read(node));
        }
        // The child's lock keys, while it still runs: a release still on
        // its way to a node slower than the settling time is heard here.
        (run.keys_at_done, run.drained_in) = self.drain(tag);
        talk.say("exit")?;
        for line in lines {
            if let Some(fields) = line.strip_prefix("result ") {
                run.absorb(fields)?;
            } else if let Some(e) = line.strip_prefix("error ") {
                run.error.get_or_insert_with(|| e.to_owned());
            }
        }
        if run.cycles == 0 {
            return Err("the child reported no result".to_owned());
        }
        Ok(())
    }

    /// This child's lock keys on every node at `done`, and how long they
    /// took to go (`None`: still there after [`DRAIN_BOUND`]).
    fn drain(&self, tag: &str) -> (usize, Option<Duration>) {
        let started = Instant::now();
        let count = || -> usize {
            self.cluster
                .nodes
                .iter()
                .map(|n| Keys::count_locks(n, tag))
                .sum()
        };
        let found = count();
        let mut left = found;
        while left > 0 {
            if started.elapsed() >= DRAIN_BOUND {
                return (found, None);
            }
            std::thread::sleep(Duration::from_millis(10));
            left = count();
        }
        (found, Some(started.elapsed()))
    }

    fn environment(&self, warmup: f64, measure: f64, reps: usize) -> String {
        let version = self.cluster.nodes[0]
            .cli(&["INFO", "server"])
            .lines()
            .find_map(|l| l.trim().strip_prefix("redis_version:").map(str::to_owned))
            .unwrap_or_else(|| "?".to_owned());
        let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
        format!(
            "env: redis-server {version}, nproc {nproc}, 5 redis-server processes (1-node rows \
             on node 0); every client in a child process of its own (tokio multi-thread \
             runtime, {nproc} workers); per child {warmup:.2} s warm-up + {measure:.2} s \
             measured; {reps} interleaved repetitions per row, medians shown; TTL {} s; \
             redfence: node_timeout 100 ms (default), restart guard off",
            TTL.as_secs(),
        )
    }
}

/// The parent's side of a child's pipes: lines from its stdout (read by a
/// thread, so that a silent child times out instead of hanging the bench),
/// and its stdin.
struct Talk {
    lines: Receiver<String>,
    stdin: Option<ChildStdin>,
}

impl Talk {
    fn new(child: &mut Child) -> Talk {
        let (tx, lines) = mpsc::channel();
        if let Some(stdout) = child.stdout.take() {
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Talk {
            lines,
            stdin: child.stdin.take(),
        }
    }

    /// The lines before `want`, once `want` arrived.
    fn expect(&self, want: &str, timeout: Duration) -> Result<Vec<String>, String> {
        let deadline = Instant::now() + timeout;
        let mut before = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line == want => return Ok(before),
                Ok(line) => before.push(line),
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!("no {want:?} from the child within {timeout:?}"))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(format!(
                        "the child ended before {want:?} (its output: {before:?})"
                    ))
                }
            }
        }
    }

    fn say(&mut self, line: &str) -> Result<(), String> {
        let stdin = self.stdin.as_mut().ok_or("the child's stdin is closed")?;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("writing {line:?} to the child: {e}"))
    }
}

/// Waits for `child` with `wait4`, which returns that one child's rusage:
/// (its exit code, `None` when a signal ended it; its user + system CPU
/// over its whole life, ns). Killed when it does not end in time.
fn reap(child: &mut Child) -> Result<(Option<i32>, u64), String> {
    let pid = libc::pid_t::try_from(child.id()).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + EXIT_TIMEOUT;
    let mut killed = false;
    loop {
        let mut status = 0;
        let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        let flags = if killed { 0 } else { libc::WNOHANG };
        // SAFETY: `wait4` writes the status and the rusage it is pointed
        // at; a zeroed rusage is a valid value even if it did not.
        let (reaped, usage) = unsafe {
            let reaped = libc::wait4(pid, &mut status, flags, usage.as_mut_ptr());
            (reaped, usage.assume_init())
        };
        if reaped == pid {
            let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
            return Ok((
                code,
                timeval_ns(usage.ru_utime) + timeval_ns(usage.ru_stime),
            ));
        }
        if reaped < 0 {
            return Err(format!(
                "wait4 on the child: {}",
                std::io::Error::last_os_error()
            ));
        }
        if Instant::now() >= deadline && !killed {
            let _ = child.kill();
            killed = true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn timeval_ns(t: libc::timeval) -> u64 {
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000
        + u64::try_from(t.tv_usec).unwrap_or(0) * 1000
}

/// Keys on one node after a child: its lock keys (by its prefix), per kind
/// of client, and anything that is neither a lock key (of any child, each
/// counted after its own child) nor a fence key (kept by design).
#[derive(Debug, Default, Clone, Copy)]
struct Keys {
    redfence: usize,
    rslock: usize,
    floor: usize,
    other: usize,
}

impl Keys {
    const LOCKS: [&str; 3] = ["redfence:lock:", "rslock:lock:", "floor:lock:"];

    fn count(node: &RedisServer, tag: &str) -> Keys {
        let [redfence, rslock, floor] = Self::LOCKS.map(|p| count(node, &format!("{p}{tag}*")));
        let locks: usize = Self::LOCKS
            .iter()
            .map(|p| count(node, &format!("{p}*")))
            .sum();
        let fences = count(node, "redfence:fence:*");
        Keys {
            redfence,
            rslock,
            floor,
            other: count(node, "*").saturating_sub(locks + fences),
        }
    }

    /// The lock keys of the child with prefix `tag`.
    fn count_locks(node: &RedisServer, tag: &str) -> usize {
        Self::LOCKS
            .iter()
            .map(|p| count(node, &format!("{p}{tag}*")))
            .sum()
    }

    fn left(self) -> usize {
        self.redfence + self.rslock + self.floor + self.other
    }
}

/// What one child measured and what the parent read around it.
#[derive(Debug, Default)]
struct Run {
    cycles: u64,
    ok: u64,
    failed: u64,
    wall: Duration,
    /// µs.
    p50: f64,
    p99: f64,
    acquire_p50: f64,
    release_p50: f64,
    /// Releases that returned with nodes still unanswered (summed).
    pending: u64,
    /// redfence rows: `Client::stats()` over the window.
    attempts: u64,
    acquired: u64,
    write_backs: u64,
    /// The child's on-CPU time over the window (schedstat, read by the
    /// parent), ns.
    child_cpu_ns: u64,
    /// The same window by the child's own getrusage, ns.
    child_self_cpu_ns: u64,
    /// The child's whole life (wait4's rusage), ns.
    life_cpu_ns: u64,
    redis_cpu_ns: u64,
    /// Summed over the nodes in use.
    stats: NodeStats,
    /// Per node, all five, after the child ended.
    keys: Vec<Keys>,
    /// The child's lock keys at `done` (releases still on their way).
    keys_at_done: usize,
    /// How long those took to go; `None` if they stayed.
    drained_in: Option<Duration>,
    exited_cleanly: bool,
    error: Option<String>,
}

impl Run {
    fn absorb(&mut self, fields: &str) -> Result<(), String> {
        let map: HashMap<&str, &str> = fields
            .split_whitespace()
            .filter_map(|f| f.split_once('='))
            .collect();
        let int = |name: &str| -> Result<u64, String> {
            map.get(name)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("the child's result has no {name}: {fields}"))
        };
        let float = |name: &str| -> Result<f64, String> {
            map.get(name)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("the child's result has no {name}: {fields}"))
        };
        self.cycles = int("cycles")?;
        self.ok = int("ok")?;
        self.failed = int("failed")?;
        self.wall = Duration::from_nanos(int("wall_ns")?);
        self.p50 = float("p50")?;
        self.p99 = float("p99")?;
        self.acquire_p50 = float("acquire_p50")?;
        self.release_p50 = float("release_p50")?;
        self.pending = int("pending")?;
        self.attempts = int("attempts")?;
        self.acquired = int("acquired")?;
        self.write_backs = int("write_backs")?;
        self.child_self_cpu_ns = int("cpu_ns")?;
        Ok(())
    }

    fn per_sec(&self) -> f64 {
        self.cycles as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    fn per_cycle(&self, x: u64) -> f64 {
        x as f64 / self.cycles.max(1) as f64
    }

    fn keys_left(&self) -> usize {
        self.keys.iter().map(|k| k.left()).sum()
    }

    fn broken(&self) -> bool {
        self.failed > 0
            || self.cycles == 0
            || self.error.is_some()
            || !self.exited_cleanly
            || self.keys_left() > 0
    }
}

struct Row {
    kind: Kind,
    nodes: usize,
    concurrency: usize,
    runs: Vec<Run>,
}

impl Row {
    fn median(&self, f: impl Fn(&Run) -> f64) -> f64 {
        median(self.runs.iter().map(f).collect())
    }

    fn per_sec(&self) -> f64 {
        self.median(Run::per_sec)
    }

    fn per_sec_range(&self) -> (f64, f64) {
        let rates: Vec<f64> = self.runs.iter().map(Run::per_sec).collect();
        (
            rates.iter().copied().fold(f64::INFINITY, f64::min),
            rates.iter().copied().fold(0.0, f64::max),
        )
    }

    fn p50(&self) -> f64 {
        self.median(|r| r.p50)
    }

    fn p99(&self) -> f64 {
        self.median(|r| r.p99)
    }

    fn acquire_p50(&self) -> f64 {
        self.median(|r| r.acquire_p50)
    }

    /// Client CPU per cycle, µs: the child's on-CPU time over the window.
    fn client_cpu(&self) -> f64 {
        self.median(|r| r.per_cycle(r.child_cpu_ns) / 1000.0)
    }

    fn client_self_cpu(&self) -> f64 {
        self.median(|r| r.per_cycle(r.child_self_cpu_ns) / 1000.0)
    }

    /// The child's whole life, ms (not per cycle: it includes the start,
    /// the connects and the warm-up).
    fn life_cpu_ms(&self) -> f64 {
        self.median(|r| r.life_cpu_ns as f64 / 1e6)
    }

    fn redis_cpu(&self) -> f64 {
        self.median(|r| r.per_cycle(r.redis_cpu_ns) / 1000.0)
    }

    /// Client and Redis CPU per cycle, µs: on this machine both share the
    /// same two cores, so at c=32 their sum bounds the throughput.
    fn total_cpu(&self) -> f64 {
        self.median(|r| r.per_cycle(r.child_cpu_ns + r.redis_cpu_ns) / 1000.0)
    }

    fn cycles(&self) -> u64 {
        self.runs.iter().map(|r| r.cycles).sum()
    }

    /// Over every repetition: calls ÷ cycles.
    fn per_cycle_total(&self, x: impl Fn(&Run) -> u64) -> f64 {
        self.runs.iter().map(x).sum::<u64>() as f64 / self.cycles().max(1) as f64
    }

    fn commands(&self) -> f64 {
        self.per_cycle_total(|r| r.stats.calls.values().sum())
    }

    fn subscribes(&self) -> f64 {
        self.per_cycle_total(|r| {
            ["subscribe", "ssubscribe", "psubscribe"]
                .iter()
                .map(|c| r.stats.calls_of(c))
                .sum()
        })
    }

    fn new_conns(&self) -> f64 {
        self.per_cycle_total(|r| r.stats.conns)
    }

    fn attempts(&self) -> f64 {
        self.per_cycle_total(|r| r.attempts)
    }

    fn write_backs(&self) -> u64 {
        self.runs.iter().map(|r| r.write_backs).sum()
    }

    fn pending(&self) -> f64 {
        self.per_cycle_total(|r| r.pending)
    }

    fn failed(&self) -> u64 {
        self.runs.iter().map(|r| r.failed).sum()
    }

    fn keys_left(&self) -> usize {
        self.runs.iter().map(Run::keys_left).sum()
    }

    /// The lock keys still there at `done`, over the repetitions, and the
    /// longest they took to go.
    fn late_keys(&self) -> String {
        let found: usize = self.runs.iter().map(|r| r.keys_at_done).sum();
        if found == 0 {
            return "0".to_owned();
        }
        let late = self.runs.iter().filter(|r| r.keys_at_done > 0);
        if late.clone().any(|r| r.drained_in.is_none()) {
            return format!("{found} (some stayed)");
        }
        let longest = late.filter_map(|r| r.drained_in).max().unwrap_or_default();
        format!("{found} (gone within {} ms)", longest.as_millis())
    }

    fn broken(&self) -> bool {
        self.runs.is_empty() || self.runs.iter().any(Run::broken)
    }

    /// Every command the nodes ran per cycle, by name, with its mean
    /// server time per call.
    fn breakdown(&self) -> String {
        let mut total: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for r in &self.runs {
            for (name, c) in &r.stats.calls {
                let e = total.entry(name).or_default();
                e.0 += c;
                e.1 += r.stats.usec.get(name).copied().unwrap_or(0);
            }
        }
        let cycles = self.cycles().max(1) as f64;
        total
            .iter()
            .map(|(name, (c, u))| {
                format!(
                    "{name} {:.3} ({:.1} µs)",
                    *c as f64 / cycles,
                    *u as f64 / (*c).max(1) as f64
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn label(&self) -> String {
        format!(
            "{} | {} | {}",
            self.kind.name(),
            self.nodes,
            self.concurrency
        )
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

fn progress(row: &Row, rep: usize, reps: usize, run: &Run) {
    let keys: Vec<String> = run.keys.iter().map(|k| k.left().to_string()).collect();
    eprintln!(
        "rep {}/{reps} {:<48} {} node{} c={:<2} {:>7.0} cycles/s  p50 {:>7.1} µs  client CPU {:>6.1} µs/cycle  Redis CPU {:>6.1} µs/cycle  failed {}  keys at done {}  left {}{}",
        rep + 1,
        row.kind.name(),
        row.nodes,
        if row.nodes == 1 { " " } else { "s" },
        row.concurrency,
        run.per_sec(),
        run.p50,
        run.per_cycle(run.child_cpu_ns) / 1000.0,
        run.per_cycle(run.redis_cpu_ns) / 1000.0,
        run.failed,
        run.keys_at_done,
        keys.join("/"),
        first_error_text(&run.error),
    );
}

// ---------------------------------------------------------------------------
// Output.

struct Report<'a> {
    rows: &'a [Row],
}

impl Report<'_> {
    fn find(&self, kind: Kind, nodes: usize, concurrency: usize) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.kind == kind && r.nodes == nodes && r.concurrency == concurrency)
    }

    fn broken(&self) -> bool {
        self.rows.iter().any(Row::broken)
    }

    fn render(&self) -> String {
        let mut out = String::new();
        self.main_table(&mut out);
        out.push('\n');
        self.paired(&mut out);
        out.push('\n');
        self.details(&mut out);
        out.push('\n');
        self.breakdown(&mut out);
        out.push('\n');
        self.invariants(&mut out);
        out
    }

    fn main_table(&self, out: &mut String) {
        out.push_str(
            "Each client in its own process; medians over the repetitions (cycles/s range = \
             lowest–highest repetition); client CPU = the child's on-CPU time over its window \
             (/proc schedstat, read by the parent); Redis CPU = the nodes in use, same window; \
             Redis commands = every commandstats call, those inside Lua included, summed over \
             the nodes in use; ÷ rslock = this row's median ÷ rslock's at the same nodes and \
             concurrency; p50 ÷ floor at c=1 only (5 nodes: ÷ the floor / ÷ the floor at \
             quorum):\n\n\
             | client | nodes | c | cycles/s | cycles/s range | cycles/s ÷ rslock | cycle p50 µs | cycle p99 µs | acquire p50 µs | p50 ÷ floor | Redis commands/cycle | SUBSCRIBE/cycle | client CPU µs/cycle | client CPU ÷ rslock | Redis CPU µs/cycle | Redis CPU ÷ rslock | client + Redis CPU ÷ rslock |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in self.rows {
            let peer = self.find(Kind::Rslock, r.nodes, r.concurrency);
            let (lo, hi) = r.per_sec_range();
            let vs_floor = if r.concurrency == 1 {
                let floor = self
                    .find(Kind::Floor, r.nodes, 1)
                    .map(|f| r.p50() / f.p50());
                let quorum = self
                    .find(Kind::FloorQuorum, r.nodes, 1)
                    .map(|f| r.p50() / f.p50());
                match quorum {
                    Some(q) => format!("{} / {}", ratio(floor), ratio(Some(q))),
                    None => ratio(floor),
                }
            } else {
                "-".to_owned()
            };
            let _ = writeln!(
                out,
                "| {} | {:.0} | {:.0}–{:.0} | {} | {:.1} | {:.1} | {:.1} | {} | {:.2} | {:.3} | {:.1} | {} | {:.1} | {} | {} |",
                r.label(),
                r.per_sec(),
                lo,
                hi,
                ratio(peer.map(|p| r.per_sec() / p.per_sec())),
                r.p50(),
                r.p99(),
                r.acquire_p50(),
                vs_floor,
                r.commands(),
                r.subscribes(),
                r.client_cpu(),
                ratio(peer.map(|p| r.client_cpu() / p.client_cpu())),
                r.redis_cpu(),
                ratio(peer.map(|p| r.redis_cpu() / p.redis_cpu())),
                ratio(peer.map(|p| r.total_cpu() / p.total_cpu())),
            );
        }
    }

    /// The ratios to rslock taken per repetition: in a repetition the
    /// group's children run one after the other, seconds apart, so a ratio
    /// of two of them is less exposed than a ratio of medians to the
    /// machine's speed drifting over the run (BENCHMARKS.md, "The current
    /// code, measured again, with paired ratios").
    fn paired(&self, out: &mut String) {
        out.push_str(
            "Paired: per repetition, this row's value ÷ rslock's in the same repetition \
             (children of one group run back to back, in an order rotated per repetition); \
             median over the repetitions, with the lowest–highest:\n\n\
             | client | nodes | c | cycles/s ÷ rslock, paired | range | client CPU ÷ rslock, paired | range |\n\
             |---|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in self.rows.iter().filter(|r| r.kind != Kind::Rslock) {
            let Some(peer) = self.find(Kind::Rslock, r.nodes, r.concurrency) else {
                continue;
            };
            let pairs = |f: &dyn Fn(&Run) -> f64| -> Vec<f64> {
                r.runs
                    .iter()
                    .zip(&peer.runs)
                    .map(|(a, b)| f(a) / f(b))
                    .collect()
            };
            let rate = pairs(&Run::per_sec);
            let cpu = pairs(&|run: &Run| run.per_cycle(run.child_cpu_ns));
            let span = |v: &[f64]| {
                let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = v.iter().copied().fold(0.0, f64::max);
                format!("{lo:.2}–{hi:.2}")
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                r.label(),
                ratio(Some(median(rate.clone()))),
                span(&rate),
                ratio(Some(median(cpu.clone()))),
                span(&cpu),
            );
        }
    }

    /// The cross-checks: CPU three ways, attempts, background releases,
    /// connections.
    fn details(&self, out: &mut String) {
        out.push_str(
            "Checks per row: client CPU µs/cycle by /proc schedstat (the table's) and by the \
             child's own getrusage over the same window; the child's whole life by wait4's \
             rusage (start, connects, warm-up, window, exit; ms, median); cycles over all \
             repetitions; releases returned with nodes unanswered (per cycle); redfence: \
             attempts per cycle and write-back rounds (Client::stats); new connections per \
             cycle; the child's lock keys still there at `done` (releases on their way to a \
             node slower than the settling time), summed over the repetitions:\n\n\
             | client | nodes | c | client CPU schedstat / getrusage µs/cycle | child life CPU ms | cycles | pending/cycle | attempts/cycle | write-backs | new conns/cycle | release p50 µs | lock keys at done |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
        );
        for r in self.rows {
            let redfence = !r.kind.is_floor() && r.kind != Kind::Rslock;
            let _ = writeln!(
                out,
                "| {} | {:.1} / {:.1} | {:.0} | {} | {:.3} | {} | {} | {:.4} | {:.1} | {} |",
                r.label(),
                r.client_cpu(),
                r.client_self_cpu(),
                r.life_cpu_ms(),
                r.cycles(),
                r.pending(),
                if redfence {
                    format!("{:.3}", r.attempts())
                } else {
                    "-".to_owned()
                },
                if redfence {
                    r.write_backs().to_string()
                } else {
                    "-".to_owned()
                },
                r.new_conns(),
                r.median(|run| run.release_p50),
                r.late_keys(),
            );
        }
    }

    /// Per command name, per cycle, over the nodes in use and every
    /// repetition (mean server µs per call in parentheses).
    fn breakdown(&self, out: &mut String) {
        out.push_str(
            "Redis commands per cycle by name (commandstats, summed over the nodes in use and \
             the repetitions; mean server µs per call):\n\n",
        );
        for r in self.rows {
            let _ = writeln!(
                out,
                "- {} {} node{} c={}: {:.3} = {}",
                r.kind.name(),
                r.nodes,
                if r.nodes == 1 { "" } else { "s" },
                r.concurrency,
                r.commands(),
                r.breakdown()
            );
        }
    }

    fn invariants(&self, out: &mut String) {
        let failed: u64 = self.rows.iter().map(Row::failed).sum();
        let keys: usize = self.rows.iter().map(Row::keys_left).sum();
        let children: usize = self.rows.iter().map(|r| r.runs.len()).sum();
        let unclean = self
            .rows
            .iter()
            .flat_map(|r| &r.runs)
            .filter(|r| !r.exited_cleanly)
            .count();
        let _ = writeln!(
            out,
            "Invariants: {children} children, {unclean} not exited cleanly; {failed} failed \
             cycles; {keys} keys left after the children (lock keys of any client, or anything \
             but redfence:fence:*)"
        );
        for r in self.rows {
            for (rep, run) in r.runs.iter().enumerate() {
                if run.broken() {
                    let keys: Vec<String> = run
                        .keys
                        .iter()
                        .map(|k| format!("{}+{}+{}+{}", k.redfence, k.rslock, k.floor, k.other))
                        .collect();
                    let _ = writeln!(
                        out,
                        "BROKEN: {} {} nodes c={} repetition {}: failed {}, exited cleanly {}, \
                         keys left per node (redfence+rslock+floor+other) {}{}",
                        r.kind.name(),
                        r.nodes,
                        r.concurrency,
                        rep + 1,
                        run.failed,
                        run.exited_cleanly,
                        keys.join(" / "),
                        first_error_text(&run.error)
                    );
                }
            }
        }
    }
}

fn ratio(x: Option<f64>) -> String {
    x.map_or_else(|| "-".to_owned(), |x| format!("{x:.2}×"))
}
