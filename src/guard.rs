//! A held lock: the guard that owns it and the read-only lease view handed
//! to code running under it.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::Instrument;

use crate::client::{Client, Grant, Held, Released, Target};
use crate::error::{Error, QuorumFailure};
use crate::fence::FencingToken;
use crate::lost::{LossReason, LostLock};
use crate::watchdog::Watchdog;

/// Shared between a guard, the lease views it hands out and its watchdog.
/// The status is a watch channel so that [`Lease::lost`] futures wake when
/// the deadline moves or a loss is recorded; nothing holds its lock across
/// an await.
struct LeaseState {
    resource: Arc<str>,
    token: Option<FencingToken>,
    status: watch::Sender<Status>,
    held: Held,
}

#[derive(Clone)]
struct Status {
    valid_until: Instant,
    expires_at: Instant,
    /// Set once, by the first loss recorded (watchdog, release); final.
    lost: Option<LostLock>,
    /// What running out of validity is called: `Expired` without a
    /// watchdog, `Unreachable` while one runs (it failed to extend in
    /// time), `HoldLimit` once it stopped at its bound.
    ending: LossReason,
}

/// A read-only view of a held lock: its resource and how long it can still
/// be trusted. Cheap to clone; given to the closure of
/// [`Client::with_lock`].
#[derive(Clone)]
pub struct Lease {
    state: Arc<LeaseState>,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The value is a secret (it authorises release): never printed.
        f.debug_struct("Lease")
            .field("resource", &self.resource())
            .field("token", &self.token())
            .field("validity", &self.validity())
            .finish()
    }
}

impl Lease {
    pub(crate) fn new(target: &Target, grant: Grant, watched: bool) -> Self {
        let (status, _) = watch::channel(Status {
            valid_until: grant.valid_until,
            expires_at: grant.held.expires_at,
            lost: None,
            ending: if watched {
                LossReason::Unreachable
            } else {
                LossReason::Expired
            },
        });
        Self {
            state: Arc::new(LeaseState {
                resource: target.resource.clone(),
                token: grant.token,
                status,
                held: grant.held,
            }),
        }
    }

    /// The resource name, as given to acquire.
    pub fn resource(&self) -> &str {
        &self.state.resource
    }

    /// The fencing token of this acquisition: larger than the token of every
    /// acquisition of this resource granted before this one began. Pass it
    /// with each write to storage that checks it
    /// ([`FencedStore`](crate::FencedStore), or the `postgres` feature's
    /// store). `None` when the client was built with
    /// [`fencing(false)`](crate::Builder::fencing). Extending keeps the
    /// token.
    pub fn token(&self) -> Option<FencingToken> {
        self.state.token
    }

    /// The instant, on this process's monotonic clock, after which the lock
    /// must be assumed lost: acquire (or last extend) start + TTL − drift.
    pub fn valid_until(&self) -> Instant {
        self.status().valid_until
    }

    /// Time left before [`valid_until`](Self::valid_until); zero once past.
    /// Computed locally, no round trip.
    pub fn validity(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// Whether any validity is left and no loss was recorded.
    pub fn is_valid(&self) -> bool {
        !self.validity().is_zero() && self.state.status.borrow().lost.is_none()
    }

    /// The recorded loss, if the lease has been reported lost (by its
    /// watchdog, or because the guard was released). A lease whose validity
    /// merely ran out has no recorded loss, but [`is_valid`](Self::is_valid)
    /// is false and [`lost`](Self::lost) resolves at once.
    pub fn loss(&self) -> Option<LostLock> {
        self.state.status.borrow().lost.clone()
    }

    /// Resolves when the lease ends without the holder's choice or with it:
    /// the watchdog found the lock gone or could not extend it in time, the
    /// validity ran out, or the guard was released. A task doing work under
    /// the lock can `select!` on it and stop at once; the result says why
    /// and how much validity was left when the loss became certain.
    ///
    /// The future owns what it needs (`'static`): it can be moved into a
    /// spawned task. It never resolves early; with a watchdog it resolves
    /// before the validity the client last computed runs out (within one
    /// node timeout of it), or at it when the task was starved.
    pub fn lost(&self) -> impl Future<Output = LostLock> + Send + 'static {
        let lease = self.clone();
        async move {
            let mut rx = lease.state.status.subscribe();
            loop {
                let (valid_until, ending) = {
                    let status = rx.borrow_and_update();
                    if let Some(lost) = &status.lost {
                        return lost.clone();
                    }
                    (status.valid_until, status.ending)
                };
                if valid_until <= Instant::now() {
                    return lease.lost_lock(ending, None);
                }
                tokio::select! {
                    // The sender lives in the state we hold: never closed.
                    _ = rx.changed() => {}
                    () = tokio::time::sleep_until(valid_until.into()) => {}
                }
            }
        }
    }

    fn status(&self) -> watch::Ref<'_, Status> {
        self.state.status.borrow()
    }

    /// What extend and release need, with the current expiry.
    pub(crate) fn held(&self) -> Held {
        Held {
            expires_at: self.status().expires_at,
            ..self.state.held.clone()
        }
    }

    pub(crate) fn extended(&self, valid_until: Instant, expires_at: Instant) {
        self.state.status.send_modify(|s| {
            s.valid_until = valid_until;
            // Nodes that missed this extend keep the old expiry: a release
            // must outlive whichever is later.
            s.expires_at = s.expires_at.max(expires_at);
        });
    }

    /// Records a loss, unless one is already recorded (the first is final).
    pub(crate) fn lose(&self, reason: LossReason, failure: Option<Box<QuorumFailure>>) {
        let lost = self.lost_lock(reason, failure);
        self.state.status.send_if_modified(|s| {
            if s.lost.is_some() {
                return false;
            }
            tracing::debug!(resource = %self.resource(), %reason, validity_left = ?lost.validity_left, "lease lost");
            s.lost = Some(lost);
            true
        });
    }

    /// What running out of validity will be reported as.
    pub(crate) fn set_ending(&self, ending: LossReason) {
        self.state.status.send_modify(|s| s.ending = ending);
    }

    fn lost_lock(&self, reason: LossReason, failure: Option<Box<QuorumFailure>>) -> LostLock {
        LostLock {
            resource: self.resource().to_owned(),
            token: self.token(),
            reason,
            at: Instant::now(),
            validity_left: self.validity(),
            failure,
        }
    }
}

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
    client: Client,
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
    pub(crate) fn new(client: Client, lease: Lease, watchdog: Option<Watchdog>) -> Self {
        Self {
            client,
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
    /// reported lost ([`Lease::loss`]) is not extended:
    /// [`Error::LockLost`], without a round trip.
    pub async fn extend(&self, ttl: Duration) -> Result<Duration, Error> {
        if let Some(lost) = self.lease.loss() {
            return Err(Error::LockLost(Box::new(lost)));
        }
        let span = tracing::debug_span!("extend", resource = %self.resource(), ?ttl);
        let extended = self
            .client
            .extend(self.resource(), &self.lease.held(), ttl, false)
            .instrument(span.clone())
            .await
            .inspect_err(|e| span.in_scope(|| tracing::debug!(error = %e, "extend failed")))?;
        let (valid_until, expires_at) = (extended.valid_until, extended.expires_at);
        // The new deadline replaces the old one even when it is earlier: a
        // shorter `ttl` shortened the keys on the nodes that answered, so the
        // old deadline is no longer backed by a majority.
        self.lease.extended(valid_until, expires_at);
        let validity = self.validity();
        span.in_scope(|| tracing::debug!(?validity, "extended"));
        Ok(validity)
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
        let released = self
            .client
            .release(&self.lease.held())
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
            self.client.release_in_background(&self.lease.held());
            return;
        };
        // The release waits for the aborted watchdog to be gone, as in
        // `release`, and takes the expiry of its last extend. Without a
        // runtime there is no task to wait for either.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (client, lease) = (self.client.clone(), self.lease.clone());
            runtime.spawn(async move {
                let _ = stopping.await;
                client.release_in_background(&lease.held());
            });
        }
    }
}
