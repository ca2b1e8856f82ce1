//! Single-flight against naive cache-aside, in one run: 500 concurrent
//! requests on 2 instances hit a key whose value just expired; its
//! computation (the "database query") takes 20 ms and is counted.
//!
//! Method. `cargo bench --bench once` starts 5 `redis-server` lock nodes and
//! one more as the naive rows' cache, then re-executes itself twice
//! (`std::env::current_exe()` with `--once-child`): each child is one
//! instance of the application, its own process with its own `Client`
//! (so nothing is shared between the two instances but the nodes), and
//! runs 250 tasks per expiry. The parent drives both children over their
//! stdin/stdout: `go MODE` to both at once, then it reads each child's
//! `done` line (computations, and each request's latency and whether it
//! computed). Rounds of the two rows alternate (a shared machine drifts),
//! each on a freshly expired value (value TTL 300 ms, 500 ms between
//! rounds); the first round of each row only warms up and is not counted.
//!
//! Rows:
//! - naive cache-aside: `GET`; on a miss, compute and `SET … PX` (what the
//!   flash-sale team's code did before the lock);
//! - single-flight: `client.once(key).get_or_compute(query)`.
//!
//! Columns: computations per expiry (summed over both instances); the
//! latency p50/p99 of the waiters (the requests that did not compute: in
//! the naive row every request computes, so its figures are over all
//! requests), and p99 ÷ the computation's 20 ms; Redis commands per request
//! (every `commandstats` call on the nodes of the row, scripts' inner
//! calls included, after `CONFIG RESETSTAT` before each round).
//!
//! `REDFENCE_BENCH_ROUNDS` sets the measured expiries per row (default 8).
//! Exits 1 when a single-flight round computed more than once or a request
//! failed.

#[path = "common/mod.rs"]
mod common;
#[path = "../tests/support/process.rs"]
mod process;
#[path = "../tests/support/server.rs"]
mod server;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use server::RedisServer;

const NODES: usize = 5;
const INSTANCES: usize = 2;
const TASKS: usize = 250;
const COMPUTE: Duration = Duration::from_millis(20);
const VALUE_TTL: Duration = Duration::from_millis(300);
const BETWEEN: Duration = Duration::from_millis(500);
const KEY: &str = "product:1";

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Naive,
    Helper,
}

impl Mode {
    fn word(self) -> &'static str {
        match self {
            Mode::Naive => "naive",
            Mode::Helper => "helper",
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--once-child") {
        let (Some(nodes), Some(cache)) = (args.get(at + 1), args.get(at + 2)) else {
            eprintln!("--once-child NODES CACHE");
            std::process::exit(2);
        };
        std::process::exit(child(nodes, cache));
    }
    if let Err(code) = common::preflight(0.0) {
        std::process::exit(code);
    }
    let rounds: usize = std::env::var("REDFENCE_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .filter(|r| *r > 0)
        .unwrap_or(8);
    match parent(rounds) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}

/// One round's outcome on one instance.
#[derive(Default)]
struct Round {
    computations: usize,
    errors: usize,
    /// (µs, computed by this request)
    latencies: Vec<(u64, bool)>,
}

#[derive(Default)]
struct Row {
    expiries: usize,
    computations: usize,
    errors: usize,
    waiters: Vec<u64>,
    everyone: Vec<u64>,
    commands: u64,
    worst_round_p99: u64,
    /// Waiters in an instance where no request computed (they waited for
    /// the other process's computation, through the lock's notice).
    other_instance: Vec<u64>,
}

impl Row {
    fn add(&mut self, rounds: &[Round], commands: u64) {
        self.expiries += 1;
        let mut waiters = Vec::new();
        for r in rounds {
            if r.computations == 0 {
                self.other_instance
                    .extend(r.latencies.iter().map(|(us, _)| *us));
            }
            self.computations += r.computations;
            self.errors += r.errors;
            for &(us, computed) in &r.latencies {
                self.everyone.push(us);
                if !computed {
                    waiters.push(us);
                }
            }
        }
        waiters.sort_unstable();
        if !waiters.is_empty() {
            self.worst_round_p99 = self.worst_round_p99.max(pct(&waiters, 0.99));
        }
        self.waiters.extend(waiters);
        self.commands += commands;
    }

    /// The tail of the waiters, and the split by instance.
    fn tail(&mut self) -> String {
        self.other_instance.sort_unstable();
        let ms = |us: u64| us as f64 / 1e3;
        let w = &self.waiters;
        format!(
            "waiters p90 {:.1} ms, p95 {:.1}, max {:.1}; in the instance that did not compute: p50 \
             {:.1}, p99 {:.1} ({} requests)",
            ms(pct(w, 0.9)),
            ms(pct(w, 0.95)),
            ms(w.last().copied().unwrap_or(0)),
            ms(pct(&self.other_instance, 0.5)),
            ms(pct(&self.other_instance, 0.99)),
            self.other_instance.len(),
        )
    }

    fn line(&mut self, name: &str) -> String {
        self.waiters.sort_unstable();
        self.everyone.sort_unstable();
        let (over, lat) = if self.waiters.is_empty() {
            ("all", &self.everyone)
        } else {
            ("waiters", &self.waiters)
        };
        let ms = |us: u64| us as f64 / 1e3;
        let requests = self.everyone.len().max(1) as f64;
        let compute_ms = COMPUTE.as_secs_f64() * 1e3;
        // Every request of the naive row computes: no waiters' rounds.
        let worst = if self.waiters.is_empty() {
            "no waiters".to_owned()
        } else {
            format!("worst round {:.2}×", ms(self.worst_round_p99) / compute_ms)
        };
        format!(
            "| {name} | {:.1} | {over}: {:.1} | {:.1} | {:.2}× ({worst}) | {:.1} | {} |",
            self.computations as f64 / self.expiries.max(1) as f64,
            ms(pct(lat, 0.5)),
            ms(pct(lat, 0.99)),
            ms(pct(lat, 0.99)) / compute_ms,
            self.commands as f64 / requests,
            self.errors,
        )
    }
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn parent(rounds: usize) -> Result<bool, String> {
    let nodes: Vec<RedisServer> = (0..NODES).map(|_| RedisServer::start()).collect();
    let cache = RedisServer::start();
    let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
    let exe = std::env::current_exe().map_err(|e| format!("finding this bench's binary: {e}"))?;
    let mut children = (0..INSTANCES)
        .map(|_| Instance::start(&exe, &urls.join(","), &cache.url()))
        .collect::<Result<Vec<_>, _>>()?;
    println!(
        "\n{} requests on {INSTANCES} instances (child processes, {TASKS} tasks each) hit an \
         expired key; the computation takes {} ms; {NODES} lock nodes; {rounds} expiries per row \
         after one warm-up; load {}\n",
        INSTANCES * TASKS,
        COMPUTE.as_millis(),
        common::loadavg(),
    );
    let started = Instant::now();
    let mut rows = [Row::default(), Row::default()];
    let mut all_once = true;
    for round in 0..=rounds {
        for (i, mode) in [Mode::Naive, Mode::Helper].into_iter().enumerate() {
            // The value of the previous round of this row has expired.
            std::thread::sleep(BETWEEN);
            let counted: Vec<&RedisServer> = match mode {
                Mode::Naive => vec![&cache],
                Mode::Helper => nodes.iter().collect(),
            };
            for node in &counted {
                node.cli(&["CONFIG", "RESETSTAT"]);
            }
            for child in &mut children {
                child.send(&format!("go {}", mode.word()))?;
            }
            let outcomes = children
                .iter_mut()
                .map(Instance::done)
                .collect::<Result<Vec<_>, _>>()?;
            // Let the background stragglers (a fan-out's slowest nodes, the
            // release) land before counting.
            std::thread::sleep(Duration::from_millis(100));
            let commands: u64 = counted.iter().map(|n| common::command_calls(n)).sum();
            if round == 0 {
                continue;
            }
            let computed: usize = outcomes.iter().map(|o| o.computations).sum();
            if mode == Mode::Helper && computed != 1 {
                eprintln!("round {round}: single-flight computed {computed} times");
                all_once = false;
            }
            rows[i].add(&outcomes, commands);
        }
    }
    for child in &mut children {
        child.send("exit")?;
    }
    println!(
        "| row | computations per expiry | latency p50 (ms) | p99 (ms) | p99 ÷ computation | Redis \
         commands per request | errors |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!("{}", rows[0].line("naive cache-aside"));
    println!("{}", rows[1].line("single-flight"));
    println!("\nsingle-flight: {}", rows[1].tail());
    println!(
        "{rounds} expiries per row in {:.1} s; the naive row's commands are on its one cache \
         node, the single-flight row's on the 5 lock nodes",
        started.elapsed().as_secs_f64()
    );
    let errors = rows.iter().map(|r| r.errors).sum::<usize>();
    if errors > 0 {
        eprintln!("{errors} requests failed");
    }
    Ok(all_once && errors == 0)
}

/// A child instance, driven over its pipes.
struct Instance {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Instance {
    fn start(exe: &std::path::Path, nodes: &str, cache: &str) -> Result<Instance, String> {
        let mut child = Command::new(exe)
            .args(["--once-child", nodes, cache])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("starting a child: {e}"))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut me = Instance {
            child,
            stdin,
            stdout,
        };
        let ready = me.line()?;
        if ready != "ready" {
            return Err(format!("child: {ready}"));
        }
        Ok(me)
    }

    fn send(&mut self, line: &str) -> Result<(), String> {
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| format!("writing to a child: {e}"))
    }

    fn line(&mut self) -> Result<String, String> {
        let mut line = String::new();
        match self.stdout.read_line(&mut line) {
            Ok(0) => Err("a child exited".into()),
            Ok(_) => Ok(line.trim_end().to_owned()),
            Err(e) => Err(format!("reading a child: {e}")),
        }
    }

    /// `done COMPUTATIONS ERRORS US:C,US:C,…`
    fn done(&mut self) -> Result<Round, String> {
        let line = self.line()?;
        let mut words = line.split(' ');
        let (Some("done"), Some(c), Some(e), list) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            return Err(format!("child: {line}"));
        };
        let latencies = list
            .unwrap_or("")
            .split(',')
            .filter(|s| !s.is_empty())
            .filter_map(|s| {
                let (us, computed) = s.split_once(':')?;
                Some((us.parse().ok()?, computed == "1"))
            })
            .collect();
        Ok(Round {
            computations: c.parse().map_err(|_| format!("child: {line}"))?,
            errors: e.parse().map_err(|_| format!("child: {line}"))?,
            latencies,
        })
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One instance: a client of the lock nodes, a connection to the naive
/// rows' cache, and 250 tasks per `go`.
fn child(nodes: &str, cache: &str) -> i32 {
    let rt = common::runtime();
    let urls: Vec<String> = nodes.split(',').map(str::to_owned).collect();
    let setup = rt.block_on(async {
        let client = common::bench_builder(&urls)
            .build()
            .map_err(|e| format!("client: {e}"))?;
        let conn = redis::Client::open(cache)
            .map_err(|e| format!("cache: {e}"))?
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("cache: {e}"))?;
        Ok::<_, String>((client, conn))
    });
    let (client, conn) = match setup {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    println!("ready");
    let mut stdin = std::io::stdin().lock();
    loop {
        let mut line = String::new();
        if stdin.read_line(&mut line).unwrap_or(0) == 0 {
            return 0;
        }
        let mode = match line.trim() {
            "go naive" => Mode::Naive,
            "go helper" => Mode::Helper,
            _ => return 0,
        };
        let round = rt.block_on(stampede(&client, &conn, mode));
        let list = round
            .latencies
            .iter()
            .map(|(us, c)| format!("{us}:{}", u8::from(*c)))
            .collect::<Vec<_>>()
            .join(",");
        println!("done {} {} {list}", round.computations, round.errors);
    }
}

/// The database query: 20 ms, counted.
async fn query(count: Arc<AtomicUsize>) -> Result<Vec<u8>, std::io::Error> {
    count.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(COMPUTE).await;
    Ok(br#"{"id":1,"name":"sneaker","price":4999}"#.to_vec())
}

async fn stampede(
    client: &redfence::Client,
    conn: &redis::aio::MultiplexedConnection,
    mode: Mode,
) -> Round {
    let count = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (count, client, mut conn) = (Arc::clone(&count), client.clone(), conn.clone());
            tokio::spawn(async move {
                let asked = Instant::now();
                let mine = Arc::new(AtomicUsize::new(0));
                let ok = match mode {
                    Mode::Helper => client
                        .once(KEY)
                        .value_ttl(VALUE_TTL)
                        .wait(Duration::from_secs(10))
                        .get_or_compute(|| {
                            mine.fetch_add(1, Ordering::SeqCst);
                            query(count)
                        })
                        .await
                        .is_ok(),
                    Mode::Naive => naive(&mut conn, &mine, count).await.is_ok(),
                };
                let us = u64::try_from(asked.elapsed().as_micros()).unwrap_or(u64::MAX);
                (ok, us, mine.load(Ordering::SeqCst) > 0)
            })
        })
        .collect();
    let mut round = Round::default();
    for task in tasks {
        match task.await {
            Ok((ok, us, computed)) => {
                round.errors += usize::from(!ok);
                round.latencies.push((us, computed));
            }
            Err(_) => round.errors += 1,
        }
    }
    round.computations = count.load(Ordering::SeqCst);
    round
}

/// `GET`; on a miss, the query and `SET … PX`.
async fn naive(
    conn: &mut redis::aio::MultiplexedConnection,
    mine: &AtomicUsize,
    count: Arc<AtomicUsize>,
) -> Result<Vec<u8>, Box<dyn std::error::Error + Send + Sync>> {
    let key = format!("naive:{KEY}");
    let cached: Option<Vec<u8>> = redis::cmd("GET").arg(&key).query_async(conn).await?;
    if let Some(page) = cached {
        return Ok(page);
    }
    mine.fetch_add(1, Ordering::SeqCst);
    let page = query(count).await?;
    let () = redis::cmd("SET")
        .arg(&key)
        .arg(&page)
        .arg("PX")
        .arg(u64::try_from(VALUE_TTL.as_millis()).unwrap_or(u64::MAX))
        .query_async(conn)
        .await?;
    Ok(page)
}
