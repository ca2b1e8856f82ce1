//! One nemesis run: fresh servers, workers (tasks here, processes
//! re-executed from this binary), the schedule on its own thread, then the
//! final counters and the check.
//!
//! Ownership is what keeps a failing run from leaking processes: the lock
//! nodes, their replicas (failover), their Sentinels (Sentinel failover)
//! and the data node are `RedisServer`s
//! (killed on drop), the proxies `FaultProxy`s (closed on drop), the
//! worker processes `Children` (killed on drop). Each is a local of
//! [`run`], so an early `?` or a panic drops them all.

use std::net::{Ipv4Addr, SocketAddr};
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;
use redis::AsyncCommands;
use tokio::runtime::Runtime;

use crate::sqlstore::{DataStore, StoreSpec};

use crate::bound;
use crate::children::Children;
use crate::cli::Options;
use crate::clock::{nanos, Clock};
use crate::history::{self, Event, Writer};
use crate::nemesis::{self, Faults, Nemesis};
use crate::once_check;
use crate::plot;
use crate::proxy::FaultProxy;
use crate::report::{self, Outcome};
use crate::sentinel;
use crate::server::{Cluster, RedisServer};
use crate::worker::{self, LockConfig, ProcArgs, Setup, Sink, Style, Workload};
use crate::BoxError;

/// Redlock's usual N: tolerates two nodes down.
pub const NODES: usize = 5;
/// Few resources, many workers: contention on every lock (the default of
/// `--resources`; 1 is the hot-lock workload).
pub const RESOURCES: u32 = 3;
/// Short leases, so that faults outlast them and a run sees many
/// hand-overs.
pub const TTL: Duration = Duration::from_millis(400);
pub const NODE_TIMEOUT: Duration = Duration::from_millis(50);
/// Bound on one waiting acquire.
pub const MAX_WAIT: Duration = Duration::from_secs(2);
/// The restart guard's window: at least the longest TTL in use (it is the
/// only TTL here), with a margin.
pub const GUARD_WINDOW: Duration = Duration::from_millis(500);
/// The lease under the Sentinel nemeses (`Nemesis::ttl` says why).
pub const SENTINEL_TTL: Duration = Duration::from_secs(2);
/// The restart guard's window under the Sentinel nemeses.
pub const SENTINEL_GUARD_WINDOW: Duration = Duration::from_millis(2400);
/// The clients' longest pause between reconnects under the Sentinel
/// nemeses (the library's default is 1 s). A node whose master died is
/// retried at 25, 50, 100 ms…: with the default, the first request to
/// reach a promoted replica came up to a second after the switch, most
/// of what is left of the lease it missed; the control then often showed
/// nothing within a short run. Clients that retry sooner are also the
/// harder test of the guard: they reach the promoted replica first.
const SENTINEL_RECONNECT_BACKOFF: Duration = Duration::from_millis(200);
/// The Sentinels' `down-after-milliseconds`: short, for the failovers the
/// Sentinels decide themselves, and well above their ping period (1 s).
/// At 1 s, a Sentinel that had just switched masters sent its first
/// `PING` to the new one a second after the switch and called it down
/// before the answer came: a second failover, back to the old master.
const SENTINEL_DOWN_AFTER: Duration = Duration::from_secs(2);
/// The Sentinels' `failover-timeout`: also the least time between two
/// failovers of one group they start themselves (twice this).
const SENTINEL_FAILOVER_TIMEOUT: Duration = Duration::from_secs(2);
/// Between the servers' start and the first client. The restart guard
/// treats a node it first sees with an uptime below its window as just
/// restarted; Redis reports uptime in whole seconds, rounded down, so
/// after a second every node reports at least 1 s and votes at once. The
/// measured run then starts with every node voting.
const WARM_UP: Duration = Duration::from_millis(1100);
/// The last faults heal this long before the workers stop, so the end of
/// every run measures recovery.
const TAIL: Duration = Duration::from_secs(1);

/// Runs `nemesis` for `opts.duration`; `index` numbers the history file and
/// varies the seed per nemesis.
pub fn run(
    nemesis: Nemesis,
    index: usize,
    opts: &Options,
    rt: &Runtime,
    dir: &Path,
    sql_url: Option<&str>,
) -> Result<Outcome, BoxError> {
    let wall = Instant::now();
    let mut cluster = start_local(|| Cluster::start_with(NODES, |_| nemesis.server_options()))?;
    let data = start_local(RedisServer::start)?;
    // Started with the nodes, so that they are in sync before the first
    // fault.
    let mut replicas: Vec<RedisServer> = if nemesis.uses_replicas() {
        start_local(|| {
            cluster
                .nodes
                .iter()
                .map(|n| RedisServer::start_with(nemesis::replica_options(n.port())))
                .collect()
        })?
    } else {
        Vec::new()
    };
    let (ttl, window) = (nemesis.ttl(), nemesis.guard_window());
    let sentinels: Vec<Vec<RedisServer>> = if nemesis.uses_sentinels() {
        start_local(|| start_sentinel_groups(&cluster, &replicas))?
    } else {
        Vec::new()
    };
    // The Sentinels report a master's uptime as no more than the time
    // they have known it (`role-reported-time`, from their start): the
    // clients start once that is past the window, so that every node
    // votes from the first request.
    let warm_up = if sentinels.is_empty() {
        WARM_UP
    } else {
        WARM_UP.max(window + Duration::from_millis(500))
    };
    let proxies: Vec<FaultProxy> = if nemesis.uses_proxies() {
        cluster
            .nodes
            .iter()
            .map(|n| FaultProxy::start(SocketAddr::from((Ipv4Addr::LOCALHOST, n.port()))))
            .collect::<std::io::Result<_>>()?
    } else {
        Vec::new()
    };
    let urls = if !sentinels.is_empty() {
        sentinels.iter().map(|s| sentinel::url(s)).collect()
    } else if proxies.is_empty() {
        cluster.urls()
    } else {
        proxies.iter().map(FaultProxy::url).collect()
    };
    let path = dir.join(format!(
        "{:02}-{}{}.jsonl",
        index + 1,
        nemesis.name(),
        workload_suffix(opts)
    ));
    // The writer's own clock is not used: every stamp comes from `Clock`.
    let writer = Arc::new(Writer::create(&path, Instant::now())?);
    thread::sleep(warm_up);

    // A table per run: each run's lock nodes are new, so its tokens owe
    // nothing to the last run's.
    let store = StoreSpec {
        kind: opts.store,
        url: sql_url.map_or_else(|| data.url(), str::to_owned),
        table: format!("chaos_fenced_{}_{:02}", std::process::id(), index + 1),
    };
    rt.block_on(DataStore::create(&store))?;
    let seed = worker::worker_seed(opts.seed, 1_000_000 + index as u32);
    let lock = LockConfig {
        workload: opts.workload,
        ttl,
        node_timeout: NODE_TIMEOUT,
        max_wait: MAX_WAIT,
        resources: opts.resources,
        permits: opts.permits,
        writers_percent: opts.writers_percent,
        fencing: nemesis.fencing(),
        guard: nemesis.restart_guard().then_some(window),
        reconnect_backoff_max: nemesis
            .uses_sentinels()
            .then_some(SENTINEL_RECONNECT_BACKOFF),
        announce: false,
    };
    let clock = Clock::start();
    let until_ns = nanos(opts.duration);
    let proc_args: Vec<ProcArgs> = (0..opts.procs)
        .map(|p| ProcArgs {
            index: p,
            tasks: opts.proc_tasks,
            first_id: 100 * (p + 1),
            nodes: urls.clone(),
            data_url: data.url(),
            store: store.clone(),
            origin_ns: clock.origin_ns(),
            until_ns,
            seed,
            lock: LockConfig {
                announce: nemesis.pauses_workers(),
                ..lock.clone()
            },
            parent_pid: std::process::id(),
        })
        .collect();
    let mut children = Children::spawn(&proc_args, &writer, clock)?;
    let setup = Arc::new(Setup {
        nodes: urls,
        data_url: data.url(),
        store,
        lock,
        clock,
        until_ns,
        sink: Sink::File(Arc::clone(&writer)),
    });

    let mut faults = Faults {
        nodes: &mut cluster,
        replicas: &mut replicas,
        proxies: &proxies,
        sentinels: &sentinels,
        workers: children.targets(),
        writer: &writer,
        clock,
        heal_by_ns: until_ns.saturating_sub(nanos(TAIL)),
        rng: StdRng::seed_from_u64(seed),
        ttl,
        window,
        injected: 0,
        notes: Vec::new(),
    };
    let mut errors = Vec::new();
    let (task_errors, schedule) = thread::scope(|s| {
        let schedule = s.spawn(|| nemesis::run(nemesis, &mut faults));
        let task_errors = rt.block_on(run_tasks(Arc::clone(&setup), opts, seed));
        let schedule = schedule
            .join()
            .unwrap_or_else(|_| Err("the nemesis thread panicked".into()));
        (task_errors, schedule)
    });
    errors.extend(task_errors);
    if let Err(e) = schedule {
        errors.push(e);
    }
    let (injected, notes) = (faults.injected, std::mem::take(&mut faults.notes));
    // Workers start no acquire after `until`; one may still be waiting
    // (max_wait) and holding (a few TTLs) after it.
    errors.extend(children.wait(Instant::now() + MAX_WAIT * 2 + ttl * 10));
    let bad = children.bad_lines();
    if bad > 0 {
        errors.push(format!("{bad} lines from worker processes were not events"));
    }

    // Every worker has stopped; an increment still in flight would have
    // timed out by now.
    thread::sleep(Duration::from_millis(100));
    let counters = setup.lock.counters();
    for e in rt.block_on(final_counters(&data.url(), counters, &writer)) {
        errors.push(e);
    }
    writer.flush()?;
    if crate::RECORD_FAILED.load(std::sync::atomic::Ordering::Relaxed) {
        errors.push("recording an event failed: the history is incomplete".into());
    }
    let events = history::read(&path)?;
    let report = history::check(&events);
    let bound = opts
        .workload
        .limit(opts.permits)
        .map(|(limit, control)| bound::check(&events, limit, control));
    if let Some(dir) = &opts.svg {
        let title = format!(
            "{} (seed {}, {} workload, {}, {} resource(s)): {}",
            nemesis.name(),
            opts.seed,
            opts.workload.name(),
            crate::cli::show_duration(opts.duration),
            opts.resources,
            nemesis.summary()
        );
        std::fs::create_dir_all(dir)?;
        let file = dir.join(format!("{}{}.svg", nemesis.name(), workload_suffix(opts)));
        std::fs::write(&file, plot::svg(&title, &events, &report))?;
    }
    let ranked = (!nemesis.fencing()).then(|| report::check_ranked(&events));
    let once = opts.workload.is_once().then(|| {
        let s = worker::OnceSettings::of(ttl);
        let limits = once_check::Limits {
            wait: s.wait,
            slack: once_check::slack(nemesis, ttl),
            value_ttl: s.value_ttl,
            control: opts.workload == Workload::OnceUnlocked,
        };
        once_check::check(&events, limits)
    });
    let late = report::late(&events);
    Ok(Outcome {
        nemesis,
        duration: opts.duration,
        clients: format!("{} + {}×{}", opts.tasks, opts.procs, opts.proc_tasks),
        resources: opts.resources,
        report,
        bound,
        once,
        ranked,
        late,
        failures: report::failures(&events),
        last_grant_ns: events
            .iter()
            .filter_map(|e| match e {
                Event::Grant { at_ns, .. } => Some(*at_ns),
                _ => None,
            })
            .max(),
        path,
        injected,
        notes,
        errors,
        wall: wall.elapsed(),
    })
}

/// `-election` in the names of an election run's history and timeline, so
/// that both workloads' files can share a directory; nothing for the
/// mutex's, whose names stay as they were.
fn workload_suffix(opts: &Options) -> String {
    match opts.workload {
        Workload::Mutex => String::new(),
        w => format!("-{}", w.name()),
    }
}

/// The parent's worker tasks, to the end of the run. Returns their errors.
async fn run_tasks(setup: Arc<Setup>, opts: &Options, seed: u64) -> Vec<String> {
    let handles: Vec<_> = (0..opts.tasks)
        .map(|i| {
            let id = i + 1;
            let seed = worker::worker_seed(seed, id);
            tokio::spawn(worker::run(id, Style::of(i), seed, Arc::clone(&setup)))
        })
        .collect();
    let deadline = tokio::time::Instant::now()
        + setup.clock.until(setup.until_ns)
        + MAX_WAIT * 2
        + setup.lock.ttl * 10;
    let mut errors = Vec::new();
    for (i, h) in handles.into_iter().enumerate() {
        let abort = h.abort_handle();
        match tokio::time::timeout_at(deadline, h).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => errors.push(format!("worker task {}: {e}", i + 1)),
            Ok(Err(e)) => errors.push(format!("worker task {}: {e}", i + 1)),
            Err(_) => {
                abort.abort();
                errors.push(format!("worker task {} did not finish in time", i + 1));
            }
        }
    }
    errors
}

/// Records each counter's final value.
async fn final_counters(url: &str, counters: u32, writer: &Writer) -> Vec<String> {
    let mut conn = match worker::data_connection(url).await {
        Ok(c) => c,
        Err(e) => return vec![format!("reading the final counters: {e}")],
    };
    let mut errors = Vec::new();
    for r in 0..counters {
        let counter = worker::counter_key(r);
        let value: Result<redis::RedisResult<Option<i64>>, _> =
            tokio::time::timeout(worker::DATA_TIMEOUT, conn.get(&counter)).await;
        match value {
            Ok(Ok(v)) => {
                let event = Event::CounterFinal {
                    counter,
                    value: v.unwrap_or(0),
                };
                if writer.record(&event).is_err() {
                    errors.push("recording a final counter failed".into());
                }
            }
            _ => errors.push(format!("reading {counter} failed")),
        }
    }
    errors
}

/// The harness panics with a precise message (printed by the panic hook)
/// when `redis-server` is missing or will not start; this turns that into
/// an error that names the way around it.
fn start_local<T>(start: impl FnOnce() -> T) -> Result<T, BoxError> {
    panic::catch_unwind(AssertUnwindSafe(start)).map_err(|_| {
        "could not start a local redis-server (see above): install redis-server \
         (Debian: apt-get install redis-server) or set REDIS_SERVER_BIN"
            .into()
    })
}

/// Three Sentinels per lock node, watching its master (and finding its
/// replica); returns once every group knows its replica and its other
/// Sentinels. All fifteen are started first, then waited for: they meet
/// through their hello messages, every 2 s.
fn start_sentinel_groups(cluster: &Cluster, replicas: &[RedisServer]) -> Vec<Vec<RedisServer>> {
    let groups: Vec<Vec<RedisServer>> = cluster
        .nodes
        .iter()
        .map(|n| {
            sentinel::start_sentinels(n.port(), SENTINEL_DOWN_AFTER, SENTINEL_FAILOVER_TIMEOUT)
        })
        .collect();
    for (group, replica) in groups.iter().zip(replicas) {
        sentinel::wait_acquainted(group, 1);
        assert!(
            replica
                .cli(&["INFO", "replication"])
                .contains("master_link_status:up"),
            "replica {} not in sync",
            replica.port()
        );
        for s in group {
            // The replicas' `INFO` every second, not every 10 s: a replica
            // cut off (a master to the Sentinels' eyes) must have answered
            // within 3 s (5 s once its master is down) to be promoted.
            // `SENTINEL DEBUG` is Redis 7's; without it a failover the
            // Sentinels decide may be refused and tried again later.
            let reply = s.cli(&["SENTINEL", "DEBUG", "info-period", "1000"]);
            if reply != "OK" {
                eprintln!("sentinel {}: SENTINEL DEBUG info-period: {reply}", s.port());
            }
        }
    }
    groups
}
