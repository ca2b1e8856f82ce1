//! How a lease ends when its holder did not choose to end it: the lost-lock
//! signal's payload. Pure data; the guard and the watchdog produce it.

use std::fmt;
use std::time::{Duration, Instant};

use crate::error::failure::QuorumFailure;
use crate::logic::fence::FencingToken;

/// Why a lease ended, as reported by [`Lease::lost`](crate::Lease::lost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// An extend found the key gone or another owner's on so many nodes that
    /// a majority is out of reach: someone else may hold the lock now.
    NotHeld,
    /// An extend found another owner's value on a node: someone else was
    /// granted the lock there (our key expired early or the node restarted),
    /// so the lease can no longer be trusted, even if a majority extended.
    TakenOver,
    /// The watchdog could not extend on a majority of nodes, retrying, before
    /// the validity ran out (nodes down, paused or partitioned away).
    Unreachable,
    /// The validity ran out without an extension (no watchdog, or nobody
    /// extended in time).
    Expired,
    /// The watchdog stopped extending because the lease reached its bound
    /// ([`AutoExtend::with_max_hold`](crate::AutoExtend::with_max_hold) or
    /// [`with_max_extensions`](crate::AutoExtend::with_max_extensions)), and
    /// the last validity then ran out.
    HoldLimit,
    /// The guard was released or dropped: the owner ended the lease.
    Released,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LossReason::NotHeld => "no longer held on a majority of nodes",
            LossReason::TakenOver => "another owner holds it on a node",
            LossReason::Unreachable => "could not extend on a majority before the validity ran out",
            LossReason::Expired => "validity ran out without an extension",
            LossReason::HoldLimit => "auto-extension reached its hold limit",
            LossReason::Released => "released by its owner",
        })
    }
}

/// A lease that ended: which, why, and when. Carried by
/// [`Error::LockLost`](crate::Error::LockLost) and returned by
/// [`Lease::lost`](crate::Lease::lost).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LostLock {
    /// The resource, as the caller named it.
    pub resource: String,
    /// The fencing token of the lost acquisition, if fencing is on.
    pub token: Option<FencingToken>,
    /// Why the lease ended.
    pub reason: LossReason,
    /// When the loss became certain, on this process's monotonic clock.
    pub at: Instant,
    /// The validity the client had computed that was still left at `at`:
    /// positive when the loss was detected early (an extend that found the
    /// key gone, or could no longer reach a majority in time), zero when the
    /// validity simply ran out. Until `at + validity_left` no other owner
    /// can have been granted the lock through a majority that includes
    /// honest nodes; after it, anyone may hold it.
    pub validity_left: Duration,
    /// The last failed extend, when one caused the loss (also the error's
    /// [`source`](std::error::Error::source)).
    pub failure: Option<Box<QuorumFailure>>,
}

impl fmt::Display for LostLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lock on {:?} lost: {}", self.resource, self.reason)?;
        if !self.validity_left.is_zero() {
            write!(f, " ({:?} of validity left)", self.validity_left)?;
        }
        Ok(())
    }
}

/// The failed extend that caused the loss, if one did, is the source.
impl std::error::Error for LostLock {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.failure
            .as_deref()
            .map(|f| f as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_resource_reason_and_margin() {
        let mut lost = LostLock {
            resource: "orders".into(),
            token: None,
            reason: LossReason::Unreachable,
            at: Instant::now(),
            validity_left: Duration::from_millis(250),
            failure: None,
        };
        assert_eq!(
            lost.to_string(),
            "lock on \"orders\" lost: could not extend on a majority before the validity ran out (250ms of validity left)"
        );
        lost.reason = LossReason::Expired;
        lost.validity_left = Duration::ZERO;
        assert_eq!(
            lost.to_string(),
            "lock on \"orders\" lost: validity ran out without an extension"
        );
    }
}
