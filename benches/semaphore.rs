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
//! `cargo bench --bench semaphore` (`REDFENCE_BENCH_SECS` sets the measured
//! seconds per row, default 2).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
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
}
