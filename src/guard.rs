//! The guard that owns a held lock: it extends on request, releases, and
//! owns the watchdog task when the lock is auto-extended. Dropping it never
//! blocks: the release goes to a background task.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::autoextend::Schedule;
use crate::error::Error;
use crate::fence::FencingToken;
use crate::lease::Lease;
use crate::lost::{LossReason, LostLock};
use crate::protocol::extend::extend;
use crate::protocol::release::{release, release_in_background, Released};
use crate::protocol::shared::{Grant, Shared, Target};
use crate::watchdog::Watchdog;

/// An acquired lock. Release it with [`release`](Self::release); dropping it
/// instead schedules a best-effort release in the background on the current
/// tokio runtime (never blocking, never panicking). Either way the TTL is
/// the real guarantee: if the release cannot reach a node, the key there
/// expires on its own.
///
/// With [auto-extension](crate::AutoExtend) the guard owns the watchdog
/// task: releasing or dropping the guard stops it before the release is
/// sent.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    shared: Arc<Shared>,
    lease: Lease,
    watchdog: Option<Watchdog>,
    released: bool,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("lease", &self.lease)
            .field("auto_extend", &self.watchdog.is_some())
            .field("released", &self.released)
            .finish()
    }
}

impl LockGuard {
    /// The guard of a grant, with its watchdog when auto-extended.
    pub(crate) fn new(
        shared: Arc<Shared>,
        target: &Target,
        grant: Grant,
        watchdog: Option<Schedule>,
    ) -> Self {
        let lease = Lease::new(target, grant, watchdog.is_some());
        let watchdog = watchdog.map(|s| Watchdog::spawn(&shared, lease.clone(), s));
        Self {
            shared,
            lease,
            watchdog,
            released: false,
        }
    }

    /// The resource name.
    pub fn resource(&self) -> &str {
        self.lease.resource()
    }

    /// The fencing token; see [`Lease::token`].
    pub fn token(&self) -> Option<FencingToken> {
        self.lease.token()
    }

    /// Time left before the lock must be assumed lost; see [`Lease::validity`].
    pub fn validity(&self) -> Duration {
        self.lease.validity()
    }

    /// See [`Lease::valid_until`].
    pub fn valid_until(&self) -> Instant {
        self.lease.valid_until()
    }

    /// A cheap read-only view of this lock, for code that should see the
    /// lease but not release it.
    pub fn lease(&self) -> Lease {
        self.lease.clone()
    }

    /// Whether the lock was extended automatically.
    pub fn is_auto_extended(&self) -> bool {
        self.watchdog.is_some()
    }

    /// Resolves when the lease is lost; see [`Lease::lost`].
    pub fn lost(&self) -> impl Future<Output = LostLock> + Send + 'static {
        self.lease.lost()
    }

    /// Resets the lock's TTL to `ttl` on a majority of all N nodes and
    /// returns the new validity, computed from this extend's start.
    ///
    /// On failure ([`Error::ExtendFailed`], with per-node detail) nothing is
    /// deleted and the previous validity still stands: the lock expires on
    /// its old schedule unless a later extend succeeds. A lease already
    /// reported lost ([`Lease::loss`]) or whose validity has run out is not
    /// extended: [`Error::LockLost`], without a round trip; nor is one whose
    /// validity ran out while this extend was on its way (a loss is final).
    pub async fn extend(&self, ttl: Duration) -> Result<Duration, Error> {
        if self.lease.expire() {
            return Err(self.lost_error());
        }
        let span = tracing::debug_span!("extend", resource = %self.resource(), ?ttl);
        let target = self.shared.target(self.resource(), ttl)?;
        let extended = extend(&self.shared, &target, &self.lease.held(), false)
            .instrument(span.clone())
            .await
            .map_err(|failure| Error::ExtendFailed(Box::new(failure)))
            .inspect_err(|e| span.in_scope(|| tracing::debug!(error = %e, "extend failed")))?;
        // The new deadline replaces the old one even when it is earlier: a
        // shorter `ttl` shortened the keys on the nodes that answered, so the
        // old deadline is no longer backed by a majority. An extend that
        // landed after the validity ran out revives nothing.
        if !self
            .lease
            .extended(extended.valid_until, extended.expires_at)
        {
            return Err(self.lost_error());
        }
        let validity = self.validity();
        span.in_scope(|| tracing::debug!(?validity, "extended"));
        Ok(validity)
    }

    fn lost_error(&self) -> Error {
        let lost = self.lease.loss();
        // `expire` and a refused `extended` record a loss first.
        Error::LockLost(Box::new(
            lost.unwrap_or_else(|| self.lease.lost_now(LossReason::Expired)),
        ))
    }

    /// Releases the lock on every node (compare-and-delete, so a lock that
    /// expired and was taken by someone else is left alone) and reports how
    /// many nodes confirmed. Returns as soon as a majority confirmed (or
    /// could no longer confirm), and after at most one node timeout; see
    /// [`Released::pending`]. The watchdog, if any, is stopped first.
    pub async fn release(mut self) -> Released {
        self.released = true;
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.stop().await;
        }
        self.lease.lose(LossReason::Released, None);
        let span = tracing::debug_span!("release", resource = %self.resource());
        let released = release(&self.shared, &self.lease.held())
            .instrument(span.clone())
            .await;
        span.in_scope(|| {
            tracing::debug!(
                confirmed = released.confirmed,
                nodes = released.nodes,
                pending = released.pending,
                "released"
            )
        });
        released
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.lease.lose(LossReason::Released, None);
        let Some(stopping) = self.watchdog.take().and_then(Watchdog::abort) else {
            release_in_background(&self.shared, &self.lease.held());
            return;
        };
        // The release waits for the aborted watchdog to be gone, as in
        // `release`, and takes the expiry of its last extend. Without a
        // runtime there is no task to wait for either.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (shared, lease) = (Arc::clone(&self.shared), self.lease.clone());
            runtime.spawn(async move {
                let _ = stopping.await;
                release_in_background(&shared, &lease.held());
            });
        }
    }
}
