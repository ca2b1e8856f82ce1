//! The state every operation works over, shared by a client's clones, its
//! guards (by `Arc`) and its watchdogs (by `Weak`): the nodes, the validated
//! settings, the client's id and counters, and the waiting queues. Also the
//! values that travel between operations: a validated request ([`Target`]),
//! a lock as extend and release need it ([`Held`]), and a grant.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::logic::fence::FencingToken;
use crate::logic::resource::{client_tag, fence_bucket, fence_keys, lock_key, validate};
use crate::logic::validity::{Ttl, TtlProblem};
use crate::node::{Kind, Node, Vote};
use crate::observe::stats::Counters;
use crate::protocol::fanout::{node_set, NodeSet};
use crate::settings::config::Config;
use crate::waiting::notify::Waits;
use crate::waiting::pregrant::Home;

pub(crate) struct Shared {
    /// Shared with every fan-out (one reference count, not a copy of the
    /// list per round).
    pub(crate) nodes: Arc<[Arc<Node>]>,
    pub(crate) config: Config,
    /// This client's tag, 64 random bits as 16 hex digits (`resource::
    /// client_tag`): every lock value starts with it (`{tag}:{secret}`,
    /// so keys seen in Redis can be traced back to a process), and so does
    /// every fair-queue ticket, whose namings travel on the tag's own
    /// channel. Two live clients with one tag would hear each other's
    /// namings; at 64 bits that takes about 2^32 clients at once, where
    /// the 32-bit tags before issue 31 took 2^16.
    pub(crate) id_text: Arc<str>,
    /// The fence key of every bucket, named once (with fencing on).
    fence_keys: Vec<Arc<str>>,
    pub(crate) counters: Counters,
    /// The longest TTL requested so far, in ms: the restart guard's
    /// default window.
    longest_ttl_ms: AtomicU64,
    /// Waiting by notification: queues and subscription connections.
    pub(crate) waits: Waits,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.id_text)
            .field("nodes", &self.nodes)
            .field("config", &self.config)
            .finish()
    }
}

/// A validated lock request.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) resource: Arc<str>,
    pub(crate) key: Arc<str>,
    pub(crate) ttl: Ttl,
    pub(crate) drift: Duration,
    /// The fence key of the resource's bucket, when fencing is on.
    pub(crate) fence: Option<Arc<str>>,
    /// The resource's home node (its fence bucket modulo N), which keeps
    /// its fair queue, and the queue's key.
    pub(crate) home: Home,
}

/// What a lock needs to be extended or released: its key, its secret value,
/// the nodes the acquire may have reached, and when the keys expire.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) key: Arc<str>,
    pub(crate) value: Arc<str>,
    /// Public id of this acquisition, published with its release (the value
    /// is secret: it authorises release).
    pub(crate) notice: u64,
    /// Whether the lock was granted (a guard's release) or this is the
    /// cleanup of a failed attempt.
    pub(crate) granted: bool,
    pub(crate) sent: NodeSet,
    /// Nodes known to have held our value: they granted it (before the
    /// acquire's decision or after it, heard in the background; a late
    /// transaction that set it but found the fence unseeded counts too,
    /// though it is no vote) or extended it since. Only there is another owner's value evidence
    /// that the lock was taken over; elsewhere it may be a contender's
    /// leftover that never was ours. Shared by every copy of this `Held`.
    pub(crate) ours: Arc<AtomicU64>,
    pub(crate) expires_at: Instant,
    /// The fair queue of the resource; the home node's release names its
    /// head in the notice.
    pub(crate) home: Home,
    /// This acquisition's ticket when it may still be in the fair queue
    /// (named by a release, which leaves it at the head, or granted after
    /// a look found the lock free): the home node's release takes it out.
    pub(crate) ticket: Option<Arc<str>>,
}

impl Held {
    /// Adds the nodes of `answers` (index, value) to those known to hold
    /// our value.
    pub(crate) fn note_ours<T>(&self, answers: &[(usize, T)]) {
        let set = node_set(answers.iter().map(|&(i, _)| i));
        self.ours.fetch_or(set, Ordering::Relaxed);
    }

    /// Whether every node of `nodes` is known to have held our value: each
    /// answered our acquire (or an extend) with a yes, so no request of
    /// ours can still land there.
    pub(crate) fn ours_on(&self, nodes: NodeSet) -> bool {
        nodes & !self.ours.load(Ordering::Relaxed) == 0
    }

    /// Whether node `index` is known to have held our value.
    pub(crate) fn was_ours(&self, index: usize) -> bool {
        self.ours.load(Ordering::Relaxed) & node_set([index]) != 0
    }

    /// The public id of this acquisition, published with its release.
    pub(crate) fn notice_id(&self) -> Arc<str> {
        crate::logic::resource::arc_built(|id| {
            crate::logic::resource::push_hex(id, u128::from(self.notice), 16);
        })
    }
}

/// A lock grant from one attempt, before it becomes a guard.
pub(crate) struct Grant {
    pub(crate) held: Held,
    pub(crate) valid_until: Instant,
    pub(crate) token: Option<FencingToken>,
    /// Nodes that granted by the decision (for the acquire's span).
    pub(crate) granted: usize,
}

impl Shared {
    pub(crate) fn new(nodes: Vec<Arc<Node>>, config: Config) -> Arc<Self> {
        let id_text: Arc<str> = client_tag().into();
        let waits = Waits::new(&id_text, config.max_local_handoffs);
        let fence_keys = if config.fencing {
            fence_keys(&config.key_prefix)
        } else {
            Vec::new()
        };
        Arc::new(Self {
            nodes: nodes.into(),
            config,
            id_text,
            fence_keys,
            counters: Counters::default(),
            longest_ttl_ms: AtomicU64::new(0),
            waits,
        })
    }

    /// Validates a resource name and TTL into a [`Target`].
    pub(crate) fn target(&self, resource: &str, ttl: Duration) -> Result<Target, Error> {
        validate(resource).map_err(Error::InvalidResource)?;
        let checked = Ttl::new(ttl).map_err(|problem| Error::InvalidTtl {
            ttl,
            reason: match problem {
                TtlProblem::TooShort => "must be at least 1 ms",
                TtlProblem::TooLong => "must be at most MAX_TTL (365 days)",
            },
        })?;
        let drift = self.config.drift_factor.drift(checked);
        self.longest_ttl_ms
            .fetch_max(checked.millis(), Ordering::Relaxed);
        // A TTL that drift alone (or drift plus the minimum validity) uses
        // up can never be granted: say so now instead of failing every
        // attempt until the deadline.
        if checked.duration().saturating_sub(drift) <= self.config.min_validity {
            return Err(Error::InvalidTtl {
                ttl,
                reason: "leaves no validity above min_validity once clock drift is deducted",
            });
        }
        let prefix = &self.config.key_prefix;
        let bucket = fence_bucket(resource);
        let fence = self.fence_keys.get(usize::from(bucket)).cloned();
        let index = usize::from(bucket) % self.nodes.len().max(1);
        let plain = self
            .nodes
            .get(index)
            .is_some_and(|node| matches!(node.kind(), Kind::Server(_)));
        let pregrant_fence = fence.clone().filter(|_| plain);
        let key = lock_key(prefix, resource, self.config.layout);
        let home = Home::of(index, key.clone(), prefix.len(), pregrant_fence);
        Ok(Target {
            resource: resource.into(),
            key,
            ttl: checked,
            drift,
            fence,
            home,
        })
    }

    /// What the restart guard asks of a vote now (`None`: guard off).
    /// `fenced`: the request moves fences (acquire, write-back), so a young
    /// server's fences must have been re-seeded first.
    pub(crate) fn vote(&self, fenced: bool) -> Option<Vote> {
        let longest = Duration::from_millis(self.longest_ttl_ms.load(Ordering::Relaxed));
        let window = self.config.restart_guard.window(longest)?;
        Some(Vote {
            window,
            fenced: fenced && self.config.fencing,
        })
    }
}
