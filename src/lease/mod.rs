//! The lease: a read-only view of a held lock, shared by its guard, the
//! views handed to code running under it, and its watchdog. It records the
//! validity as extends move it, and the loss, once, for good.

pub(crate) mod watchdog;

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::error::failure::QuorumFailure;
use crate::error::lost::{LossReason, LostLock};
use crate::logic::fence::FencingToken;
use crate::logic::validity::later;
use crate::observe::metrics;
use crate::protocol::shared::{Grant, Held, Target};

/// Shared between a guard, the lease views it hands out and its watchdog.
/// `changed` wakes the [`Lease::lost`] futures when the deadline moves or a
/// loss is recorded; nothing holds the status's lock across an await. (A
/// `watch` channel did the same with eight `Notify`s to wake at every
/// release and again at its drop: ~600 instructions per cycle, issue 32.)
struct LeaseState {
    resource: Arc<str>,
    token: Option<FencingToken>,
    status: Mutex<Status>,
    changed: Notify,
    held: Held,
}

#[derive(Clone)]
struct Status {
    valid_until: Instant,
    expires_at: Instant,
    /// Set once, by the first loss recorded (watchdog, release, or the
    /// validity running out, as soon as anything looks); final: no extend
    /// revives a lease once it is recorded lost or its validity ran out.
    lost: Option<LostLock>,
    /// What running out of validity is called: `Expired` without a
    /// watchdog, `Unreachable` while one runs (it failed to extend in
    /// time), `HoldLimit` once it stopped at its bound.
    ending: LossReason,
}

/// A read-only view of a held lock: its resource and how long it can still
/// be trusted. Cheap to clone; given to the closure of
/// [`Client::with_lock`](crate::Client::with_lock).
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
        let status = Mutex::new(Status {
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
                changed: Notify::new(),
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
        !self.validity().is_zero() && self.status().lost.is_none()
    }

    /// The recorded loss, if the lease has been reported lost: by its
    /// watchdog, because the guard was released, or because its validity
    /// ran out (recorded by the first look after it did: [`lost`](Self::lost),
    /// an extend, the watchdog). A loss is final: nothing extends the lease
    /// afterwards.
    pub fn loss(&self) -> Option<LostLock> {
        self.status().lost.clone()
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
            loop {
                // Registered before the status is read: a change made
                // after the read wakes it.
                let changed = lease.state.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                let (valid_until, ending) = {
                    let status = lease.status();
                    if let Some(lost) = &status.lost {
                        return lost.clone();
                    }
                    (status.valid_until, status.ending)
                };
                if valid_until <= Instant::now() {
                    lease.expire();
                    return lease
                        .loss()
                        .unwrap_or_else(|| lease.lost_lock(ending, None, Duration::ZERO));
                }
                tokio::select! {
                    () = changed => {}
                    () = tokio::time::sleep_until(valid_until.into()) => {}
                }
            }
        }
    }

    fn status(&self) -> MutexGuard<'_, Status> {
        // Nothing panics while holding it; a poisoned lock's status is
        // still whole (every change is a plain assignment).
        self.state
            .status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Changes the status under its lock; `change` says whether the
    /// [`lost`](Self::lost) futures must look again.
    fn update(&self, change: impl FnOnce(&mut Status) -> bool) -> bool {
        let changed = change(&mut self.status());
        if changed {
            self.state.changed.notify_waiters();
        }
        changed
    }

    /// What extend and release need, with the current expiry.
    pub(crate) fn held(&self) -> Held {
        Held {
            expires_at: self.status().expires_at,
            ..self.state.held.clone()
        }
    }

    /// An extend with `ttl` is about to be sent: whatever becomes of it
    /// (failed, cut off, answered late), a node may run it as late as the
    /// round's deadline, one node timeout from now, and keep the key until
    /// `ttl` after that. A release must live that long ("releases outlive
    /// the key", DESIGN.md section 2, Release); the validity is untouched.
    pub(crate) fn extending(&self, node_timeout: Duration, ttl: Duration) {
        let bound = later(later(Instant::now(), node_timeout), ttl);
        self.update(|s| {
            s.expires_at = s.expires_at.max(bound);
            // Nobody waits on the expiry: no notification.
            false
        });
    }

    /// Applies a successful extend's new validity. Refused (returns
    /// `false`) when the lease is already lost or its validity ran out
    /// before this call: a loss, once reportable, is final, even if a late
    /// extend found the keys still there.
    pub(crate) fn extended(&self, valid_until: Instant, expires_at: Instant) -> bool {
        let mut applied = false;
        let now = Instant::now();
        self.update(|s| {
            // Nodes that missed this extend keep the old expiry, and a late
            // extend still moved the keys: a release must outlive both.
            s.expires_at = s.expires_at.max(expires_at);
            if s.lost.is_some() || s.valid_until <= now {
                return false;
            }
            s.valid_until = valid_until;
            applied = true;
            true
        });
        if !applied {
            self.expire();
        }
        applied
    }

    /// Records the loss of a lease whose validity has run out (under its
    /// ending reason), unless a loss is recorded already. Returns whether
    /// the lease is lost.
    pub(crate) fn expire(&self) -> bool {
        let now = Instant::now();
        let (valid_until, ending, recorded) = {
            let s = self.status();
            (s.valid_until, s.ending, s.lost.is_some())
        };
        if recorded {
            return true;
        }
        if valid_until > now {
            return false;
        }
        let lost = self.lost_lock(ending, None, Duration::ZERO);
        self.record(lost);
        true
    }

    /// Records a loss, unless one is already recorded (the first is final).
    pub(crate) fn lose(&self, reason: LossReason, failure: Option<Box<QuorumFailure>>) {
        self.record(self.lost_lock(reason, failure, self.validity()));
    }

    /// Records `lost` unless a loss is recorded already, and reports a
    /// first loss the owner did not choose: a `warn` event with the reason
    /// (outside the status lock) and the lost-leases counter.
    fn record(&self, lost: LostLock) {
        let (reason, validity_left) = (lost.reason, lost.validity_left);
        let mut slot = Some(lost);
        let recorded = self.update(|s| {
            if s.lost.is_some() {
                return false;
            }
            s.lost = slot.take();
            true
        });
        if !recorded {
            return;
        }
        if reason == LossReason::Released {
            tracing::debug!(resource = %self.resource(), "lease released");
            return;
        }
        tracing::warn!(
            resource = %self.resource(),
            %reason,
            validity_left = ?validity_left,
            token = self.token().map(FencingToken::get),
            "lease lost"
        );
        metrics::lease_lost(reason);
    }

    /// What running out of validity will be reported as.
    pub(crate) fn set_ending(&self, ending: LossReason) {
        self.update(|s| {
            s.ending = ending;
            true
        });
    }

    /// A loss as of now, not recorded (for a caller that found none
    /// recorded where one must be).
    pub(crate) fn lost_now(&self, reason: LossReason) -> LostLock {
        self.lost_lock(reason, None, self.validity())
    }

    fn lost_lock(
        &self,
        reason: LossReason,
        failure: Option<Box<QuorumFailure>>,
        validity_left: Duration,
    ) -> LostLock {
        LostLock {
            resource: self.resource().to_owned(),
            token: self.token(),
            reason,
            at: Instant::now(),
            validity_left,
            failure,
        }
    }
}
