//! Semaphores: K permits across the N nodes, each permit one of K slots and
//! each slot a mutex of this crate (`{name}:permit:{i}`). A permit is
//! therefore a slot's [`LockGuard`](crate::LockGuard) and has its whole
//! lifecycle and its fencing token; never more than K holders follows from
//! each slot's exclusion (DESIGN.md, section "Semaphores", has the proof and
//! the per-node counter that fails it).
//!
//! - `slots`: the slot names, the checks on a name and on K, a pass's
//!   order (pure);
//! - `request`: [`SemaphoreRequest`]: a pass over the slots, the waiters'
//!   line and the claim, waiting for a release of any slot;
//! - `permit`: [`Permit`], the guard;
//! - `model` (tests): the bound's model checker, with the per-node counter
//!   as its negative control.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::lease::Lease;
use crate::observe::inspect::Inspection;
use crate::protocol::shared::Shared;

#[cfg(test)]
mod model;
mod permit;
mod request;
mod slots;

pub use permit::Permit;
pub use request::SemaphoreRequest;

/// A semaphore of K permits, made by
/// [`Client::semaphore`](crate::Client::semaphore): a cheap handle (the
/// client's `Arc`, the name and its K slot names), validated when made.
///
/// **K is part of the name's contract**: every client must use the same K
/// for one name. The slots are what is shared, not a count, so a client
/// with another K still never breaks *its* slots' exclusion, and the number
/// of holders is bounded by the largest K in use: a client asking K = 2
/// of a semaphore held with K = 3 uses slots 0 and 1 only, and the holder
/// of slot 2 keeps it until it releases (or its TTL ends), so until then
/// up to 3 hold. Lowering K therefore takes effect as the holders of the
/// slots at or above the new K leave; raising it, at once.
///
/// A mutex on a resource named `{name}:permit:{i}` *is* slot `i` of
/// semaphore `name`, and `{name}:queue` is its waiters' line (see
/// [`SemaphoreRequest::acquire`]): keep such names for the semaphore (an
/// operator can use them with [`Client::inspect`](crate::Client::inspect)
/// or `force_release`).
#[derive(Clone)]
pub struct Semaphore {
    shared: Arc<Shared>,
    name: Arc<str>,
    slots: Arc<[String]>,
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.name)
            .field("permits", &self.slots.len())
            .finish()
    }
}

impl Semaphore {
    /// Most permits a semaphore may have: 1024 (each waiting client listens
    /// to every slot, and a contended pass may try every slot).
    pub const MAX_PERMITS: u32 = slots::MAX_PERMITS;

    pub(crate) fn new(shared: Arc<Shared>, name: &str, permits: u32) -> Result<Self, Error> {
        slots::check(name, permits)?;
        let slots = (0..permits)
            .map(|i| slots::slot_resource(name, i))
            .collect();
        Ok(Self {
            shared,
            name: name.into(),
            slots,
        })
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// K, the number of permits.
    pub fn permits(&self) -> u32 {
        u32::try_from(self.slots.len()).unwrap_or(u32::MAX)
    }

    /// The resource name of slot `slot` (`{name}:permit:{slot}`), `None`
    /// beyond K: what a store keys that slot's tokens by.
    pub fn slot_resource(&self, slot: u32) -> Option<&str> {
        self.slots.get(slot as usize).map(String::as_str)
    }

    /// Starts a permit request with lease `ttl`, to configure (retry,
    /// auto-extension) before acquiring.
    pub fn permit(&self, ttl: Duration) -> SemaphoreRequest {
        SemaphoreRequest::new(
            Arc::clone(&self.shared),
            self.name.clone(),
            self.slots.clone(),
            ttl,
        )
    }

    /// Acquires a permit for `ttl`, waiting under the client's retry
    /// policy; see [`SemaphoreRequest::acquire`].
    pub async fn acquire(&self, ttl: Duration) -> Result<Permit, Error> {
        self.permit(ttl).acquire().await
    }

    /// One pass over the slots, no waiting: `Ok(None)` when all K are held
    /// by others; see [`SemaphoreRequest::try_acquire`].
    pub async fn try_acquire(&self, ttl: Duration) -> Result<Option<Permit>, Error> {
        self.permit(ttl).try_acquire().await
    }

    /// Acquires a permit, runs `f` holding it, releases; see
    /// [`SemaphoreRequest::run`].
    pub async fn with_permit<F, Fut, T>(&self, ttl: Duration, f: F) -> Result<T, Error>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = T>,
    {
        self.permit(ttl).run(f).await
    }

    /// Every slot's lock on every node, in slot order, read at once (see
    /// [`Client::inspect`](crate::Client::inspect)): a slot with a
    /// majority holder is a permit held. A snapshot for operators.
    pub async fn inspect(&self) -> Result<Vec<Inspection>, Error> {
        let reads = self
            .slots
            .iter()
            .map(|slot| crate::protocol::inspect::inspect(&self.shared, slot));
        futures::future::join_all(reads).await.into_iter().collect()
    }

    /// How many permits are held, from [`inspect`](Self::inspect): the
    /// slots with a majority holder.
    pub async fn held(&self) -> Result<usize, Error> {
        Ok(self
            .inspect()
            .await?
            .iter()
            .filter(|i| i.holder.is_some())
            .count())
    }
}
