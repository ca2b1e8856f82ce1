//! A Sentinel node against the same master as a plain node, and how long a
//! failover keeps a Sentinel node from granting.
//!
//! `cargo bench --bench sentinel` starts one Sentinel group on 127.0.0.1
//! (a master, a replica, three Sentinels: `tests/support/sentinel.rs`) and
//! two default clients (fencing on, restart guard off: the servers started
//! a moment ago), one given the master's `redis://` URL, one the group's
//! `redis+sentinel://` URL. A cycle is `try_acquire` + `release().await` on
//! a resource of its own, so nothing contends.
//!
//! 1. **Latency, taking turns**: one task runs the two clients cycle by
//!    cycle (plain, Sentinel, plain, ...) for `REDFENCE_BENCH_SECS`
//!    (default 4 s) after a warm-up, so drift on the machine hits both
//!    alike; p50 and p90 of each, and the ratio of the p50s; then 200
//!    cycles of each client alone, counting the commands the master
//!    processed (`total_commands_processed`) per cycle. The master's
//!    address is cached in the Sentinel node's connection: the target is a
//!    ratio ≤ 1.10 (no extra round trip per acquire), reported, not
//!    asserted.
//! 2. **Failover**: the master is killed (SIGKILL) and the Sentinel client
//!    tries every 10 ms; printed: the time from the kill to the first grant
//!    (on the promoted replica), with the Sentinels' `down-after-milliseconds`
//!    of the harness (1.5 s) beside it. With the restart guard on, add one
//!    window (the longest TTL) to that: the promoted replica does not vote
//!    before.

#[path = "../tests/support/process.rs"]
mod process;
#[path = "../tests/support/proxy.rs"]
mod proxy;
#[path = "../tests/support/sentinel.rs"]
mod sentinel;
#[path = "../tests/support/server.rs"]
mod server;

use std::time::{Duration, Instant};

use redfence::{Client, RestartGuard};
use sentinel::{SentinelGroup, DOWN_AFTER};

fn client(url: String) -> Client {
    Client::builder([url])
        .node_timeout(Duration::from_secs(1))
        .restart_guard(RestartGuard::off())
        .build()
        .expect("client")
}

async fn cycle(client: &Client, resource: &str) -> Duration {
    let started = Instant::now();
    let guard = client
        .try_acquire(resource, Duration::from_secs(10))
        .await
        .expect("no error")
        .expect("uncontended");
    guard.release().await;
    started.elapsed()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let secs: f64 = std::env::var("REDFENCE_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4.0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = SentinelGroup::start();
    let plain = client(group.servers[0].url());
    let through = client(group.url());
    runtime.block_on(async {
        let warm_until = Instant::now() + Duration::from_secs_f64((secs * 0.15).min(0.3));
        while Instant::now() < warm_until {
            cycle(&plain, "plain").await;
            cycle(&through, "sentinel").await;
        }
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let until = Instant::now() + Duration::from_secs_f64(secs);
        while Instant::now() < until {
            a.push(cycle(&plain, "plain").await);
            b.push(cycle(&through, "sentinel").await);
        }
        a.sort();
        b.sort();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        // Commands the master processed per cycle, each client alone (the
        // `INFO` that reads the counter counts itself once).
        let processed = || {
            let stats = group.servers[0].cli(&["INFO", "stats"]);
            stats
                .lines()
                .find_map(|l| l.strip_prefix("total_commands_processed:"))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .expect("total_commands_processed")
        };
        let mut per_cycle = Vec::new();
        for c in [&plain, &through] {
            let before = processed();
            for _ in 0..200 {
                cycle(c, "count").await;
            }
            per_cycle.push((processed() - before - 1.0) / 200.0);
        }
        println!("sentinel node against the same master as a plain node, c=1, taking turns ({} cycles each)", a.len());
        println!("| node | p50 µs | p90 µs | master commands per cycle |");
        println!("|---|---|---|---|");
        println!("| plain `redis://` | {:.1} | {:.1} | {:.2} |", us(percentile(&a, 0.5)), us(percentile(&a, 0.9)), per_cycle[0]);
        println!("| `redis+sentinel://` | {:.1} | {:.1} | {:.2} |", us(percentile(&b, 0.5)), us(percentile(&b, 0.9)), per_cycle[1]);
        let ratio = us(percentile(&b, 0.5)) / us(percentile(&a, 0.5));
        println!(
            "p50 ratio sentinel ÷ plain: {ratio:.3} (target ≤ 1.10: {})",
            if ratio <= 1.10 { "met" } else { "MISSED" }
        );
        group.servers[0].kill();
        let killed = Instant::now();
        loop {
            if let Ok(Some(guard)) = through
                .try_acquire("after-failover", Duration::from_secs(10))
                .await
            {
                guard.release().await;
                break;
            }
            assert!(killed.elapsed() < Duration::from_secs(60), "no grant 60 s after the kill");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        println!(
            "master killed → first grant on the promoted replica: {:.2} s (down-after-milliseconds {} ms; guard off; with the guard on add one window)",
            killed.elapsed().as_secs_f64(),
            DOWN_AFTER.as_millis()
        );
    });
}
