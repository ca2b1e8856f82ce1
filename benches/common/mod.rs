//! What the benches share (`lock.rs` and `scale.rs` most): the cycle of each
//! kind of client (the crate, the raw floors, the rslock peer), driving
//! cycles for a fixed time, contention on one resource with its invariant
//! checks (tokens in grant order, no overlapping holders), the server-side
//! counters (`INFO commandstats`) with the per-kind request accounting, CPU
//! time (getrusage for this process, /proc for the redis-servers), and key
//! counts. Included with `#[path = "common/mod.rs"] mod common;` next to the
//! harness's `process` and `server` modules, which it uses.

// Each bench uses a different subset.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::future::join_all;
use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;

use crate::server::RedisServer;

/// The lease of every lock taken here; long enough that nothing expires
/// during a run, so a key left behind is a missing release, not a race.
pub const TTL: Duration = Duration::from_secs(10);
pub const TTL_MS: u64 = 10_000;

/// The crate's own `RELEASE` script (the same file, so the same SHA1), which
/// the floors run by `EVALSHA`.
pub const RELEASE_LUA: &str = include_str!("../../src/wire/lua/release.lua");

/// The crate's fenced `ACQUIRE` script, which floor 3 runs by `EVALSHA`.
pub const ACQUIRE_LUA: &str = include_str!("../../src/wire/lua/acquire.lua");

/// Commands only ever run from inside the Lua scripts in this bench.
pub const LUA_ONLY: [&str; 6] = ["get", "del", "pttl", "pexpire", "publish", "pubsub|numsub"];
/// In fenced rows, also the commands the acquire runs inside its one
/// request, a `MULTI`/`EXEC` transaction (one request is its `EXEC`; the
/// `MULTI` is not counted) or a script (its `EVALSHA`): SET, INCR, INCRBY,
/// PEXPIRE, PTTL, whichever it uses.
pub const INSIDE_FENCED: [&str; 10] = [
    "get",
    "del",
    "pttl",
    "pexpire",
    "publish",
    "pubsub|numsub",
    "set",
    "incr",
    "incrby",
    "multi",
];

/// `REDFENCE_BENCH_SECS`, or `default` when it is not set.
pub fn measure_secs(default: f64) -> Result<f64, String> {
    match std::env::var("REDFENCE_BENCH_SECS") {
        Err(_) => Ok(default),
        Ok(s) => match s.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && (0.0..=600.0).contains(&v) => Ok(v),
            _ => Err(format!(
                "REDFENCE_BENCH_SECS={s:?}: expected seconds per row, 0 to 600 (e.g. 0.2)"
            )),
        },
    }
}

/// What every bench checks first: the measured seconds per row
/// ([`measure_secs`]) when `redis-server` runs; otherwise the message is
/// printed and the exit code (2) returned.
pub fn preflight(default: f64) -> Result<f64, i32> {
    let measure = measure_secs(default).map_err(|msg| {
        eprintln!("{msg}");
        2
    })?;
    if let Some(msg) = redis_server_missing() {
        eprintln!("{msg}");
        return Err(2);
    }
    Ok(measure)
}

/// `None` when `redis-server` (or `REDIS_SERVER_BIN`) runs; else what to
/// tell the user, so that a bench exits with a message instead of the
/// harness's panic.
pub fn redis_server_missing() -> Option<String> {
    let bin = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".to_owned());
    let works = Command::new(&bin)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .output()
        .is_ok_and(|out| out.status.success());
    (!works).then(|| {
        format!(
            "redis-server not found: install it (Debian: apt-get install redis-server) or set \
             REDIS_SERVER_BIN (tried {bin:?}); the benches start their own servers"
        )
    })
}

/// The benches' runtime: multi-threaded, one worker per core (two here).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("building the tokio runtime")
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "?".to_owned())
}

// ---------------------------------------------------------------------------
// What a cycle runs against.

pub enum Subject {
    /// `try_acquire` (one attempt, no waiting) + `release`.
    Redfence(redfence::Client),
    /// `acquire` (the waiting entry point the README leads with: it may
    /// subscribe for release notices and take a place in the fair queue
    /// before its first attempt) + `release`.
    RedfenceAcquire(redfence::Client),
    /// SET NX PX + EVALSHA compare-and-delete, sent to every connection and
    /// awaited on all of them. With `fenced` (the SHA1 of the crate's
    /// `ACQUIRE`), the acquire is that script instead of the `SET`: the
    /// fenced design's cost with no library around it.
    Floor {
        conns: Vec<MultiplexedConnection>,
        sha: String,
        fenced: Option<String>,
    },
    /// The floor deciding at the majority, as Redlock should: `SET NX PX`
    /// sent to every connection, the release sent to the nodes that
    /// granted once a majority has, and the cycle over once a majority
    /// confirmed the release. The other nodes' replies are heard by a task
    /// of their own, which releases a late grant as soon as it answers.
    /// Each cycle locks a key of its own (`{resource}:{seq}`): a late
    /// release may still be on its way when the next cycle starts.
    FloorQuorum {
        conns: Vec<MultiplexedConnection>,
        sha: Arc<str>,
        stragglers: Arc<Stragglers>,
    },
    /// The peer: rslock's `LockManager::lock` (`SET NX PX` on every node,
    /// `join_all`) and `unlock` (a compare-and-delete `EVALSHA` on every
    /// node).
    Rslock(rslock::LockManager),
}

/// The two halves of one successful cycle.
pub struct Phases {
    pub acquire: Duration,
    pub release: Duration,
    /// Crate only: nodes still unanswered when release returned.
    pub pending: usize,
}

/// `Client::stats()` counters over a window: the difference of two
/// snapshots (summed over rows' slices and over a contention row's clients).
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    pub attempts: u64,
    pub acquired: u64,
    pub write_backs: u64,
    pub write_backs_failed: u64,
}

impl Counts {
    pub fn between(before: redfence::Stats, after: redfence::Stats) -> Counts {
        Counts {
            attempts: after.attempts.saturating_sub(before.attempts),
            acquired: after.acquired.saturating_sub(before.acquired),
            write_backs: after.write_backs.saturating_sub(before.write_backs),
            write_backs_failed: after
                .write_backs_failed
                .saturating_sub(before.write_backs_failed),
        }
    }

    pub fn add(&mut self, other: Counts) {
        self.attempts += other.attempts;
        self.acquired += other.acquired;
        self.write_backs += other.write_backs;
        self.write_backs_failed += other.write_backs_failed;
    }
}

impl Subject {
    pub fn stats(&self) -> Option<redfence::Stats> {
        match self {
            Subject::Redfence(client) | Subject::RedfenceAcquire(client) => Some(client.stats()),
            Subject::Floor { .. } | Subject::FloorQuorum { .. } | Subject::Rslock(_) => None,
        }
    }

    pub async fn cycle(&self, resource: &str, task: usize, seq: u64) -> Result<Phases, String> {
        match self {
            Subject::Redfence(client) => {
                let t0 = Instant::now();
                let guard = match client.try_acquire(resource, TTL).await {
                    Ok(Some(guard)) => guard,
                    Ok(None) => return Err(format!("{resource}: contended")),
                    Err(e) => return Err(error_chain(&e)),
                };
                let t1 = Instant::now();
                let released = guard.release().await;
                let t2 = Instant::now();
                if released.confirmed < client.quorum() {
                    return Err(format!(
                        "release confirmed on {} of {} nodes: {:?}",
                        released.confirmed, released.nodes, released.failures
                    ));
                }
                Ok(Phases {
                    acquire: t1 - t0,
                    release: t2 - t1,
                    pending: released.pending,
                })
            }
            Subject::RedfenceAcquire(client) => {
                let t0 = Instant::now();
                let guard = client
                    .acquire(resource, TTL)
                    .await
                    .map_err(|e| error_chain(&e))?;
                let t1 = Instant::now();
                let released = guard.release().await;
                let t2 = Instant::now();
                if released.confirmed < client.quorum() {
                    return Err(format!(
                        "release confirmed on {} of {} nodes: {:?}",
                        released.confirmed, released.nodes, released.failures
                    ));
                }
                Ok(Phases {
                    acquire: t1 - t0,
                    release: t2 - t1,
                    pending: released.pending,
                })
            }
            Subject::FloorQuorum {
                conns,
                sha,
                stragglers,
            } => floor_quorum_cycle(conns, sha, stragglers, resource, task, seq).await,
            Subject::Rslock(manager) => {
                let key = format!("rslock:lock:{resource}");
                let t0 = Instant::now();
                let lock = manager
                    .lock(key.as_bytes(), TTL)
                    .await
                    .map_err(|e| format!("{key}: rslock: {e}"))?;
                let t1 = Instant::now();
                // Best effort, returns nothing: a failed unlock shows as a
                // lock key left behind.
                manager.unlock(&lock).await;
                let t2 = Instant::now();
                Ok(Phases {
                    acquire: t1 - t0,
                    release: t2 - t1,
                    pending: 0,
                })
            }
            Subject::Floor { conns, sha, fenced } => {
                let key = format!("floor:lock:{resource}");
                // As long as the crate's values (16 hex digits of the
                // client's tag, ':', 128 random bits in 22 base64
                // characters: 39 bytes).
                let value = format!("{:016x}:{seq:022x}", task as u64);
                let fence = fenced
                    .as_deref()
                    .map(|sha| (sha, floor_fence_key(resource)));
                let set = |c: &MultiplexedConnection| {
                    let (c, key, value) = (c.clone(), key.as_str(), value.as_str());
                    let fence = fence.as_ref().map(|(sha, f)| (*sha, f.as_str()));
                    async move {
                        match fence {
                            None => floor_set(c, key, value).await,
                            Some((sha, fence_key)) => {
                                floor_fenced_set(c, sha, key, fence_key, value).await
                            }
                        }
                    }
                };
                let t0 = Instant::now();
                let acquired = match conns.as_slice() {
                    [one] => vec![set(one).await],
                    all => join_all(all.iter().map(set)).await,
                };
                let t1 = Instant::now();
                let released = match conns.as_slice() {
                    [one] => vec![floor_del(one.clone(), sha, &key, &value).await],
                    all => {
                        join_all(all.iter().map(|c| floor_del(c.clone(), sha, &key, &value))).await
                    }
                };
                let t2 = Instant::now();
                for (i, r) in acquired.iter().enumerate() {
                    match r {
                        Ok(true) => {}
                        Ok(false) => return Err(format!("{key}: SET NX refused on node {i}")),
                        Err(e) => return Err(format!("{key}: SET on node {i}: {e}")),
                    }
                }
                for (i, r) in released.iter().enumerate() {
                    match r {
                        Ok(1) => {}
                        Ok(n) => return Err(format!("{key}: EVALSHA returned {n} on node {i}")),
                        Err(e) => return Err(format!("{key}: EVALSHA on node {i}: {e}")),
                    }
                }
                Ok(Phases {
                    acquire: t1 - t0,
                    release: t2 - t1,
                    pending: 0,
                })
            }
        }
    }
}

/// What the cycles of a [`Subject::FloorQuorum`] left to the background:
/// the replies after the majority, and the releases they still owe.
#[derive(Debug, Default)]
pub struct Stragglers {
    /// Cycles whose background part has not finished.
    pub in_flight: AtomicU64,
    /// Late grants refused or failed, late releases that did not delete.
    pub failed: AtomicU64,
    pub first_error: Mutex<Option<String>>,
}

impl Stragglers {
    fn fail(&self, error: String) {
        self.failed.fetch_add(1, AtomicOrdering::SeqCst);
        self.first_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert(error);
    }

    /// Waits (up to `bound`) until every cycle's background part finished;
    /// false if some had not by then.
    pub async fn settle(&self, bound: Duration) -> bool {
        let deadline = Instant::now() + bound;
        while self.in_flight.load(AtomicOrdering::SeqCst) > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        true
    }
}

type NodeReply<T> = futures::future::BoxFuture<'static, (usize, redis::RedisResult<T>)>;

fn quorum_set(
    conn: &MultiplexedConnection,
    i: usize,
    key: &Arc<str>,
    value: &Arc<str>,
) -> NodeReply<bool> {
    let (conn, key, value) = (conn.clone(), Arc::clone(key), Arc::clone(value));
    Box::pin(async move { (i, floor_set(conn, &key, &value).await) })
}

fn quorum_del(
    conn: &MultiplexedConnection,
    i: usize,
    sha: &Arc<str>,
    key: &Arc<str>,
    value: &Arc<str>,
) -> NodeReply<i64> {
    let (conn, sha, key, value) = (
        conn.clone(),
        Arc::clone(sha),
        Arc::clone(key),
        Arc::clone(value),
    );
    Box::pin(async move { (i, floor_del(conn, &sha, &key, &value).await) })
}

/// One cycle of [`Subject::FloorQuorum`].
async fn floor_quorum_cycle(
    conns: &[MultiplexedConnection],
    sha: &Arc<str>,
    stragglers: &Arc<Stragglers>,
    resource: &str,
    task: usize,
    seq: u64,
) -> Result<Phases, String> {
    use futures::stream::{FuturesUnordered, StreamExt};

    // A key per cycle: a node's release is sent once its own SET answered,
    // so a late node's release may still be on its way when this task's
    // next cycle starts, and that cycle's SET must not meet the key.
    let key: Arc<str> = format!("floor:lock:{resource}:{seq}").into();
    // As long as the crate's values, like the other floors'.
    let value: Arc<str> = format!("{:016x}:{seq:022x}", task as u64).into();
    let quorum = conns.len() / 2 + 1;
    let t0 = Instant::now();
    let mut acquires: FuturesUnordered<NodeReply<bool>> = conns
        .iter()
        .enumerate()
        .map(|(i, c)| quorum_set(c, i, &key, &value))
        .collect();
    let mut granted = Vec::with_capacity(conns.len());
    let mut error = None;
    while granted.len() < quorum {
        match acquires.next().await {
            Some((i, Ok(true))) => granted.push(i),
            Some((i, Ok(false))) => {
                error.get_or_insert_with(|| format!("{key}: SET NX refused on node {i}"));
            }
            Some((i, Err(e))) => {
                error.get_or_insert_with(|| format!("{key}: SET on node {i}: {e}"));
            }
            None => break,
        }
    }
    let t1 = Instant::now();
    // To the nodes that granted; a later grant is released as soon as it
    // answers (below), never before: its SET may not even be written yet.
    let mut releases: FuturesUnordered<NodeReply<i64>> = granted
        .iter()
        .map(|&i| quorum_del(&conns[i], i, sha, &key, &value))
        .collect();
    let needed = quorum.min(granted.len());
    let mut confirmed = 0;
    while confirmed < needed {
        match releases.next().await {
            Some((_, Ok(1))) => confirmed += 1,
            Some((i, Ok(n))) => {
                error.get_or_insert_with(|| format!("{key}: EVALSHA returned {n} on node {i}"));
            }
            Some((i, Err(e))) => {
                error.get_or_insert_with(|| format!("{key}: EVALSHA on node {i}: {e}"));
            }
            None => break,
        }
    }
    let t2 = Instant::now();
    let pending = acquires.len() + releases.len();
    if pending > 0 {
        stragglers.in_flight.fetch_add(1, AtomicOrdering::SeqCst);
        let (conns, sha, stragglers) = (conns.to_vec(), Arc::clone(sha), Arc::clone(stragglers));
        tokio::spawn(async move {
            while let Some((i, reply)) = acquires.next().await {
                match reply {
                    Ok(true) => releases.push(quorum_del(&conns[i], i, &sha, &key, &value)),
                    Ok(false) => stragglers.fail(format!("{key}: late SET NX refused on node {i}")),
                    Err(e) => stragglers.fail(format!("{key}: late SET on node {i}: {e}")),
                }
            }
            while let Some((i, reply)) = releases.next().await {
                match reply {
                    Ok(1) => {}
                    Ok(n) => {
                        stragglers.fail(format!("{key}: late EVALSHA returned {n} on node {i}"))
                    }
                    Err(e) => stragglers.fail(format!("{key}: late EVALSHA on node {i}: {e}")),
                }
            }
            stragglers.in_flight.fetch_sub(1, AtomicOrdering::SeqCst);
        });
    }
    match error {
        Some(e) => Err(e),
        None => Ok(Phases {
            acquire: t1 - t0,
            release: t2 - t1,
            pending,
        }),
    }
}

/// An error and its sources, `: `-separated: a `NotAcquired` says which
/// node answered what only in its source.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

pub async fn floor_set(
    mut conn: MultiplexedConnection,
    key: &str,
    value: &str,
) -> redis::RedisResult<bool> {
    let reply: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("NX")
        .arg("PX")
        .arg(TTL_MS)
        .query_async(&mut conn)
        .await?;
    Ok(reply.is_some())
}

/// Floor 3's acquire: the crate's `ACQUIRE` script (`SET NX PX`, then the
/// bucket's fence moved), its reply an integer (the fence) when granted.
pub async fn floor_fenced_set(
    mut conn: MultiplexedConnection,
    sha: &str,
    key: &str,
    fence_key: &str,
    value: &str,
) -> redis::RedisResult<bool> {
    let reply: redis::Value = redis::cmd("EVALSHA")
        .arg(sha)
        .arg(2)
        .arg(key)
        .arg(fence_key)
        .arg(value)
        .arg(TTL_MS)
        // The seed, used only when the fence is absent.
        .arg(1)
        .query_async(&mut conn)
        .await?;
    Ok(matches!(reply, redis::Value::Int(_)))
}

/// The floor's fence key of `resource`: the crate's bucket function
/// (FNV-1a 64 of the name, mod 1,024), under the floor's own prefix.
pub fn floor_fence_key(resource: &str) -> String {
    let hash = resource.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("floor:fence:{{{}}}", hash % 1024)
}

/// The waiting marker of a floor's lock key: the release script publishes
/// its notice only where it exists (the crate's `{prefix}wait:{resource}`).
pub fn floor_marker(key: &str) -> String {
    key.replacen("lock:", "wait:", 1)
}

pub async fn floor_del(
    mut conn: MultiplexedConnection,
    sha: &str,
    key: &str,
    value: &str,
) -> redis::RedisResult<i64> {
    redis::cmd("EVALSHA")
        .arg(sha)
        .arg(2)
        .arg(key)
        // The waiting marker the crate's release reads with the lock key
        // (`floor_marker`): absent, no notice is published.
        .arg(floor_marker(key))
        .arg(value)
        // The notice id the crate publishes with a release, and the notice
        // channel of the key on database 0 (`{key}@{db}`).
        .arg("0000000000000000")
        .arg(format!("{key}@0"))
        .query_async(&mut conn)
        .await
}

// ---------------------------------------------------------------------------
// Driving cycles for a fixed time.

#[derive(Default)]
pub struct Samples {
    /// Every cycle, failed ones included (until the failure), in ns.
    pub cycle_ns: Vec<u64>,
    pub acquire_ns: Vec<u64>,
    pub release_ns: Vec<u64>,
    pub ok: u64,
    pub failed: u64,
    pub release_pending: u64,
    pub first_error: Option<String>,
    pub wall: Duration,
}

impl Samples {
    pub fn merge(&mut self, other: Samples) {
        self.cycle_ns.extend(other.cycle_ns);
        self.acquire_ns.extend(other.acquire_ns);
        self.release_ns.extend(other.release_ns);
        self.ok += other.ok;
        self.failed += other.failed;
        self.release_pending += other.release_pending;
        self.wall += other.wall;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }

    pub fn sort(&mut self) {
        self.cycle_ns.sort_unstable();
        self.acquire_ns.sort_unstable();
        self.release_ns.sort_unstable();
    }

    pub fn cycles(&self) -> u64 {
        self.ok + self.failed
    }

    pub fn per_sec(&self) -> f64 {
        self.cycles() as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    pub fn success(&self) -> f64 {
        self.ok as f64 / (self.cycles().max(1)) as f64
    }
}

/// Jain's fairness index of per-client (or per-task) counts: 1 when all
/// are equal, 1/n when one has everything; 1 for no counts at all.
pub fn jain(counts: &[u64]) -> f64 {
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let squares: f64 = counts.iter().map(|&c| (c as f64).powi(2)).sum();
    if squares == 0.0 {
        return 1.0;
    }
    sum * sum / (counts.len() as f64 * squares)
}

/// Nearest-rank percentile of sorted ns samples, in µs.
pub fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `concurrency` tasks, each on its own resource, cycling until `duration`
/// has passed (at least one cycle each, so a zero duration still works).
/// The wall time runs until the last task finished its last cycle.
pub async fn drive(
    subject: Arc<Subject>,
    tag: String,
    concurrency: usize,
    duration: Duration,
) -> Samples {
    let start = Instant::now();
    let end = start + duration;
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let subject = Arc::clone(&subject);
            let resource = format!("{tag}:{task}");
            tokio::spawn(async move {
                let mut s = Samples::default();
                let mut seq = 0u64;
                loop {
                    seq += 1;
                    let t0 = Instant::now();
                    let outcome = subject.cycle(&resource, task, seq).await;
                    s.cycle_ns.push(nanos(t0.elapsed()));
                    match outcome {
                        Ok(p) => {
                            s.ok += 1;
                            s.acquire_ns.push(nanos(p.acquire));
                            s.release_ns.push(nanos(p.release));
                            s.release_pending += p.pending as u64;
                        }
                        Err(e) => {
                            s.failed += 1;
                            s.first_error.get_or_insert(e);
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
        all.merge(task.await.expect("bench task panicked"));
    }
    all.wall = start.elapsed();
    all
}

/// `concurrency` tasks, each on its own resource, running `cycles` cycles
/// each: a fixed amount of work, for counts that must not depend on time
/// (instructions per cycle under callgrind, which runs 50 times slower).
pub async fn drive_count(
    subject: Arc<Subject>,
    tag: String,
    concurrency: usize,
    cycles: u64,
) -> Samples {
    let start = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let subject = Arc::clone(&subject);
            let resource = format!("{tag}:{task}");
            tokio::spawn(async move {
                let mut s = Samples::default();
                for seq in 1..=cycles {
                    match subject.cycle(&resource, task, seq).await {
                        Ok(_) => s.ok += 1,
                        Err(e) => {
                            s.failed += 1;
                            s.first_error.get_or_insert(e);
                        }
                    }
                }
                s
            })
        })
        .collect();
    let mut all = Samples::default();
    for task in tasks {
        all.merge(task.await.expect("bench task panicked"));
    }
    all.wall = start.elapsed();
    all
}

// ---------------------------------------------------------------------------
// Contention: many tasks, one resource.

/// What the tasks of one contention run saw.
#[derive(Default)]
pub struct ContentionSamples {
    /// Critical sections run (successful acquisitions) in the window.
    pub acquired: u64,
    /// Those granted in the warm-up of the same run.
    pub warm_acquired: u64,
    /// From the start of each successful `acquire()` (waits included) to
    /// its guard, in ns; sorted after the run.
    pub wait_ns: Vec<u64>,
    /// Tokens in grant order: pushed inside the critical section.
    pub tokens: Vec<u64>,
    /// Guards without a token (a fenced client always hands one out).
    pub missing_tokens: u64,
    /// Critical sections entered while another holder was still inside.
    pub overlaps: u64,
    /// `acquire()` errors inside the window.
    pub errors: u64,
    /// Releases neither confirmed nor still pending on a quorum of nodes.
    pub short_releases: u64,
    /// Acquires still waiting when the window ended (dropped).
    pub cut: u64,
    /// Acquisitions per group of tasks (per client, or per task where
    /// each task has its own client).
    pub per_group: Vec<u64>,
    pub first_error: Option<String>,
    pub wall: Duration,
}

/// What the tasks share: the grant-ordered tokens and who is inside.
#[derive(Default)]
pub struct CriticalSection {
    pub tokens: Mutex<Vec<u64>>,
    pub inside: AtomicBool,
    pub overlaps: AtomicU64,
}

/// One task per `(group, client)` entry, all on `resource`, each looping
/// acquire (waiting, with `retry`) → critical section → release until
/// `warmup + duration` has passed. A wait that the end interrupts is
/// dropped. Acquisitions granted in the first `warmup` (the tasks' first
/// attempts collide) are only counted in `warm_acquired`; the tokens and
/// the invariants cover the whole run. Acquisitions are also counted per
/// group (`groups` of them).
pub async fn contend(
    tasks: Vec<(usize, redfence::Client)>,
    groups: usize,
    resource: String,
    retry: redfence::Retry,
    warmup: Duration,
    duration: Duration,
) -> ContentionSamples {
    let measured = Instant::now() + warmup;
    let end = tokio::time::Instant::from_std(measured + duration);
    let shared = Arc::new(CriticalSection::default());
    let tasks: Vec<_> = tasks
        .into_iter()
        .map(|(group, client)| {
            let shared = Arc::clone(&shared);
            let resource = resource.clone();
            let task = tokio::spawn(async move {
                let mut s = ContentionSamples::default();
                while tokio::time::Instant::now() < end {
                    let t0 = Instant::now();
                    let request = client.lock(resource.as_str(), TTL).retry(retry);
                    let guard = match tokio::time::timeout_at(end, request.acquire()).await {
                        Err(_) => {
                            s.cut += 1;
                            break;
                        }
                        Ok(Err(e)) => {
                            s.errors += 1;
                            s.first_error.get_or_insert_with(|| e.to_string());
                            break;
                        }
                        Ok(Ok(guard)) => guard,
                    };
                    // Granted in the window (after the warm-up) or not.
                    let in_window = Instant::now() >= measured;
                    if in_window {
                        s.wait_ns.push(nanos(t0.elapsed()));
                    }
                    // The critical section.
                    if shared.inside.swap(true, AtomicOrdering::SeqCst) {
                        shared.overlaps.fetch_add(1, AtomicOrdering::SeqCst);
                    }
                    match guard.token() {
                        Some(token) => shared
                            .tokens
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(token.get()),
                        None => s.missing_tokens += 1,
                    }
                    shared.inside.store(false, AtomicOrdering::SeqCst);
                    let released = guard.release().await;
                    if in_window {
                        s.acquired += 1;
                    } else {
                        s.warm_acquired += 1;
                    }
                    // Confirmed where our key was, plus still on its way to
                    // a paused node of the grant, plus handed over to the
                    // next fair waiter: fewer than a quorum means a
                    // release failed where the lock was held.
                    if released.confirmed + released.pending + released.handed_over
                        < client.quorum()
                    {
                        s.short_releases += 1;
                        s.first_error.get_or_insert_with(|| {
                            format!(
                                "release confirmed on {} of {} nodes: {:?}",
                                released.confirmed, released.nodes, released.failures
                            )
                        });
                    }
                }
                s
            });
            (group, task)
        })
        .collect();
    let mut all = ContentionSamples {
        per_group: vec![0; groups],
        ..ContentionSamples::default()
    };
    for (group, task) in tasks {
        let s = task.await.expect("contention task panicked");
        all.per_group[group] += s.acquired;
        all.acquired += s.acquired;
        all.warm_acquired += s.warm_acquired;
        all.wait_ns.extend(s.wait_ns);
        all.missing_tokens += s.missing_tokens;
        all.errors += s.errors;
        all.short_releases += s.short_releases;
        all.cut += s.cut;
        if all.first_error.is_none() {
            all.first_error = s.first_error;
        }
    }
    // The window: from the warm-up's end until the last task stopped.
    all.wall = measured.elapsed();
    all.wait_ns.sort_unstable();
    all.overlaps = shared.overlaps.load(AtomicOrdering::SeqCst);
    all.tokens = std::mem::take(&mut *shared.tokens.lock().unwrap_or_else(PoisonError::into_inner));
    all
}

/// The first place where `tokens` does not strictly increase: (index, the
/// token before, the token there).
pub fn first_non_increase(tokens: &[u64]) -> Option<(usize, u64, u64)> {
    tokens
        .windows(2)
        .position(|w| w[0] >= w[1])
        .map(|i| (i + 1, tokens[i], tokens[i + 1]))
}

// ---------------------------------------------------------------------------
// Server-side counters.

#[derive(Debug, Default, Clone)]
pub struct NodeStats {
    pub calls: BTreeMap<String, u64>,
    pub usec: BTreeMap<String, u64>,
    pub conns: u64,
}

impl NodeStats {
    pub fn read(node: &RedisServer) -> NodeStats {
        let info = node.cli(&["INFO", "stats", "commandstats"]);
        let mut stats = NodeStats::default();
        for line in info.lines() {
            let line = line.trim();
            if let Some(v) = line.strip_prefix("total_connections_received:") {
                stats.conns = v.parse().unwrap_or(0);
            } else if let Some(rest) = line.strip_prefix("cmdstat_") {
                let Some((name, fields)) = rest.split_once(':') else {
                    continue;
                };
                for field in fields.split(',') {
                    match field.split_once('=') {
                        Some(("calls", v)) => {
                            stats.calls.insert(name.to_owned(), v.parse().unwrap_or(0));
                        }
                        Some(("usec", v)) => {
                            stats.usec.insert(name.to_owned(), v.parse().unwrap_or(0));
                        }
                        _ => {}
                    }
                }
            }
        }
        // Our own traffic since the reset: the RESETSTAT itself, and the
        // connection of this INFO (accepted before INFO ran; the RESETSTAT's
        // connection was accepted before the reset).
        if let Some(c) = stats.calls.get_mut("config|resetstat") {
            *c = c.saturating_sub(1);
        }
        stats.calls.retain(|_, c| *c > 0);
        stats.conns = stats.conns.saturating_sub(1);
        stats
    }

    pub fn add(&mut self, other: &NodeStats) {
        for (name, c) in &other.calls {
            *self.calls.entry(name.clone()).or_default() += c;
        }
        for (name, u) in &other.usec {
            *self.usec.entry(name.clone()).or_default() += u;
        }
        self.conns += other.conns;
    }

    /// Requests a client sent (a command, or a whole `MULTI`/`EXEC`
    /// transaction; not the commands a script or a transaction ran), and
    /// their server time (an `EXEC`'s and an `EVALSHA`'s usec include the
    /// commands they ran; `MULTI`'s is added). `fenced`: the row's client
    /// acquires with the fenced transaction.
    pub fn client_commands(&self, fenced: bool) -> (u64, u64) {
        let inner: &[&str] = if fenced { &INSIDE_FENCED } else { &LUA_ONLY };
        let mut calls = 0;
        let mut usec = 0;
        for (name, c) in &self.calls {
            if name == "multi" {
                usec += self.usec.get(name).copied().unwrap_or(0);
            }
            if inner.contains(&name.as_str()) {
                continue;
            }
            calls += c;
            usec += self.usec.get(name).copied().unwrap_or(0);
        }
        (calls, usec)
    }

    pub fn calls_of(&self, name: &str) -> u64 {
        self.calls.get(name).copied().unwrap_or(0)
    }
}

/// This process's user + system CPU time so far (getrusage), in ns: every
/// thread, the runtime's workers included.
pub fn self_cpu_ns() -> u64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` fills the `rusage` it is pointed at; a zeroed one
    // is a valid value even if it did not.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let ns = |t: libc::timeval| {
        u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000
            + u64::try_from(t.tv_usec).unwrap_or(0) * 1000
    };
    ns(usage.ru_utime) + ns(usage.ru_stime)
}

/// A process's CPU time so far, in ns: the on-CPU time of its threads from
/// `/proc/<pid>/task/*/schedstat` (ns resolution), or, where that is
/// missing, utime + stime from `/proc/<pid>/stat` (clock ticks).
pub fn proc_cpu_ns(pid: &str) -> Option<u64> {
    let from_schedstat = || -> Option<u64> {
        let mut total = 0u64;
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
            let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
            total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
        }
        Some(total)
    };
    from_schedstat().or_else(|| {
        static CLK_TCK: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
        let tck = *CLK_TCK.get_or_init(clk_tck);
        cpu_ticks(pid).map(|t| (t as f64 * 1e9 / tck) as u64)
    })
}

/// A process's `read` and `write` system calls so far (`syscr` + `syscw`
/// of `/proc/<pid>/io`). For `redis-server`, which reads and writes its
/// sockets with `read`/`write`/`writev`, that is the messages it took in
/// and sent.
pub fn proc_syscalls(pid: &str) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    let field = |name: &str| -> Option<u64> {
        io.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
    };
    Some(field("syscr:")? + field("syscw:")?)
}

/// utime + stime of a process, in clock ticks.
pub fn cpu_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state); utime and stime are fields 14 and 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

pub fn clk_tck() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

// ---------------------------------------------------------------------------
// Keys and output helpers.

/// For progress lines: the first failure, if any.
pub fn first_error_text(first_error: &Option<String>) -> String {
    first_error
        .as_ref()
        .map(|e| format!("  first error: {e}"))
        .unwrap_or_default()
}

/// Lock keys left on the nodes counted (`None`: not running).
pub fn keys_left(keys: &[Option<usize>]) -> usize {
    keys.iter().flatten().sum()
}

/// Per node, `-` for a node not running.
pub fn keys_text(keys: &[Option<usize>]) -> String {
    keys.iter()
        .map(|k| k.map_or_else(|| "-".to_owned(), |k| k.to_string()))
        .collect::<Vec<_>>()
        .join("/")
}

pub fn count(node: &RedisServer, pattern: &str) -> usize {
    node.cli(&["KEYS", pattern])
        .lines()
        .filter(|l| !l.is_empty())
        .count()
}

/// One acquire+release cycle outside any measurement, so that the client
/// is connected to every node and has cached its scripts. Tried up to 10
/// times (on a fresh resource each time): 32 clients connecting at once on
/// a loaded machine can take longer than the node timeout.
pub async fn prime(client: &redfence::Client, resource: String) -> Result<(), String> {
    let mut last = String::new();
    for attempt in 0..10 {
        match client
            .try_acquire(&format!("{resource}:{attempt}"), TTL)
            .await
        {
            Ok(Some(guard)) => {
                guard.release().await;
                return Ok(());
            }
            Ok(None) => last = "contended".to_owned(),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(last)
}

/// Keys matching `pattern`, counted with `SCAN` (10,000 per call), so a
/// node holding a million keys is not blocked by one `KEYS`.
pub fn scan_count(node: &RedisServer, pattern: &str) -> usize {
    let mut cursor = "0".to_owned();
    let mut total = 0;
    loop {
        // `cli` flattens the reply: the next cursor, then the keys.
        let reply = node.cli(&["SCAN", &cursor, "MATCH", pattern, "COUNT", "10000"]);
        let mut lines = reply.lines();
        cursor = lines.next().unwrap_or("0").to_owned();
        total += lines.filter(|l| !l.is_empty()).count();
        if cursor == "0" {
            return total;
        }
    }
}

/// One multiplexed connection per URL for a floor, without a response
/// timeout (the library turns the driver's off and bounds calls itself;
/// the floors have no bound at all, to stay a floor).
pub async fn floor_conns(urls: &[String]) -> Vec<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new().set_response_timeout(None);
    join_all(urls.iter().map(|url| {
        let config = config.clone();
        async move {
            redis::Client::open(url.as_str())
                .expect("valid node URL")
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .expect("connecting a floor connection")
        }
    }))
    .await
}

// ---------------------------------------------------------------------------
// Clients and command counts of the waiting and hot benches.

/// A client builder for the bench's servers, with the restart guard off:
/// they started a moment ago, which the guard cannot tell from a restart
/// without data (it would keep them out of quorums for one TTL).
pub fn bench_builder(urls: &[String]) -> redfence::Builder {
    let builder = redfence::Client::builder(urls.iter().cloned())
        .restart_guard(redfence::RestartGuard::off());
    // Set by `peers --instructions` for its children under callgrind, which
    // runs 50 times slower: with the default 100 ms a reply would time out,
    // and the count would include the timeouts' work (probes, replacement
    // connections) that a real run never does.
    match std::env::var("REDFENCE_BENCH_NODE_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(ms) => builder.node_timeout(Duration::from_millis(ms)),
        None => builder,
    }
}

pub fn reset_stats(nodes: &[RedisServer]) {
    for node in nodes {
        node.cli(&["CONFIG", "RESETSTAT"]);
    }
}

/// Every command call on a node since the last `CONFIG RESETSTAT`, minus
/// that `CONFIG` (an `INFO` does not count itself).
pub fn command_calls(node: &RedisServer) -> u64 {
    let info = node.cli(&["INFO", "commandstats"]);
    let total: u64 = info
        .lines()
        .filter_map(|l| {
            l.split_once(":calls=")?
                .1
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    total.saturating_sub(1)
}
