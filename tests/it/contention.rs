//! Mutual exclusion under contention, checked two independent ways:
//!
//! - a counter in a *separate* redis-server, incremented by a deliberately
//!   non-atomic read-modify-write (GET, sleep, SET) inside each critical
//!   section: any two overlapping sections lose an update;
//! - the holders' time windows `[granted, min(released, valid_until)]`,
//!   which must not overlap when sorted by grant time.
//!
//! The same workload without the lock is the negative control: both checks
//! must catch it, or they prove nothing.

use std::time::{Duration, Instant};

use redfence::Retry;

use crate::helpers::{eventually, ms, secs, LOCK_KEYS};
use crate::support::{Cluster, RedisServer};

const RESOURCE: &str = "contended";
const COUNTER: &str = "counter";
const TTL: Duration = Duration::from_secs(2);

/// One critical section, on this process's monotonic clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Section {
    pub(crate) task: usize,
    pub(crate) granted: Instant,
    pub(crate) valid_until: Instant,
    pub(crate) released: Instant,
}

impl Section {
    /// The lock protects the holder until it starts releasing or its
    /// validity ends, whichever comes first.
    fn end(&self) -> Instant {
        self.released.min(self.valid_until)
    }
}

/// The first pair of sections whose windows overlap, if any.
pub(crate) fn first_overlap(sections: &[Section]) -> Option<(Section, Section)> {
    let mut sorted = sections.to_vec();
    sorted.sort_by_key(|s| s.granted);
    let mut latest: Option<Section> = None;
    for s in sorted {
        if let Some(prev) = latest {
            if s.granted < prev.end() {
                return Some((prev, s));
            }
        }
        if latest.is_none_or(|prev| s.end() > prev.end()) {
            latest = Some(s);
        }
    }
    None
}

async fn counter_connection(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// GET, pause, SET: correct only if nobody else runs it at the same time.
async fn unsafe_increment(conn: &mut redis::aio::MultiplexedConnection) {
    let value: Option<i64> = redis::cmd("GET")
        .arg(COUNTER)
        .query_async(conn)
        .await
        .unwrap();
    tokio::time::sleep(ms(1)).await;
    let () = redis::cmd("SET")
        .arg(COUNTER)
        .arg(value.unwrap_or(0) + 1)
        .query_async(conn)
        .await
        .unwrap();
}

/// `tasks` tasks, each with its own client (as separate processes would
/// have), each running `rounds` critical sections. With `urls` = None the
/// sections run without any lock.
async fn workload(
    urls: Option<Vec<String>>,
    counter_url: String,
    tasks: usize,
    rounds: usize,
) -> Vec<Section> {
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let urls = urls.clone();
            let counter_url = counter_url.clone();
            tokio::spawn(async move {
                let mut conn = counter_connection(&counter_url).await;
                let client = urls.map(|urls| {
                    crate::helpers::builder(urls)
                        .node_timeout(ms(500))
                        .retry(
                            Retry::new()
                                .with_max_wait(secs(30))
                                .with_delay(ms(5))
                                .with_jitter(ms(20)),
                        )
                        .build()
                        .unwrap()
                });
                let mut sections = Vec::with_capacity(rounds);
                for _ in 0..rounds {
                    let guard = match &client {
                        Some(client) => Some(client.acquire(RESOURCE, TTL).await.unwrap()),
                        None => None,
                    };
                    let granted = Instant::now();
                    let valid_until = guard
                        .as_ref()
                        .map_or(granted + TTL, redfence::LockGuard::valid_until);
                    unsafe_increment(&mut conn).await;
                    let released = Instant::now();
                    if let Some(guard) = guard {
                        guard.release().await;
                    }
                    sections.push(Section {
                        task,
                        granted,
                        valid_until,
                        released,
                    });
                }
                sections
            })
        })
        .collect();
    let mut all = Vec::with_capacity(tasks * rounds);
    for handle in handles {
        all.extend(handle.await.unwrap());
    }
    all
}

fn final_count(counter: &RedisServer) -> usize {
    counter.cli(&["GET", COUNTER]).parse().unwrap()
}

async fn mutual_exclusion(n: usize, tasks: usize, rounds: usize) {
    let cluster = Cluster::start(n);
    let counter = RedisServer::start();
    let started = Instant::now();
    let sections = workload(Some(cluster.urls()), counter.url(), tasks, rounds).await;
    let took = started.elapsed();

    assert_eq!(sections.len(), tasks * rounds, "every acquire succeeded");
    let overran = sections
        .iter()
        .filter(|s| s.released > s.valid_until)
        .count();
    assert_eq!(overran, 0, "a section outlived its validity (TTL {TTL:?})");
    assert_eq!(
        final_count(&counter),
        sections.len(),
        "lost updates: two sections overlapped ({took:?})"
    );
    if let Some((a, b)) = first_overlap(&sections) {
        panic!("overlapping holders: {a:?} and {b:?}");
    }
    // Every task got its turn; nobody was starved out entirely.
    for task in 0..tasks {
        assert_eq!(sections.iter().filter(|s| s.task == task).count(), rounds);
    }
    assert!(
        eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; n]).await,
        "{:?}",
        cluster.count_keys(LOCK_KEYS)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_on_three_nodes() {
    mutual_exclusion(3, 16, 25).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_on_five_nodes() {
    mutual_exclusion(5, 8, 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_on_one_node() {
    mutual_exclusion(1, 8, 20).await;
}

/// The negative control: the same workload with no lock must be caught by
/// both checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkers_catch_the_unlocked_workload() {
    let counter = RedisServer::start();
    let sections = workload(None, counter.url(), 16, 5).await;
    assert_eq!(sections.len(), 80);
    assert!(
        final_count(&counter) < sections.len(),
        "no lost update without a lock: the counter check proves nothing"
    );
    assert!(
        first_overlap(&sections).is_some(),
        "no overlap without a lock: the window check proves nothing"
    );
}

#[test]
fn overlap_checker_on_known_windows() {
    let t0 = Instant::now();
    let section = |task, from: u64, to: u64, valid: u64| Section {
        task,
        granted: t0 + ms(from),
        valid_until: t0 + ms(valid),
        released: t0 + ms(to),
    };
    // Back to back, out of order: fine.
    assert!(first_overlap(&[section(1, 10, 20, 100), section(0, 0, 10, 100)]).is_none());
    // Overlap with the latest-ending earlier window, not just the neighbour.
    let nested = [
        section(0, 0, 50, 100),
        section(1, 10, 20, 100),
        section(2, 30, 40, 100),
    ];
    assert!(first_overlap(&nested).is_some());
    // A holder past its validity no longer excludes others.
    assert!(first_overlap(&[section(0, 0, 50, 20), section(1, 20, 30, 100)]).is_none());
    assert!(first_overlap(&[section(0, 0, 50, 21), section(1, 20, 30, 100)]).is_some());
}
