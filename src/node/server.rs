//! One Redis server: its connection, its identity checks, and every command
//! sent to it, each bounded by a deadline. A plain node is one server; a
//! Redis Cluster node (`cluster.rs`) routes each key to the server of its
//! master shard, and each of those is one of these.
//!
//! One concept, one file (about 800 lines): the connection state machine,
//! the identity checks and the stalled-node logic all guard the same
//! `Inner` under one mutex.
//!
//! Each node keeps **one** multiplexed connection, shared by every task of the
//! client and reused across calls: concurrent commands are pipelined on it,
//! so there is no pool and no connection per command. The connection is our
//! own small state machine rather than redis-rs's `ConnectionManager` because
//! a (re)connect must run the identity checks (`INFO server`, `ROLE`) *before*
//! the first lock command travels over it; `ConnectionManager` reconnects
//! silently underneath its users.
//!
//! Commands on one connection are executed by Redis in the order they were
//! enqueued. The lock protocol relies on that: a release enqueued after an
//! acquire on the same node can never be overtaken by it, even when the node
//! is paused and both sit in its socket buffer.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt, Shared};
use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ErrorKind, Pipeline, RedisError, ServerErrorKind,
    Value,
};

use crate::error::failure::NodeErrorKind;
use crate::node::restart;
use crate::node::sentinel::Sentinel;
use crate::node::tls;
use crate::observe::metrics::NodeGauges;
use crate::wire::scripts::{lock_scripts, sharded_scripts, Script};
use crate::wire::{info, probe};

/// Set when a fan-out has decided (see `fanout`): a request that only then
/// gets its connection sends nothing.
#[derive(Debug, Clone, Default)]
pub(crate) struct Settled(Option<Arc<AtomicBool>>);

impl Settled {
    /// A flag that is never set: for requests that must go out however late
    /// (releases).
    pub(crate) const NEVER: Settled = Settled(None);

    pub(crate) fn new() -> Self {
        Self(Some(Arc::default()))
    }

    pub(crate) fn is_set(&self) -> bool {
        self.0.as_ref().is_some_and(|f| f.load(Ordering::Acquire))
    }

    pub(crate) fn set(&self) {
        if let Some(f) = &self.0 {
            f.store(true, Ordering::Release);
        }
    }
}

/// What a node learned about the server at connect time. Later features (the
/// restart guard) compare `run_id` and `uptime` across reconnects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) run_id: String,
    pub(crate) version: String,
    pub(crate) uptime: Duration,
}

type ConnectResult = Result<Connected, NodeErrorKind>;

/// Commands that may wait to be written on one node's connection.
const PIPELINE_BUFFER: usize = 1024;

#[derive(Clone)]
struct Connected {
    conn: MultiplexedConnection,
    /// Distinguishes this connection from its successors, so a failure seen
    /// on an old connection cannot tear down a newer one.
    generation: u64,
    /// The server this connection reached. What the restart guard knows
    /// of it is kept per server, not per connection (`Server::lineage`).
    identity: Arc<Identity>,
}

enum State {
    /// Never connected, or the last connection was lost: connect on next use.
    Idle,
    /// A connect is in flight; every caller awaits the same one.
    Connecting(Shared<BoxFuture<'static, ConnectResult>>),
    Ready(Connected),
    /// The last connect failed; calls fail fast until `retry_at`.
    Down {
        retry_at: Instant,
        error: NodeErrorKind,
    },
}

/// Identity state shared by the nodes of one client: the `run_id` each node
/// reported, to catch two URLs that reach the same server. (What each
/// node's address reaches over time is its own [`restart::Lineage`].)
#[derive(Debug, Default)]
pub(crate) struct Registry {
    run_ids: Mutex<Vec<Option<String>>>,
}

impl Registry {
    pub(crate) fn new(nodes: usize) -> Arc<Self> {
        Arc::new(Self {
            run_ids: Mutex::new(vec![None; nodes]),
        })
    }

    /// Records `run_id` for node `index`, unless another node already
    /// claimed it (`Err` names that node). The first node to connect keeps
    /// the identity, so the outcome does not flap between the two URLs.
    fn claim(&self, index: usize, run_id: &str) -> Result<(), usize> {
        // A std Mutex: held for a scan of N entries, never across an await.
        let mut ids = self.run_ids.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(other) = ids
            .iter()
            .enumerate()
            .position(|(i, id)| i != index && id.as_deref() == Some(run_id))
        {
            return Err(other);
        }
        if let Some(slot) = ids.get_mut(index) {
            *slot = Some(run_id.to_owned());
        }
        Ok(())
    }
}

/// Timing settings a node needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeTimeouts {
    /// Bound on TCP connect + AUTH + identity checks.
    pub(crate) connect: Duration,
    /// First pause after a failed connect; doubles up to `backoff_max`.
    pub(crate) backoff_min: Duration,
    pub(crate) backoff_max: Duration,
    /// Interval between probes of a stalled node (the node timeout).
    pub(crate) probe: Duration,
}

pub(crate) struct Server {
    index: usize,
    addr: String,
    /// The database index the URL selects.
    db: i64,
    client: redis::Client,
    timeouts: NodeTimeouts,
    registry: Arc<Registry>,
    me: Weak<Server>,
    inner: Mutex<Inner>,
    /// Origin of `last_reply`, which is an atomic to keep the lock off the
    /// reply path.
    epoch: Instant,
    /// Nanoseconds after `epoch` of the last answer from this node.
    last_reply: AtomicU64,
    /// Mirrors `inner.stalled.is_some()` so a reply only takes the lock when
    /// there is something to clear.
    stalled_hint: AtomicBool,
    /// What the restart guard knows of the servers this address reached:
    /// kept across connections, so that no reconnect makes a young server
    /// vote or skips its re-seed (`restart::Lineage`). A std Mutex, never
    /// held across an await.
    lineage: Mutex<restart::Lineage>,
    /// Set when a fenced vote found the server young and not re-seeded; the
    /// client takes it and starts the re-seed.
    reseed_wanted: AtomicBool,
    /// A re-seed is running.
    reseeding: AtomicBool,
    /// Up, stalled, quarantined: reported on change (feature `metrics`).
    gauges: NodeGauges,
    /// A master shard of a Redis Cluster node: `redis_mode:cluster` is
    /// expected, not refused.
    shard: bool,
    /// A Sentinel-managed master (`sentinel.rs`): every connect asks the
    /// Sentinels where it is; `client` is then only a placeholder.
    sentinel: Option<Arc<Sentinel>>,
    /// The Sentinel watch (`watch_sentinels`) was started.
    watching: AtomicBool,
}

/// How a server is reached.
#[derive(Debug)]
pub(crate) enum Reach {
    /// A plain node, at its URL.
    Plain,
    /// A master shard of a Redis Cluster node: `redis_mode:cluster` is
    /// expected, not refused.
    Shard,
    /// A Sentinel-managed master, wherever the Sentinels say it is.
    Sentinel(Arc<Sentinel>),
}

/// What a request that counts toward a quorum needs from the restart guard.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Vote {
    /// A server that started less than this ago does not vote.
    pub(crate) window: Duration,
    /// Fenced requests also need a young server's fences re-seeded.
    pub(crate) fenced: bool,
}

struct Inner {
    state: State,
    next_generation: u64,
    backoff: Duration,
    /// Send time of the oldest request known unanswered, while stalled.
    stalled: Option<Instant>,
    next_probe: Instant,
    /// While stalled: when to try a fresh connection next (see
    /// `try_replacement`), and whether one is being tried.
    next_replacement: Instant,
    replacing: bool,
    /// The last connect's failure, if permanent; cleared by a connect that
    /// succeeds.
    refused: Option<NodeErrorKind>,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("index", &self.index)
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Server {
    pub(crate) fn new(
        index: usize,
        addr: String,
        db: i64,
        client: redis::Client,
        timeouts: NodeTimeouts,
        registry: Arc<Registry>,
        reach: Reach,
    ) -> Arc<Self> {
        let shard = matches!(reach, Reach::Shard);
        let sentinel = match reach {
            Reach::Sentinel(sentinel) => Some(sentinel),
            _ => None,
        };
        Arc::new_cyclic(|me| Server {
            shard,
            sentinel,
            watching: AtomicBool::new(false),
            index,
            addr,
            db,
            client,
            timeouts,
            registry,
            me: me.clone(),
            inner: Mutex::new(Inner {
                state: State::Idle,
                next_generation: 0,
                backoff: timeouts.backoff_min,
                stalled: None,
                next_probe: Instant::now(),
                next_replacement: Instant::now(),
                replacing: false,
                refused: None,
            }),
            epoch: Instant::now(),
            last_reply: AtomicU64::new(0),
            stalled_hint: AtomicBool::new(false),
            lineage: Mutex::new(restart::Lineage::default()),
            reseed_wanted: AtomicBool::new(false),
            reseeding: AtomicBool::new(false),
            gauges: NodeGauges::default(),
        })
    }

    pub(crate) fn index(&self) -> usize {
        self.index
    }

    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// The database index this node's URL selects.
    pub(crate) fn db(&self) -> i64 {
        self.db
    }

    /// For the subscription connection, which is not multiplexed with the
    /// lock commands (a subscribed connection accepts no other commands).
    /// On a Sentinel node, the master the last connect reached.
    pub(crate) fn redis_client(&self) -> redis::Client {
        self.sentinel
            .as_ref()
            .and_then(|s| s.current())
            .unwrap_or_else(|| self.client.clone())
    }

    /// The Sentinels of a Sentinel node.
    pub(crate) fn sentinel(&self) -> Option<&Arc<Sentinel>> {
        self.sentinel.as_ref()
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        self.timeouts.connect
    }

    pub(crate) fn backoff_max(&self) -> Duration {
        self.timeouts.backoff_max
    }

    /// When the server of the current connection started, on this
    /// process's clock (`None` when not connected): a reply that came over
    /// the connection came from a server at least that old.
    pub(crate) fn started(&self) -> Option<Instant> {
        let run_id = match &self.lock_inner().state {
            State::Ready(connected) => connected.identity.run_id.clone(),
            _ => return None,
        };
        self.lineage().started(&run_id)
    }

    fn lineage(&self) -> std::sync::MutexGuard<'_, restart::Lineage> {
        self.lineage.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The restart guard's verdict on the server of `connected` now.
    fn verdict(&self, connected: &Connected, vote: Vote) -> restart::Verdict {
        self.lineage().verdict(
            &connected.identity.run_id,
            vote.window,
            vote.fenced,
            Instant::now(),
        )
    }

    /// Whether the server on the current connection would vote in a
    /// request under `vote` now (past its window and, for a fenced vote,
    /// re-seeded if it was young when first seen). A fair queue's waiter
    /// asks before it counts a vote the home pre-granted without asking
    /// it, and a release before it lets the home pre-grant one.
    pub(crate) fn votes_now(&self, vote: Vote) -> bool {
        let connected = match &self.lock_inner().state {
            State::Ready(connected) => connected.clone(),
            _ => return false,
        };
        self.verdict(&connected, vote) == restart::Verdict::Votes
    }

    fn lock_inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Nothing panics while holding this lock; recover from poison anyway
        // rather than propagate a panic into the caller.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs a script, its `EVALSHA` built by the caller
    /// (`script.evalsha(keys, args)`, once for every node of a fan-out). If
    /// `settled` is set by the time a connection is available, nothing is
    /// sent (see `fanout`: a straggler must not overtake a later release).
    /// `through_stall` sends even to a server marked stalled (releases: the
    /// command they follow may be queued there). The caller bounds the
    /// wait; dropping the future abandons it.
    pub(crate) async fn run_script_prepared(
        &self,
        script: &Script,
        evalsha: &Cmd,
        settled: &Settled,
        through_stall: bool,
        vote: Option<Vote>,
    ) -> Result<Value, NodeErrorKind> {
        let connected = self.ready(settled, through_stall, vote).await?;
        self.send_script(&connected, script, evalsha, settled).await
    }

    /// Runs `vouched` when the server this connection reaches would vote
    /// under `vouch` now (always with the guard off, `None`), else `plain`:
    /// the home's release, which may pre-grant a fair waiter the home's
    /// vote only when the releaser itself would count that server's vote
    /// (DESIGN.md, section 2, step 3, "The restart guard"). Chosen on the
    /// connection the script then goes out on, so a reconnect to another
    /// server in between cannot slip past the check. Sent through stalls
    /// and however late, as releases are.
    pub(crate) async fn run_script_vouched(
        &self,
        script: &Script,
        vouched: &Cmd,
        plain: &Cmd,
        vouch: Option<Vote>,
    ) -> Result<Value, NodeErrorKind> {
        let connected = self.ready(&Settled::NEVER, true, None).await?;
        let votes = vouch.is_none_or(|v| self.verdict(&connected, v) == restart::Verdict::Votes);
        let evalsha = if votes { vouched } else { plain };
        self.send_script(&connected, script, evalsha, &Settled::NEVER)
            .await
    }

    async fn send_script(
        &self,
        connected: &Connected,
        script: &Script,
        evalsha: &Cmd,
        settled: &Settled,
    ) -> Result<Value, NodeErrorKind> {
        let mut conn = connected.conn.clone();
        let first = evalsha.query_async(&mut conn).await;
        let reply = match first {
            Err(e)
                if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
                    && !script.eval_when_decided
                    && settled.is_set() =>
            {
                // Nothing ran, and the acquire's release may already be
                // queued: load the script for the next acquire, run nothing.
                let _ = script.load().query_async::<Value>(&mut conn).await;
                return Err(NodeErrorKind::Skipped);
            }
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                // The node restarted (or flushed scripts) since we last used
                // it. EVAL runs and re-caches in one round trip. It is sent
                // even after the round decided: every script acts only on
                // our own unique value (release, extend, write-back) or only
                // raises fences (re-seed), so a late run leaves nothing
                // behind. Skipping it instead left a node that was always
                // the third to answer without the script, and so without
                // any extend, for the life of the lease (a watchdog test
                // found its key expired on one of three nodes).
                script.eval_of(evalsha).query_async(&mut conn).await
            }
            other => other,
        };
        self.finish(connected.generation, reply, Sent::Script(script))
    }

    /// Runs a plain command; see
    /// [`run_script_prepared`](Self::run_script_prepared) (`through_stall`
    /// for releases, which a cluster routes as plain commands too).
    pub(crate) async fn run_command(
        &self,
        cmd: &Cmd,
        settled: &Settled,
        through_stall: bool,
        vote: Option<Vote>,
    ) -> Result<Value, NodeErrorKind> {
        self.run_request(Request::Cmd(cmd), settled, through_stall, vote)
            .await
    }

    /// Runs a pipeline (a `MULTI`/`EXEC` transaction when atomic) as one
    /// request: written in one piece, so nothing else on the multiplexed
    /// connection lands inside it. See
    /// [`run_script_prepared`](Self::run_script_prepared).
    pub(crate) async fn run_pipeline(
        &self,
        pipe: &Pipeline,
        settled: &Settled,
        through_stall: bool,
        vote: Option<Vote>,
    ) -> Result<Value, NodeErrorKind> {
        self.run_request(Request::Pipe(pipe), settled, through_stall, vote)
            .await
    }

    async fn run_request(
        &self,
        request: Request<'_>,
        settled: &Settled,
        through_stall: bool,
        vote: Option<Vote>,
    ) -> Result<Value, NodeErrorKind> {
        let connected = self.ready(settled, through_stall, vote).await?;
        let mut conn = connected.conn.clone();
        let reply = match request {
            Request::Cmd(cmd) => cmd.query_async(&mut conn).await,
            Request::Pipe(pipe) => pipe.query_async(&mut conn).await,
        };
        self.finish(connected.generation, reply, Sent::Request(request))
    }

    /// The connection to send on, or why nothing may be sent. The caller
    /// sends right after, with no await in between (the first poll of
    /// `query_async` puts the command in the connection's queue), so the
    /// `settled` check cannot go stale. `vote` is the restart guard's
    /// window for requests that count toward a quorum (acquire, extend,
    /// write-back): a server that started less than that ago gets nothing.
    async fn ready(
        &self,
        settled: &Settled,
        through_stall: bool,
        vote: Option<Vote>,
    ) -> Result<Connected, NodeErrorKind> {
        let connected = self.connection(through_stall).await?;
        if settled.is_set() {
            return Err(NodeErrorKind::Skipped);
        }
        if let Some(vote) = vote {
            // The verdict is the server's, whatever connection reaches it.
            // A server already young when we first saw it may have lost
            // fences (a restart without data): with fencing it votes only
            // once they are re-seeded from the other nodes. The re-seed
            // starts only once the window is over: read earlier, while an
            // attempt this server granted before its restart still collects
            // grants elsewhere, the others may not hold that attempt's token
            // yet (DESIGN.md §6, found by the model check).
            match self.verdict(&connected, vote) {
                restart::Verdict::Votes => {}
                restart::Verdict::Young { uptime, votes_in } => {
                    self.gauges.quarantined(&self.addr, true);
                    return Err(NodeErrorKind::Restarted { uptime, votes_in });
                }
                restart::Verdict::Unseeded => {
                    if !self.reseeding.load(Ordering::Acquire) {
                        self.reseed_wanted.store(true, Ordering::Release);
                    }
                    self.gauges.quarantined(&self.addr, true);
                    return Err(NodeErrorKind::Reseeding);
                }
            }
            self.gauges.quarantined(&self.addr, false);
        }
        Ok(connected)
    }

    /// Takes the re-seed request, marking a re-seed as running.
    pub(crate) fn take_reseed_wanted(&self) -> bool {
        self.reseed_wanted.swap(false, Ordering::AcqRel)
            && !self.reseeding.swap(true, Ordering::AcqRel)
    }

    /// The re-seed of the server with `run_id` finished (`true`) or gave up.
    pub(crate) fn reseed_done(&self, run_id: Option<String>) {
        if let Some(run_id) = run_id {
            self.lineage().reseeded(&run_id);
        }
        self.reseeding.store(false, Ordering::Release);
    }

    /// The cluster's topology names this server master of slots it did not
    /// serve before: a replica promoted by a failover, which may lack the
    /// last writes of the master it replaces (replication is asynchronous).
    /// Like a restarted server, it counts as started now: out of quorums for
    /// the restart guard's window, and with fencing re-seeded before it
    /// votes in fenced requests (DESIGN.md, "Redis Cluster nodes").
    pub(crate) fn restarted_now(&self) {
        tracing::warn!(node = %self.addr, "promoted to master of its slots: counted as started now");
        // On this connection and every later one to the same server (a
        // promoted replica keeps its process and `run_id`).
        self.lineage().restarted_now(Instant::now());
    }

    /// The `run_id` of the server on the current connection, if connected.
    pub(crate) fn run_id(&self) -> Option<String> {
        match &self.lock_inner().state {
            State::Ready(c) => Some(c.identity.run_id.clone()),
            _ => None,
        }
    }

    /// The `run_id` of the server on the current connection if its
    /// restart-guard `window` is over: the re-seed reads nothing before.
    pub(crate) fn run_id_past_window(&self, window: Duration) -> Option<String> {
        let run_id = match &self.lock_inner().state {
            State::Ready(c) => c.identity.run_id.clone(),
            _ => return None,
        };
        let started = self.lineage().started(&run_id)?;
        restart::votes_in(started, Instant::now(), window)
            .is_none()
            .then_some(run_id)
    }

    /// Records that the node answered (an error reply is an answer too) and
    /// classifies failures.
    fn finish(
        &self,
        generation: u64,
        reply: redis::RedisResult<Value>,
        sent: Sent<'_>,
    ) -> Result<Value, NodeErrorKind> {
        let answered = match &reply {
            Ok(_) => true,
            Err(e) => !(e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error()),
        };
        if answered {
            self.last_reply
                .store(self.since_epoch(Instant::now()), Ordering::Relaxed);
            if self.stalled_hint.load(Ordering::Relaxed) {
                self.stalled_hint.store(false, Ordering::Relaxed);
                self.lock_inner().stalled = None;
                self.gauges.stalled(&self.addr, false);
                tracing::debug!(node = %self.addr, "answered again");
            }
        }
        reply.map_err(|e| self.command_failed(generation, e, sent))
    }

    fn since_epoch(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// A request sent at `sent_at` got no answer by its deadline. If nothing
    /// else was answered since then either, the node is stalled (paused,
    /// black-holed, overloaded): further requests fail at once, except one
    /// probe per node timeout, until something is answered.
    pub(crate) fn note_timeout(&self, sent_at: Instant) {
        let mut inner = self.lock_inner();
        self.try_replacement(&mut inner);
        if self.last_reply.load(Ordering::Relaxed) >= self.since_epoch(sent_at) {
            return;
        }
        if inner.stalled.is_none() {
            tracing::debug!(node = %self.addr, "stalled");
            self.gauges.stalled(&self.addr, true);
            inner.stalled = Some(sent_at);
            self.stalled_hint.store(true, Ordering::Relaxed);
        }
        // Also after a failed probe: the next one waits a full interval from
        // now, so callers right after a probe timed out do not pay again.
        inner.next_probe = inner.next_probe.max(Instant::now() + self.timeouts.probe);
    }

    /// After a request to this node timed out (at most once per connect
    /// timeout), a fresh connection is tried beside the current one, and
    /// the current one is asked to echo a random token (`PING token`). If
    /// the fresh one completes the handshake while the current one does not
    /// echo the token in time, the current one is dead or out of step (a
    /// path that died without a reset, or a middlebox that lost bytes: its
    /// replies would then go to older requests forever), and the fresh one
    /// replaces it. A paused or unreachable server answers neither, and a
    /// slow one echoes eventually: both keep their connection, and the order
    /// of what is queued on it.
    fn try_replacement(&self, inner: &mut Inner) {
        let now = Instant::now();
        if inner.replacing || now < inner.next_replacement {
            return;
        }
        let State::Ready(old) = &inner.state else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        inner.replacing = true;
        inner.next_replacement = now + self.timeouts.connect;
        let (old_generation, mut old_conn) = (old.generation, old.conn.clone());
        let (client, timeout, me) = (self.client.clone(), self.timeouts.connect, self.me.clone());
        let (shard, sentinel) = (self.shard, self.sentinel.clone());
        runtime.spawn(async move {
            let token = format!("redfence-{:016x}", rand::random::<u64>());
            let mut ping = redis::cmd("PING");
            ping.arg(&token);
            let (fresh, echo) = futures::future::join(
                tokio::time::timeout(timeout, reach(&client, sentinel.as_deref(), timeout, shard)),
                tokio::time::timeout(timeout, ping.query_async::<Value>(&mut old_conn)),
            )
            .await;
            let in_step = matches!(
                echo,
                Ok(Ok(Value::BulkString(ref b))) if b.as_slice() == token.as_bytes()
            );
            let Some(node) = me.upgrade() else { return };
            let fresh = if in_step {
                None
            } else {
                fresh.ok().and_then(Result::ok)
            };
            node.finish_replacement(old_generation, fresh);
        });
    }

    fn finish_replacement(
        &self,
        old_generation: u64,
        fresh: Option<(MultiplexedConnection, Identity)>,
    ) {
        let mut inner = self.lock_inner();
        inner.replacing = false;
        let current = matches!(&inner.state, State::Ready(c) if c.generation == old_generation);
        let (Some((conn, identity)), true) = (fresh, current) else {
            return;
        };
        if self.registry.claim(self.index, &identity.run_id).is_err() {
            return;
        }
        tracing::warn!(node = %self.addr, "connection out of step while a fresh one answers: replaced");
        let generation = inner.next_generation;
        inner.next_generation += 1;
        inner.state = State::Ready(self.connected(conn, generation, identity));
        inner.stalled = None;
        self.stalled_hint.store(false, Ordering::Relaxed);
        self.gauges.stalled(&self.addr, false);
    }

    /// The current connection, connecting first if there is none.
    async fn connection(&self, through_stall: bool) -> Result<Connected, NodeErrorKind> {
        let pending = {
            let mut inner = self.lock_inner();
            if let (Some(since), false) = (inner.stalled, through_stall) {
                let now = Instant::now();
                if now < inner.next_probe {
                    return Err(NodeErrorKind::Stalled {
                        silent_for: now.saturating_duration_since(since),
                    });
                }
                // This request is the probe.
                inner.next_probe = now + self.timeouts.probe;
            }
            match &inner.state {
                State::Ready(c) => return Ok(c.clone()),
                State::Connecting(fut) => fut.clone(),
                State::Down { retry_at, error } => {
                    let now = Instant::now();
                    if now < *retry_at {
                        return Err(NodeErrorKind::Backoff {
                            retry_in: *retry_at - now,
                            last: Box::new(error.clone()),
                        });
                    }
                    self.start_connect(&mut inner)
                }
                State::Idle => self.start_connect(&mut inner),
            }
        };
        // After a permanent failure (a refused certificate or password, a
        // replica), a reconnect in flight is most likely refused again: the
        // caller hears the refusal now instead of waiting out the connect,
        // which could outlast its node timeout and pass for a transient
        // timeout. The reconnect goes on in the background and clears this
        // when it succeeds.
        if let Some(refused) = self.lock_inner().refused.clone() {
            return Err(NodeErrorKind::Backoff {
                retry_in: Duration::ZERO,
                last: Box::new(refused),
            });
        }
        pending.await
    }

    fn start_connect(&self, inner: &mut Inner) -> Shared<BoxFuture<'static, ConnectResult>> {
        let generation = inner.next_generation;
        inner.next_generation += 1;
        let (client, shard) = (self.client.clone(), self.shard);
        let sentinel = self.sentinel.clone();
        let timeout = self.timeouts.connect;
        // The future holds a Weak: the node owns the future (in its state), so
        // a strong reference here would be a cycle that leaks both.
        let me = self.me.clone();
        let fut = async move {
            let result = match tokio::time::timeout(
                timeout,
                reach(&client, sentinel.as_deref(), timeout, shard),
            )
            .await
            {
                Ok(r) => r,
                Err(_) => Err(NodeErrorKind::Timeout(timeout)),
            };
            match me.upgrade() {
                Some(node) => node.finish_connect(generation, result),
                None => result.map(|(conn, identity)| Connected {
                    conn,
                    generation,
                    identity: Arc::new(identity),
                }),
            }
        }
        .boxed()
        .shared();
        // Drive the connect on its own task so it progresses even when every
        // caller gave up on its (shorter) per-call deadline; it ends by itself
        // within the connect timeout. Outside a runtime the callers drive it.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(fut.clone());
        }
        inner.state = State::Connecting(fut.clone());
        fut
    }

    fn finish_connect(
        &self,
        generation: u64,
        result: Result<(MultiplexedConnection, Identity), NodeErrorKind>,
    ) -> ConnectResult {
        // A connect overtaken by a newer one tells the restart guard
        // nothing: its server may not be the one the address reaches now.
        let newest = self.lock_inner().next_generation == generation + 1;
        let result = result.and_then(|(conn, identity)| {
            self.registry
                .claim(self.index, &identity.run_id)
                .map_err(|other| NodeErrorKind::SameServer {
                    other,
                    run_id: identity.run_id.clone(),
                })?;
            Ok(if newest {
                self.connected(conn, generation, identity)
            } else {
                Connected {
                    conn,
                    generation,
                    identity: Arc::new(identity),
                }
            })
        });
        let mut inner = self.lock_inner();
        // Only the newest connect may install its result.
        if inner.next_generation != generation + 1 {
            return result;
        }
        inner.refused = match &result {
            Err(error) if error.is_permanent() => Some(error.clone()),
            _ => None,
        };
        match &result {
            Ok(connected) => {
                tracing::debug!(node = %self.addr, run_id = %connected.identity.run_id, "connected");
                self.watch_sentinels();
                inner.backoff = self.timeouts.backoff_min;
                inner.state = State::Ready(connected.clone());
                // A new connection starts with a clean slate.
                inner.stalled = None;
                self.stalled_hint.store(false, Ordering::Relaxed);
                self.gauges.up(&self.addr, true);
                self.gauges.stalled(&self.addr, false);
            }
            Err(error) => {
                tracing::debug!(node = %self.addr, %error, "connect failed");
                self.gauges.up(&self.addr, false);
                let pause = inner.backoff;
                inner.backoff = (pause * 2).min(self.timeouts.backoff_max);
                inner.state = State::Down {
                    retry_at: Instant::now() + pause,
                    error: error.clone(),
                };
            }
        }
        result
    }

    /// A new connection to the server that answered the handshake. A server
    /// whose `run_id` differs from the one this node reached before is
    /// another server: the old one restarted, or the address now reaches a
    /// different one (a moved VIP or DNS name, a replaced pod, a promoted
    /// replica). Either way it has none of the locks it may be asked about,
    /// so it counts as a server that started now, whatever its uptime: out
    /// of quorums for the restart guard's window, and with fencing its
    /// fences re-seeded before it votes (DESIGN.md, "The restart guard").
    /// That verdict is kept with the server (`restart::Lineage`), so a
    /// later connection to it, which reads its real uptime, changes
    /// nothing.
    fn connected(
        &self,
        conn: MultiplexedConnection,
        generation: u64,
        identity: Identity,
    ) -> Connected {
        let mut lineage = self.lineage();
        let previous = lineage.run_id().map(str::to_owned);
        if lineage.observe(&identity.run_id, identity.uptime, Instant::now()) {
            // The master it replaced is never used again for the group.
            if let (Some(sentinel), Some(previous)) = (&self.sentinel, previous) {
                if previous != identity.run_id {
                    sentinel.demote(&previous);
                }
            }
            tracing::warn!(node = %self.addr, run_id = %identity.run_id, uptime = ?identity.uptime, "another server (restarted, replaced or promoted): counted as started now");
        }
        Connected {
            conn,
            generation,
            identity: Arc::new(identity),
        }
    }

    /// On a Sentinel node, from its first connection on: every
    /// [`SENTINEL_WATCH`] (at least, or every node timeout when longer) the
    /// Sentinels are asked for the master, off the lock path; a failover
    /// since the connection's master was admitted (a higher config epoch)
    /// drops that connection and demotes its server, so a master that a
    /// failover replaced while it kept answering (paused, partitioned from
    /// the Sentinels) is not asked again. The task ends with the node.
    fn watch_sentinels(&self) {
        let Some(sentinel) = self.sentinel.clone() else {
            return;
        };
        if self.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.watching.store(false, Ordering::Release);
            return;
        };
        let me = self.me.clone();
        let timeout = self.timeouts.connect;
        let every = self.timeouts.probe.max(SENTINEL_WATCH);
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if me.strong_count() == 0 {
                    return;
                }
                let Ok(located) = sentinel.locate(timeout).await else {
                    continue;
                };
                if located.report.epoch <= sentinel.epoch() {
                    continue;
                }
                let Some(node) = me.upgrade() else { return };
                node.master_replaced();
            }
        });
    }

    /// The Sentinels replaced the master of the current connection.
    fn master_replaced(&self) {
        let mut inner = self.lock_inner();
        if let (State::Ready(c), Some(sentinel)) = (&inner.state, &self.sentinel) {
            sentinel.demote(&c.identity.run_id);
            tracing::warn!(node = %self.addr, "the sentinels switched masters: reconnecting");
            inner.state = State::Idle;
            self.gauges.up(&self.addr, false);
        }
    }

    /// Classifies a command error; a broken connection is dropped so the next
    /// call reconnects (and re-checks identity).
    fn command_failed(&self, generation: u64, e: RedisError, sent: Sent<'_>) -> NodeErrorKind {
        if let (Some(sentinel), Some("READONLY")) = (&self.sentinel, e.code()) {
            // The Sentinels demoted this master: it is never used again for
            // the group, and the next request asks them where the new one is.
            let mut inner = self.lock_inner();
            if let State::Ready(c) = &inner.state {
                if c.generation == generation {
                    sentinel.demote(&c.identity.run_id);
                    inner.state = State::Idle;
                    self.gauges.up(&self.addr, false);
                }
            }
            return NodeErrorKind::Demoted {
                role: String::from("replica (refused a write: READONLY)"),
            };
        }
        let broken = e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error();
        if broken {
            let mut inner = self.lock_inner();
            if matches!(&inner.state, State::Ready(c) if c.generation == generation) {
                inner.state = State::Idle;
                self.gauges.up(&self.addr, false);
            }
            return NodeErrorKind::ConnectionLost(Arc::new(e));
        }
        classify(e, &sent.name())
    }
}

/// `command`: what was sent, named in a permission error about its keys or
/// channels.
pub(crate) fn classify(e: RedisError, command: &str) -> NodeErrorKind {
    // With TLS 1.3 a server checks the client's certificate after the
    // client's side of the handshake is done: a refused certificate shows
    // up on the first command, as an alert.
    if let Some(reason) = tls::handshake_error(&e) {
        NodeErrorKind::Tls { reason }
    } else if let Some(denied) = info::permission_denied(&e, command) {
        NodeErrorKind::NoPermission {
            denied,
            source: Arc::new(e),
        }
    } else if info::is_auth_error(&e) {
        NodeErrorKind::Auth(Arc::new(e))
    } else if e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped() {
        NodeErrorKind::Connect(Arc::new(e))
    } else {
        NodeErrorKind::Redis(Arc::new(e))
    }
}

/// The handshake with the node's server; on a Sentinel node, with the
/// master the Sentinels name (see `sentinel.rs`): a server that is not a
/// master, or a master this node saw replaced, is refused (`Demoted`), and
/// its uptime counts only from when the Sentinel first knew it as master.
async fn reach(
    client: &redis::Client,
    sentinel: Option<&Sentinel>,
    timeout: Duration,
    shard: bool,
) -> Result<(MultiplexedConnection, Identity), NodeErrorKind> {
    let Some(sentinel) = sentinel else {
        return handshake(client, timeout, shard).await;
    };
    let located = sentinel.locate(timeout).await?;
    let (conn, mut identity) = match handshake(&located.client, timeout, shard).await {
        Err(NodeErrorKind::NotMaster { role }) => return Err(NodeErrorKind::Demoted { role }),
        other => other?,
    };
    if !sentinel.admit(&identity.run_id, located.report.epoch) {
        return Err(NodeErrorKind::Demoted {
            role: String::from("master replaced by a failover"),
        });
    }
    identity.uptime = identity.uptime.min(located.report.master_for);
    sentinel.set_current(located.client);
    Ok((conn, identity))
}

/// TCP connect, AUTH (from the URL), then `INFO server` and `ROLE` pipelined
/// in one round trip. The node may vote only if it is a master.
async fn handshake(
    client: &redis::Client,
    timeout: Duration,
    shard: bool,
) -> Result<(MultiplexedConnection, Identity), NodeErrorKind> {
    // Our own deadline bounds every call, so the driver's response timeout is
    // off: it would only race ours.
    //
    // The pipeline buffer is the queue between callers and the connection's
    // writer task. Its default (50) makes callers wait for a slot when many
    // tasks share the connection, and a command whose deadline fires while
    // waiting is never sent: a release lost that way leaves its key for the
    // whole TTL. 1024 slots keep enqueueing immediate under any load this
    // client can generate.
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(None)
        .set_pipeline_buffer_size(PIPELINE_BUFFER);
    let connect = async {
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| classify(e, "HELLO/AUTH"))
    };
    let conn = match client.get_connection_info().addr() {
        ConnectionAddr::TcpTls { host, port, .. } => {
            // A plain-text server takes the TLS hello for the start of an
            // inline command and waits for the rest, so the handshake would
            // only time out. Past half the budget, one plain `PING` on a
            // second connection tells the two apart: a RESP answer means
            // the URL should not say `rediss://`. A healthy TLS server
            // answers long before, and never sees the probe.
            let plain = async {
                tokio::time::sleep(timeout / 2).await;
                if probe::answers_plain_resp(host, *port, timeout / 2).await {
                    NodeErrorKind::Tls {
                        reason: String::from(
                            "the server answers in plain text (a redis:// server behind a rediss:// url)",
                        ),
                    }
                } else {
                    std::future::pending().await
                }
            };
            tokio::select! {
                connected = connect => connected?,
                refused = plain => return Err(refused),
            }
        }
        _ => connect.await?,
    };
    // Two commands on the multiplexed connection at once: one round trip,
    // but each with its own reply, so an error (NOAUTH when the URL lacks a
    // password) keeps its code; a pipeline would fold it into a
    // pipeline error without one.
    // The lock's scripts go in the same round trip: a fresh or restarted
    // server then has them before the first EVALSHA (a failed load, say an
    // ACL without SCRIPT, only leaves the NOSCRIPT fallback to do it).
    let (mut c1, mut c2) = (conn.clone(), conn.clone());
    let mut info_cmd = redis::cmd("INFO");
    info_cmd.arg("server");
    let role_cmd = redis::cmd("ROLE");
    let (plain, sharded) = (lock_scripts(), sharded_scripts());
    let sharded = if shard { &sharded[..] } else { &[] };
    let loads = futures::future::join_all(plain.iter().chain(sharded).map(|script| {
        let mut c = conn.clone();
        async move { script.load().query_async::<Value>(&mut c).await }
    }));
    let (info, role, _) = futures::future::join3(
        info_cmd.query_async::<String>(&mut c1),
        role_cmd.query_async::<Value>(&mut c2),
        loads,
    )
    .await;
    let (server, role) = (
        info.map_err(|e| classify(e, "INFO"))?,
        role.map_err(|e| classify(e, "ROLE"))?,
    );
    // The audit reads ROLE with the same parser, so what it reports is what
    // this check decides.
    let role = info::parse_role(&role).map_or_else(|| String::from("unknown"), |r| r.name);
    if role != "master" {
        return Err(NodeErrorKind::NotMaster { role });
    }
    // A cluster node answers `ROLE` as a master too, then refuses every
    // script of ours (`CROSSSLOT`) or sends keys elsewhere (`MOVED`).
    // A shard of a cluster node is one on purpose (`cluster.rs`).
    if !shard && info::info_field(&server, "redis_mode") == Some("cluster") {
        return Err(NodeErrorKind::ClusterMode);
    }
    let field = |name: &str| {
        info::info_field(&server, name)
            .unwrap_or_default()
            .to_owned()
    };
    let identity = Identity {
        run_id: field("run_id"),
        version: field("redis_version"),
        uptime: info::uptime(&server).unwrap_or_default(),
    };
    Ok((conn, identity))
}

/// The shortest interval of a Sentinel node's watch for failovers.
const SENTINEL_WATCH: Duration = Duration::from_millis(500);

/// What [`Server::run_request`] sends.
#[derive(Clone, Copy)]
enum Request<'a> {
    Cmd(&'a Cmd),
    Pipe(&'a Pipeline),
}

/// What was sent, to name it in an error.
#[derive(Clone, Copy)]
enum Sent<'a> {
    Request(Request<'a>),
    Script(&'a Script),
}

impl Sent<'_> {
    /// `SET`, `SET/PTTL` (a pipeline), `EVALSHA of the release script`.
    fn name(self) -> String {
        let first = |cmd: &Cmd| match cmd.args_iter().next() {
            Some(redis::Arg::Simple(name)) => String::from_utf8_lossy(name).to_ascii_uppercase(),
            _ => String::from("a command"),
        };
        match self {
            Sent::Request(Request::Cmd(cmd)) => first(cmd),
            Sent::Request(Request::Pipe(pipe)) => {
                pipe.cmd_iter().map(first).collect::<Vec<_>>().join("/")
            }
            Sent::Script(script) => format!("EVALSHA of the {} script", script.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_first_claim_wins() {
        let r = Registry::new(3);
        assert_eq!(r.claim(0, "a"), Ok(()));
        assert_eq!(r.claim(1, "b"), Ok(()));
        assert_eq!(r.claim(2, "a"), Err(0));
        // A node reconnecting to its own server is fine; a restart with a new
        // run_id replaces the old one.
        assert_eq!(r.claim(0, "a"), Ok(()));
        assert_eq!(r.claim(0, "c"), Ok(()));
        assert_eq!(r.claim(2, "a"), Ok(()));
        // Out-of-range index: no panic.
        assert_eq!(r.claim(9, "z"), Ok(()));
    }
}
