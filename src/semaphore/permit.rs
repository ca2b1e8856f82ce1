//! The permit guard: one slot's mutex guard, and which slot it is. Every
//! part of the lifecycle (extend, auto-extension, `lost()`, release,
//! release on drop) is the mutex's, through the [`LockGuard`] inside.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::lost::LostLock;
use crate::error::Error;
use crate::lease::Lease;
use crate::logic::fence::FencingToken;
use crate::mutex::guard::LockGuard;
use crate::protocol::release::Released;

/// One of a semaphore's K permits: slot [`slot`](Self::slot) of
/// [`semaphore`](Self::semaphore), held as that slot's lock. Release it
/// with [`release`](Self::release); dropping it releases in the
/// background, as a [`LockGuard`] does.
///
/// **What the token orders.** The fencing token is the slot's lock token:
/// strictly larger than the token of every earlier holder of *this slot*.
/// Tokens of different slots come from different counters and are not
/// comparable. A store that fences a permit's writes keys the token by the
/// slot: [`resource`](Self::resource) (`{name}:permit:{slot}`), for example
/// `FencedStore::write(permit.resource(), ..)`; a late write of an earlier
/// holder of the same slot is then refused.
#[must_use = "dropping the permit releases it at once"]
pub struct Permit {
    guard: LockGuard,
    semaphore: Arc<str>,
    slot: u32,
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("semaphore", &self.semaphore)
            .field("slot", &self.slot)
            .field("guard", &self.guard)
            .finish()
    }
}

impl Permit {
    pub(crate) fn new(guard: LockGuard, semaphore: Arc<str>, slot: u32) -> Self {
        Self {
            guard,
            semaphore,
            slot,
        }
    }

    /// The semaphore's name.
    pub fn semaphore(&self) -> &str {
        &self.semaphore
    }

    /// The slot held, in `0..K`.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The slot's resource name, `{name}:permit:{slot}`: what a fenced
    /// store keys this permit's token by, and what `inspect`,
    /// `force_release` and `redfence status` take to look at this slot.
    pub fn resource(&self) -> &str {
        self.guard.resource()
    }

    /// The fencing token: larger than every earlier holder's of this slot
    /// (see the type's documentation). `None` with fencing off.
    pub fn token(&self) -> Option<FencingToken> {
        self.guard.token()
    }

    /// Time left before the permit must be assumed lost; see
    /// [`Lease::validity`].
    pub fn validity(&self) -> Duration {
        self.guard.validity()
    }

    /// See [`Lease::valid_until`].
    pub fn valid_until(&self) -> Instant {
        self.guard.valid_until()
    }

    /// A read-only view of the slot's lease.
    pub fn lease(&self) -> Lease {
        self.guard.lease()
    }

    /// Whether the permit is extended automatically.
    pub fn is_auto_extended(&self) -> bool {
        self.guard.is_auto_extended()
    }

    /// Resolves when the permit is lost; see [`Lease::lost`].
    pub fn lost(&self) -> impl Future<Output = LostLock> + Send + 'static {
        self.guard.lost()
    }

    /// Extends the permit; see [`LockGuard::extend`].
    pub async fn extend(&self, ttl: Duration) -> Result<Duration, Error> {
        self.guard.extend(ttl).await
    }

    /// Releases the permit: the compare-and-delete of this slot's own
    /// value, nothing else (never a blind increment); see
    /// [`LockGuard::release`]. Cancel-safe as that is.
    pub async fn release(self) -> Released {
        self.guard.release().await
    }

    /// The slot's lock guard, for code written against [`LockGuard`].
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// Gives up the permit's wrapper, keeping the hold: the slot's
    /// [`LockGuard`], whose drop or release frees the permit.
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }
}
