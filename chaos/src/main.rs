//! The fault suite: Jepsen-style nemeses against redfence, each run
//! checked by `history::check`, one results table at the end.
//!
//! ```sh
//! # CI: every nemesis for 8 s (a few minutes in all, debug build)
//! cargo run -p chaos -- --nemesis all --duration 8s --seed 7
//! # long form
//! cargo run --release -p chaos -- --nemesis all --duration 10m --seed 7
//! # a subset; `--list` names them all
//! cargo run -p chaos -- --nemesis kill-aof,pause --duration 1m
//! ```
//!
//! Exit status 1 when a nemesis expected to be safe shows a violation, or
//! a negative control (`kill-nopersist`, `failover-noguard`,
//! `sentinel-failover-noguard`, `evict`, `no-fencing`) fails to show one;
//! so CI can run it.
//!
//! ## The rig (one machine, loopback only)
//!
//! Per nemesis, fresh servers: 5 lock nodes and 1 data node (`redis-server`
//! through `tests/support/server.rs`; the data node, which holds the shared
//! counters and the fenced store, is never faulted), and for the network
//! nemeses one `FaultProxy` per lock node between every client and it
//! (for the failover ones also a replica per lock node, to which the
//! proxy is repointed). For the Sentinel ones each lock node is a
//! Sentinel group: its master, a replica and three Sentinels
//! (`redis-server <conf> --sentinel`, through `tests/support/sentinel.rs`),
//! and the clients are given the Sentinels' addresses; the lease is 2 s
//! there, the restart guard's window 2.4 s.
//! Workers are tasks of this process (`--tasks`) and of worker processes
//! (`--procs` × `--proc-tasks`), which are this binary re-executed with
//! `--worker ...`. Each worker has its own lock client and data
//! connection, and loops: pick one of 3 resources (`--resources`; 1 is
//! the hot-lock workload, every worker on one resource), acquire (TTL 400 ms,
//! node timeout 50 ms, at most 2 s of waiting), then in the critical
//! section read-modify-write the resource's counter with plain GET/SET
//! (only the lock protects it: a lost update is broken mutual exclusion)
//! and write its lease to the resource's `FencedStore` key with its token;
//! then release. Half the workers release at once, a quarter hold past the
//! TTL under `AutoExtend` (and repeat the read-modify-write after the
//! extensions), a quarter keep the guard until the lease has run out.
//!
//! With `--workload election` each worker is instead a candidate of the
//! elections `r0`… (one per resource): campaign, the same critical section
//! every 0.3–0.7 TTL while leading with the term as the fenced write's
//! token, then resign or lose the leadership. Leaderships are recorded as
//! grants (term = token), so the same checker verifies at most one leader
//! and strictly increasing terms.
//!
//! With `--workload semaphore` (`worker/semaphore.rs`) each worker waits
//! for one of `--permits` K permits of the semaphores `r0`… and runs the
//! mutex's critical section on the permit's *slot* (its own counter and
//! store key). A permit is recorded as a grant of its slot's resource
//! (`r0:permit:1`) with the slot's token, so the checker's per-resource
//! checks are each slot's exclusion and token order; `bound` adds the
//! family's bound across slots: never more than K holders of one
//! semaphore at once. `--workload semaphore-overcommit` is that check's
//! negative control (the worker processes ask for K + 1 permits).
//!
//! With `--workload rw` (`worker/rw.rs`) each worker reads or writes the
//! read-write locks `r0`… (`--writers-percent` of its rounds write,
//! default 25); writers run the mutex's critical section, readers only
//! hold. Writes are recorded on `r0:write`, so the checker's per-resource
//! checks are the writers' exclusion and token order; each read on a
//! resource of its own, and `bound` joins them: a writer holds alone, and
//! the tokens across modes are what DESIGN.md, section 6b, promises.
//! `--workload rw-unsafe` is its negative control (the writers take a
//! mutex of the lock's name, which readers never meet).
//!
//! ## Clock and history
//!
//! Every event (attempt, grant with its validity deadline, extension,
//! release, lost signal, fenced write, increment, nemesis start/stop,
//! final counter) is one `history::Event` JSON line, stamped in
//! nanoseconds since the run's origin on `CLOCK_MONOTONIC`, read with
//! `clock_gettime` in every process; the parent passes the origin to its
//! workers. Deadlines (`Instant`s) are converted by reading both clocks at
//! once. Worker processes write their lines to stdout; the parent's reader
//! threads append them to the same file as its own workers' events. The
//! histories are kept (`--history-dir`, default a new temporary directory),
//! and with `--svg DIR` each run's timeline is drawn to `DIR/<nemesis>.svg`
//! (`plot`).
//!
//! Module map: `cli` (options), `clock` (the shared clock), `worker` (the
//! workloads, in tasks and processes; `worker/semaphore.rs` the
//! semaphore's, `worker/rw.rs` the read-write lock's), `bound` (the bound
//! across a group's resources: K holders of a semaphore, a writer alone
//! on a read-write lock, and that lock's tokens across modes),
//! `children` (worker processes, their
//! output, the worker-pause gate), `nemesis` (the schedules; its docs have
//! the table of every nemesis; `nemesis/failover.rs` the failover's,
//! `nemesis/sentinel.rs` the Sentinel failover's),
//! `rig` (one run), `report` (rows, verdicts, the checks the history
//! checker cannot make itself), `plot` (a run's SVG timeline, `--svg DIR`).

#[path = "../../tests/support/mariadb.rs"]
mod mariadb;
#[path = "../../tests/support/postgres.rs"]
mod postgres;
#[path = "../../tests/support/process.rs"]
mod process;
#[path = "../../tests/support/proxy.rs"]
mod proxy;
#[path = "../../tests/support/sentinel.rs"]
mod sentinel;
#[path = "../../tests/support/server.rs"]
mod server;

mod bound;
mod children;
mod cli;
mod clock;
mod history;
mod nemesis;
mod once_check;
mod plot;
mod report;
mod rig;
mod sqlstore;
mod worker;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::nemesis::Nemesis;
use crate::report::Outcome;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Set by Ctrl-C: every loop stops early, every `Drop` still runs.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);
/// Set when an event could not be recorded: the history has holes, and a
/// history with holes could pass checks the run would fail.
pub static RECORD_FAILED: AtomicBool = AtomicBool::new(false);

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--worker") {
        return worker::process_main(&args[1..]);
    }
    let opts = match cli::parse(&args) {
        Ok(o) => o,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("error: {e}\n");
            }
            eprintln!("{}", cli::USAGE);
            return ExitCode::from(2);
        }
    };
    if opts.list {
        for n in Nemesis::ALL {
            println!("{:<22} {}", n.name(), n.summary());
        }
        return ExitCode::SUCCESS;
    }
    match suite(&opts) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn suite(opts: &cli::Options) -> Result<ExitCode, BoxError> {
    let dir = match &opts.history_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!(
            "redfence-chaos-seed{}-{}",
            opts.seed,
            std::process::id()
        )),
    };
    std::fs::create_dir_all(&dir)?;
    // One runtime for the whole suite: Ctrl-C is caught by tokio's handler
    // from the first run on, and must keep being caught between runs.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.spawn(async {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("\ninterrupted: stopping the current run and cleaning up");
            INTERRUPTED.store(true, Ordering::Relaxed);
        }
    });

    let started = Instant::now();
    println!(
        "redfence chaos: seed {}, {} workload, {} nemesis run(s) of {} each; {} tasks + {} processes × {} tasks; \
         {} resources{}, TTL {:?}, node timeout {:?}, max wait {:?}, restart guard window {:?}",
        opts.seed,
        opts.workload.name(),
        opts.nemeses.len(),
        cli::show_duration(opts.duration),
        opts.tasks,
        opts.procs,
        opts.proc_tasks,
        opts.resources,
        opts.workload
            .limit(opts.permits)
            .map_or(String::new(), |(limit, _)| format!(" ({limit})")),
        rig::TTL,
        rig::NODE_TIMEOUT,
        rig::MAX_WAIT,
        rig::GUARD_WINDOW,
    );
    println!("histories: {}", dir.display());
    let sql = sqlstore::SqlServer::start(opts.store, &dir)?;
    if let Some(sql) = &sql {
        println!(
            "fenced writes: the sqlx {} store at {}",
            opts.store.name(),
            sql.url
        );
    }

    let mut outcomes: Vec<Outcome> = Vec::new();
    for (i, &n) in opts.nemeses.iter().enumerate() {
        if interrupted() {
            break;
        }
        println!(
            "\n== {} ({}/{}): {}",
            n.name(),
            i + 1,
            opts.nemeses.len(),
            n.summary()
        );
        if n.ttl() != rig::TTL {
            println!(
                "  TTL {:?}, restart guard window {:?} for this nemesis",
                n.ttl(),
                n.guard_window()
            );
        }
        let outcome = rig::run(n, i, opts, &rt, &dir, sql.as_ref().map(|s| s.url.as_str()))?;
        if interrupted() {
            // A run cut short proves nothing either way: no row.
            println!("  interrupted; history so far: {}", outcome.path.display());
            break;
        }
        print!("{}", report::details(&outcome));
        let (_, verdict) = report::judge(&outcome);
        println!("  verdict: {verdict}");
        outcomes.push(outcome);
    }
    rt.shutdown_timeout(Duration::from_secs(1));

    println!(
        "\n## Results (seed {}, {} workload, {} per nemesis, wall time {:.0} s)\n",
        opts.seed,
        opts.workload.name(),
        cli::show_duration(opts.duration),
        started.elapsed().as_secs_f64()
    );
    print!("{}", report::table(&outcomes));
    if opts.workload.is_once() {
        println!("\n{}", once_check::LEGEND);
    } else {
        println!(
            "\nmutual-exclusion violations: grants whose validity window began inside another holder's \
             (semaphore workloads: plus grants that made a semaphore's holders more than K; \
             rw workloads: plus grants that put a writer beside another holder); \
             duplicate or decreasing tokens: grants whose token was granted before, or is below one \
             known when their attempt began (rw workloads: plus writes not above an earlier read, \
             reads below an earlier write); \
             lost updates: acknowledged increments missing from the final counters; \
             stale writes: accepted with a token (or, fencing off, a grant rank) below one already written; \
             availability: waiting acquires granted within {:?}; \
             recovery: longest time from a fault's heal to the next grant.",
            rig::MAX_WAIT
        );
    }
    for w in report::liveness_warnings(&outcomes) {
        println!("\nliveness warning (not counted in the exit status): {w}");
    }
    if interrupted() {
        println!("\ninterrupted: the table is partial");
        return Ok(ExitCode::from(130));
    }
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| !report::judge(o).0)
        .map(|o| o.nemesis.name())
        .collect();
    if failed.is_empty() {
        println!("\nall {} nemeses as expected", outcomes.len());
        Ok(ExitCode::SUCCESS)
    } else {
        println!("\nnot as expected: {}", failed.join(", "));
        Ok(ExitCode::FAILURE)
    }
}
