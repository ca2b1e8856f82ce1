//! `redfence bench`: acquire and release latency percentiles and
//! throughput on the user's own nodes, then the same on the first node
//! alone (single-node mode) for comparison. Each task locks its own
//! resource, so there is no contention: what is measured is the protocol's
//! cost on these nodes. A progress bar on a terminal, plain lines otherwise.

use std::io::{IsTerminal as _, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cli::{Bench, Common, EXIT_FAILURE, EXIT_USAGE};
use crate::duration::show;
use crate::fail;

/// One run's measurements.
struct Run {
    target: String,
    nodes: usize,
    concurrency: usize,
    cycles: usize,
    failures: u64,
    elapsed: Duration,
    acquire: Vec<Duration>,
    release: Vec<Duration>,
}

pub(crate) async fn run(common: &Common, args: Bench) -> i32 {
    if args.concurrency.iter().any(|&c| c == 0 || c > 10_000) {
        return fail(
            EXIT_USAGE,
            "--concurrency values must be between 1 and 10000",
        );
    }
    if args.duration.is_zero() {
        return fail(EXIT_USAGE, "--duration must be greater than zero");
    }
    let all = match crate::client(common, &common.nodes) {
        Ok(client) => client,
        Err(code) => return code,
    };
    let n = all.nodes();
    let mut targets = vec![(format!("{n} node{}", if n == 1 { "" } else { "s" }), all)];
    if common.nodes.len() > 1 {
        match crate::client(common, &common.nodes[..1]) {
            Ok(one) => targets.push(("first node alone".to_owned(), one)),
            Err(code) => return code,
        }
    }
    let progress = std::io::stderr().is_terminal();
    let mut runs = Vec::new();
    for (target, client) in &targets {
        for &concurrency in &args.concurrency {
            match measure(client, target, concurrency, &args, progress).await {
                Ok(run) => runs.push(run),
                Err(e) => {
                    return fail(
                        EXIT_FAILURE,
                        &format!("{target}, concurrency {concurrency}: {e}"),
                    )
                }
            }
        }
    }
    if args.json {
        println!("{}", Value::Array(runs.iter().map(to_json).collect()));
    } else {
        print_table(&runs);
    }
    i32::from(runs.iter().any(|r| r.failures > 0 || r.cycles == 0))
}

async fn measure(
    client: &redfence::Client,
    target: &str,
    concurrency: usize,
    args: &Bench,
    progress: bool,
) -> Result<Run, redfence::Error> {
    // A resource name that nobody else uses, checked (TTL too) before the
    // run so that a bad value is one error, not one per cycle.
    let prefix = format!("redfence-bench:{}:{}", std::process::id(), client.id());
    let probe = client.acquire(&format!("{prefix}:probe"), args.ttl).await?;
    probe.release().await;
    if !progress {
        eprintln!(
            "bench: {target}, concurrency {concurrency}, {}",
            show(args.duration)
        );
    }
    let started = Instant::now();
    let deadline = started + args.duration;
    let done = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let client = client.clone();
            let resource = format!("{prefix}:{task}");
            let (done, failures, ttl) = (Arc::clone(&done), Arc::clone(&failures), args.ttl);
            tokio::spawn(async move {
                let (mut acquire, mut release) = (Vec::new(), Vec::new());
                while Instant::now() < deadline {
                    let t0 = Instant::now();
                    let Ok(guard) = client.acquire(&resource, ttl).await else {
                        failures.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    let t1 = Instant::now();
                    guard.release().await;
                    acquire.push(t1 - t0);
                    release.push(t1.elapsed());
                    done.fetch_add(1, Ordering::Relaxed);
                }
                (acquire, release)
            })
        })
        .collect();
    let ticker = async {
        if !progress {
            // Plain output: nothing to draw until the run ends.
            std::future::pending::<()>().await;
        }
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let frac = (started.elapsed().as_secs_f64() / args.duration.as_secs_f64()).min(1.0);
            let width = 30;
            let filled = (frac * f64::from(width)).round() as usize;
            eprint!(
                "\r{target:>18}, c={concurrency:<4} [{}{}] {:>3.0}% {} cycles",
                "#".repeat(filled),
                " ".repeat(width as usize - filled),
                frac * 100.0,
                done.load(Ordering::Relaxed)
            );
            let _ = std::io::stderr().flush();
        }
    };
    let joined = tokio::select! {
        joined = futures_join(tasks) => joined,
        () = ticker => unreachable_ticker(),
    };
    if progress {
        eprint!("\r{}\r", " ".repeat(80));
    }
    let elapsed = started.elapsed();
    let (mut acquire, mut release) = (Vec::new(), Vec::new());
    for (a, r) in joined {
        acquire.extend(a);
        release.extend(r);
    }
    acquire.sort_unstable();
    release.sort_unstable();
    Ok(Run {
        target: target.to_owned(),
        nodes: client.nodes(),
        concurrency,
        cycles: acquire.len(),
        failures: failures.load(Ordering::Relaxed),
        elapsed,
        acquire,
        release,
    })
}

/// Every task's samples; a task that panicked contributes none.
async fn futures_join(
    tasks: Vec<tokio::task::JoinHandle<(Vec<Duration>, Vec<Duration>)>>,
) -> Vec<(Vec<Duration>, Vec<Duration>)> {
    let mut out = Vec::with_capacity(tasks.len());
    for task in tasks {
        if let Ok(samples) = task.await {
            out.push(samples);
        }
    }
    out
}

/// The ticker loops forever; its branch is never taken.
fn unreachable_ticker() -> Vec<(Vec<Duration>, Vec<Duration>)> {
    Vec::new()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn micros(d: Duration) -> String {
    format!("{:.0}µs", d.as_secs_f64() * 1e6)
}

fn throughput(run: &Run) -> f64 {
    run.cycles as f64 / run.elapsed.as_secs_f64().max(1e-9)
}

fn print_table(runs: &[Run]) {
    println!(
        "{:<18} {:>5} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8}",
        "TARGET",
        "TASKS",
        "CYCLES/S",
        "ACQ P50",
        "ACQ P99",
        "ACQ MAX",
        "REL P50",
        "REL P99",
        "REL MAX",
        "FAILED"
    );
    for r in runs {
        println!(
            "{:<18} {:>5} {:>9.0} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8}",
            r.target,
            r.concurrency,
            throughput(r),
            micros(percentile(&r.acquire, 50.0)),
            micros(percentile(&r.acquire, 99.0)),
            micros(percentile(&r.acquire, 100.0)),
            micros(percentile(&r.release, 50.0)),
            micros(percentile(&r.release, 99.0)),
            micros(percentile(&r.release, 100.0)),
            r.failures,
        );
    }
}

fn to_json(r: &Run) -> Value {
    let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    let pcts = |v: &[Duration]| {
        json!({
            "p50_us": us(percentile(v, 50.0)),
            "p90_us": us(percentile(v, 90.0)),
            "p99_us": us(percentile(v, 99.0)),
            "max_us": us(percentile(v, 100.0)),
        })
    };
    json!({
        "target": r.target,
        "nodes": r.nodes,
        "concurrency": r.concurrency,
        "cycles": r.cycles,
        "failures": r.failures,
        "elapsed_ms": crate::duration::millis(r.elapsed),
        "cycles_per_sec": throughput(r),
        "acquire": pcts(&r.acquire),
        "release": pcts(&r.release),
    })
}
