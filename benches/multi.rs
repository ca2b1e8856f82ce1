//! A lock of 3 resources against the crate's own one-resource mutex
//! acquire, on the same nodes, in one run: acquire + `release().await`
//! cycles, one task, 1 and 3 nodes, the two rows interleaved in slices (a
//! shared machine drifts). Per cycle: time, Redis commands (every
//! `commandstats` call on the nodes, scripts' inner calls included, after
//! `CONFIG RESETSTAT`) and requests (`EVALSHA` calls: what the client
//! sends, each one message to one node). Nothing else holds the resources.
//!
//! `cargo bench --bench multi` (`REDFENCE_BENCH_SECS` sets the measured
//! seconds per row, default 2).

#[path = "common/mod.rs"]
mod common;
#[path = "../tests/support/process.rs"]
mod process;
#[path = "../tests/support/server.rs"]
mod server;

use std::time::{Duration, Instant};

use server::RedisServer;

#[derive(Default, Clone, Copy)]
struct Row {
    cycles: u64,
    nanos: u128,
    commands: u64,
    requests: u64,
}

impl Row {
    fn per_cycle_us(&self) -> f64 {
        self.nanos as f64 / 1000.0 / self.cycles.max(1) as f64
    }
    fn per_cycle(&self, n: u64) -> f64 {
        n as f64 / self.cycles.max(1) as f64
    }
}

/// `EVALSHA` calls on a node since the last `CONFIG RESETSTAT`.
fn evalsha_calls(node: &RedisServer) -> u64 {
    node.cli(&["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

const SET: [&str; 3] = ["bench:a", "bench:b", "bench:c"];

async fn slice(
    servers: &[RedisServer],
    client: &redfence::Client,
    multi: bool,
    secs: f64,
    row: &mut Row,
) {
    let ttl = Duration::from_secs(10);
    for s in servers {
        s.cli(&["CONFIG", "RESETSTAT"]);
    }
    let started = Instant::now();
    let mut cycles = 0u64;
    while started.elapsed().as_secs_f64() < secs {
        if multi {
            client
                .lock_all(SET, ttl)
                .await
                .expect("a free set")
                .release()
                .await;
        } else {
            client
                .acquire("bench:mutex", ttl)
                .await
                .expect("a free lock")
                .release()
                .await;
        }
        cycles += 1;
    }
    row.nanos += started.elapsed().as_nanos();
    row.cycles += cycles;
    row.requests += servers.iter().map(evalsha_calls).sum::<u64>();
    row.commands += servers.iter().map(common::command_calls).sum::<u64>();
}

fn main() {
    let secs = match common::preflight(2.0) {
        Ok(secs) => secs,
        Err(code) => std::process::exit(code),
    };
    let runtime = common::runtime();
    println!("multi bench: {secs} s per row in 4 interleaved slices, one task, 3 resources vs 1");
    println!(
        "| nodes | row | cycles | µs/cycle | requests/cycle | Redis commands/cycle | time ratio | requests ratio | commands ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for n in [1usize, 3] {
        let servers: Vec<RedisServer> = (0..n).map(|_| RedisServer::start()).collect();
        let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
        let client = redfence::Client::builder(urls)
            .restart_guard(redfence::RestartGuard::off())
            .build()
            .expect("a client");
        let (mut mutex, mut multi) = (Row::default(), Row::default());
        runtime.block_on(async {
            // Warm up: connections, script cache, fences.
            for _ in 0..50 {
                let ttl = Duration::from_secs(10);
                client
                    .acquire("bench:mutex", ttl)
                    .await
                    .unwrap()
                    .release()
                    .await;
                client.lock_all(SET, ttl).await.unwrap().release().await;
            }
            for _ in 0..4 {
                slice(&servers, &client, false, secs / 4.0, &mut mutex).await;
                slice(&servers, &client, true, secs / 4.0, &mut multi).await;
            }
        });
        for (name, row) in [
            ("mutex, 1 resource", mutex),
            ("lock_all, 3 resources", multi),
        ] {
            println!(
                "| {n} | {name} | {} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                row.cycles,
                row.per_cycle_us(),
                row.per_cycle(row.requests),
                row.per_cycle(row.commands),
                row.per_cycle_us() / mutex.per_cycle_us(),
                row.per_cycle(row.requests) / mutex.per_cycle(mutex.requests),
                row.per_cycle(row.commands) / mutex.per_cycle(mutex.commands),
            );
        }
    }
}
