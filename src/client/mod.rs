//! The public handle: [`Client`], a cheap `Clone` over the shared state
//! (`protocol::shared::Shared`), and its entry points. A lock is taken
//! through a [`LockRequest`]; the shortcuts here cover the usual cases. How
//! a client is made (`Client::new`, `Client::builder`) is in `builder`.

pub(crate) mod builder;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::field::{self, Empty};
use tracing::Instrument;

use crate::audit::Audit;
use crate::election::Election;
use crate::error::Error;
use crate::lease::Lease;
use crate::logic::quorum::quorum;
use crate::logic::resource::fence_key;
use crate::multi::{MultiGuard, MultiRequest};
use crate::mutex::guard::LockGuard;
use crate::mutex::request::LockRequest;
use crate::observe::inspect::Inspection;
use crate::observe::stats::Stats;
use crate::once::SingleFlight;
use crate::protocol::inspect::ForceReleased;
use crate::protocol::release::release_orphan;
use crate::protocol::shared::Shared;
use crate::rwlock::RwLock;
use crate::semaphore::Semaphore;

/// A handle to a set of independent Redis masters. Cheap to clone (one
/// `Arc`); clones share the node connections. Build it once at startup with
/// [`Client::new`] or [`Client::builder`] and pass clones to your tasks.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.shared.fmt(f)
    }
}

impl Client {
    pub(crate) fn from_shared(shared: Arc<Shared>) -> Self {
        let weak = Arc::downgrade(&shared);
        shared.waits.on_orphan(move |orphan| {
            if let Some(shared) = weak.upgrade() {
                release_orphan(&shared, orphan);
            }
        });
        Self { shared }
    }

    /// N, the number of configured nodes.
    pub fn nodes(&self) -> usize {
        self.shared.nodes.len()
    }

    /// Votes needed for a lock: ⌊N/2⌋ + 1.
    pub fn quorum(&self) -> usize {
        quorum(self.shared.nodes.len())
    }

    /// Whether acquisitions hand out fencing tokens; see
    /// [`Builder::fencing`](crate::Builder::fencing).
    pub fn fencing(&self) -> bool {
        self.shared.config.fencing
    }

    /// The Redis key holding `resource`'s fence on every node (with fencing
    /// on), for inspection: `{prefix}fence:{b}`, shared with the other
    /// resources of bucket `b` (see
    /// [`FENCE_BUCKETS`](crate::limits::FENCE_BUCKETS)). Nothing is
    /// validated or sent.
    pub fn fence_key(&self, resource: &str) -> String {
        fence_key(&self.shared.config.key_prefix, resource).to_string()
    }

    /// This client's tag: 16 hex digits (64 random bits) that begin every
    /// lock value it writes (`{tag}:{secret}`) and every fair-queue ticket,
    /// so that a key seen in Redis, or a holder reported by
    /// [`inspect`](Self::inspect), can be traced to a process.
    /// Random per client (clones share it); not a secret.
    pub fn id(&self) -> &str {
        &self.shared.id_text
    }

    /// Reads `resource`'s lock on every node at once (one read-only round
    /// trip each, `GET` and `PTTL` of the lock key and `GET` of its fence,
    /// bounded by the node timeout): whether the key is there, held by this
    /// client or another (its tag, never the secret part of the value),
    /// its TTL, the fence; and whether one value is on a majority, whose,
    /// and for how long at least. A snapshot for operators and health
    /// checks: it takes no lock and proves nothing a moment later. Fails
    /// only on an invalid resource name; nodes that fail are reported in
    /// the result.
    pub async fn inspect(&self, resource: &str) -> Result<Inspection, Error> {
        crate::protocol::inspect::inspect(&self.shared, resource).await
    }

    /// **Dangerous.** Deletes `resource`'s lock key on every node whatever
    /// its value, and reports each node's outcome. For an operator who knows
    /// the holder is gone (a crashed host with a long TTL), not for
    /// programs.
    ///
    /// It breaks the current holder's exclusion: the next acquire succeeds
    /// at once, while the holder may still be working. Its watchdog notices
    /// at its next extend (the lease is then lost,
    /// [`LossReason::NotHeld`](crate::LossReason::NotHeld)), not sooner.
    /// What still protects the data is fencing: once the next holder has
    /// written with its larger token, storage that checks tokens
    /// ([`FencedStore`](crate::FencedStore)) refuses the old holder's
    /// writes. Waiters of other clients are not woken (no release notice is
    /// published); they retry on their own schedule.
    pub async fn force_release(&self, resource: &str) -> Result<ForceReleased, Error> {
        crate::protocol::inspect::force_release(&self.shared, resource).await
    }

    /// This client's counters (shared by its clones): attempts, grants, and
    /// how often a token had to be written back.
    pub fn stats(&self) -> Stats {
        Stats {
            waiting: self.shared.waits.waiting(),
            ..self.shared.counters.snapshot()
        }
    }

    /// Checks every node's deployment against what Redlock assumes of it:
    /// reachable, a master, a distinct server (`run_id`), no eviction of
    /// lock keys, persistence, version, clock offset. Nodes are visited
    /// concurrently over fresh connections (not the lock connections), each
    /// visit bounded by the connect timeout, so a dead or paused node yields
    /// an "unreachable" finding instead of a hang. Read-only; run it at
    /// startup or from a health endpoint. See [`Audit`].
    pub async fn audit(&self) -> Audit {
        let started = Instant::now();
        let span = tracing::debug_span!(
            "audit",
            nodes = self.shared.nodes.len(),
            errors = Empty,
            warnings = Empty,
            elapsed = Empty,
        );
        let audit = crate::audit::run(&self.shared.nodes)
            .instrument(span.clone())
            .await;
        if !span.is_disabled() {
            span.record("errors", audit.errors().count())
                .record("warnings", audit.warnings().count())
                .record("elapsed", field::debug(started.elapsed()));
        }
        audit
    }

    /// Starts a lock request on `resource` with lease `ttl`, to configure
    /// (retry policy) before acquiring. The shortcuts below cover the usual
    /// cases.
    pub fn lock(&self, resource: impl Into<String>, ttl: Duration) -> LockRequest {
        LockRequest::new(Arc::clone(&self.shared), resource.into(), ttl)
    }

    /// Acquires `resource` for `ttl`, retrying under the client's retry
    /// policy (default: up to 10 s). Fails with [`Error::NotAcquired`].
    pub async fn acquire(&self, resource: &str, ttl: Duration) -> Result<LockGuard, Error> {
        self.lock(resource, ttl).acquire().await
    }

    /// One attempt, no waiting. `Ok(None)` when another owner holds the lock
    /// ("someone else is doing it: skip"); an error when nodes failed.
    pub async fn try_acquire(
        &self,
        resource: &str,
        ttl: Duration,
    ) -> Result<Option<LockGuard>, Error> {
        self.lock(resource, ttl).try_acquire().await
    }

    /// Acquires `resource`, runs `f` to completion under the lock, then
    /// releases. The release happens only after `f`'s future has finished,
    /// also when it returns an error or panics (the panic is resumed after
    /// the release), so work such as a database commit inside `f` completes
    /// while the lock is still held.
    pub async fn with_lock<F, Fut, T>(
        &self,
        resource: &str,
        ttl: Duration,
        f: F,
    ) -> Result<T, Error>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = T>,
    {
        self.lock(resource, ttl).run(f).await
    }

    /// Leader election `name` over these nodes: campaign to lead, read or
    /// observe who leads. The leadership is this client's lock on
    /// `election:{name}`, its term the lock's fencing token; see
    /// [`Election`]. Nothing is validated or sent until used.
    pub fn election(&self, name: &str) -> Election {
        Election::new(Arc::clone(&self.shared), name)
    }

    /// Single-flight on `key` over these nodes: one computation per expiry
    /// of the cached value across every client, the others waiting for it.
    /// The computation holds this client's lock on `once:{key}`; the value
    /// is written fenced by its token. See [`SingleFlight`]. Nothing is
    /// validated or sent until used.
    pub fn once(&self, key: &str) -> SingleFlight {
        SingleFlight::new(Arc::clone(&self.shared), key)
    }

    /// A semaphore of `permits` (K) permits named `name`: at most K
    /// holders at once across every client that uses the name with the
    /// same K, each permit with a fencing token of its own slot. See
    /// [`Semaphore`]. Fails with [`Error::InvalidPermits`] for K = 0 or
    /// above [`Semaphore::MAX_PERMITS`], [`Error::InvalidResource`] for an
    /// empty name or one too long for its slots' names. Nothing is sent.
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore, Error> {
        Semaphore::new(Arc::clone(&self.shared), name, permits)
    }

    /// The read-write lock named `name`: many readers or one writer,
    /// writers first, each hold with a fencing token that orders writes
    /// after every earlier read and write. See [`RwLock`]. Fails with
    /// [`Error::InvalidResource`] for an empty name or one longer than
    /// 1024 bytes. Nothing is sent.
    pub fn rw_lock(&self, name: &str) -> Result<RwLock, Error> {
        RwLock::new(Arc::clone(&self.shared), name)
    }

    /// Starts a multi-resource lock request on `resources` with lease
    /// `ttl`, to configure (retry, auto-extension) before acquiring: every
    /// resource held at once, all or nothing, each with its own fencing
    /// token. See [`MultiRequest`] and [`MultiGuard`]. Nothing is checked
    /// or sent until acquired.
    pub fn lock_set<I, S>(&self, resources: I, ttl: Duration) -> MultiRequest
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let resources: Vec<String> = resources.into_iter().map(Into::into).collect();
        MultiRequest::new(Arc::clone(&self.shared), resources.into(), ttl)
    }

    /// Acquires every resource of `resources` for `ttl`, all or nothing,
    /// waiting under the client's retry policy; see
    /// [`MultiRequest::acquire`]. Fails with [`Error::NotAcquired`], or
    /// [`Error::InvalidResourceSet`] for an empty set, more than
    /// [`MAX_RESOURCES`](crate::limits::MAX_RESOURCES), a resource given
    /// twice, or (with a Redis Cluster node) resources in different hash
    /// slots.
    pub async fn lock_all<I, S>(&self, resources: I, ttl: Duration) -> Result<MultiGuard, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.lock_set(resources, ttl).acquire().await
    }

    /// One all-or-nothing attempt, no waiting: `Ok(None)` when another
    /// owner holds any of the resources (nothing is taken); see
    /// [`MultiRequest::try_acquire`].
    pub async fn try_lock_all<I, S>(
        &self,
        resources: I,
        ttl: Duration,
    ) -> Result<Option<MultiGuard>, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.lock_set(resources, ttl).try_acquire().await
    }

    /// Acquires every resource, runs `f` with one lease per resource (in
    /// the order given), then releases them all; see [`MultiRequest::run`].
    pub async fn with_all<I, S, F, Fut, T>(
        &self,
        resources: I,
        ttl: Duration,
        f: F,
    ) -> Result<T, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
        F: FnOnce(Vec<Lease>) -> Fut,
        Fut: Future<Output = T>,
    {
        self.lock_set(resources, ttl).run(f).await
    }
}
