//! Fencing tokens: the public token type, and the pure arithmetic of how
//! the fences that granting nodes report become one token, and when that
//! token must be written back before it may be handed out. The protocol and
//! its proof are in DESIGN.md ("Fencing tokens"); the model check of this
//! logic, with the naive variant it must catch, is in `fence/model/`.
//!
//! The protocol this serves:
//! 1. Each node, atomically with granting the lock key, sets the fence of
//!    the resource's bucket to `fence + 1` (seeded from the client's clock
//!    when it has none) and returns it.
//! 2. The client takes `T` = the largest fence among the granting nodes.
//! 3. If fewer than a quorum of the N nodes returned `T`, the client writes
//!    `T` back (`fence = max(fence, T)`) to the granting nodes, only where
//!    its lock key is still there, and hands the guard out only once a
//!    quorum of nodes stores a fence ≥ `T`.
//!
//! Quorum intersection then gives strict monotonicity: a later acquisition
//! is granted by a quorum that shares a node with the quorum storing the
//! earlier token, and that node hands out at least that token + 1.

use std::fmt;

/// A fencing token: a number that is strictly larger for every later
/// acquisition of the same resource. Pass it with every write to storage
/// that checks it (see [`FencedStore`](crate::FencedStore)); a write
/// carrying a token lower than one the storage has already accepted comes
/// from a holder whose lease ran out, and must be rejected.
///
/// Tokens of different resources are unrelated (two resources may even get
/// the same token). They are around 1.8 × 10^15 (the first token of a
/// bucket of resources comes from the client's clock in microseconds, so
/// that tokens keep increasing even after fence state was lost; see
/// DESIGN.md) and grow by about one per acquisition attempt on any
/// resource of the bucket;
/// they fit in an `i64` column (the nodes count with `INCR`, which stops at
/// `i64::MAX`) and, for the next centuries, in a JSON number (2^53).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a number read back from storage. Tokens come from
    /// [`LockGuard::token`](crate::LockGuard::token); this is for code that
    /// stores them and compares later.
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The number, to store next to the data it protects.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> Self {
        token.0
    }
}

/// The token chosen from the fences of the granting nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Merge {
    /// The largest fence reported: the token to hand out.
    pub(crate) token: u64,
    /// How many of the granting nodes reported exactly that fence, i.e.
    /// already store it.
    pub(crate) stored: usize,
}

/// Merges the fences the granting nodes returned. `None` for no grants.
pub(crate) fn merge(fences: &[u64]) -> Option<Merge> {
    let token = *fences.iter().max()?;
    let stored = fences.iter().filter(|&&f| f == token).count();
    Some(Merge { token, stored })
}

impl Merge {
    /// Whether the token must be written back before the guard is handed
    /// out: it is on fewer than `quorum` nodes.
    pub(crate) fn needs_write_back(&self, quorum: usize) -> bool {
        self.stored < quorum
    }
}

/// A node's new fence when it grants: one more than its current one. The
/// nodes do this with `INCR`; the model check runs this copy.
#[cfg_attr(not(test), allow(dead_code))]
/// Saturating: a fence at `u64::MAX` stays there (unreachable in practice:
/// `INCR` stops at `i64::MAX` with an error).
pub(crate) fn next_fence(fence: u64) -> u64 {
    fence.saturating_add(1)
}

/// The floor of a seeded fence, 2^40: a fence below it was absent, or was
/// moved by a fenced acquire's transaction (`wire::transacted`), which
/// cannot seed, and never seeded since. Its value is never a token: every
/// script that moves a fence seeds one below this floor (`INCRBY` the
/// clock seed, as for an absent one), and an attempt whose transaction
/// returned one asks that node again with the script. The clock seed is
/// above it since 1970-01-13 (microseconds), and a seeded fence only grows.
/// The Lua scripts spell it `1099511627776`.
pub(crate) const SEEDED_FROM: u64 = 1 << 40;

/// The seed of a fence the acquire finds absent, and the floor of a
/// re-seed that could not read enough nodes:
/// this machine's wall clock in microseconds since the Unix epoch. The only
/// use of the wall clock in the crate, and not a timing decision: it only
/// makes a fresh fence start above the tokens of fences that were lost,
/// because no bucket of resources is acquired a million times a second
/// (DESIGN.md, "Fence state"). Safety while nodes keep their fences does
/// not depend on it. A clock before 1970 seeds 1.
pub(crate) fn clock_seed() -> u64 {
    seed_at(std::time::SystemTime::now())
}

/// The largest seed: far from `INCR`'s `i64` limit.
const MAX_SEED: u64 = 1 << 62;

fn seed_at(now: std::time::SystemTime) -> u64 {
    now.duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_micros()).unwrap_or(MAX_SEED))
        .clamp(1, MAX_SEED)
}

#[cfg(test)]
mod model;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_takes_the_max_and_counts_it() {
        assert_eq!(merge(&[]), None);
        assert_eq!(
            merge(&[3]),
            Some(Merge {
                token: 3,
                stored: 1
            })
        );
        assert_eq!(
            merge(&[2, 5, 5]),
            Some(Merge {
                token: 5,
                stored: 2
            })
        );
        let m = merge(&[1, 2, 1]).unwrap();
        assert_eq!(
            m,
            Merge {
                token: 2,
                stored: 1
            }
        );
        assert!(m.needs_write_back(2));
        assert!(!merge(&[4, 4]).unwrap().needs_write_back(2));
    }

    #[test]
    fn next_fence_is_monotone() {
        assert_eq!(next_fence(0), 1);
        assert_eq!(next_fence(4), 5);
        assert_eq!(next_fence(u64::MAX), u64::MAX);
    }

    #[test]
    fn seeds_are_clock_microseconds() {
        let seed = clock_seed();
        // After 2020, and far from the i64 limit.
        assert!(seed > 1_577_836_800_000_000, "{seed}");
        assert!(seed <= MAX_SEED);
        let before_1970 = std::time::UNIX_EPOCH - std::time::Duration::from_secs(1);
        assert_eq!(seed_at(before_1970), 1);
    }

    #[test]
    fn tokens_order_and_display_as_numbers() {
        let (a, b) = (FencingToken::new(7), FencingToken::new(12));
        assert!(a < b);
        assert_eq!(b.to_string(), "12");
        assert_eq!(u64::from(b), 12);
        assert_eq!(b.get(), 12);
    }
}
