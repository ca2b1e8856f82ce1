//! The bound check of the lock family's workloads: how many may hold one
//! group of resources at once, counted from the history's windows.
//!
//! `history::check` judges each resource alone: a semaphore's slot is a
//! mutex, so its windows must not overlap and its tokens must increase.
//! What no per-resource check sees is the family's own promise across
//! resources: never more than K holders of one semaphore, whatever slots
//! they hold. This module groups the holds (the checker's windows, the
//! same [`holds`] join: `[at_ns, end)` from the grant to the earliest of
//! its release, its lost signal and its last known deadline) by the group
//! their resource belongs to, walks each group's windows in start order,
//! and asks the [`Limit`] whether the holders at that instant are allowed.
//!
//! Generic on purpose: a read-write lock adds a `Limit` variant whose
//! `group` reads a hold's mode from its resource name and whose `admits`
//! says "one writer alone, or readers only"; the sweep does not change.

use std::collections::BTreeMap;
use std::fmt;

use crate::history::{holds, Event, Found, Hold, Holder};

/// What may hold one group at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// A semaphore of K permits: the holds of the resources
    /// `{name}:permit:{i}` are group `name`, and at most K hold at once.
    Permits(u32),
}

impl Limit {
    /// The group a resource's holds count in; `None` for a resource
    /// outside every group (not judged here).
    fn group(self, resource: &str) -> Option<&str> {
        match self {
            // The slot index follows the *last* separator, as the library
            // names slots (`semaphore/slots.rs`).
            Limit::Permits(_) => resource.rsplit_once(":permit:").map(|(name, _)| name),
        }
    }

    /// Whether the holds of one group that hold at one instant may do so.
    fn admits(self, holding: &[&Hold<'_>]) -> bool {
        match self {
            Limit::Permits(k) => holding.len() <= k as usize,
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Permits(k) => write!(f, "at most {k} holders of a semaphore at once"),
        }
    }
}

/// A grant that made its group's holders more than the limit allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Excess {
    /// The group (a semaphore's name).
    pub group: String,
    /// When the grant's window began.
    pub at_ns: u64,
    /// Everyone holding at that instant, each with the resource held; the
    /// grant that broke the limit last.
    pub holders: Vec<(String, Holder)>,
}

impl fmt::Display for Excess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who: Vec<String> = self
            .holders
            .iter()
            .map(|(resource, h)| format!("{h} on {resource:?}"))
            .collect();
        let (g, n, at) = (&self.group, self.holders.len(), self.at_ns);
        write!(f, "{g:?}: {n} holders at {at} ns: {}", who.join(", "))
    }
}

/// What [`check`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bounded {
    /// The limit judged.
    pub limit: Limit,
    /// Every grant that broke it (the first few listed).
    pub excess: Found<Excess>,
    /// The most holders of one group at once, over the run: the evidence
    /// that the bound was approached at all.
    pub most: usize,
    /// Whether the run was the bound's negative control (holders above
    /// the limit expected).
    pub control: bool,
}

/// Counts the grants of `events` that broke `limit`. O(n · h) for n holds
/// and at most h holding at once.
pub fn check(events: &[Event], limit: Limit, control: bool) -> Bounded {
    let (all, _) = holds(events);
    let mut groups: BTreeMap<&str, Vec<&Hold<'_>>> = BTreeMap::new();
    for h in &all {
        // A window known only once it was over held nothing (the
        // checker's rule too).
        if h.end() <= h.at_ns {
            continue;
        }
        if let Some(group) = limit.group(h.resource) {
            groups.entry(group).or_default().push(h);
        }
    }
    let (mut excess, mut most) = (Found::default(), 0);
    for (group, mut hs) in groups {
        hs.sort_by_key(|h| (h.at_ns, h.end(), h.who.lease));
        let mut holding: Vec<&Hold<'_>> = Vec::new();
        for h in hs {
            // Half-open windows: one that ends as this begins is a clean
            // hand-over, not a holder.
            holding.retain(|a| a.end() > h.at_ns);
            holding.push(h);
            most = most.max(holding.len());
            if !limit.admits(&holding) {
                excess.push(Excess {
                    group: group.to_owned(),
                    at_ns: h.at_ns,
                    holders: holding
                        .iter()
                        .map(|a| (a.resource.to_owned(), a.who))
                        .collect(),
                });
            }
        }
    }
    Bounded {
        limit,
        excess,
        most,
        control,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(lease: u64, resource: &str, at_ns: u64, valid_until_ns: u64) -> Event {
        Event::Grant {
            worker: lease as u32,
            resource: resource.into(),
            lease,
            start_ns: at_ns - 1,
            at_ns,
            valid_until_ns,
            token: Some(lease),
        }
    }

    fn release(lease: u64, at_ns: u64) -> Event {
        Event::Release { lease, at_ns }
    }

    #[test]
    fn k_plus_one_holders_of_distinct_slots_are_caught() {
        // Three holders of three different slots: each slot excludes,
        // the semaphore of 2 does not.
        let three = [
            grant(1, "s:permit:0", 10, 100),
            grant(2, "s:permit:1", 20, 100),
            grant(3, "s:permit:2", 30, 100),
        ];
        let b = check(&three, Limit::Permits(2), false);
        assert_eq!((b.excess.count, b.most), (1, 3));
        let e = &b.excess.first[0];
        assert_eq!((e.group.as_str(), e.at_ns, e.holders.len()), ("s", 30, 3));
        assert_eq!(e.holders[2].0, "s:permit:2");
        assert!(
            e.to_string()
                .starts_with("\"s\": 3 holders at 30 ns: lease 1"),
            "{e}"
        );
        let b = check(&three, Limit::Permits(3), false);
        assert_eq!((b.excess.count, b.most), (0, 3));
        // The first holder released before the third came: two at most.
        let mut handed = three.to_vec();
        handed.push(release(1, 30));
        assert_eq!(check(&handed, Limit::Permits(2), false).excess.count, 0);
        handed.push(release(2, 31));
        handed.push(grant(4, "s:permit:0", 31, 50));
        handed.push(grant(5, "s:permit:1", 40, 50));
        let b = check(&handed, Limit::Permits(2), false);
        assert_eq!((b.excess.count, b.most), (1, 3), "3, 4 and 5 at 40");
    }

    #[test]
    fn groups_are_judged_apart_and_other_resources_ignored() {
        let events = [
            grant(1, "a:permit:0", 10, 100),
            grant(2, "b:permit:0", 10, 100),
            grant(3, "a", 10, 100),
            // The index follows the last separator: this is group
            // `a:permit:1`, not `a`.
            grant(4, "a:permit:1:permit:0", 10, 100),
        ];
        let b = check(&events, Limit::Permits(1), false);
        assert_eq!((b.excess.count, b.most), (0, 1));
    }

    #[test]
    fn a_window_over_before_it_was_known_holds_nothing() {
        let events = [
            grant(1, "s:permit:0", 10, 100),
            grant(2, "s:permit:1", 20, 20),
        ];
        assert_eq!(check(&events, Limit::Permits(1), false).excess.count, 0);
    }
}
