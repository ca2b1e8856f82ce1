//! RESP3 against RESP2, and what sharing one connection between the lock's
//! commands and the release notices would change (DESIGN.md section 3,
//! "RESP3").
//!
//! `cargo bench --bench resp3` starts 6 `redis-server`s. Two parts, each
//! interleaved in three slices so a machine's drift hits every row alike:
//!
//! 1. The default (fenced) client on 5 nodes, acquire + release cycles at
//!    concurrency 1 and 32, with plain URLs (RESP2) and with
//!    `?protocol=resp3`.
//! 2. The notice path, raw redis-rs on 1 node: 32 tasks, each cycling `SET
//!    NX PX` and the crate's release script on its own key while subscribed
//!    to that key's notice channel, so every release publishes one notice.
//!    - `2 connections, RESP2`: what redfence does (a command connection
//!      and a `PubSub` connection per node);
//!    - `2 connections, RESP3`: the same, the subscription's messages
//!      arriving as pushes;
//!    - `1 connection, RESP3`: the subscription on the command connection
//!      itself, its notices as pushes among the replies.
//!
//!    Notices heard per cycle must be 1 in every row (exit 1 otherwise).
//!
//! `REDFENCE_BENCH_SECS` sets each row's total window (default 3 s).

#[path = "common/mod.rs"]
mod common;
#[path = "../tests/support/process.rs"]
mod process;
#[path = "../tests/support/server.rs"]
mod server;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    drive, floor_del, floor_set, loadavg, nanos, pct, preflight, self_cpu_ns, Samples, Subject,
};
use futures::StreamExt;
use redfence::{Client, RestartGuard};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ProtocolVersion, PushKind};
use server::RedisServer;

const SLICES: usize = 3;
const TASKS: usize = 32;

struct Row {
    name: String,
    concurrency: usize,
    samples: Samples,
    cpu_ns: u64,
    notices: u64,
    connections: usize,
}

impl Row {
    fn add(
        rows: &mut Vec<Row>,
        name: &str,
        concurrency: usize,
        samples: Samples,
        cpu_ns: u64,
        notices: u64,
    ) {
        match rows
            .iter_mut()
            .find(|r| r.name == name && r.concurrency == concurrency)
        {
            Some(row) => {
                row.samples.merge(samples);
                row.cpu_ns += cpu_ns;
                row.notices += notices;
            }
            None => rows.push(Row {
                name: name.to_owned(),
                concurrency,
                samples,
                cpu_ns,
                notices,
                connections: 0,
            }),
        }
    }

    fn cpu_us(&self) -> f64 {
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
    let nodes: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let single = RedisServer::start();
    let rt = common::runtime();
    let slice = Duration::from_secs_f64(measure / SLICES as f64);
    let mut lock_rows = Vec::new();
    let mut notice_rows = Vec::new();
    let mut broken = false;
    rt.block_on(async {
        // Part 1.
        let client = |query: &str| {
            let urls: Vec<String> = nodes
                .iter()
                .map(|n| format!("{}{query}", n.url()))
                .collect();
            Client::builder(urls)
                .restart_guard(RestartGuard::off())
                .build()
                .expect("a client")
        };
        let kinds = [
            ("RESP2", Arc::new(Subject::Redfence(client("")))),
            (
                "RESP3",
                Arc::new(Subject::Redfence(client("/?protocol=resp3"))),
            ),
        ];
        for (i, (_, subject)) in kinds.iter().enumerate() {
            drive(
                Arc::clone(subject),
                format!("warm{i}"),
                4,
                Duration::from_millis(50),
            )
            .await;
        }
        for _ in 0..SLICES {
            for concurrency in [1, 32] {
                for (i, (name, subject)) in kinds.iter().enumerate() {
                    let cpu0 = self_cpu_ns();
                    let samples =
                        drive(Arc::clone(subject), format!("resp{i}"), concurrency, slice).await;
                    Row::add(
                        &mut lock_rows,
                        name,
                        concurrency,
                        samples,
                        self_cpu_ns() - cpu0,
                        0,
                    );
                }
            }
        }
        // Part 2.
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(common::RELEASE_LUA)
            .query_async(&mut connect(&single.url(), ProtocolVersion::RESP2, None).await)
            .await
            .expect("loading the release script");
        for _ in 0..SLICES {
            for layout in Layout::ALL {
                let (samples, cpu_ns, notices, connections) =
                    notices_row(&single, layout, &sha, slice).await;
                Row::add(
                    &mut notice_rows,
                    layout.name(),
                    TASKS,
                    samples,
                    cpu_ns,
                    notices,
                );
                if let Some(row) = notice_rows.iter_mut().find(|r| r.name == layout.name()) {
                    row.connections = connections;
                }
            }
        }
    });
    drop(rt);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "RESP3 against RESP2, loopback, {measure:.1} s per row in {SLICES} interleaved slices, load average \
         {load_before} before / {} after\n\nThe default (fenced) client, 5 nodes:\n",
        loadavg()
    );
    out.push_str(
        "| protocol | conc | cycles/s | p50 µs | p99 µs | success | client CPU µs/cycle | p50 ÷ RESP2 | cycles/s ÷ RESP2 | CPU ÷ RESP2 |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in lock_rows.iter_mut().chain(notice_rows.iter_mut()) {
        row.samples.sort();
    }
    for row in &lock_rows {
        broken |= row.samples.failed > 0;
        let base = lock_rows
            .iter()
            .find(|r| r.name == "RESP2" && r.concurrency == row.concurrency);
        let ratio = |f: &dyn Fn(&Row) -> f64| base.map_or(f64::NAN, |b| f(row) / f(b));
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {:.1} | {:.1} | {:.2}% | {:.1} | {:.2}× | {:.2}× | {:.2}× |",
            row.name,
            row.concurrency,
            row.samples.per_sec(),
            pct(&row.samples.cycle_ns, 0.5),
            pct(&row.samples.cycle_ns, 0.99),
            100.0 * row.samples.success(),
            row.cpu_us(),
            ratio(&|r| pct(&r.samples.cycle_ns, 0.5)),
            ratio(&|r| r.samples.per_sec()),
            ratio(&Row::cpu_us),
        );
    }
    out.push_str(
        "\nThe notice path, raw redis-rs, 1 node, 32 tasks (SET NX PX + the release script, each task subscribed to \
         its key's notice channel):\n\n\
         | layout | connections | cycles/s | p50 µs | p99 µs | notices heard / cycle | client CPU µs/cycle | cycles/s ÷ today | CPU ÷ today |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let today = notice_rows
        .iter()
        .find(|r| r.name == Layout::TwoResp2.name());
    for row in &notice_rows {
        let heard = row.notices as f64 / row.samples.ok.max(1) as f64;
        // Notices still in flight at the end of a slice may be lost to the
        // count: a few per slice, not per cycle.
        broken |= row.samples.failed > 0 || !(0.99..=1.0).contains(&heard);
        let ratio = |f: &dyn Fn(&Row) -> f64| today.map_or(f64::NAN, |b| f(row) / f(b));
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {:.1} | {:.1} | {:.4} | {:.1} | {:.2}× | {:.2}× |",
            row.name,
            row.connections,
            row.samples.per_sec(),
            pct(&row.samples.cycle_ns, 0.5),
            pct(&row.samples.cycle_ns, 0.99),
            heard,
            row.cpu_us(),
            ratio(&|r| r.samples.per_sec()),
            ratio(&Row::cpu_us),
        );
        if let Some(e) = &row.samples.first_error {
            let _ = writeln!(out, "  first error: {e}");
        }
    }
    let left: usize = nodes
        .iter()
        .chain([&single])
        .map(|s| s.count_keys("*lock:*"))
        .sum();
    broken |= left != 0;
    let _ = writeln!(out, "\nlock keys left on the 6 nodes: {left}");
    let _ = writeln!(
        out,
        "bench wall time: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    print!("{out}");
    if broken {
        println!("\nINVARIANT BROKEN: a cycle failed, a notice was missed or a key was left behind (exit 1)");
        1
    } else {
        0
    }
}

#[derive(Clone, Copy)]
enum Layout {
    TwoResp2,
    TwoResp3,
    OneResp3,
}

impl Layout {
    const ALL: [Layout; 3] = [Layout::TwoResp2, Layout::TwoResp3, Layout::OneResp3];

    fn name(self) -> &'static str {
        match self {
            Layout::TwoResp2 => "2 connections, RESP2 (today)",
            Layout::TwoResp3 => "2 connections, RESP3",
            Layout::OneResp3 => "1 connection, RESP3 (shared)",
        }
    }
}

async fn connect(
    url: &str,
    protocol: ProtocolVersion,
    pushes: Option<Arc<AtomicU64>>,
) -> MultiplexedConnection {
    let info = redis::IntoConnectionInfo::into_connection_info(url).expect("a node url");
    let settings = info.redis_settings().clone().set_protocol(protocol);
    let info = info.set_redis_settings(settings);
    let mut config = AsyncConnectionConfig::new().set_response_timeout(None);
    if let Some(count) = pushes {
        config = config.set_push_sender(move |push: redis::PushInfo| {
            if push.kind == PushKind::Message {
                count.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), redis::aio::SendError>(())
        });
    }
    redis::Client::open(info)
        .expect("a client")
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("connecting")
}

/// One slice of a notice-path row: the cycles, this process's CPU, the
/// notices heard, and the connections the layout holds.
async fn notices_row(
    node: &RedisServer,
    layout: Layout,
    sha: &str,
    slice: Duration,
) -> (Samples, u64, u64, usize) {
    let url = node.url();
    let heard = Arc::new(AtomicU64::new(0));
    let channels: Vec<String> = (0..TASKS).map(|t| format!("lock:resp3-{t}@0")).collect();
    let (commands, keep, connections) = match layout {
        Layout::TwoResp2 => {
            let mut pubsub = redis::Client::open(url.as_str())
                .expect("a client")
                .get_async_pubsub()
                .await
                .expect("a subscription connection");
            pubsub.subscribe(&channels).await.expect("subscribing");
            let count = Arc::clone(&heard);
            let listener = tokio::spawn(async move {
                let mut messages = pubsub.into_on_message();
                while messages.next().await.is_some() {
                    count.fetch_add(1, Ordering::Relaxed);
                }
            });
            (
                connect(&url, ProtocolVersion::RESP2, None).await,
                Some(listener),
                2,
            )
        }
        Layout::TwoResp3 => {
            let mut subscriber =
                connect(&url, ProtocolVersion::RESP3, Some(Arc::clone(&heard))).await;
            subscriber.subscribe(&channels).await.expect("subscribing");
            let keep = tokio::spawn(async move {
                // Holds the subscription connection for the slice.
                std::future::pending::<()>().await;
                drop(subscriber);
            });
            (
                connect(&url, ProtocolVersion::RESP3, None).await,
                Some(keep),
                2,
            )
        }
        Layout::OneResp3 => {
            let mut shared = connect(&url, ProtocolVersion::RESP3, Some(Arc::clone(&heard))).await;
            shared.subscribe(&channels).await.expect("subscribing");
            (shared, None, 1)
        }
    };
    // Every release publishes: the waiting markers are there for the slice.
    {
        let mut c = commands.clone();
        for t in 0..TASKS {
            let marker = common::floor_marker(&format!("lock:resp3-{t}"));
            let _: redis::RedisResult<()> = redis::cmd("SET")
                .arg(&marker)
                .arg(1)
                .arg("PX")
                .arg(600_000)
                .query_async(&mut c)
                .await;
        }
    }
    let cpu0 = self_cpu_ns();
    let start = Instant::now();
    let end = start + slice;
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let conn = commands.clone();
            let sha = sha.to_owned();
            tokio::spawn(async move {
                let key = format!("lock:resp3-{t}");
                let mut s = Samples::default();
                let mut seq = 0u64;
                loop {
                    seq += 1;
                    let value = format!("v{t}-{seq}");
                    let t0 = Instant::now();
                    let outcome = async {
                        if !floor_set(conn.clone(), &key, &value).await? {
                            return Ok(false);
                        }
                        Ok::<bool, redis::RedisError>(
                            floor_del(conn.clone(), &sha, &key, &value).await? == 1,
                        )
                    }
                    .await;
                    s.cycle_ns.push(nanos(t0.elapsed()));
                    match outcome {
                        Ok(true) => s.ok += 1,
                        Ok(false) => {
                            s.failed += 1;
                            s.first_error
                                .get_or_insert_with(|| format!("{key}: not granted"));
                        }
                        Err(e) => {
                            s.failed += 1;
                            s.first_error.get_or_insert_with(|| e.to_string());
                        }
                    }
                    if Instant::now() >= end {
                        break;
                    }
                }
                s
            })
        })
        .collect();
    let mut all = Samples::default();
    for task in tasks {
        all.merge(task.await.expect("a bench task"));
    }
    all.wall = start.elapsed();
    let cpu = self_cpu_ns() - cpu0;
    // The last notices are on their way: give them a moment.
    let expected = all.ok;
    let deadline = Instant::now() + Duration::from_secs(2);
    while heard.load(Ordering::Relaxed) < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if let Some(task) = keep {
        task.abort();
    }
    (all, cpu, heard.load(Ordering::Relaxed), connections)
}
