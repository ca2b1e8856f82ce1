//! The [`Server`] handle and the state behind its one mutex: the
//! connection's state machine (`State`), the stall bookkeeping (`Inner`),
//! and what the restart guard and the re-seed read of it.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, Shared};

use super::identity::{Identity, Registry};
use super::link::Link;
use super::options::{NodeTimeouts, Reach, Vote};
use crate::error::failure::NodeErrorKind;
use crate::node::restart;
use crate::node::sentinel::Sentinel;
use crate::observe::metrics::NodeGauges;

pub(super) type ConnectResult = Result<Connected, NodeErrorKind>;

#[derive(Clone)]
pub(super) struct Connected {
    pub(super) conn: Link,
    /// Distinguishes this connection from its successors, so a failure seen
    /// on an old connection cannot tear down a newer one.
    pub(super) generation: u64,
    /// The server this connection reached. What the restart guard knows
    /// of it is kept per server, not per connection (`Server::lineage`).
    pub(super) identity: Arc<Identity>,
}

pub(super) enum State {
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

pub(crate) struct Server {
    pub(super) index: usize,
    pub(super) addr: String,
    /// The database index the URL selects.
    pub(super) db: i64,
    pub(super) client: redis::Client,
    pub(super) timeouts: NodeTimeouts,
    pub(super) registry: Arc<Registry>,
    pub(super) me: Weak<Server>,
    pub(super) inner: Mutex<Inner>,
    /// Origin of `last_reply`, which is an atomic to keep the lock off the
    /// reply path.
    pub(super) epoch: Instant,
    /// Nanoseconds after `epoch` of the last answer from this node.
    pub(super) last_reply: AtomicU64,
    /// Mirrors `inner.stalled.is_some()` so a reply only takes the lock when
    /// there is something to clear.
    pub(super) stalled_hint: AtomicBool,
    /// What the restart guard knows of the servers this address reached:
    /// kept across connections, so that no reconnect makes a young server
    /// vote or skips its re-seed (`restart::Lineage`). A std Mutex, never
    /// held across an await.
    pub(super) lineage: Mutex<restart::Lineage>,
    /// Set when a fenced vote found the server young and not re-seeded; the
    /// client takes it and starts the re-seed.
    pub(super) reseed_wanted: AtomicBool,
    /// A re-seed is running.
    pub(super) reseeding: AtomicBool,
    /// The server refused this node's `CLIENT KILL` (an ACL user without
    /// `client|kill`): not asked again, so that its ACL log gets one entry
    /// per node and client, not one per reconnect (`connect::cut_off`).
    pub(super) cut_off_refused: AtomicBool,
    /// Up, stalled, quarantined: reported on change (feature `metrics`).
    pub(super) gauges: NodeGauges,
    /// A master shard of a Redis Cluster node: `redis_mode:cluster` is
    /// expected, not refused.
    pub(super) shard: bool,
    /// A Sentinel-managed master (`sentinel.rs`): every connect asks the
    /// Sentinels where it is; `client` is then only a placeholder.
    pub(super) sentinel: Option<Arc<Sentinel>>,
    /// The Sentinel watch (`watch_sentinels`) was started.
    pub(super) watching: AtomicBool,
}

pub(super) struct Inner {
    pub(super) state: State,
    pub(super) next_generation: u64,
    pub(super) backoff: Duration,
    /// Send time of the oldest request known unanswered, while stalled.
    pub(super) stalled: Option<Instant>,
    pub(super) next_probe: Instant,
    /// While stalled: when to try a fresh connection next (see
    /// `try_replacement`), and whether one is being tried.
    pub(super) next_replacement: Instant,
    pub(super) replacing: bool,
    /// The last connect's failure, if permanent; cleared by a connect that
    /// succeeds.
    pub(super) refused: Option<NodeErrorKind>,
    /// The server and server-side id of the newest connection installed,
    /// kept after it is lost: the next connection to the same server cuts
    /// it off before it carries anything (`connect::cut_off`).
    pub(super) installed: Option<Arc<Identity>>,
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
                installed: None,
            }),
            epoch: Instant::now(),
            last_reply: AtomicU64::new(0),
            stalled_hint: AtomicBool::new(false),
            lineage: Mutex::new(restart::Lineage::default()),
            reseed_wanted: AtomicBool::new(false),
            reseeding: AtomicBool::new(false),
            cut_off_refused: AtomicBool::new(false),
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

    pub(super) fn lineage(&self) -> std::sync::MutexGuard<'_, restart::Lineage> {
        self.lineage.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The restart guard's verdict on the server of `connected` now.
    pub(super) fn verdict(&self, connected: &Connected, vote: Vote) -> restart::Verdict {
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

    /// Whether this server's connection gathers a round's requests before
    /// each write: when the client has several nodes (`Pipelined::start`).
    pub(super) fn gathers(&self) -> bool {
        self.registry.nodes() > 1
    }

    pub(super) fn lock_inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Nothing panics while holding this lock; recover from poison anyway
        // rather than propagate a panic into the caller.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
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
}
