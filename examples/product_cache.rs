//! The flash sale's product-detail cache: a product page's cache entry
//! expires and 500 requests on two instances of the shop (two `Client`s,
//! 250 tasks each) miss at once. The "database query" takes 20 ms and is
//! counted.
//!
//! Three runs, each on a freshly expired entry:
//! - the naive cache-aside code (GET from a Redis cache; on a miss, query
//!   and SET): every request that misses queries the database;
//! - `client.once(key).get_or_compute(query)`: one query per expiry, the
//!   other requests wait for its release notice and read the result;
//! - the same with serve-stale: the others get the previous page at once.
//!
//! Then a hot key for 4 s with a 1 s TTL and 200 ms of jitter, first
//! without and then with early recomputation (XFetch): the queries per
//! expiry, and how many requests had to wait for one.
//!
//! Prints database queries per expiry, the waiters' p50/p99 latency beside
//! the query's 20 ms, and Redis commands per request on the lock nodes.
//! Fails (exit code 1) unless every single-flight run queried once per
//! expiry.

mod common;

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redfence::{Client, OnceError, SingleFlight};

use common::{BoxError, DataStore};

const INSTANCES: usize = 2;
const REQUESTS_PER_INSTANCE: usize = 250;
const QUERY: Duration = Duration::from_millis(20);

fn main() -> ExitCode {
    common::run(product_cache)
}

/// The product database: 20 ms per query, counted.
#[derive(Clone, Default)]
struct Database {
    queries: Arc<AtomicUsize>,
}

impl Database {
    async fn product(self, id: u64) -> Result<Vec<u8>, std::io::Error> {
        self.queries.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(QUERY).await;
        Ok(format!("{{\"id\":{id},\"name\":\"sneaker\",\"price\":4999}}").into_bytes())
    }

    fn count(&self) -> usize {
        self.queries.load(Ordering::SeqCst)
    }
}

async fn product_cache(nodes: Vec<String>) -> Result<(), BoxError> {
    let store = DataStore::from_env_or_start().await?;
    let clients: Vec<Client> = (0..INSTANCES)
        .map(|_| common::client(&nodes))
        .collect::<Result<_, _>>()?;
    println!(
        "\n{} requests on {INSTANCES} instances hit an expired product page; a query takes {} ms\n",
        INSTANCES * REQUESTS_PER_INSTANCE,
        QUERY.as_millis()
    );

    // Warm the connections: the first operation of a fresh client connects.
    for (i, client) in clients.iter().enumerate() {
        let once = client.once(&format!("warm:{i}"));
        let _: Result<Vec<u8>, OnceError<std::io::Error>> =
            once.get_or_compute(|| async { Ok(vec![]) }).await;
    }

    let naive = naive_run(&store).await?;
    naive.print("naive cache-aside           ");
    let flight = flight_run(&clients, &nodes, "product:1", false).await?;
    flight.print("single-flight               ");
    let stale = flight_run(&clients, &nodes, "product:2", true).await?;
    stale.print("single-flight, serve-stale  ");

    println!(
        "\na hot page for 4 s (TTL 1 s, jitter 200 ms), requests every 5 ms on each instance:"
    );
    let plain = hot_run(&clients, "product:3", 0.0).await?;
    plain.print("without early recomputation");
    let early = hot_run(&clients, "product:4", 3.0).await?;
    early.print("with XFetch (β = 3)        ");
    println!();

    for (name, queries) in [
        ("single-flight", flight.queries),
        ("serve-stale", stale.queries),
    ] {
        if queries != 1 {
            return Err(format!("{name}: {queries} queries for one expiry").into());
        }
    }
    if early.queries > early.expiries_seen.max(1) + 1 {
        return Err(format!("XFetch: {} queries", early.queries).into());
    }
    println!("single-flight: one database query per expiry");
    Ok(())
}

struct Stampede {
    queries: usize,
    latencies: Vec<Duration>,
    commands: Option<u64>,
}

impl Stampede {
    fn print(&self, name: &str) {
        let mut l = self.latencies.clone();
        l.sort();
        let at = |q: f64| l[((l.len() as f64 - 1.0) * q).round() as usize];
        let per_request = self
            .commands
            .map(|c| format!("{:.1}", c as f64 / l.len() as f64))
            .unwrap_or_else(|| "-".into());
        println!(
            "{name} database queries {:>3}   latency p50 {:>6.1} ms  p99 {:>6.1} ms ({:.1}× the query)   lock-node commands per request {per_request}",
            self.queries,
            at(0.5).as_secs_f64() * 1e3,
            at(0.99).as_secs_f64() * 1e3,
            at(0.99).as_secs_f64() / QUERY.as_secs_f64(),
        );
    }
}

/// GET; on a miss, query and SET with a TTL: the code the single-flight
/// replaces.
async fn naive_run(store: &DataStore) -> Result<Stampede, BoxError> {
    let db = Database::default();
    let key: Arc<str> = store.key("naive:product:1").into();
    let mut tasks = Vec::new();
    for _ in 0..INSTANCES {
        let conn = store.connect().await?;
        for _ in 0..REQUESTS_PER_INSTANCE {
            let (mut conn, db, key) = (conn.clone(), db.clone(), Arc::clone(&key));
            tasks.push(tokio::spawn(async move {
                let asked = Instant::now();
                let cached: Option<Vec<u8>> =
                    redis::cmd("GET").arg(&*key).query_async(&mut conn).await?;
                if cached.is_none() {
                    let page = db.product(1).await?;
                    let () = redis::cmd("SET")
                        .arg(&*key)
                        .arg(page)
                        .arg("PX")
                        .arg(60_000)
                        .query_async(&mut conn)
                        .await?;
                }
                Ok::<_, BoxError>(asked.elapsed())
            }));
        }
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.push(task.await??);
    }
    Ok(Stampede {
        queries: db.count(),
        latencies,
        commands: None,
    })
}

/// The stampede through `client.once(key)`, on an entry that just expired.
async fn flight_run(
    clients: &[Client],
    nodes: &[String],
    key: &str,
    serve_stale: bool,
) -> Result<Stampede, BoxError> {
    let once = |c: &Client| -> SingleFlight {
        c.once(key)
            .wait(Duration::from_secs(30))
            .serve_stale(serve_stale)
    };
    // The previous page, expired.
    let db = Database::default();
    once(&clients[0])
        .value_ttl(Duration::from_millis(50))
        .get_or_compute(|| db.clone().product(1))
        .await?;
    tokio::time::sleep(Duration::from_millis(200)).await;

    let db = Database::default();
    let before = common_calls(nodes).await;
    let mut tasks = Vec::new();
    for client in clients {
        for _ in 0..REQUESTS_PER_INSTANCE {
            let (once, db) = (once(client), db.clone());
            tasks.push(tokio::spawn(async move {
                let asked = Instant::now();
                once.get_or_compute(|| db.product(1)).await?;
                Ok::<_, BoxError>(asked.elapsed())
            }));
        }
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.push(task.await??);
    }
    let after = common_calls(nodes).await;
    let commands = before.zip(after).map(|(b, a)| a.saturating_sub(b));
    Ok(Stampede {
        queries: db.count(),
        latencies,
        commands,
    })
}

struct Hot {
    queries: usize,
    expiries_seen: usize,
    slow_requests: usize,
    requests: usize,
}

impl Hot {
    fn print(&self, name: &str) {
        println!(
            "  {name}: {} database queries, {} of {} requests slower than 10 ms",
            self.queries, self.slow_requests, self.requests
        );
    }
}

/// A hot page for 4 s: every 5 ms on each instance.
async fn hot_run(clients: &[Client], key: &str, beta: f64) -> Result<Hot, BoxError> {
    let db = Database::default();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for client in clients {
        let once = client
            .once(key)
            .value_ttl(Duration::from_secs(1))
            .jitter(Duration::from_millis(200))
            .early(beta)
            .wait(Duration::from_secs(10));
        let db = db.clone();
        tasks.push(tokio::spawn(async move {
            let (mut slow, mut requests) = (0, 0);
            while started.elapsed() < Duration::from_secs(4) {
                let asked = Instant::now();
                once.get_or_compute(|| db.clone().product(3)).await?;
                requests += 1;
                if asked.elapsed() > Duration::from_millis(10) {
                    slow += 1;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok::<_, BoxError>((slow, requests))
        }));
    }
    let (mut slow_requests, mut requests) = (0, 0);
    for task in tasks {
        let (s, r) = task.await??;
        slow_requests += s;
        requests += r;
    }
    Ok(Hot {
        queries: db.count(),
        // About one expiry per TTL of 1–1.2 s over 4 s.
        expiries_seen: 4,
        slow_requests,
        requests,
    })
}

/// Every command call on the lock nodes so far, from `INFO commandstats`.
async fn common_calls(nodes: &[String]) -> Option<u64> {
    let mut total = 0;
    for url in nodes {
        let client = redis::Client::open(url.as_str()).ok()?;
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .ok()?;
        total += info
            .lines()
            .filter_map(|l| {
                l.split_once(":calls=")?
                    .1
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum::<u64>();
    }
    Some(total)
}
