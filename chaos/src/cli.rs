//! Command-line options of the parent process. Hand-parsed: the suite
//! takes a handful of flags and should not add a dependency for them.

use std::path::PathBuf;
use std::time::Duration;

use crate::nemesis::Nemesis;

pub const USAGE: &str = "\
usage: chaos [--nemesis all|NAME[,NAME...]] [--duration D] [--seed N]
             [--history-dir DIR] [--tasks N] [--procs N] [--proc-tasks N]
             [--resources N] [--store KIND] [--workload KIND] [--permits K]
             [--writers-percent P] [--svg DIR] [--list]

  --nemesis      which faults to run, in order (default all); --list names them
  --duration     how long each nemesis runs: 8s, 90s, 2m, 10m, 500ms (default 10s)
  --seed         seeds every schedule and worker (default: random, printed)
  --history-dir  where the JSON-lines histories go (default: a new temp dir);
                 the files are kept either way and their paths printed
  --tasks        worker tasks in the main process (default 4)
  --procs        worker processes (default 2; at least 1)
  --proc-tasks   worker tasks per process (default 2)
  --resources    resources the workers pick from (default 3; 1 is the hot
                 lock: every worker contends for one resource), 1 to 16;
                 the semaphore and rw workloads' default is 1 (8 workers
                 on one semaphore or read-write lock)
  --store        where the fenced writes go: redis (default, the crate's
                 FencedStore on the data node), or mysql, postgres, sqlite
                 (the sqlx stores on a MariaDB or PostgreSQL server started
                 once for the suite, or an SQLite file in the history dir)
  --workload     what each worker does: mutex (default: acquire, fenced
                 writes, release), or election (campaign, fenced writes with
                 the term while leading, resign or lose the leadership; its
                 terms are the history's grants, so the checks read: at most
                 one leader at a time, terms strictly increasing), or
                 semaphore (one of --permits K permits per resource, the
                 critical section on the permit's slot; checked: never more
                 than K holders of a semaphore at once, each slot exclusive,
                 its tokens strictly increasing), or semaphore-overcommit
                 (the bound's negative control: the worker processes ask
                 for K + 1 permits, the checker must see K + 1 holders), or
                 once (single-flight: client.once(key).get_or_compute on
                 --resources keys whose values expire every quarter lease;
                 checked: computations of a key never overlap inside their
                 leases, no read older than an acknowledged value, waiters
                 back by their deadline, typed outcomes), once-unlocked
                 (its negative control: naive cache-aside, no lock),
                 rw (readers and writers of one read-write lock, the
                 writers running the critical section; checked: a writer
                 holds alone, readers may share, a write's token above
                 every read and write granted before it, a read's at least
                 every earlier write's), or rw-unsafe (its negative
                 control: the writers take a mutex of the lock's name
                 instead of its write lock, the checker must see a writer
                 beside readers)
  --permits      K of the semaphore workloads, 1 to 16 (default 2)
  --writers-percent
                 the share of the rw workloads' rounds that write, 0 to 100
                 (default 25: read-mostly, as read-write locks are used)
  --svg          also draw each run's timeline to DIR/<nemesis>.svg: a lane
                 per worker, its holds, the faults, every violation in red

Exit status 1 when a nemesis expected to be safe shows a violation, or a
negative control fails to show one; 2 on a usage error.";

#[derive(Debug, Clone)]
pub struct Options {
    pub nemeses: Vec<Nemesis>,
    pub duration: Duration,
    pub seed: u64,
    pub history_dir: Option<PathBuf>,
    pub tasks: u32,
    pub procs: u32,
    pub proc_tasks: u32,
    pub resources: u32,
    pub store: crate::sqlstore::StoreKind,
    /// What each worker does (`--workload`).
    pub workload: crate::worker::Workload,
    /// K of the semaphore workloads (`--permits`).
    pub permits: u32,
    /// The share of the rw workloads' rounds that write, in percent.
    pub writers_percent: u32,
    /// Where each run's timeline goes, as `<nemesis>.svg`.
    pub svg: Option<PathBuf>,
    pub list: bool,
}

/// Parses the arguments after the program name.
pub fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        nemeses: Nemesis::ALL.to_vec(),
        duration: Duration::from_secs(10),
        seed: rand::random::<u64>() % 1_000_000,
        history_dir: None,
        tasks: 4,
        procs: 2,
        proc_tasks: 2,
        resources: crate::rig::RESOURCES,
        store: crate::sqlstore::StoreKind::Redis,
        workload: crate::worker::Workload::Mutex,
        permits: 2,
        writers_percent: 25,
        svg: None,
        list: false,
    };
    let mut resources_given = false;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        // `--flag=value` and `--flag value` both work.
        let (flag, inline) = match flag.split_once('=') {
            Some((f, v)) => (f, Some(v.to_owned())),
            None => (flag.as_str(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag {
            "--nemesis" => o.nemeses = parse_nemeses(&value()?)?,
            "--duration" => o.duration = parse_duration(&value()?)?,
            "--seed" => o.seed = parse_num(flag, &value()?)?,
            "--history-dir" => o.history_dir = Some(PathBuf::from(value()?)),
            "--tasks" => o.tasks = parse_num(flag, &value()?)?,
            "--procs" => o.procs = parse_num(flag, &value()?)?,
            "--proc-tasks" => o.proc_tasks = parse_num(flag, &value()?)?,
            "--resources" => {
                o.resources = parse_num(flag, &value()?)?;
                resources_given = true;
            }
            "--store" => o.store = crate::sqlstore::StoreKind::parse(&value()?)?,
            "--workload" => o.workload = crate::worker::Workload::parse(&value()?)?,
            "--permits" => o.permits = parse_num(flag, &value()?)?,
            "--writers-percent" => o.writers_percent = parse_num(flag, &value()?)?,
            "--svg" => o.svg = Some(PathBuf::from(value()?)),
            "--list" => o.list = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    // The worker-pause nemeses stop a whole process, and the brief of the
    // suite is that some clients are separate processes: never zero.
    if o.procs == 0 || o.proc_tasks == 0 {
        return Err("--procs and --proc-tasks must be at least 1".into());
    }
    if !(1..=16).contains(&o.resources) {
        return Err("--resources must be 1 to 16".into());
    }
    // One semaphore unless told: every worker contends for its K permits,
    // so the bound is under pressure all the time and a permit that runs
    // out is taken over at once (what the pause controls need). One
    // read-write lock likewise: readers and writers of one lock.
    if !resources_given && o.workload.limit(o.permits).is_some() {
        o.resources = 1;
    }
    if !(1..=16).contains(&o.permits) {
        return Err("--permits must be 1 to 16".into());
    }
    if o.writers_percent > 100 {
        return Err("--writers-percent must be 0 to 100".into());
    }
    if o.tasks + o.procs * o.proc_tasks > 64 {
        return Err("at most 64 workers in all".into());
    }
    if o.duration < Duration::from_secs(3) {
        return Err("--duration must be at least 3s (warm-up and healing need room)".into());
    }
    Ok(o)
}

fn parse_nemeses(list: &str) -> Result<Vec<Nemesis>, String> {
    if list == "all" {
        return Ok(Nemesis::ALL.to_vec());
    }
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|name| {
            Nemesis::from_name(name).ok_or_else(|| {
                let known: Vec<_> = Nemesis::ALL.iter().map(|n| n.name()).collect();
                format!("unknown nemesis {name:?}; known: {}", known.join(", "))
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .and_then(|v| {
            if v.is_empty() {
                Err("--nemesis lists nothing".into())
            } else {
                Ok(v)
            }
        })
}

fn parse_num<T: std::str::FromStr>(flag: &str, s: &str) -> Result<T, String> {
    s.parse()
        .map_err(|_| format!("{flag}: {s:?} is not a non-negative integer"))
}

/// `500ms`, `8s`, `2m`, `1h`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("bad duration {s:?} (try 8s, 2m, 10m)"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" | "min" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(format!("bad duration unit in {s:?} (ms, s, m, h)")),
    };
    Ok(d)
}

/// `8s`, `2m`, `1m30s`, `750ms`: how the table shows a duration.
pub fn show_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) {
        return format!("{ms}ms");
    }
    let s = ms / 1000;
    match (s / 60, s % 60) {
        (0, s) => format!("{s}s"),
        (m, 0) => format!("{m}m"),
        (m, s) => format!("{m}m{s}s"),
    }
}
