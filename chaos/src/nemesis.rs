//! The nemeses: what each one breaks, how the rig is configured for it,
//! what the checker is expected to find, and its fault schedule.
//!
//! Every schedule runs on its own OS thread (it blocks: restarting a
//! server waits for it to load, SIGSTOP waits for `/proc` to say stopped)
//! and draws every choice from one `StdRng` seeded from `--seed`, so a run
//! is reproducible up to timing. A schedule is a loop: a quiet period, a
//! fault on its victims (1 or 2 of the 5 lock nodes unless said
//! otherwise), the fault held for a random time, the heal. Every fault is
//! recorded as a `nemesis` start/stop event pair, and every fault is
//! healed before `heal_by` (one second before the workers stop), so the
//! end of the run measures recovery.
//!
//! | nemesis | rig | fault, repeated | victims | expected |
//! |---|---|---|---|---|
//! | `kill-aof` | AOF `appendfsync always`; restart guard **off**, so that persistence alone is tested | quiet 100–400 ms; SIGKILL, down 0–300 ms, restart (AOF replayed) | 1–2, lock holders first, not last step's | safe |
//! | `kill-nopersist-guard` | no persistence; restart guard on (window 500 ms) | quiet 50–250 ms; SIGKILL and restart at once, empty | as above: consecutive steps hit different holders within one TTL | safe |
//! | `kill-nopersist` | same, restart guard **off** | same | same | violation (negative control) |
//! | `failover` | every node has a replica (`--replicaof`), clients reach nodes through fault proxies (the address that moves); restart guard on (window 500 ms) | rounds of two faults 10–60 ms apart: both faults' replicas cut off (`REPLICAOF NO ONE`), then, after a quiet 50–250 ms, once a lease granted after the cut is kept (extended, or held 150 ms): SIGKILL the masters, repoint the proxies to the replicas, drop every connection (proxy `Reset`, `CLIENT KILL TYPE normal`), again 3–5 times inside the window; a new replica for each promoted server | 1–2 per fault, 3–4 per round; fair-queue homes first, in the second fault | safe |
//! | `failover-noguard` | same, restart guard **off** | same | same | violation (negative control): overlapping holders, repeated or decreasing tokens |
//! | `sentinel-failover` | every node a Sentinel group: its master, a replica and three Sentinels (`down-after-milliseconds` 2 s, `failover-timeout` 2 s), the clients given the Sentinels (`redis+sentinel://`, reconnects backing off at most 200 ms); TTL 2 s, restart guard on (window 2.4 s) | rounds: the victims' replicas cut off (`REPLICAOF NO ONE`), then, once a lease granted after the cut is kept, per victim 10–60 ms apart: `SENTINEL FAILOVER` and SIGKILL (or SIGSTOP) of the old master the moment the replica is promoted, or SIGKILL and the Sentinels' own failover, the three kinds in turn; the old master restarted (or resumed 1.5 s later) as the new one's replica | 3–4 groups per round; fair-queue homes first | safe |
//! | `sentinel-failover-noguard` | same, restart guard **off** | same | same | violation (negative control): overlapping holders, repeated or decreasing tokens |
//! | `pause` | | quiet 200–800 ms; SIGSTOP 100–1500 ms, SIGCONT | 1–2 random | safe |
//! | `client-pause` | | quiet 200–800 ms; `CLIENT PAUSE ms ALL`, 100–1500 ms | 1–2 random | safe |
//! | `worker-pause` | workers in processes dwell 40–80 ms between read and write | quiet 200–600 ms; SIGSTOP a worker process at its next critical section, for 1.5–3 TTL, SIGCONT | 1 process | no overlap; lost updates; 0 stale writes accepted, some rejected |
//! | `partition` | clients reach nodes through fault proxies | quiet 200–800 ms; `Blackhole`, `Reset`, `Stall` or `DropReplies` for 100–1500 ms | 1–2 random | safe |
//! | `delay` | fault proxies | quiet 200–800 ms; `Delay` 20–80 ms per victim (round trip 40–160 ms against a 50 ms node timeout) for 300–2000 ms | 1–2 random | safe |
//! | `clock-jump` | | quiet 100–500 ms; on each victim `PEXPIRE` every lock key (a mutex's, a read-write lock's writer key and reader entries) to 1–5 ms: that node's clock jumping ahead past every lock it holds | one or both of 2 "bad clock" nodes drawn once per run | tokens safe; mutual exclusion is not promised (Redlock assumes bounded clock drift on every node) |
//! | `evict` | `maxmemory-policy volatile-lru` | quiet 300–800 ms; `maxmemory` set 256 KB above use, 4 KB filler keys with a TTL pumped for 500–1500 ms, limit lifted | 3 random: a majority, as the misconfiguration is the deployment's, not one node's | violation (negative control) |
//! | `no-fencing` | as `worker-pause`, with `fencing(false)` and plain `SET` for the store | as `worker-pause` | 1 process | stale writes accepted (negative control) |
//!
//! The failover nemesis (`nemesis/failover.rs`, whose docs have the
//! schedule and why it is shaped so) models a managed endpoint or a
//! Sentinel-managed VIP that moves to a replica promoted after its master
//! died, having missed the master's last writes: the lease granted last and
//! the fence moves that went with it. The guard promises that such a
//! server, another server behind a known address, does not vote for one
//! window from the first connection that reached it, on that connection
//! and every later one, and with fencing not until its fences are
//! re-seeded.
//!
//! The Sentinel failover nemesis (`nemesis/sentinel.rs`) is the same
//! loss through the real thing: Sentinels that promote the replica, config
//! epochs, the clients' discovery, demoted masters that come back. Its
//! lease is longer (2 s, `Nemesis::ttl`): a Sentinel failover takes up to
//! about a second and a half, and the lease the promoted replicas missed
//! must outlive it.
//!
//! `libfaketime` would be the usual way to move a node's clock, but it
//! hangs Debian's `redis-server`; expiring the keys early is what a clock
//! jump does to them (fence keys have no expiry, so a jump does not touch
//! them).

use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::RngExt;

use crate::children::{signal, PauseTargets};
use crate::clock::Clock;
use crate::history::{Event, NemesisPhase, Writer};
use crate::proxy::{Fault, FaultProxy};
use crate::server::{Cluster, RedisServer, ServerOptions};

mod failover;
mod sentinel;

/// Bounds every command the nemesis sends to a node itself.
const NODE_TIMEOUT: Duration = Duration::from_millis(500);
/// How long the worker-pause nemesis waits for an armed process to enter a
/// critical section.
const ARM_TIMEOUT: Duration = Duration::from_secs(2);
/// No fault before this much of the run has passed.
const FIRST_FAULT: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nemesis {
    KillAof,
    KillNopersistGuard,
    KillNopersist,
    Failover,
    FailoverNoguard,
    SentinelFailover,
    SentinelFailoverNoguard,
    Pause,
    ClientPause,
    WorkerPause,
    Partition,
    Delay,
    ClockJump,
    Evict,
    NoFencing,
}

/// What the checker must find for the row to pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Every check clean.
    Safe,
    /// Negative control: overlapping holders, lost updates, or a
    /// duplicate or decreasing token must show.
    Violation,
    /// A holder paused past its lease: windows never overlap, the
    /// unfenced counter loses updates, the fenced store accepts no stale
    /// write and rejects some.
    PauseFenced,
    /// Negative control: the same pause without fencing must get stale
    /// writes accepted.
    PauseUnfenced,
    /// Outside the model for mutual exclusion; tokens and the fenced store
    /// must still be clean.
    TokensOnly,
}

impl Expect {
    pub fn label(self) -> &'static str {
        match self {
            Expect::Safe => "safe",
            Expect::Violation => "violation (control)",
            Expect::PauseFenced => "no overlap, lost updates, 0 stale accepted",
            Expect::PauseUnfenced => "stale accepted (control)",
            Expect::TokensOnly => "tokens safe, overlap possible",
        }
    }
}

impl Nemesis {
    pub const ALL: [Nemesis; 15] = [
        Nemesis::KillAof,
        Nemesis::KillNopersistGuard,
        Nemesis::KillNopersist,
        Nemesis::Failover,
        Nemesis::FailoverNoguard,
        Nemesis::SentinelFailover,
        Nemesis::SentinelFailoverNoguard,
        Nemesis::Pause,
        Nemesis::ClientPause,
        Nemesis::WorkerPause,
        Nemesis::Partition,
        Nemesis::Delay,
        Nemesis::ClockJump,
        Nemesis::Evict,
        Nemesis::NoFencing,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Nemesis::KillAof => "kill-aof",
            Nemesis::KillNopersistGuard => "kill-nopersist-guard",
            Nemesis::KillNopersist => "kill-nopersist",
            Nemesis::Failover => "failover",
            Nemesis::FailoverNoguard => "failover-noguard",
            Nemesis::SentinelFailover => "sentinel-failover",
            Nemesis::SentinelFailoverNoguard => "sentinel-failover-noguard",
            Nemesis::Pause => "pause",
            Nemesis::ClientPause => "client-pause",
            Nemesis::WorkerPause => "worker-pause",
            Nemesis::Partition => "partition",
            Nemesis::Delay => "delay",
            Nemesis::ClockJump => "clock-jump",
            Nemesis::Evict => "evict",
            Nemesis::NoFencing => "no-fencing",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|n| n.name() == name)
    }

    pub fn summary(self) -> &'static str {
        match self {
            Nemesis::KillAof => {
                "SIGKILL and restart 1-2 AOF (appendfsync always) nodes; restart guard off"
            }
            Nemesis::KillNopersistGuard => {
                "SIGKILL and restart at once 1-2 nodes without persistence; restart guard on"
            }
            Nemesis::KillNopersist => "negative control: the same with the restart guard off",
            Nemesis::Failover => {
                "move 1-2 nodes' addresses to promoted replicas that missed writes; restart guard on"
            }
            Nemesis::FailoverNoguard => {
                "negative control: the same failover with the restart guard off"
            }
            Nemesis::SentinelFailover => {
                "Sentinel failovers of 3-4 groups to replicas that missed writes; restart guard on"
            }
            Nemesis::SentinelFailoverNoguard => {
                "negative control: the same Sentinel failovers with the restart guard off"
            }
            Nemesis::Pause => "SIGSTOP 1-2 nodes for 100-1500 ms",
            Nemesis::ClientPause => "CLIENT PAUSE ALL on 1-2 nodes for 100-1500 ms",
            Nemesis::WorkerPause => {
                "SIGSTOP a worker process inside its critical section for 1.5-3 TTL"
            }
            Nemesis::Partition => {
                "proxy blackhole/reset/stall/drop-replies on 1-2 nodes for 100-1500 ms"
            }
            Nemesis::Delay => "proxy delay of 20-80 ms on 1-2 nodes for 300-2000 ms",
            Nemesis::ClockJump => {
                "expire every lock key early (a clock jumping ahead) on 1-2 of 2 bad-clock nodes"
            }
            Nemesis::Evict => {
                "negative control: volatile-lru eviction under memory pressure on 3 nodes"
            }
            Nemesis::NoFencing => {
                "negative control: worker-pause with fencing off and plain SET writes"
            }
        }
    }

    pub fn expect(self) -> Expect {
        match self {
            Nemesis::KillNopersist
            | Nemesis::FailoverNoguard
            | Nemesis::SentinelFailoverNoguard
            | Nemesis::Evict => Expect::Violation,
            Nemesis::WorkerPause => Expect::PauseFenced,
            Nemesis::NoFencing => Expect::PauseUnfenced,
            Nemesis::ClockJump => Expect::TokensOnly,
            _ => Expect::Safe,
        }
    }

    pub fn server_options(self) -> ServerOptions {
        match self {
            Nemesis::KillAof => ServerOptions {
                appendonly: true,
                appendfsync_always: true,
                ..ServerOptions::default()
            },
            Nemesis::Evict => ServerOptions {
                maxmemory_policy: Some("volatile-lru".into()),
                ..ServerOptions::default()
            },
            Nemesis::Failover
            | Nemesis::FailoverNoguard
            | Nemesis::SentinelFailover
            | Nemesis::SentinelFailoverNoguard => ServerOptions {
                extra_args: replication_args(),
                ..ServerOptions::default()
            },
            _ => ServerOptions::default(),
        }
    }

    pub fn uses_proxies(self) -> bool {
        matches!(
            self,
            Nemesis::Partition | Nemesis::Delay | Nemesis::Failover | Nemesis::FailoverNoguard
        )
    }

    /// Whether every lock node has a replica (started by the rig with
    /// [`replica_options`]).
    pub fn uses_replicas(self) -> bool {
        matches!(
            self,
            Nemesis::Failover
                | Nemesis::FailoverNoguard
                | Nemesis::SentinelFailover
                | Nemesis::SentinelFailoverNoguard
        )
    }

    /// Whether every lock node is a Sentinel group: its master, its
    /// replica and three Sentinels, the clients given the Sentinels'
    /// addresses (`redis+sentinel://`).
    pub fn uses_sentinels(self) -> bool {
        matches!(
            self,
            Nemesis::SentinelFailover | Nemesis::SentinelFailoverNoguard
        )
    }

    /// The workers' lease. A Sentinel failover takes up to about a second
    /// and a half (the Sentinels read the promoted replica's role from its
    /// `INFO`, sent every second during a failover), and a lease the
    /// promoted replicas missed must outlive it with room for a contender,
    /// or the control could show nothing.
    pub fn ttl(self) -> Duration {
        if self.uses_sentinels() {
            crate::rig::SENTINEL_TTL
        } else {
            crate::rig::TTL
        }
    }

    /// The restart guard's window: at least the TTL, with a margin.
    pub fn guard_window(self) -> Duration {
        if self.uses_sentinels() {
            crate::rig::SENTINEL_GUARD_WINDOW
        } else {
            crate::rig::GUARD_WINDOW
        }
    }

    /// Whether the clients run with the restart guard.
    pub fn restart_guard(self) -> bool {
        !matches!(
            self,
            Nemesis::KillAof
                | Nemesis::KillNopersist
                | Nemesis::FailoverNoguard
                | Nemesis::SentinelFailoverNoguard
        )
    }

    pub fn fencing(self) -> bool {
        self != Nemesis::NoFencing
    }

    /// Whether worker processes announce their critical sections.
    pub fn pauses_workers(self) -> bool {
        matches!(self, Nemesis::WorkerPause | Nemesis::NoFencing)
    }
}

/// Arguments of every server of a rig with replicas. Redis 7 waits 5 s
/// (`repl-diskless-sync-delay`) for more replicas before it streams a full
/// sync; a new replica of a promoted server must be in sync within the
/// next quiet period.
fn replication_args() -> Vec<String> {
    vec!["--repl-diskless-sync-delay".into(), "0".into()]
}

/// A replica of the lock node on `master`'s port, configured like it.
pub fn replica_options(master: u16) -> ServerOptions {
    ServerOptions {
        replica_of: Some(master),
        extra_args: replication_args(),
        ..ServerOptions::default()
    }
}

/// What a schedule may touch, and where it records.
pub struct Faults<'a> {
    /// The servers behind the nodes' addresses now: a failover swaps a
    /// node's server with its replica.
    pub nodes: &'a mut Cluster,
    /// One replica per node, in node order; empty unless the nemesis uses
    /// replicas.
    pub replicas: &'a mut [RedisServer],
    /// One per node, in node order; empty unless the nemesis uses proxies.
    pub proxies: &'a [FaultProxy],
    /// The three Sentinels of each node's group, in node order; empty
    /// unless the nemesis uses Sentinels.
    pub sentinels: &'a [Vec<RedisServer>],
    pub workers: PauseTargets,
    pub writer: &'a Writer,
    pub clock: Clock,
    /// Every fault is healed by this instant on the run's clock.
    pub heal_by_ns: u64,
    pub rng: StdRng,
    pub ttl: Duration,
    /// The restart guard's window (used also when the guard is off, so
    /// that a control's schedule is its nemesis's).
    pub window: Duration,
    /// Faults injected.
    pub injected: u32,
    /// Things worth printing with the row.
    pub notes: Vec<String>,
}

/// Runs `nemesis`'s schedule until `heal_by`. A panic of the harness (a
/// server that would not restart) becomes an error; the servers are still
/// owned by the caller and cleaned up by their `Drop`.
pub fn run(nemesis: Nemesis, f: &mut Faults<'_>) -> Result<(), String> {
    // The workers (processes especially) need a moment to start and take
    // their first locks; a fault before that would hit an idle rig.
    f.sleep(FIRST_FAULT);
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| match nemesis {
        Nemesis::KillAof => rolling_kill(f, (100, 400), (0, 300)),
        Nemesis::KillNopersist | Nemesis::KillNopersistGuard => rolling_kill(f, (50, 250), (0, 0)),
        Nemesis::Failover | Nemesis::FailoverNoguard => failover::run(f),
        Nemesis::SentinelFailover | Nemesis::SentinelFailoverNoguard => sentinel::run(f),
        Nemesis::Pause => node_pause(f),
        Nemesis::ClientPause => client_pause(f),
        Nemesis::WorkerPause | Nemesis::NoFencing => worker_pause(f),
        Nemesis::Partition => partition(f),
        Nemesis::Delay => delay(f),
        Nemesis::ClockJump => clock_jump(f),
        Nemesis::Evict => evict(f),
    }));
    match outcome {
        Ok(result) => result,
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "panic".into());
            Err(format!("nemesis failed: {msg}"))
        }
    }
}

impl Faults<'_> {
    fn left(&self) -> Duration {
        self.clock.until(self.heal_by_ns)
    }

    fn ms(&mut self, (lo, hi): (u64, u64)) -> Duration {
        Duration::from_millis(self.rng.random_range(lo..=hi))
    }

    /// Sleeps `d` in slices, so a Ctrl-C is seen; false when interrupted.
    fn sleep(&self, d: Duration) -> bool {
        let until = Instant::now() + d;
        while !crate::interrupted() {
            let now = Instant::now();
            if now >= until {
                return true;
            }
            thread::sleep((until - now).min(Duration::from_millis(50)));
        }
        false
    }

    /// The quiet period before the next fault; false when no fault of at
    /// least `min_fault` fits before `heal_by` any more.
    fn quiet(&mut self, range: (u64, u64), min_fault: Duration) -> bool {
        let d = self.ms(range);
        self.sleep(d) && self.left() > min_fault
    }

    /// A fault's hold time, cut to what is left before `heal_by`.
    fn hold(&mut self, range: (u64, u64)) -> Duration {
        let d = self.ms(range);
        d.min(self.left())
    }

    /// `k` distinct nodes, drawn at random.
    fn victims(&mut self, k: usize) -> Vec<usize> {
        let mut all: Vec<usize> = (0..self.nodes.nodes.len()).collect();
        all.shuffle(&mut self.rng);
        all.truncate(k);
        all.sort_unstable();
        all
    }

    fn one_or_two(&mut self) -> usize {
        self.rng.random_range(1..=2)
    }

    fn record(&mut self, name: &str, phase: NemesisPhase, detail: String, at_ns: Option<u64>) {
        if phase == NemesisPhase::Start {
            self.injected += 1;
        }
        let event = Event::Nemesis {
            at_ns: at_ns.unwrap_or_else(|| self.clock.now_ns()),
            name: name.to_owned(),
            phase,
            detail: Some(detail),
        };
        if self.writer.record(&event).is_err() {
            crate::RECORD_FAILED.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn start(&mut self, name: &str, detail: String) {
        self.record(name, NemesisPhase::Start, detail, None);
    }

    fn stop(&mut self, name: &str, detail: String) {
        self.record(name, NemesisPhase::Stop, detail, None);
    }

    fn port(&self, node: usize) -> u16 {
        self.nodes.nodes[node].port()
    }

    /// Nodes that hold at least one lock key now (asked directly, not
    /// through the proxies).
    fn lock_holders(&self) -> Vec<usize> {
        (0..self.nodes.nodes.len())
            .filter(|&i| lock_keys(self.port(i)).is_ok_and(|keys| !keys.is_empty()))
            .collect()
    }
}

fn nodes_label(nodes: &[usize]) -> String {
    let list: Vec<String> = nodes.iter().map(usize::to_string).collect();
    format!("nodes {}", list.join(","))
}

/// A direct, bounded connection to a node on 127.0.0.1.
fn connect(port: u16) -> redis::RedisResult<redis::Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let conn = client.get_connection_with_timeout(NODE_TIMEOUT)?;
    conn.set_read_timeout(Some(NODE_TIMEOUT))?;
    conn.set_write_timeout(Some(NODE_TIMEOUT))?;
    Ok(conn)
}

/// The kinds of key that hold a lock, each a string with its holder's
/// value and a TTL: a mutex's (and a semaphore slot's) `lock:`, a
/// read-write lock's writer key `rw:w:` and reader entries `rw:e:`. Not
/// the readers' index (`rw:r:`, a set without a TTL, which a clock jump
/// does not touch).
const HOLD_KINDS: [&str; 3] = ["lock:", "rw:w:", "rw:e:"];

/// The lock keys on a node (the default prefix; the rig has few keys, so
/// `KEYS` is cheap).
fn lock_keys(port: u16) -> redis::RedisResult<Vec<String>> {
    let mut conn = connect(port)?;
    let mut pipe = redis::pipe();
    for kind in HOLD_KINDS {
        pipe.cmd("KEYS")
            .arg(format!("{}{kind}*", redfence::limits::DEFAULT_PREFIX));
    }
    let lists: Vec<Vec<String>> = pipe.query(&mut conn)?;
    Ok(lists.into_iter().flatten().collect())
}

/// Rolling SIGKILL + restart of 1–2 nodes per step, preferring nodes that
/// hold lock keys and that the previous step did not hit: two consecutive
/// steps within one TTL then take a lock off a majority of its nodes, the
/// situation the restart guard exists for. `down` is how long a victim
/// stays dead before its restart (0 for "restart at once").
fn rolling_kill(f: &mut Faults<'_>, quiet: (u64, u64), down: (u64, u64)) -> Result<(), String> {
    let mut last: Vec<usize> = Vec::new();
    // A restart takes tens of milliseconds; leave room for it.
    let room = Duration::from_millis(300 + down.1);
    while f.quiet(quiet, room) {
        let k = f.one_or_two();
        let holders = f.lock_holders();
        let mut pool: Vec<usize> = holders
            .iter()
            .copied()
            .filter(|n| !last.contains(n))
            .collect();
        pool.shuffle(&mut f.rng);
        if pool.len() < k {
            let mut rest: Vec<usize> = (0..f.nodes.nodes.len())
                .filter(|n| !last.contains(n) && !pool.contains(n))
                .collect();
            rest.shuffle(&mut f.rng);
            pool.extend(rest);
        }
        pool.truncate(k);
        pool.sort_unstable();
        let down = f.hold(down);
        let detail = format!("{}, down {down:?}", nodes_label(&pool));
        f.start("kill", detail.clone());
        for &v in &pool {
            f.nodes.node(v).kill();
        }
        f.sleep(down);
        for &v in &pool {
            // Waits until the node answers (and has replayed its AOF).
            f.nodes.node(v).restart();
        }
        // Where in its wall-clock second the restart ended: Redis reports
        // uptime as a difference of whole wall-clock seconds, so a server
        // started late in a second reads 1 s old a few ms later. Recorded
        // to tell such restarts apart when reading a history.
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_millis());
        f.stop(
            "kill",
            format!("{detail}, restarted at wall-clock second + {wall} ms"),
        );
        last = pool;
    }
    Ok(())
}

fn node_pause(f: &mut Faults<'_>) -> Result<(), String> {
    while f.quiet((200, 800), Duration::from_millis(100)) {
        let k = f.one_or_two();
        let victims = f.victims(k);
        let hold = f.hold((100, 1500));
        let detail = format!("{}, {hold:?}", nodes_label(&victims));
        for &v in &victims {
            f.nodes.node(v).pause();
        }
        f.start("pause", detail.clone());
        f.sleep(hold);
        for &v in &victims {
            f.nodes.node(v).resume();
        }
        f.stop("pause", detail);
    }
    Ok(())
}

fn client_pause(f: &mut Faults<'_>) -> Result<(), String> {
    while f.quiet((200, 800), Duration::from_millis(100)) {
        let k = f.one_or_two();
        let victims = f.victims(k);
        let hold = f.hold((100, 1500));
        let ms = hold.as_millis().to_string();
        let mut paused = Vec::new();
        for &v in &victims {
            // The pause ends by itself after `ms`: no second command is
            // needed to heal it (and a paused server would not take one).
            let sent = connect(f.port(v)).and_then(|mut c| {
                redis::cmd("CLIENT")
                    .arg("PAUSE")
                    .arg(&ms)
                    .arg("ALL")
                    .query::<()>(&mut c)
            });
            match sent {
                Ok(()) => paused.push(v),
                Err(e) => f
                    .notes
                    .push(format!("CLIENT PAUSE on node {v} failed: {e}")),
            }
        }
        let detail = format!("{}, {hold:?}", nodes_label(&paused));
        f.start("client-pause", detail.clone());
        f.sleep(hold);
        f.stop("client-pause", detail);
    }
    Ok(())
}

fn worker_pause(f: &mut Faults<'_>) -> Result<(), String> {
    let procs = f.workers.pids.len();
    let (mut missed, ttl) = (0, f.ttl);
    // The longest pause is 3 TTL; the wait for a critical section takes
    // whatever else is left.
    let longest = ttl * 3;
    while f.quiet((200, 600), longest + Duration::from_millis(200)) {
        let p = f.rng.random_range(0..procs);
        // Longer than the TTL, so the lease surely runs out while the
        // holder is stopped and the next holder gets in.
        let pause = ttl.mul_f64(f.rng.random_range(1.5..3.0));
        let wait = ARM_TIMEOUT.min(f.left().saturating_sub(longest));
        let (tx, rx) = mpsc::channel();
        f.workers.gate.arm(p, tx);
        let stopped = match rx.recv_timeout(wait) {
            Ok(s) => Some(s),
            Err(_) => {
                f.workers.gate.disarm();
                // The reader may have stopped it just before the disarm.
                rx.try_recv().ok()
            }
        };
        let Some(s) = stopped else {
            missed += 1;
            continue;
        };
        let detail = format!(
            "worker process {} (pid {}) in lease {}, {pause:?}",
            s.process, s.pid, s.lease
        );
        f.record(
            "worker-pause",
            NemesisPhase::Start,
            detail.clone(),
            Some(s.at_ns),
        );
        let rest = pause.saturating_sub(Duration::from_nanos(f.clock.now_ns() - s.at_ns));
        f.sleep(rest);
        signal(s.pid, libc::SIGCONT);
        f.stop("worker-pause", detail);
    }
    if missed > 0 {
        f.notes.push(format!(
            "{missed} pause(s) armed but no critical section announced in time"
        ));
    }
    Ok(())
}

fn partition(f: &mut Faults<'_>) -> Result<(), String> {
    let kinds = [
        (Fault::Blackhole, "blackhole"),
        (Fault::Reset, "reset"),
        (Fault::Stall, "stall"),
        (Fault::DropReplies, "drop-replies"),
    ];
    while f.quiet((200, 800), Duration::from_millis(100)) {
        let k = f.one_or_two();
        let victims = f.victims(k);
        let (fault, kind) = kinds[f.rng.random_range(0..kinds.len())];
        let hold = f.hold((100, 1500));
        let detail = format!("{kind} {}, {hold:?}", nodes_label(&victims));
        for &v in &victims {
            f.proxies[v].set(fault);
        }
        f.start("partition", detail.clone());
        f.sleep(hold);
        for &v in &victims {
            f.proxies[v].set(Fault::Pass);
        }
        f.stop("partition", detail);
    }
    Ok(())
}

fn delay(f: &mut Faults<'_>) -> Result<(), String> {
    while f.quiet((200, 800), Duration::from_millis(300)) {
        let k = f.one_or_two();
        let victims = f.victims(k);
        let hold = f.hold((300, 2000));
        let mut parts = Vec::new();
        for &v in &victims {
            let d = f.ms((20, 80));
            f.proxies[v].set(Fault::Delay(d));
            parts.push(format!("node {v} +{d:?}"));
        }
        let detail = format!("{}, {hold:?}", parts.join(" "));
        f.start("delay", detail.clone());
        f.sleep(hold);
        for &v in &victims {
            f.proxies[v].set(Fault::Pass);
        }
        f.stop("delay", detail);
    }
    Ok(())
}

/// The nodes with bad clocks are drawn once (2 of 5, a minority) and stay
/// the same for the run: a deployment with two misbehaving clocks, not
/// every clock misbehaving in turn. Each step jumps one of them or both.
fn clock_jump(f: &mut Faults<'_>) -> Result<(), String> {
    let bad = f.victims(2);
    f.notes.push(format!("bad clocks: {}", nodes_label(&bad)));
    while f.quiet((100, 500), Duration::from_millis(50)) {
        let victims = if f.rng.random_bool(0.5) {
            bad.clone()
        } else {
            vec![bad[f.rng.random_range(0..bad.len())]]
        };
        f.start("clock-jump", nodes_label(&victims));
        let mut expired = 0;
        for &v in &victims {
            let port = f.port(v);
            let done = lock_keys(port).and_then(|keys| {
                if keys.is_empty() {
                    return Ok(0);
                }
                let mut conn = connect(port)?;
                let mut pipe = redis::pipe();
                for key in &keys {
                    pipe.cmd("PEXPIRE")
                        .arg(key)
                        .arg(f.rng.random_range(1..=5u32))
                        .ignore();
                }
                pipe.query::<()>(&mut conn)?;
                Ok(keys.len())
            });
            match done {
                Ok(n) => expired += n,
                Err(e) => f.notes.push(format!("clock jump on node {v} failed: {e}")),
            }
        }
        let detail = format!(
            "{}, {expired} lock keys expired early",
            nodes_label(&victims)
        );
        f.stop("clock-jump", detail);
    }
    Ok(())
}

/// Filler value size and keys per pipeline per tick.
const FILLER: usize = 4096;
const FILLER_BATCH: usize = 8;

fn evict(f: &mut Faults<'_>) -> Result<(), String> {
    let filler = "x".repeat(FILLER);
    let mut next_key = 0u64;
    let mut evicted_total = 0u64;
    while f.quiet((300, 800), Duration::from_millis(200)) {
        let victims = f.victims(3);
        let hold = f.hold((500, 1500));
        let mut conns = Vec::new();
        let mut before = 0;
        for &v in &victims {
            let setup = connect(f.port(v)).and_then(|mut c| {
                let used = info_field(&mut c, "memory", "used_memory")?;
                before += info_field(&mut c, "stats", "evicted_keys")?;
                redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("maxmemory")
                    .arg(used + 256 * 1024)
                    .query::<()>(&mut c)?;
                Ok(c)
            });
            match setup {
                Ok(c) => conns.push((v, c)),
                Err(e) => f.notes.push(format!("evict setup on node {v} failed: {e}")),
            }
        }
        let detail = format!("{}, {hold:?}", nodes_label(&victims));
        f.start("evict", detail.clone());
        let until = Instant::now() + hold;
        while Instant::now() < until && !crate::interrupted() {
            for (_, c) in &mut conns {
                let mut pipe = redis::pipe();
                for _ in 0..FILLER_BATCH {
                    next_key += 1;
                    // Volatile (a TTL), so volatile-lru may evict it, and
                    // short-lived, so the heap does not grow run after run.
                    pipe.cmd("SET")
                        .arg(format!("chaos:filler:{next_key}"))
                        .arg(&filler)
                        .arg("PX")
                        .arg(3000)
                        .ignore();
                }
                let _ = pipe.query::<()>(c);
            }
            thread::sleep(Duration::from_millis(5));
        }
        let mut after = 0;
        for (v, c) in &mut conns {
            let lifted = redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory")
                .arg(0)
                .query::<()>(c);
            if let Err(e) = lifted {
                f.notes
                    .push(format!("lifting maxmemory on node {v} failed: {e}"));
            }
            after += info_field(c, "stats", "evicted_keys").unwrap_or(0);
        }
        evicted_total += after.saturating_sub(before);
        f.stop(
            "evict",
            format!("{detail}, {} keys evicted", after.saturating_sub(before)),
        );
    }
    f.notes
        .push(format!("keys evicted in all: {evicted_total}"));
    Ok(())
}

fn info_field(conn: &mut redis::Connection, section: &str, field: &str) -> redis::RedisResult<u64> {
    let info: String = redis::cmd("INFO").arg(section).query(conn)?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0))
}
