//! A free permit against a mutex acquire on the same nodes, in one run:
//! acquire + `release().await` cycles, one task, 1 and 3 nodes, the two
//! rows interleaved in slices (a shared machine drifts). Per cycle: time,
//! attempts (`Client::stats`) and Redis commands (every `commandstats` call
//! on the nodes, scripts' inner calls included, after `CONFIG RESETSTAT`).
//! The semaphore has K = 4 permits and none held: the first slot tried is
//! free, so a permit should cost what a mutex acquire costs.
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

async fn slice(
    servers: &[Server],
    client: &redfence::Client,
    semaphore: Option<&redfence::Semaphore>,
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
        match semaphore {
            Some(sem) => {
                sem.acquire(ttl)
                    .await
                    .expect("a free permit")
                    .release()
                    .await
            }
            None => {
                client
                    .acquire("bench-mutex", ttl)
                    .await
                    .expect("a free lock")
                    .release()
                    .await
            }
        };
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
        "semaphore bench: {secs} s per row in 4 interleaved slices, one task, K = 4, none held"
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
        let (mut mutex, mut permit) = (Row::default(), Row::default());
        runtime.block_on(async {
            // Warm up: connections, script cache.
            for _ in 0..50 {
                client
                    .acquire("bench-mutex", Duration::from_secs(10))
                    .await
                    .unwrap()
                    .release()
                    .await;
                sem.acquire(Duration::from_secs(10))
                    .await
                    .unwrap()
                    .release()
                    .await;
            }
            for _ in 0..4 {
                slice(&servers, &client, None, secs / 4.0, &mut mutex).await;
                slice(&servers, &client, Some(&sem), secs / 4.0, &mut permit).await;
            }
        });
        for (name, row) in [("mutex", mutex), ("semaphore permit", permit)] {
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
