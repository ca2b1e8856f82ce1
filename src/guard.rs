//! A held lock: the guard that owns it and the read-only lease view handed
//! to code running under it.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::client::{Client, Grant, Released, Target};
use crate::error::Error;

/// Shared between a guard and the lease views it hands out. The deadline
/// moves when an extend succeeds; a std Mutex, because it is only read or
/// written, never held across an await.
struct LeaseState {
    resource: Arc<str>,
    key: Arc<str>,
    value: Arc<str>,
    valid_until: Mutex<Instant>,
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
            .field("validity", &self.validity())
            .finish()
    }
}

impl Lease {
    pub(crate) fn new(target: &Target, grant: Grant) -> Self {
        Self {
            state: Arc::new(LeaseState {
                resource: target.resource.clone(),
                key: target.key.clone(),
                value: grant.value,
                valid_until: Mutex::new(grant.valid_until),
            }),
        }
    }

    /// The resource name, as given to acquire.
    pub fn resource(&self) -> &str {
        &self.state.resource
    }

    /// The instant, on this process's monotonic clock, after which the lock
    /// must be assumed lost: acquire (or last extend) start + TTL − drift.
    pub fn valid_until(&self) -> Instant {
        *self
            .state
            .valid_until
            .lock()
            .unwrap_or_else(|p| p.into_inner())
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

    fn set_valid_until(&self, until: Instant) {
        *self
            .state
            .valid_until
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = until;
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
        let state = &self.lease.state;
        let until = self
            .client
            .extend(&state.resource, &state.key, &state.value, ttl)
            .await?;
        // The new deadline replaces the old one even when it is earlier: a
        // shorter `ttl` shortened the keys on the nodes that answered, so the
        // old deadline is no longer backed by a majority.
        self.lease.set_valid_until(until);
        Ok(self.validity())
    }

    /// Releases the lock on every node (compare-and-delete, so a lock that
    /// expired and was taken by someone else is left alone) and reports how
    /// many nodes confirmed. Returns as soon as a majority confirmed (or
    /// could no longer confirm), and after at most one node timeout; see
    /// [`Released::pending`].
    pub async fn release(mut self) -> Released {
        self.released = true;
        let state = &self.lease.state;
        self.client.release(&state.key, &state.value).await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.released {
            let state = &self.lease.state;
            self.client.release_in_background(&state.key, &state.value);
        }
    }
}
