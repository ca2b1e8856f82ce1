//! The pure part of a semaphore: the names of its K slots, the checks on
//! the name and on K, and the order in which a pass tries the slots. No
//! I/O; tested here.

use crate::error::Error;
use crate::logic::limits::MAX_RESOURCE_LEN;
use crate::logic::resource::validate;

/// Most permits a semaphore may have. Each waiting client listens to
/// every slot's notices and a contended pass may try every slot, so K is
/// meant to be small (tens); 1024 leaves room without letting a typo
/// subscribe a million channels.
pub(crate) const MAX_PERMITS: u32 = 1024;

/// Between a semaphore's name and a slot's index: slot `i` of semaphore
/// `name` is the lock of resource `{name}:permit:{i}`.
pub(crate) const SEPARATOR: &str = ":permit:";

/// The resource name of slot `slot` of semaphore `name`. The index is the
/// text after the *last* separator and has no separator in it, so two
/// semaphores (whatever their names) never share a slot.
pub(crate) fn slot_resource(name: &str, slot: u32) -> String {
    format!("{name}{SEPARATOR}{slot}")
}

/// The resource name of semaphore `name`'s waiting line: a mutex taken by
/// the waiter whose turn it is to try the slots (`{name}:queue`, shorter
/// than any slot's name, so [`check`] covers it).
pub(crate) fn queue_resource(name: &str) -> String {
    format!("{name}:queue")
}

/// Checks a semaphore's name and number of permits: K in 1..=MAX_PERMITS,
/// and every slot's resource name a valid one (non-empty name, the longest
/// slot name within [`MAX_RESOURCE_LEN`]).
pub(crate) fn check(name: &str, permits: u32) -> Result<(), Error> {
    if permits == 0 {
        return Err(Error::InvalidPermits {
            permits,
            reason: "a semaphore needs at least one permit",
        });
    }
    if permits > MAX_PERMITS {
        return Err(Error::InvalidPermits {
            permits,
            reason: "more than Semaphore::MAX_PERMITS (1024)",
        });
    }
    if name.is_empty() {
        return Err(Error::InvalidResource("must not be empty"));
    }
    let longest = slot_resource(name, permits - 1);
    if longest.len() > MAX_RESOURCE_LEN {
        return Err(Error::InvalidResource(
            "too long for its permits' names (name + \":permit:\" + index, at most 1024 bytes)",
        ));
    }
    validate(&longest).map_err(Error::InvalidResource)
}

/// The slots a pass tries, in order: all K, from `start` round the ring.
/// A random start spreads clients over the slots, so that with permits
/// free the first attempt nearly always lands on a free one.
pub(crate) fn pass_order(start: u32, permits: u32) -> impl Iterator<Item = u32> {
    (0..permits).map(move |i| (start % permits + i) % permits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_names_never_collide_across_semaphores() {
        // Names that end like a slot: `a:permit:1` slot 0 vs `a` slot 1.
        let mut seen = std::collections::HashSet::new();
        for name in ["a", "a:permit:1", "a:permit", "a:permit:", "a:permit:10"] {
            for slot in 0..12 {
                let resource = slot_resource(name, slot);
                // The slot is recovered from the last separator.
                let (got_name, got_slot) = resource.rsplit_once(SEPARATOR).unwrap();
                assert_eq!((got_name, got_slot), (name, slot.to_string().as_str()));
                assert!(seen.insert(resource));
            }
        }
    }

    #[test]
    fn bad_names_and_counts_are_refused() {
        assert!(matches!(
            check("x", 0),
            Err(Error::InvalidPermits { permits: 0, .. })
        ));
        assert!(matches!(
            check("x", MAX_PERMITS + 1),
            Err(Error::InvalidPermits { .. })
        ));
        assert!(matches!(check("", 3), Err(Error::InvalidResource(_))));
        let long = "x".repeat(MAX_RESOURCE_LEN - SEPARATOR.len() - 1);
        assert!(check(&long, 10).is_ok());
        assert!(matches!(check(&long, 11), Err(Error::InvalidResource(_))));
        assert!(check("backup", MAX_PERMITS).is_ok());
    }

    #[test]
    fn a_pass_tries_every_slot_once() {
        for permits in 1..8 {
            for start in 0..20 {
                let mut order: Vec<u32> = pass_order(start, permits).collect();
                assert_eq!(order[0], start % permits);
                order.sort_unstable();
                assert_eq!(order, (0..permits).collect::<Vec<_>>());
            }
        }
    }
}
