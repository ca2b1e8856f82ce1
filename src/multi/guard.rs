//! The guard of a multi-resource lock: one mutex [`LockGuard`] per
//! resource, granted together by one attempt. Every part of the lifecycle
//! (extend, auto-extension, `lost()`, release, release on drop, the
//! restart guard) is the mutex's, applied to every resource at once.

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

use crate::error::lost::LostLock;
use crate::error::Error;
use crate::lease::Lease;
use crate::logic::fence::FencingToken;
use crate::mutex::guard::LockGuard;
use crate::protocol::release::Released;

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
    guards: Vec<LockGuard>,
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiGuard")
            .field("guards", &self.guards)
            .finish()
    }
}

impl MultiGuard {
    /// At least one guard, in the set's order (the request checks it).
    pub(crate) fn new(guards: Vec<LockGuard>) -> Self {
        Self { guards }
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

    /// The guard of `resource`, for code written against [`LockGuard`].
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

    /// Whether the resources are extended automatically.
    pub fn is_auto_extended(&self) -> bool {
        self.guards.iter().all(LockGuard::is_auto_extended)
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

    /// Extends every resource to `ttl` at once (each the mutex's extend,
    /// concurrently) and returns the set's new validity, the least of
    /// them. Fails when any resource's extend fails, with that error (the
    /// first in the set's order); the others may have been extended, which
    /// only makes them last longer, and the set's validity is still the
    /// least, so nothing is claimed that one resource lacks.
    pub async fn extend(&self, ttl: Duration) -> Result<Duration, Error> {
        let extended = futures::future::join_all(self.guards.iter().map(|g| g.extend(ttl))).await;
        for result in extended {
            result?;
        }
        Ok(self.validity())
    }

    /// Releases every resource (each the mutex's compare-and-delete,
    /// concurrently) and reports each one's outcome in the order given.
    /// Cancel-safe as [`LockGuard::release`]: cut off, each unfinished
    /// release goes on in the background.
    pub async fn release(self) -> Vec<Released> {
        futures::future::join_all(self.guards.into_iter().map(LockGuard::release)).await
    }

    /// Gives up the set's wrapper, keeping every hold: one guard per
    /// resource, each released (or dropped) on its own from then on.
    pub fn into_guards(self) -> Vec<LockGuard> {
        self.guards
    }
}
