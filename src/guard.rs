//! A held lock: the guard that owns it and the read-only lease view handed
//! to code running under it.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::client::{Client, Grant, Held, Released, Target};
use crate::error::Error;
use crate::fence::FencingToken;
use tracing::Instrument;

/// Shared between a guard and the lease views it hands out. The deadline
/// and expiry move when an extend succeeds; a std Mutex, because it is only
/// read or written, never held across an await.
struct LeaseState {
    resource: Arc<str>,
    token: Option<FencingToken>,
    times: Mutex<Times>,
    held: Held,
}

#[derive(Clone, Copy)]
struct Times {
    valid_until: Instant,
    expires_at: Instant,
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
    pub(crate) fn new(target: &Target, grant: Grant) -> Self {
        Self {
            state: Arc::new(LeaseState {
                resource: target.resource.clone(),
                token: grant.token,
                times: Mutex::new(Times {
                    valid_until: grant.valid_until,
                    expires_at: grant.held.expires_at,
                }),
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
        self.times().valid_until
    }

    /// Time left before [`valid_until`](Self::valid_until); zero once past.
    /// Computed locally, no round trip.
    pub fn validity(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// Whether any validity is left.
    pub fn is_valid(&self) -> bool {
        !self.validity().is_zero()
    }

    fn times(&self) -> Times {
        *self.state.times.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What extend and release need, with the current expiry.
    fn held(&self) -> Held {
        Held {
            expires_at: self.times().expires_at,
            ..self.state.held.clone()
        }
    }

    fn extended(&self, valid_until: Instant, expires_at: Instant) {
        let mut times = self.state.times.lock().unwrap_or_else(|p| p.into_inner());
        times.valid_until = valid_until;
        // Nodes that missed this extend keep the old expiry: a release must
        // outlive whichever is later.
        times.expires_at = times.expires_at.max(expires_at);
    }
}

/// An acquired lock. Release it with [`release`](Self::release); dropping it
/// instead schedules a best-effort release in the background on the current
/// tokio runtime (never blocking, never panicking). Either way the TTL is
/// the real guarantee: if the release cannot reach a node, the key there
/// expires on its own.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    client: Client,
    lease: Lease,
    released: bool,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("lease", &self.lease)
            .field("released", &self.released)
            .finish()
    }
}

impl LockGuard {
    pub(crate) fn new(client: Client, lease: Lease) -> Self {
        Self {
            client,
            lease,
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

    /// Resets the lock's TTL to `ttl` on a majority of all N nodes and
    /// returns the new validity, computed from this extend's start.
    ///
    /// On failure ([`Error::ExtendFailed`], with per-node detail) nothing is
    /// deleted and the previous validity still stands: the lock expires on
    /// its old schedule unless a later extend succeeds.
    pub async fn extend(&self, ttl: Duration) -> Result<Duration, Error> {
        let span = tracing::debug_span!("extend", resource = %self.resource(), ?ttl);
        let (valid_until, expires_at) = self
            .client
            .extend(self.resource(), &self.lease.held(), ttl)
            .instrument(span.clone())
            .await
            .inspect_err(|e| span.in_scope(|| tracing::debug!(error = %e, "extend failed")))?;
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
    /// [`Released::pending`].
    pub async fn release(mut self) -> Released {
        self.released = true;
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
        if !self.released {
            self.client.release_in_background(&self.lease.held());
        }
    }
}
