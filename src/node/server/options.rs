//! What a server is given: how it is reached ([`Reach`]) and timed
//! ([`NodeTimeouts`]), and what a call brings to it: the fan-out's
//! [`Settled`] flag and the restart guard's [`Vote`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::node::sentinel::Sentinel;

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
