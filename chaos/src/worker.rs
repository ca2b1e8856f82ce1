//! The workloads (`--workload`): in `mutex` a worker loops acquire →
//! critical section → release (or not); in `election` it loops campaign →
//! fenced writes with the term while leading → resign (or lose the
//! leadership); `semaphore` and `rw` are in `worker/semaphore.rs` and
//! `worker/rw.rs`. Every step is recorded as a history event, a leadership
//! as a grant (its term the token) and its end as a release or a lost
//! signal, so one checker judges both. The same loop runs as tasks of the
//! parent and as tasks of worker processes; only the [`Sink`] differs (the
//! history file, or stdout for the parent to append).

use std::io::{self, BufWriter, Write};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use redfence::{AutoExtend, Client, Leadership, Lease, LockGuard, RestartGuard, Retry};

use crate::sqlstore::{DataStore, StoreSpec};
use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, AsyncConnectionConfig};

use crate::bound::Limit;
use crate::clock::Clock;
use crate::history::{Event, Writer};
use crate::BoxError;

mod once;
mod rw;
mod semaphore;

pub use once::OnceSettings;

/// Every call the workload makes to the data node is bounded by this (the
/// lock's own calls are bounded by the library). The data node is never
/// faulted, so this only fires when the machine is badly overloaded.
pub const DATA_TIMEOUT: Duration = Duration::from_millis(500);
/// A read-modify-write is only started with at least this much validity
/// left: the workload plays a careful holder, so that a lost update in a
/// "safe" row means the lock failed, not that the worker knowingly wrote
/// late. (A check cannot make a late write impossible: a pause can still
/// fall right after it; that is the worker-pause nemesis.)
const WORK_MARGIN: Duration = Duration::from_millis(100);
/// How often a holder looks at its guard's deadline, to record the
/// watchdog's extensions (the guard has no extension callback).
const POLL: Duration = Duration::from_millis(10);

/// What each worker does (`--workload`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Acquire a lock, a critical section, release (or let it run out).
    Mutex,
    /// Campaign in an election, fenced writes with the term while leading,
    /// resign (or lose the leadership).
    Election,
    /// Acquire one of K permits of a semaphore (`--permits`), a critical
    /// section on the slot's counter and store key, release (or let it
    /// run out); see `worker/semaphore.rs`.
    Semaphore,
    /// The semaphore's negative control: the worker processes' clients
    /// ask for K + 1 permits, the checker bounds at K.
    SemaphoreOvercommit,
    /// Single-flight requests on a few keys whose values expire fast;
    /// see `worker/once.rs`.
    Once,
    /// The single-flight's negative control: naive cache-aside, no lock.
    OnceUnlocked,
    /// Readers and writers of one read-write lock (`--writers-percent` of
    /// the rounds write); see `worker/rw.rs`.
    Rw,
    /// The read-write check's negative control: the writers take a mutex
    /// of the lock's name instead of its write lock, so they exclude each
    /// other but not the readers.
    RwUnsafe,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Mutex => "mutex",
            Workload::Election => "election",
            Workload::Semaphore => "semaphore",
            Workload::SemaphoreOvercommit => "semaphore-overcommit",
            Workload::Once => "once",
            Workload::OnceUnlocked => "once-unlocked",
            Workload::Rw => "rw",
            Workload::RwUnsafe => "rw-unsafe",
        }
    }

    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "mutex" => Ok(Workload::Mutex),
            "election" => Ok(Workload::Election),
            "semaphore" => Ok(Workload::Semaphore),
            "semaphore-overcommit" => Ok(Workload::SemaphoreOvercommit),
            "once" => Ok(Workload::Once),
            "once-unlocked" => Ok(Workload::OnceUnlocked),
            "rw" => Ok(Workload::Rw),
            "rw-unsafe" => Ok(Workload::RwUnsafe),
            _ => Err(format!(
                "--workload {s:?}: expected mutex, election, semaphore, semaphore-overcommit, \
                 once, once-unlocked, rw or rw-unsafe"
            )),
        }
    }

    /// The bound the run is judged against beyond each resource's own
    /// checks (`bound.rs`), and whether it is the bound's negative
    /// control; `None` for the one-holder workloads.
    pub fn limit(self, permits: u32) -> Option<(Limit, bool)> {
        match self {
            Workload::Mutex | Workload::Election => None,
            Workload::Once | Workload::OnceUnlocked => None,
            Workload::Semaphore => Some((Limit::Permits(permits), false)),
            Workload::SemaphoreOvercommit => Some((Limit::Permits(permits), true)),
            Workload::Rw => Some((Limit::ReadWrite, false)),
            Workload::RwUnsafe => Some((Limit::ReadWrite, true)),
        }
    }
}

/// The lock settings of a run, shared by tasks and processes.
#[derive(Debug, Clone)]
pub struct LockConfig {
    pub workload: Workload,
    pub ttl: Duration,
    pub node_timeout: Duration,
    /// Bound on one waiting acquire.
    pub max_wait: Duration,
    pub resources: u32,
    /// K of the semaphore workloads (`--permits`).
    pub permits: u32,
    /// The share of the rw workloads' rounds that write, in percent
    /// (`--writers-percent`).
    pub writers_percent: u32,
    /// Whether the workers' writes carry their token (or term). The
    /// election needs tokens, so with `Workload::Election` the client keeps
    /// fencing on and `false` means a leader that ignores its term (plain
    /// `SET`), the `no-fencing` control.
    pub fencing: bool,
    /// The restart guard's window; `None` turns the guard off.
    pub guard: Option<Duration>,
    /// The clients' longest pause between reconnects to a node that is
    /// down (the library's default, 1 s, unless set).
    pub reconnect_backoff_max: Option<Duration>,
    /// Announce each critical section on stdout (`#cs LEASE`) and dwell in
    /// it long enough for the parent to SIGSTOP the process there.
    pub announce: bool,
}

impl LockConfig {
    fn client(&self, nodes: &[String]) -> Result<Client, BoxError> {
        let guard = match self.guard {
            Some(window) => RestartGuard::new().with_window(window),
            None => RestartGuard::off(),
        };
        let mut builder = Client::builder(nodes.iter().cloned());
        if let Some(max) = self.reconnect_backoff_max {
            builder = builder.reconnect_backoff_max(max);
        }
        Ok(builder
            .node_timeout(self.node_timeout)
            .retry(Retry::new().with_max_wait(self.max_wait))
            // Single-flight needs tokens too (`OnceError::FencingOff`).
            .fencing(self.fencing || self.workload == Workload::Election || self.workload.is_once())
            .restart_guard(guard)
            .build()?)
    }

    /// The dwell between the counter's read and its write. Short, except
    /// where the parent must hit it with a SIGSTOP: the announcement
    /// travels through a pipe and a thread first.
    fn dwell(&self, rng: &mut StdRng) -> Duration {
        let ms = if self.announce {
            rng.random_range(40..=80)
        } else {
            rng.random_range(1..=8)
        };
        Duration::from_millis(ms)
    }
}

/// How a worker ends its leases. Each is a way real holders behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Short critical section, then release.
    Release,
    /// The watchdog extends the lock through a critical section longer
    /// than the TTL; a second read-modify-write runs after the extensions.
    AutoExtend,
    /// Keep the guard, without a watchdog, until the lease has run out
    /// (the lost signal says `Expired`), then release (a no-op by then).
    RunOut,
}

impl Style {
    /// The mix: half release at once, a quarter extend, a quarter run out.
    pub fn of(index: u32) -> Self {
        [
            Style::Release,
            Style::AutoExtend,
            Style::Release,
            Style::RunOut,
        ][(index % 4) as usize]
    }
}

/// Where a worker's events go.
#[derive(Clone)]
pub enum Sink {
    /// The parent's history file.
    File(Arc<Writer>),
    /// A worker process's stdout, read by the parent.
    Pipe(Arc<Mutex<BufWriter<io::Stdout>>>),
}

impl Sink {
    pub fn record(&self, event: &Event) {
        let failed = match self {
            Sink::File(w) => w.record(event).is_err(),
            Sink::Pipe(out) => {
                let line = serde_json::to_string(event).unwrap_or_default();
                let mut out = out.lock().unwrap_or_else(PoisonError::into_inner);
                writeln!(out, "{line}").is_err()
            }
        };
        if failed {
            // A history with holes could pass checks the run would fail.
            crate::RECORD_FAILED.store(true, Ordering::Relaxed);
        }
    }

    /// Tells the parent this process is inside a critical section, and
    /// flushes, so the line and every event before it arrive now.
    fn announce(&self, lease: u64) {
        if let Sink::Pipe(out) = self {
            let mut out = out.lock().unwrap_or_else(PoisonError::into_inner);
            let _ = writeln!(out, "#cs {lease}").and_then(|()| out.flush());
        }
    }

    pub fn flush(&self) {
        let failed = match self {
            Sink::File(w) => w.flush().is_err(),
            Sink::Pipe(out) => out
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .flush()
                .is_err(),
        };
        if failed {
            crate::RECORD_FAILED.store(true, Ordering::Relaxed);
        }
    }
}

/// What every worker of one process shares.
pub struct Setup {
    pub nodes: Vec<String>,
    pub data_url: String,
    /// Where the fenced writes go (`--store`).
    pub store: StoreSpec,
    pub lock: LockConfig,
    pub clock: Clock,
    /// No new acquire starts after this (on the run's clock).
    pub until_ns: u64,
    pub sink: Sink,
}

/// A connection to the data node, as a separate host would have. Bounded
/// connect and response times: nothing the rig does waits forever.
pub async fn data_connection(url: &str) -> Result<MultiplexedConnection, BoxError> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(DATA_TIMEOUT))
        .set_response_timeout(Some(DATA_TIMEOUT));
    let client = redis::Client::open(url)?;
    Ok(client
        .get_multiplexed_async_connection_with_config(&config)
        .await?)
}

pub fn counter_key(resource: u32) -> String {
    format!("counter:r{resource}")
}

pub fn store_key(resource: u32) -> String {
    format!("fenced:r{resource}")
}

/// One worker: its own lock client and data connection, looping until the
/// run's end.
pub async fn run(id: u32, style: Style, seed: u64, setup: Arc<Setup>) -> Result<(), BoxError> {
    let client = setup.lock.client(&setup.nodes)?;
    let conn = data_connection(&setup.data_url).await?;
    let store = DataStore::connect(&setup.store, conn.clone()).await?;
    let mut w = Worker {
        id,
        style,
        rng: StdRng::seed_from_u64(seed),
        setup,
        conn,
        store,
        seq: 0,
    };
    let s = Arc::clone(&w.setup);
    while s.clock.now_ns() < s.until_ns && !crate::interrupted() {
        let resource = w.rng.random_range(0..s.lock.resources);
        w.seq += 1;
        // Unique across all workers and processes of the run.
        let lease = (u64::from(id) << 32) | w.seq;
        let granted = match s.lock.workload {
            Workload::Mutex => w.attempt(resource, lease, &client).await,
            Workload::Election => w.campaign(resource, lease, &client).await,
            Workload::Semaphore | Workload::SemaphoreOvercommit => {
                w.permit_round(resource, lease, &client).await
            }
            Workload::Once | Workload::OnceUnlocked => w.once_round(resource, lease, &client).await,
            Workload::Rw | Workload::RwUnsafe => w.rw_round(resource, lease, &client).await,
        };
        if !granted {
            // A quick failure (nodes refusing connections) must not spin.
            let ms = w.rng.random_range(5..=30);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }
    Ok(())
}

struct Worker {
    id: u32,
    style: Style,
    rng: StdRng,
    setup: Arc<Setup>,
    conn: MultiplexedConnection,
    store: DataStore,
    seq: u64,
}

impl Worker {
    fn now(&self) -> u64 {
        self.setup.clock.now_ns()
    }

    fn record(&self, event: Event) {
        self.setup.sink.record(&event);
    }

    /// One waiting acquire and, when granted, the critical section.
    /// Returns whether the lock was granted.
    async fn attempt(&mut self, resource: u32, lease: u64, client: &Client) -> bool {
        let name = format!("r{resource}");
        let lock = &self.setup.lock;
        let mut request = client.lock(name.clone(), lock.ttl);
        if self.style == Style::AutoExtend {
            request = request.auto_extend(AutoExtend::new());
        }
        let start_ns = self.now();
        // The library bounds the wait by `max_wait` plus one attempt; the
        // outer bound only guards the rig against a bug there.
        let outcome = match tokio::time::timeout(lock.max_wait * 2, request.acquire()).await {
            Ok(Ok(guard)) => Ok((name.clone(), guard)),
            Ok(Err(e)) => Err(short_reason(&e)),
            Err(_) => Err("rig timeout".to_owned()),
        };
        self.settle(name, start_ns, outcome, Some(resource), lease)
            .await
    }

    /// Records a waiting acquire of `asked` begun at `start_ns` and, when
    /// it got `guard` on resource `held` (the lock's own, a permit's slot,
    /// or a read-write lock's mode), the grant and the hold, whose critical
    /// sections use counter and store key `cell` (`None`: a reader, which
    /// writes nothing). Returns whether it was granted.
    async fn settle(
        &mut self,
        asked: String,
        start_ns: u64,
        outcome: Result<(String, LockGuard), String>,
        cell: Option<u32>,
        lease: u64,
    ) -> bool {
        let end_ns = self.now();
        self.record(Event::Attempt {
            worker: self.id,
            resource: asked,
            start_ns,
            end_ns,
            granted: outcome.is_ok(),
            reason: outcome.as_ref().err().cloned(),
        });
        let Ok((held, guard)) = outcome else {
            return false;
        };
        self.record(Event::Grant {
            worker: self.id,
            resource: held,
            lease,
            start_ns,
            at_ns: end_ns,
            valid_until_ns: self.setup.clock.ns_of(guard.valid_until()),
            token: guard.token().map(|t| t.get()),
        });
        self.hold(guard, cell, lease).await;
        true
    }

    /// The critical section (none for a reader: `cell` is `None`), then
    /// the end of the lease by the worker's style.
    async fn hold(&mut self, guard: LockGuard, cell: Option<u32>, lease: u64) {
        let mut lost = Box::pin(guard.lost());
        let mut deadline = guard.valid_until();
        if let Some(cell) = cell {
            self.work(&guard.lease(), cell, lease).await;
        }
        let ttl = self.setup.lock.ttl;
        let dwell = match self.style {
            Style::Release => Some(Duration::from_millis(self.rng.random_range(5..=30))),
            // Long enough for at least one extension (every third of the
            // validity), often two.
            Style::AutoExtend => Some(ttl.mul_f64(self.rng.random_range(0.6..1.3))),
            // Until the lost signal; bounded by the validity, since no
            // watchdog runs.
            Style::RunOut => None,
        };
        let until = dwell.map(|d| Instant::now() + d);
        let mut gone = false;
        // A hard bound on the loop, whatever the lease does.
        let bound = Instant::now() + ttl * 10;
        loop {
            let now = Instant::now();
            let next = until.unwrap_or(bound).min(bound).min(now + POLL);
            tokio::select! {
                loss = &mut lost => {
                    self.note_extension(&guard.lease(), lease, &mut deadline);
                    self.record(Event::Lost {
                        lease,
                        at_ns: self.now(),
                        reason: format!("{:?}", loss.reason),
                    });
                    gone = true;
                    break;
                }
                () = tokio::time::sleep_until(next.into()) => {
                    self.note_extension(&guard.lease(), lease, &mut deadline);
                    let now = Instant::now();
                    if until.is_some_and(|u| now >= u) || now >= bound {
                        break;
                    }
                }
            }
        }
        if let Some(cell) = cell.filter(|_| self.style == Style::AutoExtend && !gone) {
            // Under the extended lease, well past the first TTL.
            self.work(&guard.lease(), cell, lease).await;
        }
        if gone {
            // Let the keys expire on the nodes too (validity is TTL minus
            // drift), so the release below deletes nothing: the lease ran
            // out, it was not ended.
            tokio::time::sleep(Duration::from_millis(20)).await;
        } else {
            // The holder stops claiming the lock when it asks for the
            // release, not when the release returns.
            self.record(Event::Release {
                lease,
                at_ns: self.now(),
            });
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), guard.release()).await;
    }

    /// The election workload's round: one campaign for the election
    /// `r{resource}`, bounded by the lock's `max_wait` (its deadline), and
    /// when elected the leadership. Recorded as the mutex's attempt and
    /// grant (the term is the grant's token), so the checker's mutual
    /// exclusion is "at most one leader" and its token order "terms
    /// strictly increasing". Returns whether it was elected.
    async fn campaign(&mut self, resource: u32, lease: u64, client: &Client) -> bool {
        let name = format!("r{resource}");
        let lock = &self.setup.lock;
        let election = client
            .election(&name)
            .ttl(lock.ttl)
            .retry(Retry::new().with_max_wait(lock.max_wait))
            .campaign_deadline(lock.max_wait);
        let start_ns = self.now();
        let value = format!("worker {} lease {lease}", self.id);
        // The deadline bounds the campaign; the outer bound only guards
        // the rig against a bug there.
        let outcome = tokio::time::timeout(lock.max_wait * 2, election.campaign(value)).await;
        let end_ns = self.now();
        let (leadership, reason) = match outcome {
            Ok(Ok(leadership)) => (Some(leadership), None),
            Ok(Err(e)) => (None, Some(election_reason(&e))),
            Err(_) => (None, Some("rig timeout".to_owned())),
        };
        self.record(Event::Attempt {
            worker: self.id,
            resource: name.clone(),
            start_ns,
            end_ns,
            granted: leadership.is_some(),
            reason,
        });
        let Some(leadership) = leadership else {
            return false;
        };
        let view = leadership.lease();
        self.record(Event::Grant {
            worker: self.id,
            resource: name,
            lease,
            start_ns,
            at_ns: end_ns,
            valid_until_ns: self.setup.clock.ns_of(view.valid_until()),
            token: Some(leadership.term().get()),
        });
        self.lead(leadership, resource, lease).await;
        true
    }

    /// The term: fenced writes (and the unfenced counter's increments)
    /// every 0.3–0.7 TTL while leading, the extensions of the watchdog
    /// recorded as they come. The worker's style picks the term's end:
    /// `Release` resigns after a short term (5–30 ms), `AutoExtend` after
    /// 0.6–1.3 TTL (past at least one extension), `RunOut` keeps leading
    /// until `lost()` (a fault), stepping down after 3–6 TTL so that the
    /// others get terms in a quiet run.
    async fn lead(&mut self, leadership: Leadership, resource: u32, lease: u64) {
        let view = leadership.lease();
        let mut lost = Box::pin(leadership.lost());
        let mut deadline = view.valid_until();
        let ttl = self.setup.lock.ttl;
        let term = match self.style {
            Style::Release => Duration::from_millis(self.rng.random_range(5..=30)),
            Style::AutoExtend => ttl.mul_f64(self.rng.random_range(0.6..1.3)),
            Style::RunOut => ttl.mul_f64(self.rng.random_range(3.0..6.0)),
        };
        let until = Instant::now() + term;
        let mut next_work = Instant::now();
        let mut gone = false;
        loop {
            if Instant::now() >= next_work {
                self.work(&view, resource, lease).await;
                next_work = Instant::now() + ttl.mul_f64(self.rng.random_range(0.3..0.7));
            }
            let now = Instant::now();
            if now >= until {
                self.note_extension(&view, lease, &mut deadline);
                break;
            }
            let next = until.min(next_work).min(now + POLL);
            tokio::select! {
                loss = &mut lost => {
                    self.note_extension(&view, lease, &mut deadline);
                    self.record(Event::Lost {
                        lease,
                        at_ns: self.now(),
                        reason: format!("{:?}", loss.reason),
                    });
                    gone = true;
                    break;
                }
                () = tokio::time::sleep_until(next.into()) => {
                    self.note_extension(&view, lease, &mut deadline);
                }
            }
        }
        if gone {
            // As the mutex workload: the keys expire on the nodes first, so
            // the resignation below deletes nothing.
            tokio::time::sleep(Duration::from_millis(20)).await;
        } else {
            // The leader stops acting as one when it resigns, not when the
            // resignation returns.
            self.record(Event::Release {
                lease,
                at_ns: self.now(),
            });
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), leadership.resign()).await;
    }

    fn note_extension(&self, view: &Lease, lease: u64, deadline: &mut Instant) {
        let now_deadline = view.valid_until();
        if now_deadline != *deadline {
            *deadline = now_deadline;
            self.record(Event::Extend {
                lease,
                at_ns: self.now(),
                valid_until_ns: self.setup.clock.ns_of(now_deadline),
            });
        }
    }

    /// Read-modify-write of the resource's counter with plain GET and SET
    /// (nothing but the lock protects it), then a write of the lease to the
    /// resource's fenced key with the lease's token, a leadership's term
    /// (or, with fencing off, a plain SET).
    async fn work(&mut self, view: &Lease, resource: u32, lease: u64) {
        if view.validity() < WORK_MARGIN || !view.is_valid() {
            return;
        }
        let counter = counter_key(resource);
        let start_ns = self.now();
        let read: Result<redis::RedisResult<Option<i64>>, _> =
            tokio::time::timeout(DATA_TIMEOUT, self.conn.get(&counter)).await;
        let Ok(Ok(read)) = read else {
            return; // nothing read, nothing to record
        };
        let read = read.unwrap_or(0);
        if self.setup.lock.announce {
            self.setup.sink.announce(lease);
        }
        let dwell = self.setup.lock.dwell(&mut self.rng);
        tokio::time::sleep(dwell).await;
        let set: Result<redis::RedisResult<()>, _> =
            tokio::time::timeout(DATA_TIMEOUT, self.conn.set(&counter, read + 1)).await;
        self.record(Event::Increment {
            worker: self.id,
            lease,
            counter,
            read,
            start_ns,
            end_ns: self.now(),
            acked: matches!(set, Ok(Ok(()))),
        });

        let key = store_key(resource);
        let token = view.token().filter(|_| self.setup.lock.fencing);
        let start_ns = self.now();
        // Fencing off (`token` is `None`): what an application without
        // tokens does, a plain write. It is recorded without a token; the
        // report orders it by its lease's grant instead (see `report.rs`).
        let outcome = self.store.write(&key, lease, token).await;
        self.record(Event::Write {
            worker: self.id,
            lease,
            key,
            token: token.map(|t| t.get()),
            start_ns,
            end_ns: self.now(),
            outcome,
        });
    }
}

/// The library's message: the reason, the vote and each node's failure,
/// which is what one needs to read a failed attempt in the history.
fn short_reason(e: &redfence::Error) -> String {
    e.to_string()
}

/// A failed campaign's reason, with the lock's error behind it (the
/// election's own message names only the phase).
fn election_reason(e: &redfence::ElectionError) -> String {
    match std::error::Error::source(e) {
        Some(source) => format!("{e}: {source}"),
        None => e.to_string(),
    }
}

/// The arguments of a worker process: `--worker key=value ...`.
#[derive(Debug, Clone)]
pub struct ProcArgs {
    pub index: u32,
    pub tasks: u32,
    pub first_id: u32,
    pub nodes: Vec<String>,
    pub data_url: String,
    pub store: StoreSpec,
    pub origin_ns: u64,
    pub until_ns: u64,
    pub seed: u64,
    pub lock: LockConfig,
    pub parent_pid: u32,
}

impl ProcArgs {
    pub fn to_args(&self) -> Vec<String> {
        let l = &self.lock;
        let ms = |d: Duration| d.as_millis().to_string();
        let pairs = [
            ("index", self.index.to_string()),
            ("tasks", self.tasks.to_string()),
            ("first-id", self.first_id.to_string()),
            // Spaces: a Sentinel node's URL has commas.
            ("nodes", self.nodes.join(" ")),
            ("data", self.data_url.clone()),
            ("store", self.store.to_arg()),
            ("origin-ns", self.origin_ns.to_string()),
            ("until-ns", self.until_ns.to_string()),
            ("seed", self.seed.to_string()),
            ("workload", l.workload.name().to_owned()),
            ("ttl-ms", ms(l.ttl)),
            ("node-timeout-ms", ms(l.node_timeout)),
            ("max-wait-ms", ms(l.max_wait)),
            ("resources", l.resources.to_string()),
            ("permits", l.permits.to_string()),
            ("writers-percent", l.writers_percent.to_string()),
            ("fencing", l.fencing.to_string()),
            ("guard-ms", l.guard.map_or("off".to_owned(), ms)),
            (
                "backoff-max-ms",
                l.reconnect_backoff_max.map_or("default".to_owned(), ms),
            ),
            ("announce", l.announce.to_string()),
            ("parent-pid", self.parent_pid.to_string()),
        ];
        std::iter::once("--worker".to_owned())
            .chain(pairs.into_iter().map(|(k, v)| format!("{k}={v}")))
            .collect()
    }

    fn parse(args: &[String]) -> Result<Self, String> {
        let get = |key: &str| {
            args.iter()
                .find_map(|a| a.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
                .ok_or_else(|| format!("worker: missing {key}="))
        };
        fn num<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, String> {
            v.parse().map_err(|_| format!("worker: bad {key}={v}"))
        }
        let ms = |key: &str| -> Result<Duration, String> {
            Ok(Duration::from_millis(num(key, get(key)?)?))
        };
        let guard = match get("guard-ms")? {
            "off" => None,
            v => Some(Duration::from_millis(num("guard-ms", v)?)),
        };
        let reconnect_backoff_max = match get("backoff-max-ms")? {
            "default" => None,
            v => Some(Duration::from_millis(num("backoff-max-ms", v)?)),
        };
        Ok(Self {
            index: num("index", get("index")?)?,
            tasks: num("tasks", get("tasks")?)?,
            first_id: num("first-id", get("first-id")?)?,
            nodes: get("nodes")?.split(' ').map(str::to_owned).collect(),
            data_url: get("data")?.to_owned(),
            store: StoreSpec::parse(get("store")?)?,
            origin_ns: num("origin-ns", get("origin-ns")?)?,
            until_ns: num("until-ns", get("until-ns")?)?,
            seed: num("seed", get("seed")?)?,
            lock: LockConfig {
                workload: Workload::parse(get("workload")?)?,
                ttl: ms("ttl-ms")?,
                node_timeout: ms("node-timeout-ms")?,
                max_wait: ms("max-wait-ms")?,
                resources: num("resources", get("resources")?)?,
                permits: num("permits", get("permits")?)?,
                writers_percent: num("writers-percent", get("writers-percent")?)?,
                fencing: num("fencing", get("fencing")?)?,
                guard,
                reconnect_backoff_max,
                announce: num("announce", get("announce")?)?,
            },
            parent_pid: num("parent-pid", get("parent-pid")?)?,
        })
    }
}

/// The seed of one worker: the run's seed mixed with the worker's id
/// (splitmix64), so that workers draw different but reproducible numbers.
pub fn worker_seed(run_seed: u64, id: u32) -> u64 {
    let mut z = run_seed.wrapping_add(0x9E37_79B9_7F4A_7C15u64.wrapping_mul(u64::from(id) + 1));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `main` of a worker process.
pub fn process_main(args: &[String]) -> ExitCode {
    let a = match ProcArgs::parse(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    // Die with the parent, whatever kills it: a SIGKILLed parent runs no
    // Drop, and an orphaned worker would keep locking until its deadline.
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and touches no
    // memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
    // The parent may have died before the prctl took effect.
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } as u32 != a.parent_pid {
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("worker {}: runtime: {e}", a.index);
            return ExitCode::FAILURE;
        }
    };
    let sink = Sink::Pipe(Arc::new(Mutex::new(BufWriter::new(io::stdout()))));
    let setup = Arc::new(Setup {
        nodes: a.nodes.clone(),
        data_url: a.data_url.clone(),
        store: a.store.clone(),
        lock: a.lock.clone(),
        clock: Clock::from_origin(a.origin_ns),
        until_ns: a.until_ns,
        sink: sink.clone(),
    });
    let failed = runtime.block_on(async {
        // Lines reach the parent in batches; every 20 ms keeps the
        // parent's file current without a write per event.
        let flusher = {
            let sink = sink.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    sink.flush();
                }
            })
        };
        let tasks: Vec<_> = (0..a.tasks)
            .map(|i| {
                let id = a.first_id + i;
                let seed = worker_seed(a.seed, id);
                tokio::spawn(run(id, Style::of(i), seed, Arc::clone(&setup)))
            })
            .collect();
        let mut failed = false;
        for t in tasks {
            match t.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    eprintln!("worker process {}: {e}", a.index);
                    failed = true;
                }
                Err(e) => {
                    eprintln!("worker process {}: task failed: {e}", a.index);
                    failed = true;
                }
            }
        }
        flusher.abort();
        failed
    });
    sink.flush();
    // Background releases of the last guards get a moment, bounded.
    runtime.shutdown_timeout(Duration::from_millis(500));
    if failed || crate::RECORD_FAILED.load(Ordering::Relaxed) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
