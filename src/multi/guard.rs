//! The guard of a multi-resource lock: one mutex [`LockGuard`] per
//! resource, granted together by one attempt, and extended and released
//! together: one `EXTEND_ALL` and one `RELEASE_ALL` script per node for
//! the whole set (`protocol::extend`, `protocol::release_all`), and one
//! watchdog for the set when auto-extended. `lost()` and the restart
//! guard are each resource's, as the mutex's.

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

use std::sync::Arc;

use tracing::field::{self, Empty};
use tracing::Instrument;

use crate::error::lost::{LossReason, LostLock};
use crate::error::Error;
use crate::lease::watchdog::Watchdog;
use crate::lease::Lease;
use crate::logic::fence::FencingToken;
use crate::logic::quorum::quorum;
use crate::mutex::guard::LockGuard;
use crate::observe::metrics::{self, ExtendBy, ExtendOutcome};
use crate::protocol::extend::extend_all;
use crate::protocol::release::Released;
use crate::protocol::release_all::{release_all, release_all_in_background};
use crate::protocol::shared::Shared;
use crate::settings::autoextend::Schedule;

/// A multi-resource lock, made by [`Client::lock_all`](crate::Client::lock_all):
/// every resource of the set held at once, each with **its own fencing
/// token** (strictly larger than the token of every earlier holder of that
/// resource, whether it locked it alone through
/// [`Client::acquire`](crate::Client::acquire) or in a set; tokens of
/// different resources are not comparable). Release it with
/// [`release`](Self::release); dropping it releases every resource in the
/// background, as a [`LockGuard`] does.
///
/// Each resource is held as the mutex holds it (the same keys and values),
/// so [`Client::inspect`](crate::Client::inspect), `force_release` and
/// `redfence status` see each one as a held lock.
#[must_use = "dropping the guard releases every resource at once"]
pub struct MultiGuard {
    shared: Arc<Shared>,
    guards: Vec<LockGuard>,
    /// The set's watchdog, when auto-extended.
    watchdog: Option<Watchdog>,
    /// Its schedule, for guards handed over on their own.
    schedule: Option<Schedule>,
    released: bool,
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiGuard")
            .field("guards", &self.guards)
            .field("auto_extend", &self.watchdog.is_some())
            .field("released", &self.released)
            .finish()
    }
}

impl MultiGuard {
    /// At least one guard, in the set's order (the request checks it),
    /// each made by [`LockGuard::in_set`]; with `schedule`, the set's
    /// watchdog starts here.
    pub(crate) fn new(
        shared: Arc<Shared>,
        guards: Vec<LockGuard>,
        schedule: Option<Schedule>,
    ) -> Self {
        let watchdog = schedule.map(|s| {
            let leases = guards.iter().map(LockGuard::lease).collect();
            Watchdog::spawn_set(&shared, leases, s)
        });
        Self {
            shared,
            guards,
            watchdog,
            schedule,
            released: false,
        }
    }

    /// The resources, in the order given to the request.
    pub fn resources(&self) -> impl Iterator<Item = &str> + '_ {
        self.guards.iter().map(LockGuard::resource)
    }

    /// The fencing token of each resource, in the order given (`None`
    /// inside with fencing off). Pass each with the writes to what that
    /// resource protects.
    pub fn tokens(&self) -> Vec<Option<FencingToken>> {
        self.guards.iter().map(LockGuard::token).collect()
    }

    /// The fencing token of `resource`; `None` when it is not in the set
    /// (or fencing is off).
    pub fn token(&self, resource: &str) -> Option<FencingToken> {
        self.guard(resource).and_then(LockGuard::token)
    }

    /// The guard of `resource`, for code written against [`LockGuard`]
    /// (its own extend and release act on that resource alone; the set's
    /// auto-extension is the set's, so its
    /// [`is_auto_extended`](LockGuard::is_auto_extended) is `false`).
    pub fn guard(&self, resource: &str) -> Option<&LockGuard> {
        self.guards.iter().find(|g| g.resource() == resource)
    }

    /// Every resource's guard, in the order given.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// Time left before the set must be assumed lost: the least of the
    /// resources' validities (all equal after an acquire or a successful
    /// extend of the whole set).
    pub fn validity(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// The earliest of the resources' [`Lease::valid_until`].
    pub fn valid_until(&self) -> Instant {
        self.guards
            .iter()
            .map(LockGuard::valid_until)
            .min()
            .unwrap_or_else(Instant::now)
    }

    /// One lease per resource, in the order given: read-only views for
    /// code that runs under the lock.
    pub fn leases(&self) -> Vec<Lease> {
        self.guards.iter().map(LockGuard::lease).collect()
    }

    /// Whether the set is extended automatically (one watchdog for the
    /// set, each extension every resource at once).
    pub fn is_auto_extended(&self) -> bool {
        self.watchdog.is_some()
    }

    /// Resolves when any resource's lease is lost (see [`Lease::lost`]):
    /// the set is held only while every resource is.
    pub fn lost(&self) -> impl Future<Output = LostLock> + Send + 'static {
        let losses: Vec<_> = self.guards.iter().map(|g| Box::pin(g.lost())).collect();
        async move {
            if losses.is_empty() {
                // Never made (a set has at least one resource); `select_all`
                // would panic on it.
                return futures::future::pending().await;
            }
            futures::future::select_all(losses).await.0
        }
    }

    /// Extends every resource to `ttl` at once, with one script per node
    /// that extends every key of the set there or none (so an extension
    /// never leaves a node holding part of the set), on a majority of all
    /// N nodes, and returns the set's new validity, computed from this
    /// extend's start. A node counts only when it extended every key.
    ///
    /// On failure ([`Error::ExtendFailed`], with per-node detail) nothing
    /// is deleted and the previous validity still stands, as for
    /// [`LockGuard::extend`]; a set with any resource reported lost, or
    /// whose validity ran out, is not extended: [`Error::LockLost`].
    pub async fn extend(&self, ttl: Duration) -> Result<Duration, Error> {
        let started = Instant::now();
        let span = tracing::debug_span!(
            "extend",
            resource = %self.names(),
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
            Ok(granted) => {
                span.record("granted", granted)
                    .record("quorum", quorum(self.shared.nodes.len()))
                    .record("outcome", "extended");
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
                if error.is_lost() {
                    span.record("outcome", "lost");
                    ExtendOutcome::Lost
                } else {
                    span.record("outcome", "failed");
                    ExtendOutcome::Failed
                }
            }
        };
        metrics::extend(ExtendBy::Caller, outcome);
        extended.map(|_| self.validity())
    }

    /// [`extend`](Self::extend) inside its span: the nodes that extended.
    async fn extend_inner(&self, ttl: Duration) -> Result<usize, Error> {
        let leases = self.leases();
        // Each records its own loss: every one is looked at.
        if leases.iter().fold(false, |lost, l| l.expire() | lost) {
            return Err(self.lost_error(&leases));
        }
        let Some(first) = leases.first() else {
            return Ok(0);
        };
        let target = self.shared.target(first.resource(), ttl)?;
        for lease in &leases {
            lease.extending(self.shared.config.node_timeout, target.ttl.duration());
        }
        let keys: Vec<_> = leases.iter().map(|l| l.held().key).collect();
        let extended = extend_all(&self.shared, &target, &first.held(), &keys, false)
            .await
            .map_err(|failure| Error::ExtendFailed(Box::new(failure)))?;
        // As the mutex's: the new deadline replaces the old one, and an
        // extend that landed after the validity ran out revives nothing.
        let applied = leases.iter().fold(true, |all, lease| {
            lease.extended(extended.valid_until, extended.expires_at) & all
        });
        if !applied {
            return Err(self.lost_error(&leases));
        }
        Ok(extended.granted)
    }

    /// The first recorded loss among `leases`.
    fn lost_error(&self, leases: &[Lease]) -> Error {
        // `expire` and a refused `extended` record a loss first.
        let lost = leases
            .iter()
            .find_map(Lease::loss)
            .unwrap_or_else(|| LostLock {
                resource: self.names(),
                token: None,
                reason: LossReason::Expired,
                at: Instant::now(),
                validity_left: Duration::ZERO,
                failure: None,
            });
        Error::LockLost(Box::new(lost))
    }

    /// The resources' names joined, for spans.
    fn names(&self) -> String {
        self.resources().collect::<Vec<_>>().join(", ")
    }

    /// Releases every resource with one script per node (compare-and-delete
    /// of every key of the set that still holds this guard's value, and
    /// each resource's notice to its waiters) and reports each resource's
    /// outcome in the order given. Returns as soon as each resource is
    /// deleted on a majority (or no longer can be), after one node timeout
    /// at most; see
    /// [`Released::pending`]. A resource that fair-queue waiters wait for
    /// gets the mutex's full release on its home node, which names the
    /// next one. The set's watchdog, if any, is stopped first.
    ///
    /// Cancel-safe as [`LockGuard::release`]: cut off, the release goes on
    /// in the background.
    pub async fn release(mut self) -> Vec<Released> {
        // Until the release is under way, a cut-off drops the guard
        // unreleased, and `Drop` releases in the background.
        if let Some(watchdog) = self.watchdog.as_mut() {
            watchdog.stop().await;
        }
        self.watchdog = None;
        self.released = true;
        let helds = self.guards.iter_mut().map(LockGuard::relinquish).collect();
        let started = Instant::now();
        let span = tracing::debug_span!(
            "release",
            resource = %self.names(),
            confirmed = Empty,
            elapsed = Empty,
        );
        let released = release_all(&self.shared, helds)
            .instrument(span.clone())
            .await;
        let confirmed = released.iter().map(|r| r.confirmed).min().unwrap_or(0);
        span.record("confirmed", confirmed)
            .record("elapsed", field::debug(started.elapsed()));
        span.in_scope(|| tracing::debug!(confirmed, "released"));
        released
    }

    /// Gives up the set's wrapper, keeping every hold: one guard per
    /// resource, each released (or dropped) on its own from then on.
    /// With auto-extension each guard gets its own watchdog, with the
    /// set's schedule (from then on each resource is extended on its own).
    pub fn into_guards(mut self) -> Vec<LockGuard> {
        self.released = true;
        if let Some(watchdog) = self.watchdog.take() {
            // The set's extension in flight may still land: it only
            // extends keys the guards still hold.
            drop(watchdog.abort());
        }
        let mut guards = std::mem::take(&mut self.guards);
        if let Some(schedule) = self.schedule {
            for guard in &mut guards {
                guard.watch(schedule);
            }
        }
        guards
    }
}

impl Drop for MultiGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let helds: Vec<_> = self.guards.iter_mut().map(LockGuard::relinquish).collect();
        let Some(stopping) = self.watchdog.take().and_then(Watchdog::abort) else {
            release_all_in_background(&self.shared, helds);
            return;
        };
        // The release waits for the aborted watchdog to be gone, as the
        // mutex guard's drop does, and takes the expiry of its last
        // extend.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let shared = Arc::clone(&self.shared);
            let leases = self.leases();
            runtime.spawn(async move {
                let _ = stopping.await;
                let helds = leases.iter().map(Lease::held).collect();
                release_all_in_background(&shared, helds);
            });
        }
    }
}
