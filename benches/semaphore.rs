//! A free permit against a mutex acquire on the same nodes, in one run:
//! acquire + `release().await` cycles, one task, 1 and 3 nodes, the two
//! rows interleaved in slices (a shared machine drifts). Per cycle: time,
//! attempts (`Client::stats`) and Redis commands (every `commandstats` call
//! on the nodes, scripts' inner calls included, after `CONFIG RESETSTAT`).
//! The semaphore has K = 4 permits and none held: the first slot tried is
//! free, so a permit should cost what a mutex acquire costs. The
//! read-write lock's rows (issue 33: a read lock ≤ 1.2× a mutex acquire)
//! take a read, and a write, of a free lock the same way.
//!
//! The second table is contended: T tasks, each with its own client (T
//! hosts), loop on one semaphore of K permits: a waiting acquire, a 1 ms
//! critical section, `release().await`. K = 1, 2 and 4 with 2K and 8K
//! tasks (the waiters in the semaphore's line, the default), K = 4 again
//! with `fair(false)` (every waiting client retries on every release),
//! beside the mutex's hot lock (the fair queue, 2 and 8 tasks), on 1 and
//! 3 nodes, all in one run. Per row, in the measured window: handoffs
//! (grants) per second, and that ÷ the mutex's hot rate (8 tasks) and ÷
//! K × the mutex's (what each permit serves against one lock); permits
//! held on average (Σ grant → release returned ÷ window: at most K);
//! Redis commands and attempts per acquisition; each acquire's wait (call
//! → grant), p50, p99 and max, and Jain's index of the tasks' grant
//! counts (1 = equal shares). No row may see more than K holders at once
//! (checked: an excess exits 1).
//!
//! `cargo bench --bench semaphore` (`REDFENCE_BENCH_SECS` sets the measured
//! seconds per row, default 2).

#[path = "common/mod.rs"]
mod common;
#[path = "../tests/support/process.rs"]
mod process;
#[path = "../tests/support/server.rs"]
mod server;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Server {
    port: u16,
    child: Child,
}

impl Server {
    fn start() -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let bin = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
        let child = Command::new(bin)
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server runs");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Server { port, child }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn cmd(&self, args: &[&str]) -> String {
        let mut conn = redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .expect("a connection");
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query::<redis::Value>(&mut conn)
            .map(|v| match v {
                redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                redis::Value::VerbatimString { text, .. } => text,
                other => format!("{other:?}"),
            })
            .unwrap_or_default()
    }

    /// Every call in `INFO commandstats`.
    fn calls(&self) -> u64 {
        self.cmd(&["INFO", "commandstats"])
            .lines()
            .filter_map(|l| l.split("calls=").nth(1))
            .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
            .sum()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Default, Clone, Copy)]
struct Row {
    cycles: u64,
    nanos: u128,
    attempts: u64,
    commands: u64,
}

impl Row {
    fn per_cycle_us(&self) -> f64 {
        self.nanos as f64 / 1000.0 / self.cycles.max(1) as f64
    }
    fn per_cycle(&self, n: u64) -> f64 {
        n as f64 / self.cycles.max(1) as f64
    }
}

/// What a row's cycle acquires and releases.
#[derive(Clone, Copy)]
enum Subject<'a> {
    Mutex,
    Permit(&'a redfence::Semaphore),
    Read(&'a redfence::RwLock),
    Write(&'a redfence::RwLock),
}

impl Subject<'_> {
    async fn cycle(self, client: &redfence::Client, ttl: Duration) {
        match self {
            Subject::Permit(sem) => {
                sem.acquire(ttl)
                    .await
                    .expect("a free permit")
                    .release()
                    .await
            }
            Subject::Mutex => {
                client
                    .acquire("bench-mutex", ttl)
                    .await
                    .expect("a free lock")
                    .release()
                    .await
            }
            Subject::Read(rw) => {
                rw.acquire_read(ttl)
                    .await
                    .expect("a free read")
                    .release()
                    .await
            }
            Subject::Write(rw) => {
                rw.acquire_write(ttl)
                    .await
                    .expect("a free write")
                    .release()
                    .await
            }
        };
    }
}

async fn slice(
    servers: &[Server],
    client: &redfence::Client,
    subject: Subject<'_>,
    secs: f64,
    row: &mut Row,
) {
    let ttl = Duration::from_secs(10);
    for s in servers {
        s.cmd(&["CONFIG", "RESETSTAT"]);
    }
    let before = client.stats().attempts;
    let started = Instant::now();
    let mut cycles = 0u64;
    while started.elapsed().as_secs_f64() < secs {
        subject.cycle(client, ttl).await;
        cycles += 1;
    }
    let nanos = started.elapsed().as_nanos();
    // Each server counted our RESETSTAT and now its INFO: not the client's.
    let commands: u64 = servers.iter().map(|s| s.calls().saturating_sub(1)).sum();
    row.cycles += cycles;
    row.nanos += nanos;
    row.attempts += client.stats().attempts - before;
    row.commands += commands;
}

/// What a contended row's tasks take.
#[derive(Clone, Copy)]
enum Kind {
    /// The crate's mutex on one resource (the fair queue, the default).
    Mutex,
    /// A semaphore of K permits; `false`: its waiters without the line
    /// (`fair(false)`, every waiting client retries on every release).
    Semaphore(u32, bool),
    /// A read-write lock: this many of the tasks write, the others read.
    Rw(usize),
    /// Multi-resource locks: task i locks resources i and i + 1 of 3, so
    /// any two tasks' sets overlap (one holder at a time).
    Multi,
}

/// What a contended task holds.
enum Held {
    One(redfence::LockGuard),
    Set(redfence::MultiGuard),
}

impl Held {
    async fn release(self) {
        match self {
            Held::One(guard) => {
                guard.release().await;
            }
            Held::Set(guard) => {
                guard.release().await;
            }
        }
    }
}

/// One task's share of a contended row, in the measured window.
#[derive(Default)]
struct Share {
    grants: u64,
    held: Duration,
    waits: Vec<Duration>,
    /// Whether the task wrote (read-write rows).
    writer: bool,
}

/// A contended row's totals.
struct Hot {
    kind: Kind,
    tasks: usize,
    /// The critical section, ms.
    hold_ms: u64,
    window: Duration,
    shares: Vec<u64>,
    held: Duration,
    waits: Vec<Duration>,
    commands: u64,
    attempts: u64,
    most: usize,
    errors: u64,
    /// Read-write rows: grants that put a writer beside another holder.
    mixed: usize,
    /// Read-write rows: the writers' grants and waits.
    writes: u64,
    write_waits: Vec<Duration>,
}

impl Hot {
    fn grants(&self) -> u64 {
        self.shares.iter().sum()
    }
    fn per_sec(&self) -> f64 {
        self.grants() as f64 / self.window.as_secs_f64()
    }
    fn permits(&self) -> u32 {
        match self.kind {
            Kind::Mutex => 1,
            Kind::Semaphore(k, _) => k,
            // Readers share: the bound is checked by `mixed` instead.
            Kind::Rw(_) => u32::MAX,
            Kind::Multi => 1,
        }
    }
    /// The wait at quantile `q` (0..=1) of the sorted waits, in ms.
    fn wait_ms(&self, q: f64) -> f64 {
        let last = self.waits.len().saturating_sub(1);
        let at = ((last as f64) * q).round() as usize;
        self.waits
            .get(at)
            .map_or(f64::NAN, |w| w.as_secs_f64() * 1e3)
    }
}

/// T tasks, a client each, contending for `kind` (named `name`) for a
/// warm-up and then `secs` measured.
async fn contended(
    servers: &[Server],
    (kind, tasks, hold_ms): (Kind, usize, u64),
    secs: f64,
    name: &str,
) -> Hot {
    let urls: Vec<String> = servers.iter().map(Server::url).collect();
    let clients: Vec<redfence::Client> = (0..tasks)
        .map(|_| {
            redfence::Client::builder(urls.clone())
                .restart_guard(redfence::RestartGuard::off())
                .retry(redfence::Retry::new().with_max_wait(Duration::from_secs(30)))
                .fair(!matches!(kind, Kind::Semaphore(_, false)))
                .build()
                .expect("a client")
        })
        .collect();
    let ttl = Duration::from_secs(10);
    let start = Instant::now() + Duration::from_millis(500);
    let end = start + Duration::from_secs_f64(secs);
    let (holding, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    // Read-write rows: writers holding, and grants that put a writer
    // beside another holder (checked in-process, as the bound above).
    let (writing, mixed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let handles: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(index, client)| {
            let (client, name) = (client.clone(), name.to_owned());
            let (holding, most) = (Arc::clone(&holding), Arc::clone(&most));
            let (writing, mixed) = (Arc::clone(&writing), Arc::clone(&mixed));
            tokio::spawn(async move {
                let semaphore = match kind {
                    Kind::Semaphore(k, _) => Some(client.semaphore(&name, k).expect("a semaphore")),
                    Kind::Mutex | Kind::Rw(_) | Kind::Multi => None,
                };
                let rw = match kind {
                    Kind::Rw(writers) => Some((
                        client.rw_lock(&name).expect("a read-write lock"),
                        index < writers,
                    )),
                    Kind::Mutex | Kind::Semaphore(..) | Kind::Multi => None,
                };
                let set = matches!(kind, Kind::Multi).then(|| {
                    [
                        format!("{name}-{}", index % 3),
                        format!("{name}-{}", (index + 1) % 3),
                    ]
                });
                let writer = rw.as_ref().is_some_and(|(_, w)| *w);
                let (mut share, mut errors) = (Share::default(), 0u64);
                share.writer = writer;
                while Instant::now() < end {
                    let asked = Instant::now();
                    let guard = match (&semaphore, &rw, &set) {
                        (Some(s), _, _) => s.acquire(ttl).await.map(|p| Held::One(p.into_guard())),
                        (None, Some((lock, true)), _) => lock
                            .acquire_write(ttl)
                            .await
                            .map(|g| Held::One(g.into_guard())),
                        (None, Some((lock, false)), _) => lock
                            .acquire_read(ttl)
                            .await
                            .map(|g| Held::One(g.into_guard())),
                        (None, None, Some(set)) => {
                            client.lock_all(set.iter(), ttl).await.map(Held::Set)
                        }
                        (None, None, None) => {
                            client.acquire(name.as_str(), ttl).await.map(Held::One)
                        }
                    };
                    let Ok(guard) = guard else {
                        errors += 1;
                        continue;
                    };
                    let granted = Instant::now();
                    let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    let writers_now = if writer {
                        writing.fetch_add(1, Ordering::SeqCst) + 1
                    } else {
                        writing.load(Ordering::SeqCst)
                    };
                    if writers_now > 0 && now > 1 {
                        mixed.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(hold_ms)).await;
                    if writer {
                        writing.fetch_sub(1, Ordering::SeqCst);
                    }
                    holding.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await;
                    let released = Instant::now();
                    if granted >= start && granted < end {
                        share.grants += 1;
                        share.held += released.min(end) - granted;
                        share.waits.push(granted - asked);
                    }
                }
                (share, errors)
            })
        })
        .collect();
    tokio::time::sleep_until(start.into()).await;
    let (before, attempts) = tokio::task::block_in_place(|| {
        for s in servers {
            s.cmd(&["CONFIG", "RESETSTAT"]);
        }
        let attempts: u64 = clients.iter().map(|c| c.stats().attempts).sum();
        (Instant::now(), attempts)
    });
    tokio::time::sleep_until(end.into()).await;
    let (commands, attempts) = tokio::task::block_in_place(|| {
        let commands: u64 = servers.iter().map(|s| s.calls().saturating_sub(1)).sum();
        let after: u64 = clients.iter().map(|c| c.stats().attempts).sum();
        (commands, after - attempts)
    });
    let window = end
        .saturating_duration_since(before.min(end))
        .max(Duration::from_millis(1));
    let mut hot = Hot {
        kind,
        tasks,
        hold_ms,
        window,
        shares: Vec::new(),
        held: Duration::ZERO,
        waits: Vec::new(),
        commands,
        attempts,
        most: 0,
        errors: 0,
        mixed: 0,
        writes: 0,
        write_waits: Vec::new(),
    };
    for h in handles {
        let (share, errors) = h.await.expect("a contending task");
        hot.shares.push(share.grants);
        hot.held += share.held;
        if share.writer {
            hot.writes += share.grants;
            hot.write_waits.extend(share.waits.iter().copied());
        }
        hot.waits.extend(share.waits);
        hot.errors += errors;
    }
    hot.waits.sort_unstable();
    hot.write_waits.sort_unstable();
    hot.most = most.load(Ordering::SeqCst);
    hot.mixed = mixed.load(Ordering::SeqCst);
    hot
}

/// The contended table: every shape on 1 and 3 nodes, in one run.
fn contended_table(runtime: &tokio::runtime::Runtime, secs: f64) -> bool {
    println!(
        "\ncontended: T tasks (a client each) on one semaphore of K permits, a 1 ms critical section, {secs} s per row"
    );
    println!(
        "| nodes | primitive | K | tasks | handoffs/s | ÷ mutex hot | ÷ (K × mutex hot) | permits held (avg) | Redis commands/acq | attempts/acq | wait p50 ms | p99 ms | max ms | Jain | errors |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    // (primitive, tasks, critical section in ms)
    let shapes: [(Kind, usize, u64); 16] = [
        (Kind::Mutex, 2, 1),
        (Kind::Mutex, 8, 1),
        (Kind::Semaphore(1, true), 2, 1),
        (Kind::Semaphore(1, true), 8, 1),
        (Kind::Semaphore(2, true), 4, 1),
        (Kind::Semaphore(2, true), 16, 1),
        (Kind::Semaphore(4, true), 8, 1),
        (Kind::Semaphore(4, true), 32, 1),
        (Kind::Semaphore(4, false), 8, 1),
        (Kind::Semaphore(4, false), 32, 1),
        (Kind::Semaphore(4, true), 8, 20),
        (Kind::Semaphore(4, false), 8, 20),
        (Kind::Rw(1), 8, 1),
        (Kind::Rw(2), 8, 1),
        (Kind::Multi, 3, 1),
        (Kind::Multi, 12, 1),
    ];
    let mut bounded = true;
    let mut rw_lines: Vec<String> = Vec::new();
    for n in [1usize, 3] {
        let servers: Vec<Server> = (0..n).map(|_| Server::start()).collect();
        let rows: Vec<Hot> = shapes
            .iter()
            .enumerate()
            .map(|(i, &shape)| {
                let name = format!("hot-{n}-{i}");
                runtime.block_on(contended(&servers, shape, secs, &name))
            })
            .collect();
        // The mutex's hot lock: its 8-task row.
        let hot_rate = rows[1].per_sec();
        rw_lines.extend(rows
            .iter()
            .filter(|row| matches!(row.kind, Kind::Rw(_)))
            .map(|row| {
                let writes = row.writes as f64 / row.window.as_secs_f64();
                let reads = row.per_sec() - writes;
                let q = |p: f64| {
                    let last = row.write_waits.len().saturating_sub(1);
                    row.write_waits
                        .get(((last as f64) * p).round() as usize)
                        .map_or(f64::NAN, |w| w.as_secs_f64() * 1e3)
                };
                format!(
                    "{n} node(s), rw lock with {} writer(s) of {} tasks: writes/s {writes:.0}, reads/s {reads:.0}, readers at once (avg) {:.2}, write waits p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                    match row.kind { Kind::Rw(w) => w, _ => 0 },
                    row.tasks,
                    row.held.as_secs_f64() / row.window.as_secs_f64(),
                    q(0.5),
                    q(0.99),
                    q(1.0),
                )
            }));
        for row in &rows {
            let (name, k) = match row.kind {
                Kind::Mutex => ("mutex (fair queue)", 1),
                Kind::Semaphore(k, true) => ("semaphore", k),
                Kind::Semaphore(k, false) => ("semaphore, fair(false)", k),
                Kind::Rw(1) => ("rw lock, 1 writer + readers", 1),
                Kind::Rw(_) => ("rw lock, 2 writers + readers", 1),
                Kind::Multi => ("lock_all, 2 of 3 resources", 1),
            };
            let grants = row.grants().max(1) as f64;
            let name = if row.hold_ms == 1 {
                name.to_owned()
            } else {
                format!("{name}, {} ms held", row.hold_ms)
            };
            println!(
                "| {n} | {name} | {k} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.1} | {:.2} | {:.1} | {:.1} | {:.1} | {:.2} | {} |",
                row.tasks,
                row.per_sec(),
                row.per_sec() / hot_rate,
                row.per_sec() / (f64::from(k) * hot_rate),
                row.held.as_secs_f64() / row.window.as_secs_f64(),
                row.commands as f64 / grants,
                row.attempts as f64 / grants,
                row.wait_ms(0.5),
                row.wait_ms(0.99),
                row.wait_ms(1.0),
                common::jain(&row.shares),
                row.errors,
            );
            if row.most > row.permits() as usize {
                println!("BOUND BROKEN: {} holders of {k} permits at once", row.most);
                bounded = false;
            }
            if row.mixed > 0 {
                println!(
                    "BOUND BROKEN: {} grants put a writer beside another holder",
                    row.mixed
                );
                bounded = false;
            }
        }
    }
    for line in rw_lines {
        println!("{line}");
    }
    bounded
}

fn main() {
    let secs: f64 = std::env::var("REDFENCE_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    println!(
        "semaphore and rw lock bench: {secs} s per row in 4 interleaved slices, one task, K = 4, none held"
    );
    println!(
        "| nodes | row | cycles | µs/cycle | attempts/cycle | Redis commands/cycle | time ratio | commands ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for n in [1usize, 3] {
        let servers: Vec<Server> = (0..n).map(|_| Server::start()).collect();
        let urls: Vec<String> = servers.iter().map(Server::url).collect();
        let client = redfence::Client::builder(urls)
            .restart_guard(redfence::RestartGuard::off())
            .build()
            .expect("a client");
        let sem = client.semaphore("bench-sem", 4).expect("a semaphore");
        let rw = client.rw_lock("bench-rw").expect("a read-write lock");
        let (mut mutex, mut permit) = (Row::default(), Row::default());
        let (mut read, mut write) = (Row::default(), Row::default());
        runtime.block_on(async {
            // Warm up: connections, script cache.
            let subjects = [
                Subject::Mutex,
                Subject::Permit(&sem),
                Subject::Read(&rw),
                Subject::Write(&rw),
            ];
            for _ in 0..50 {
                for subject in subjects {
                    subject.cycle(&client, Duration::from_secs(10)).await;
                }
            }
            for _ in 0..4 {
                let rows = [&mut mutex, &mut permit, &mut read, &mut write];
                for (subject, row) in subjects.into_iter().zip(rows) {
                    slice(&servers, &client, subject, secs / 4.0, row).await;
                }
            }
        });
        let rows = [
            ("mutex", mutex),
            ("semaphore permit", permit),
            ("rw read lock", read),
            ("rw write lock", write),
        ];
        for (name, row) in rows {
            println!(
                "| {n} | {name} | {} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} |",
                row.cycles,
                row.per_cycle_us(),
                row.per_cycle(row.attempts),
                row.per_cycle(row.commands),
                row.per_cycle_us() / mutex.per_cycle_us(),
                row.per_cycle(row.commands) / mutex.per_cycle(mutex.commands),
            );
        }
    }
    if !contended_table(&runtime, secs) {
        std::process::exit(1);
    }
}
