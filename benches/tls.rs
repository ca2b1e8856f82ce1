//! What TLS costs: the default (fenced) client on TLS nodes against the same
//! client on plain TCP nodes, side by side in one run.
//!
//! `cargo bench --features tls --bench tls` starts 5 plain and 5 TLS-only
//! `redis-server`s (certificates made at start with rcgen, a private CA the
//! client trusts). Rows, interleaved in three slices so that a machine's
//! drift hits every row alike:
//! - acquire + release cycles on 1 node and on 5 nodes, at concurrency 1
//!   (p50, p99: the latency a caller sees) and 32 (cycles/s: what one
//!   client can push), TCP and TLS;
//! - the cold start: from building a client to its first lock, on 1 and on 5
//!   nodes (the TCP connect, or the TCP connect plus the TLS handshake,
//!   then the identity checks and script loads), the median of 15.
//!
//! Every cycle must succeed and no lock key may be left (exit 1 otherwise).
//! `REDFENCE_BENCH_SECS` sets each row's total window (default 3 s).

#[path = "../tests/support/certs.rs"]
mod certs;
#[path = "common/mod.rs"]
mod common;
#[path = "../tests/support/process.rs"]
mod process;
#[path = "../tests/support/server.rs"]
mod server;

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{drive, loadavg, pct, preflight, self_cpu_ns, Samples, Subject};
use redfence::{Client, RestartGuard, Tls};
use server::{RedisServer, ServerOptions};

const SLICES: usize = 3;
const COLD_STARTS: usize = 15;

#[derive(Clone, Copy, PartialEq)]
enum Transport {
    Tcp,
    Tls,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "TCP",
            Transport::Tls => "TLS",
        }
    }
}

struct Row {
    transport: Transport,
    nodes: usize,
    concurrency: usize,
    samples: Samples,
    cpu_ns: u64,
}

impl Row {
    fn cpu_per_cycle_us(&self) -> f64 {
        self.cpu_ns as f64 / 1000.0 / self.samples.cycles().max(1) as f64
    }
}

fn main() {
    std::process::exit(run());
}

fn run() -> i32 {
    let measure = match preflight(3.0) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let load_before = loadavg();
    let started = Instant::now();
    let plain: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let tls: Vec<RedisServer> = (0..5)
        .map(|_| {
            RedisServer::start_with(ServerOptions {
                tls: Some(certs::certs().server()),
                ..ServerOptions::default()
            })
        })
        .collect();
    let urls = |servers: &[RedisServer], n: usize| -> Vec<String> {
        servers[..n].iter().map(RedisServer::url).collect()
    };
    let rt = common::runtime();
    let trust = Tls::new().root_ca_pem(certs::certs().ca_pem.clone());
    let client = |transport: Transport, n: usize| -> Client {
        let builder = match transport {
            Transport::Tcp => Client::builder(urls(&plain, n)),
            Transport::Tls => Client::builder(urls(&tls, n)).tls(trust.clone()),
        };
        builder
            .restart_guard(RestartGuard::off())
            .build()
            .expect("a client")
    };
    let kinds: Vec<(Transport, usize)> = [1, 5]
        .into_iter()
        .flat_map(|n| [(Transport::Tcp, n), (Transport::Tls, n)])
        .collect();
    let subjects: Vec<Arc<Subject>> = kinds
        .iter()
        .map(|&(t, n)| Arc::new(Subject::Redfence(client(t, n))))
        .collect();
    let mut rows: Vec<Row> = Vec::new();
    rt.block_on(async {
        // Warm every client (connections, scripts) outside the window.
        for (i, subject) in subjects.iter().enumerate() {
            drive(
                Arc::clone(subject),
                format!("warm{i}"),
                4,
                Duration::from_millis(50),
            )
            .await;
        }
        let slice = Duration::from_secs_f64(measure / SLICES as f64);
        for _ in 0..SLICES {
            for concurrency in [1, 32] {
                for (i, &(transport, nodes)) in kinds.iter().enumerate() {
                    let cpu0 = self_cpu_ns();
                    let samples = drive(
                        Arc::clone(&subjects[i]),
                        format!("tls-bench{i}"),
                        concurrency,
                        slice,
                    )
                    .await;
                    let cpu_ns = self_cpu_ns().saturating_sub(cpu0);
                    match rows.iter_mut().find(|r| {
                        r.transport == transport && r.nodes == nodes && r.concurrency == concurrency
                    }) {
                        Some(row) => {
                            row.samples.merge(samples);
                            row.cpu_ns += cpu_ns;
                        }
                        None => rows.push(Row {
                            transport,
                            nodes,
                            concurrency,
                            samples,
                            cpu_ns,
                        }),
                    }
                }
            }
        }
    });
    let cold: Vec<(Transport, usize, Result<f64, String>)> = kinds
        .iter()
        .map(|&(t, n)| (t, n, rt.block_on(cold_start(|| client(t, n)))))
        .collect();
    drop(subjects);
    drop(rt);

    let mut out = String::new();
    let _ = writeln!(
        out,
        "TLS (rustls, ECDSA P-256 certificates, TLS 1.3) against plain TCP, loopback, {measure:.1} s per row in \
         {SLICES} interleaved slices, load average {load_before} before / {} after\n",
        loadavg()
    );
    out.push_str(
        "| transport | nodes | conc | cycles/s | p50 µs | p99 µs | success | client CPU µs/cycle | p50 ÷ TCP | cycles/s ÷ TCP | CPU ÷ TCP |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut broken = false;
    for row in &mut rows {
        row.samples.sort();
    }
    for row in &rows {
        let tcp = rows.iter().find(|r| {
            r.transport == Transport::Tcp
                && r.nodes == row.nodes
                && r.concurrency == row.concurrency
        });
        let p50 = pct(&row.samples.cycle_ns, 0.5);
        let ratio = |f: &dyn Fn(&Row) -> f64| tcp.map_or(f64::NAN, |t| f(row) / f(t));
        broken |= row.samples.failed > 0;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0} | {:.1} | {:.1} | {:.2}% | {:.1} | {:.2}× | {:.2}× | {:.2}× |",
            row.transport.name(),
            row.nodes,
            row.concurrency,
            row.samples.per_sec(),
            p50,
            pct(&row.samples.cycle_ns, 0.99),
            100.0 * row.samples.success(),
            row.cpu_per_cycle_us(),
            ratio(&|r| pct(&r.samples.cycle_ns, 0.5)),
            ratio(&|r| r.samples.per_sec()),
            ratio(&Row::cpu_per_cycle_us),
        );
        if let Some(e) = &row.samples.first_error {
            let _ = writeln!(out, "  first error: {e}");
        }
    }
    out.push_str(
        "\nCold start: build a client, take and release its first lock (connect, TLS handshake, identity checks, \
         script loads), median of 15\n\n| transport | nodes | median ms | ÷ TCP |\n|---|---:|---:|---:|\n",
    );
    for (transport, nodes, median) in &cold {
        let tcp = cold
            .iter()
            .find(|(t, n, _)| *t == Transport::Tcp && n == nodes)
            .and_then(|(_, _, m)| m.as_ref().ok());
        match median {
            Ok(ms) => {
                let _ = writeln!(
                    out,
                    "| {} | {nodes} | {ms:.2} | {} |",
                    transport.name(),
                    tcp.map_or("–".to_owned(), |t| format!("{:.2}×", ms / t))
                );
            }
            Err(e) => {
                broken = true;
                let _ = writeln!(out, "| {} | {nodes} | failed: {e} | |", transport.name());
            }
        }
    }
    let left: usize = plain
        .iter()
        .chain(&tls)
        .map(|s| s.count_keys("redfence:lock:*"))
        .sum();
    broken |= left != 0;
    let _ = writeln!(out, "\nlock keys left on the 10 nodes: {left}");
    let _ = writeln!(
        out,
        "bench wall time: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    print!("{out}");
    if broken {
        println!("\nINVARIANT BROKEN: a cycle or a cold start failed, or a lock key was left behind (exit 1)");
        1
    } else {
        0
    }
}

/// The median time, in ms, from building a fresh client to the end of its
/// first acquire + release.
async fn cold_start(make: impl Fn() -> Client) -> Result<f64, String> {
    let mut ms = Vec::with_capacity(COLD_STARTS);
    for i in 0..COLD_STARTS {
        let started = Instant::now();
        let client = make();
        let guard = client
            .acquire(&format!("cold{i}"), common::TTL)
            .await
            .map_err(|e| e.to_string())?;
        guard.release().await;
        ms.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    ms.sort_by(f64::total_cmp);
    Ok(ms[ms.len() / 2])
}
