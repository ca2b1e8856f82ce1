//! The guard of a read or write hold: the mutex's [`LockGuard`] over the
//! rw entry (the writer key or the reader's entry), so extend,
//! auto-extension, `lost()`, release and release on drop are the mutex's;
//! plus the mode, the downgrade and the refused upgrade ([`UpgradeError`],
//! which hands the read guard back).

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use super::convert::downgrade;
use super::keys::RwKeys;
use super::target::{rw_target, RwMode};
use crate::error::failure::FailureReason;
use crate::error::lost::{LossReason, LostLock};
use crate::error::Error;
use crate::mutex::guard::LockGuard;
use crate::protocol::release::Released;
use crate::protocol::shared::Shared;
use crate::settings::autoextend::Schedule;

/// A read or write hold of a [`RwLock`](crate::RwLock). Everything a
/// [`LockGuard`] does is here through `Deref` (`token`, `validity`,
/// `lease`, `lost`, `extend`); release with [`release`](Self::release),
/// or drop to release in the background.
///
/// **What the token orders** (with fencing on), as Chubby's sequencer:
/// the pair ([`mode`](Self::mode), token).
/// - A write's token is strictly larger than the token of every write and
///   every read of this lock granted before it.
/// - A read's token is the *generation* it saw: the token of the last
///   write granted before it (at least), and smaller than the token of
///   every write granted after it. Reads of one generation share it.
///
/// So a store keyed by [`resource`](LockGuard::resource) (the lock's
/// name) refuses a write whose token is below the largest it accepted
/// (a late writer), and can refuse a read whose token is below the last
/// write's (a reader whose lease ran out while a writer came and went).
#[must_use = "dropping the guard releases the lock at once"]
pub struct RwGuard {
    guard: LockGuard,
    mode: RwMode,
    shared: Arc<Shared>,
    keys: Arc<RwKeys>,
    ttl: Duration,
    schedule: Option<Schedule>,
}

impl fmt::Debug for RwGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwGuard")
            .field("mode", &self.mode)
            .field("guard", &self.guard)
            .finish()
    }
}

impl Deref for RwGuard {
    type Target = LockGuard;

    fn deref(&self) -> &LockGuard {
        &self.guard
    }
}

impl RwGuard {
    pub(crate) fn new(
        guard: LockGuard,
        mode: RwMode,
        shared: Arc<Shared>,
        keys: Arc<RwKeys>,
        ttl: Duration,
        schedule: Option<Schedule>,
    ) -> Self {
        Self {
            guard,
            mode,
            shared,
            keys,
            ttl,
            schedule,
        }
    }

    /// Read or write.
    pub fn mode(&self) -> RwMode {
        self.mode
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.keys.name
    }

    /// Releases the hold (compare-and-delete of this holder's own entry);
    /// see [`LockGuard::release`]. Cancel-safe as that is.
    pub async fn release(self) -> Released {
        self.guard.release().await
    }

    /// The inner guard, for code written against [`LockGuard`] (its drop
    /// or release frees this hold).
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }

    /// A writer becomes a reader without a gap: on each node the writer
    /// key becomes a reader entry in one script, so other writers stay out
    /// throughout and other readers may come in as soon as it is done. The
    /// read keeps the write's token (the generation it wrote) and the
    /// guard's TTL and auto-extension; its validity counts from the
    /// downgrade's start. A reader's downgrade returns it unchanged.
    ///
    /// When fewer than a majority convert, the write was no longer held
    /// by a majority: [`Error::LockLost`], and everything is released.
    pub async fn downgrade(self) -> Result<RwGuard, Error> {
        if self.mode == RwMode::Read {
            return Ok(self);
        }
        let Self {
            guard,
            shared,
            keys,
            ttl,
            schedule,
            ..
        } = self;
        let target = rw_target(&shared, &keys, RwMode::Read, rand::random(), ttl)?;
        let lease = guard.disown().await;
        let token = lease.token();
        match downgrade(&shared, &keys, &target, &lease.held(), token).await {
            Ok(grant) => {
                let guard = LockGuard::new(Arc::clone(&shared), &target, grant, schedule);
                Ok(Self::new(guard, RwMode::Read, shared, keys, ttl, schedule))
            }
            Err(failure) => {
                let reason = match failure.reason {
                    FailureReason::NotHeld => LossReason::NotHeld,
                    _ => LossReason::Unreachable,
                };
                Err(Error::LockLost(Box::new(LostLock {
                    resource: keys.name.to_string(),
                    token,
                    reason,
                    at: std::time::Instant::now(),
                    validity_left: lease.validity(),
                    failure: Some(Box::new(failure)),
                })))
            }
        }
    }

    /// A reader asking to become a writer: refused at once with
    /// [`UpgradeError`], which hands the read guard back (see there why).
    /// A writer's upgrade returns it unchanged.
    pub fn upgrade(self) -> Result<RwGuard, UpgradeError> {
        match self.mode {
            RwMode::Write => Ok(self),
            RwMode::Read => Err(UpgradeError::new(self)),
        }
    }
}

/// A reader asked to become a writer ([`RwGuard::upgrade`]). Refused at
/// once, never waited for: two readers upgrading would each wait for the
/// other to leave (the deadlock Curator's and Redisson's users meet). The
/// read lock is still held, in [`into_guard`](Self::into_guard); to write,
/// release it and acquire the write lock (a writer's token then tells
/// storage that the generation moved on).
pub struct UpgradeError {
    guard: Box<RwGuard>,
}

impl UpgradeError {
    pub(crate) fn new(guard: RwGuard) -> Self {
        Self {
            guard: Box::new(guard),
        }
    }

    /// The read guard, still held.
    pub fn into_guard(self) -> RwGuard {
        *self.guard
    }
}

impl fmt::Debug for UpgradeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpgradeError")
            .field("name", &self.guard.name())
            .finish()
    }
}

impl fmt::Display for UpgradeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "read lock on {:?} cannot be upgraded to a write lock: release it, then acquire the write lock",
            self.guard.name()
        )
    }
}

impl std::error::Error for UpgradeError {}
