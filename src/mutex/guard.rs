//! The guard that owns a held lock: it extends on request, releases, and
//! owns the watchdog task when the lock is auto-extended. Dropping it never
//! blocks: the release goes to a background task.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::field::{self, Empty};
use tracing::Instrument;

use crate::error::lost::{LossReason, LostLock};
use crate::error::Error;
use crate::lease::watchdog::Watchdog;
use crate::lease::Lease;
use crate::logic::fence::FencingToken;
use crate::logic::quorum::quorum;
use crate::observe::metrics::{self, ExtendBy, ExtendOutcome};
use crate::observe::span::{unseen, within};
use crate::protocol::extend::extend;
use crate::protocol::release::{release, release_in_background, Released};
use crate::protocol::shared::{Grant, Held, Shared, Target};
use crate::settings::autoextend::Schedule;

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

    /// The guard of one resource of a multi-resource set: no watchdog of
    /// its own (the set's extends every resource at once); `watched` says
    /// whether the set has one (what running out is reported as).
    pub(crate) fn in_set(
        shared: Arc<Shared>,
        target: &Target,
        grant: Grant,
        watched: bool,
    ) -> Self {
        Self {
            lease: Lease::new(target, grant, watched),
            shared,
            watchdog: None,
            released: false,
        }
    }

    /// Starts this guard's own watchdog (a set's guard handed over on its
    /// own, with the set's schedule).
    pub(crate) fn watch(&mut self, schedule: Schedule) {
        if self.watchdog.is_none() && !self.released {
            self.watchdog = Some(Watchdog::spawn(&self.shared, self.lease.clone(), schedule));
        }
    }

    /// Gives the hold up to the caller, which releases it (a set's release
    /// of every resource at once): records the lease as released and hands
    /// back what the release needs. The guard's drop then does nothing.
    /// Any watchdog of its own is aborted.
    pub(crate) fn relinquish(&mut self) -> Held {
        if let Some(watchdog) = self.watchdog.take() {
            drop(watchdog.abort());
        }
        self.released = true;
        self.lease.lose(LossReason::Released, None);
        self.lease.held()
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
        let started = Instant::now();
        let span = tracing::debug_span!(
            "extend",
            resource = %self.resource(),
            ?ttl,
            by = "caller",
            granted = Empty,
            quorum = Empty,
            elapsed = Empty,
            outcome = Empty,
            reason = Empty,
        );
        let extended = self.extend_inner(ttl).instrument(span.clone()).await;
        span.record("elapsed", field::debug(started.elapsed()));
        let outcome = match &extended {
            Ok((validity, granted)) => {
                span.record("granted", granted)
                    .record("quorum", quorum(self.shared.nodes.len()))
                    .record("outcome", "extended");
                span.in_scope(|| tracing::debug!(?validity, "extended"));
                ExtendOutcome::Extended
            }
            Err(error) => {
                if let Some(failure) = error.quorum_failure() {
                    span.record("granted", failure.granted)
                        .record("quorum", failure.quorum)
                        .record("reason", field::display(failure.reason));
                } else {
                    span.record("reason", field::display(error));
                }
                let (outcome, label) = if error.is_lost() {
                    (ExtendOutcome::Lost, "lost")
                } else {
                    (ExtendOutcome::Failed, "failed")
                };
                span.record("outcome", label);
                span.in_scope(|| tracing::debug!(%error, "extend failed"));
                outcome
            }
        };
        metrics::extend(ExtendBy::Caller, outcome);
        extended.map(|(validity, _)| validity)
    }

    /// [`extend`](Self::extend) inside its span: the new validity and the
    /// nodes that extended.
    async fn extend_inner(&self, ttl: Duration) -> Result<(Duration, usize), Error> {
        if self.lease.expire() {
            return Err(self.lost_error());
        }
        let target = self.shared.target(self.resource(), ttl)?;
        self.lease
            .extending(self.shared.config.node_timeout, target.ttl.duration());
        let extended = extend(&self.shared, &target, &self.lease.held(), false)
            .await
            .map_err(|failure| Error::ExtendFailed(Box::new(failure)))?;
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
        Ok((self.validity(), extended.granted))
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
    /// [`Released::pending`]. With waiters in the fair queue, the home
    /// node may instead hand the lock over to the next one, which then
    /// replaces our keys on the other nodes; see [`Released::handed_over`].
    /// The watchdog, if any, is stopped first.
    ///
    /// Cancel-safe: dropped at any await point (a `timeout`, a `select!`),
    /// the release still happens, in the background, as for a dropped
    /// guard (`tests/it/cancellation.rs` cuts it at every await point).
    pub async fn release(mut self) -> Released {
        // Until the release is under way, cancelling this future drops the
        // guard unreleased, and `Drop` releases in the background; the
        // watchdog stays in `self.watchdog` until it is gone, so that drop
        // waits for it too. (Marking the guard released before this await,
        // as before issue 31, left a cut-off release with nothing sent:
        // the lock stayed for its TTL.)
        if let Some(watchdog) = self.watchdog.as_mut() {
            watchdog.stop().await;
        }
        self.watchdog = None;
        // From here `release` owns the job: cut off, its own guard
        // (`ReleaseOnDrop`) sends it again in the background.
        self.released = true;
        self.lease.lose(LossReason::Released, None);
        let span = tracing::debug_span!(
            "release",
            resource = %self.resource(),
            confirmed = Empty,
            nodes = Empty,
            pending = Empty,
            handed_over = Empty,
            elapsed = Empty,
        );
        // Read only for a span someone sees: a clock read per release less.
        let started = (!unseen(&span)).then(Instant::now);
        let released = within(release(&self.shared, &self.lease.held()), &span).await;
        if let Some(started) = started {
            span.record("confirmed", released.confirmed)
                .record("nodes", released.nodes)
                .record("pending", released.pending)
                .record("handed_over", released.handed_over)
                .record("elapsed", field::debug(started.elapsed()));
        }
        span.in_scope(|| {
            tracing::debug!(
                confirmed = released.confirmed,
                nodes = released.nodes,
                pending = released.pending,
                handed_over = released.handed_over,
                "released"
            )
        });
        released
    }
}

impl LockGuard {
    /// Gives the hold up without releasing it: stops the watchdog, records
    /// the lease as released (its `lost()` resolves) and hands back what
    /// the lock needs to be released (`Lease::held`), which the caller now
    /// owns. A
    /// read-write lock's downgrade converts the writer's keys into a
    /// reader's this way (`rwlock::convert`). Cancel-safe: cut off while
    /// the watchdog stops, the guard is dropped and releases as usual.
    pub(crate) async fn disown(mut self) -> Lease {
        if let Some(watchdog) = self.watchdog.as_mut() {
            watchdog.stop().await;
        }
        self.watchdog = None;
        self.released = true;
        self.lease.lose(LossReason::Released, None);
        self.lease.clone()
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
