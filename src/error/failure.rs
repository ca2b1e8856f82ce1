//! What each node answered, and a quorum round that failed: the per-node
//! detail every error carries. Plain data at the bottom of the crate; the
//! fan-out and the protocol operations produce it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Which operation a quorum failure belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Phase {
    /// Taking the lock.
    Acquire,
    /// Extending a held lock.
    Extend,
    /// Writing the chosen fencing token back to granting nodes that
    /// reported a lower fence, before the guard is handed out.
    WriteBack,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Acquire => "acquire",
            Phase::Extend => "extend",
            Phase::WriteBack => "token write-back",
        })
    }
}

/// Why a quorum was not reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureReason {
    /// Other owners hold the lock on so many nodes that a majority was out of
    /// reach even if every failed node had answered: someone else has it.
    Contended,
    /// Nodes that failed (timeout, connection, configuration) made the
    /// difference: with them healthy a majority might have been reached.
    Unavailable,
    /// A majority agreed, but so late that the validity left
    /// (TTL − elapsed − drift) was not above the configured minimum.
    ValidityExhausted,
    /// An extend found the lock gone (expired, or taken by another owner)
    /// on so many nodes that a majority was out of reach.
    NotHeld,
}

impl fmt::Display for FailureReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailureReason::Contended => "held by another owner",
            FailureReason::Unavailable => "too many nodes unavailable",
            FailureReason::ValidityExhausted => "quorum reached too late, no validity left",
            FailureReason::NotHeld => "lock no longer held by this owner",
        })
    }
}

/// What went wrong on one node.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum NodeErrorKind {
    /// The node did not answer within its per-node budget.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// Another owner holds the key on this node.
    #[error("held by another owner{}", fmt_expiry(*.expires_in))]
    HeldByOther {
        /// The holder's remaining TTL on this node, when the node reported
        /// it: the retries of a waiting `acquire` ask; a first attempt on
        /// a resource none of this client's tasks waits for
        /// (`try_acquire`'s, and `acquire`'s first) does not.
        expires_in: Option<Duration>,
    },
    /// The key on this node is absent or has another owner's value (extend or
    /// release of a lock that expired or was never taken here).
    #[error("lock not held by this owner")]
    NotHeld,
    /// A TCP connection could not be made (refused, reset, unreachable).
    #[error("connection failed")]
    Connect(#[source] Arc<redis::RedisError>),
    /// The connection dropped while the command was in flight.
    #[error("connection lost")]
    ConnectionLost(#[source] Arc<redis::RedisError>),
    /// The TLS handshake with a `rediss://` node failed: its certificate is
    /// not trusted (signed by another CA, expired, issued for another host),
    /// it refused this client's certificate, or it does not speak TLS at all
    /// (a plain-text server behind a `rediss://` URL, found by a plain
    /// `PING` once half the connect timeout has passed without an answer to
    /// the TLS hello). Permanent: retrying does not fix a certificate.
    #[error("TLS handshake failed: {reason}")]
    Tls {
        /// What went wrong, as the TLS layer said it (never key material).
        reason: String,
    },
    /// The node refused the credentials (or requires some).
    #[error("authentication failed")]
    Auth(#[source] Arc<redis::RedisError>),
    /// The credentials were accepted, but the node's ACL user may not do
    /// something the client needs (`NOPERM`): run a command, touch a key
    /// outside its key patterns, or publish on a channel outside its channel
    /// patterns, directly or inside one of the crate's scripts. Permanent:
    /// retrying does not help; docs/operations.md lists the ACL rule each feature
    /// needs ("Least-privilege ACL users").
    #[error("no permission to {denied}")]
    NoPermission {
        /// What was denied, naming the command: `run GET`, `access a key of
        /// SET outside the user's key patterns`, `run a command of the
        /// acquire script (SET, INCR, INCRBY, PTTL)`.
        denied: String,
        /// The server's reply.
        #[source]
        source: Arc<redis::RedisError>,
    },
    /// The node answered `ROLE` with something other than `master`. Writes to
    /// a replica are refused or lost on failover; it cannot vote.
    #[error("node is a {role}, not a master")]
    NotMaster {
        /// What `ROLE` said.
        role: String,
    },
    /// The node runs in cluster mode (`redis_mode:cluster` in `INFO
    /// server`) but was given as a plain `redis://` URL: its keys live on
    /// several shards, which answer each other's keys with `MOVED`. Give it
    /// as a cluster node (`redis+cluster://host:port`, or
    /// [`NodeSpec::cluster`](crate::NodeSpec::cluster)). Permanent.
    #[error("node runs in cluster mode: give it as redis+cluster://host:port")]
    ClusterMode,
    /// A node given as a Redis Cluster (`redis+cluster://`,
    /// [`NodeSpec::cluster`](crate::NodeSpec::cluster)) whose seed is not
    /// in cluster mode: give it as `redis://`. Permanent.
    #[error("node given as a cluster is not in cluster mode: give it as redis://host:port")]
    NotCluster,
    /// A cluster node's topology could not be read or followed: no seed or master answered `CLUSTER SLOTS`,
    /// no master serves the key's slot, or redirects went on past the
    /// limit.
    #[error("cluster topology: {reason}")]
    ClusterTopology {
        /// What went wrong.
        reason: String,
    },
    /// The node is the same server (same `run_id`) as another configured
    /// node: two URLs reach one Redis process, which must not vote twice.
    #[error("same server as node {other} (run_id {run_id})")]
    SameServer {
        /// Index of the node that connected first with this `run_id`.
        other: usize,
        /// The shared `run_id`.
        run_id: String,
    },
    /// The last connection attempt failed recently; the client waits before
    /// trying again instead of paying a connect on every call. After a
    /// permanent failure (see [`is_permanent`](Self::is_permanent)) calls
    /// get it at once also while the next reconnect is in flight
    /// (`retry_in` is then zero), until a connect succeeds.
    #[error("down, next reconnect in {retry_in:?}")]
    Backoff {
        /// Time until the next connection attempt.
        retry_in: Duration,
        /// The failure that started the back-off.
        #[source]
        last: Box<NodeErrorKind>,
    },
    /// The node timed out recently and has not answered since, so commands
    /// to it fail at once instead of piling up behind a stalled server; one
    /// probe per node timeout still goes through and clears this when answered.
    #[error("unresponsive since {silent_for:?} ago, skipped until a probe answers")]
    Stalled {
        /// Time since the oldest unanswered request was sent.
        silent_for: Duration,
    },
    /// The node's server started less than the restart guard's window ago
    /// (it restarted, or is seen for the first time that young), so it may
    /// have lost locks it granted: it does not vote until the window has
    /// passed. Nothing was sent. See [`RestartGuard`](crate::RestartGuard).
    #[error("started {uptime:?} ago, does not vote for another {votes_in:?} (restart guard)")]
    Restarted {
        /// Time since the server started (as estimated from its uptime).
        uptime: Duration,
        /// Time until it votes again.
        votes_in: Duration,
    },
    /// The node's server was young when this client connected (it may have
    /// restarted without its data), its restart-guard window is over, and
    /// its fences are being re-seeded from the other nodes: with fencing it
    /// does not vote until that is done. Nothing was sent.
    #[error("fences being restored from a majority after a restart (restart guard)")]
    Reseeding,
    /// Not sent: a release to a node the lock never reached, or a request
    /// whose round was decided before its connection was ready (answers
    /// after the decision are not reported).
    #[error("skipped: not sent to this node")]
    Skipped,
    /// A Sentinel node (`redis+sentinel://`): no Sentinel said where the
    /// master is within the node's connect timeout (each was asked at
    /// once). `reason` is the last one's failure. Transient.
    #[error("none of {asked} sentinels named the master: {reason}")]
    NoSentinel {
        /// How many Sentinels were asked.
        asked: usize,
        /// Why the last one gave no usable answer.
        reason: String,
    },
    /// A Sentinel node: every Sentinel that answered knows no master of
    /// this name. Permanent (a typo in the URL's master name).
    #[error("the sentinels know no master named {name:?}")]
    UnknownMaster {
        /// The master name the node was given.
        name: String,
    },
    /// A Sentinel node: the server the Sentinels named is not, or no
    /// longer, the group's master (a replica, a Sentinel that lags behind a
    /// failover, a demoted master that refused a write with `READONLY`).
    /// Not used; the next request asks the Sentinels again. Transient.
    #[error("the sentinels' master is not usable: {role}")]
    Demoted {
        /// What it is instead.
        role: String,
    },
    /// Any other error from Redis (script error, OOM, unexpected reply).
    #[error("redis error")]
    Redis(#[source] Arc<redis::RedisError>),
}

fn fmt_expiry(expires_in: Option<Duration>) -> String {
    match expires_in {
        Some(d) => format!(" (expires in {d:?})"),
        None => String::new(),
    }
}

impl NodeErrorKind {
    /// Failures that will not go away by retrying: wrong credentials, a
    /// refused TLS handshake, a replica, a duplicate server. An acquire stops retrying when these alone
    /// make a majority impossible.
    pub fn is_permanent(&self) -> bool {
        match self {
            NodeErrorKind::Auth(_)
            | NodeErrorKind::Tls { .. }
            | NodeErrorKind::NoPermission { .. }
            | NodeErrorKind::NotMaster { .. }
            | NodeErrorKind::ClusterMode
            | NodeErrorKind::NotCluster
            | NodeErrorKind::UnknownMaster { .. }
            | NodeErrorKind::SameServer { .. } => true,
            NodeErrorKind::Backoff { last, .. } => last.is_permanent(),
            _ => false,
        }
    }

    /// False when the command certainly never reached the node (refused
    /// connection, back-off, failed handshake, skipped): a later release need
    /// not go there. Timeouts and lost connections may have delivered it.
    pub(crate) fn may_have_been_sent(&self) -> bool {
        !matches!(
            self,
            NodeErrorKind::Connect(_)
                | NodeErrorKind::Tls { .. }
                | NodeErrorKind::Auth(_)
                | NodeErrorKind::NotMaster { .. }
                | NodeErrorKind::ClusterMode
                | NodeErrorKind::NotCluster
                | NodeErrorKind::SameServer { .. }
                | NodeErrorKind::Backoff { .. }
                | NodeErrorKind::Stalled { .. }
                | NodeErrorKind::Restarted { .. }
                | NodeErrorKind::Reseeding
                | NodeErrorKind::Skipped
                | NodeErrorKind::NoSentinel { .. }
                | NodeErrorKind::UnknownMaster { .. }
                | NodeErrorKind::Demoted { .. }
        )
    }

    /// True for a per-node timeout (also behind a back-off, or a node
    /// skipped as stalled after one).
    pub fn is_timeout(&self) -> bool {
        match self {
            NodeErrorKind::Timeout(_) | NodeErrorKind::Stalled { .. } => true,
            NodeErrorKind::Backoff { last, .. } => last.is_timeout(),
            _ => false,
        }
    }
}

/// One node's failure: where, and what.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NodeFailure {
    /// Position of the node in the configured list.
    pub index: usize,
    /// `host:port` of the node (never includes credentials).
    pub addr: String,
    /// What happened.
    pub kind: NodeErrorKind,
}

impl fmt::Display for NodeFailure {
    /// `addr: kind: cause: cause…` — the whole source chain on one line,
    /// because these are listed inside a larger message.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.addr, self.kind)?;
        let mut source = std::error::Error::source(&self.kind);
        let mut last = String::new();
        while let Some(s) = source {
            // redis-rs errors print their I/O cause and also return it as
            // their source: show each text once.
            let text = s.to_string();
            if !last.contains(&text) {
                write!(f, ": {text}")?;
            }
            last = text;
            source = s.source();
        }
        Ok(())
    }
}

/// A majority of all N nodes could not be reached for an acquire or extend.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct QuorumFailure {
    /// Which operation failed.
    pub phase: Phase,
    /// The resource (as the caller named it, not the Redis key).
    pub resource: String,
    /// Why, in one word.
    pub reason: FailureReason,
    /// Nodes that granted in the last attempt.
    pub granted: usize,
    /// Votes needed: ⌊N/2⌋ + 1.
    pub quorum: usize,
    /// N, the number of configured nodes.
    pub nodes: usize,
    /// Attempts made (1 for a single try or an extend).
    pub attempts: u32,
    /// Time from the first attempt's start to giving up.
    pub elapsed: Duration,
    /// The failures of the last attempt, one per node that did not grant,
    /// in node order. Nodes still unanswered when the outcome became certain
    /// do not appear (their answer could not have changed it).
    pub failures: Vec<NodeFailure>,
}

/// The per-node failures are listed in the message (there are several), so
/// there is no single `source`.
impl std::error::Error for QuorumFailure {}

impl fmt::Display for QuorumFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {:?} failed: {}; {} of {} nodes granted, quorum {}, {} attempt{} in {:?}",
            self.phase,
            self.resource,
            self.reason,
            self.granted,
            self.nodes,
            self.quorum,
            self.attempts,
            if self.attempts == 1 { "" } else { "s" },
            self.elapsed,
        )?;
        for (i, failure) in self.failures.iter().enumerate() {
            f.write_str(if i == 0 { " [" } else { "; " })?;
            write!(f, "{failure}")?;
        }
        if !self.failures.is_empty() {
            f.write_str("]")?;
        }
        Ok(())
    }
}
