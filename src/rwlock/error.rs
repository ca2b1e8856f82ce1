//! What an upgrade attempt fails with: [`UpgradeError`], at once, with the
//! read guard handed back.

use std::fmt;

use super::guard::RwGuard;

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
