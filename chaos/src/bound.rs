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
//! Generic on purpose: a read-write lock is the [`Limit::ReadWrite`]
//! variant, whose `group` reads a hold's mode from its resource name
//! ([`rw_resource`]) and whose `admits` says "one writer alone, or
//! readers only"; the sweep is the same.
//!
//! A read-write lock's tokens are not one resource's either: reads of one
//! generation share a token, so the per-resource checker judges only the
//! writes (all on `{name}:write`, each read on a resource of its own), and
//! [`rw_tokens`] checks what DESIGN.md, section 6b, promises across modes,
//! with the checker's rule for "before" (a grant known strictly before the
//! other's attempt began): (W) a write's token is strictly larger than the
//! token of every read granted before it (write against write is the
//! per-resource check's); (R) a read's token is at least the token of
//! every write granted before it. Nothing is claimed between reads, nor
//! between holds whose attempts overlapped.

use std::collections::BTreeMap;
use std::fmt;

use crate::history::{holds, Event, Found, Hold, Holder, TokenPair};

/// What may hold one group at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// A semaphore of K permits: the holds of the resources
    /// `{name}:permit:{i}` are group `name`, and at most K hold at once.
    Permits(u32),
    /// A read-write lock: the holds of `{name}:write` and of each
    /// `{name}:read:{lease}` ([`rw_resource`]) are group `name`, and a
    /// writer holds alone.
    ReadWrite,
}

/// The resource a read-write lock's hold is recorded on: every write of
/// lock `name` on `{name}:write`, each read on `{name}:read:{lease}` of
/// its own, so that the per-resource checker judges the writes' exclusion
/// and token order and leaves the reads (which overlap and share tokens)
/// to this module.
pub fn rw_resource(name: &str, write: bool, lease: u64) -> String {
    if write {
        format!("{name}{WRITE}")
    } else {
        format!("{name}{READ}{lease:x}")
    }
}

const WRITE: &str = ":write";
const READ: &str = ":read:";

/// The lock and the mode of a read-write hold's resource; `None` for one
/// that is not ([`rw_resource`]).
fn rw_mode(resource: &str) -> Option<(&str, bool)> {
    if let Some(name) = resource.strip_suffix(WRITE) {
        return Some((name, true));
    }
    resource.rsplit_once(READ).map(|(name, _)| (name, false))
}

impl Limit {
    /// The group a resource's holds count in; `None` for a resource
    /// outside every group (not judged here).
    fn group(self, resource: &str) -> Option<&str> {
        match self {
            // The slot index follows the *last* separator, as the library
            // names slots (`semaphore/slots.rs`).
            Limit::Permits(_) => resource.rsplit_once(":permit:").map(|(name, _)| name),
            Limit::ReadWrite => rw_mode(resource).map(|(name, _)| name),
        }
    }

    /// Whether the holds of one group that hold at one instant may do so.
    fn admits(self, holding: &[&Hold<'_>]) -> bool {
        match self {
            Limit::Permits(k) => holding.len() <= k as usize,
            Limit::ReadWrite => {
                holding.len() <= 1
                    || !holding
                        .iter()
                        .any(|h| rw_mode(h.resource).is_some_and(|m| m.1))
            }
        }
    }

    /// The "expected" cell of its negative control's row.
    pub fn control_label(self) -> &'static str {
        match self {
            Limit::Permits(_) => "above K (control)",
            Limit::ReadWrite => "writer beside readers (control)",
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Permits(k) => write!(f, "at most {k} holders of a semaphore at once"),
            Limit::ReadWrite => write!(f, "one writer alone, or readers only"),
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
    /// Tokens out of the order a read-write lock promises across modes
    /// ([`rw_tokens`]); empty for a semaphore.
    pub tokens: Found<TokenPair>,
    /// A read-write lock's holds by mode; `None` for a semaphore.
    pub modes: Option<Modes>,
}

/// A read-write run's holds by mode: the evidence that both ran, and that
/// readers shared the lock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Modes {
    /// Read holds (windows that held anything).
    pub reads: u64,
    /// Write holds.
    pub writes: u64,
    /// The most read holds of one lock at once.
    pub most_readers: usize,
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
    let (mut excess, mut most, mut tokens) = (Found::default(), 0, Found::default());
    let mut modes = (limit == Limit::ReadWrite).then(Modes::default);
    for (group, mut hs) in groups {
        if limit == Limit::ReadWrite {
            for pair in rw_tokens(group, &hs) {
                tokens.push(pair);
            }
        }
        hs.sort_by_key(|h| (h.at_ns, h.end(), h.who.lease));
        let mut holding: Vec<&Hold<'_>> = Vec::new();
        for h in hs {
            // Half-open windows: one that ends as this begins is a clean
            // hand-over, not a holder.
            holding.retain(|a| a.end() > h.at_ns);
            holding.push(h);
            most = most.max(holding.len());
            if let Some(m) = modes.as_mut() {
                let is_write = |h: &Hold<'_>| rw_mode(h.resource).is_some_and(|(_, w)| w);
                if is_write(h) {
                    m.writes += 1;
                } else {
                    m.reads += 1;
                }
                let readers = holding.iter().filter(|a| !is_write(a)).count();
                m.most_readers = m.most_readers.max(readers);
            }
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
        tokens,
        modes,
    }
}

/// `(start_ns, at_ns, token, who)` of a grant: from its attempt's start
/// to when it was known.
type Timed = (u64, u64, u64, Holder);

/// The token violations across modes among one read-write lock's holds
/// (the module docs have the two rules); holds without a token are left
/// out. Each pair is (the earlier grant with the largest token among
/// those known before the later's attempt began, the later).
pub fn rw_tokens(lock: &str, hs: &[&Hold<'_>]) -> Vec<TokenPair> {
    let (mut reads, mut writes) = (Vec::new(), Vec::new());
    for h in hs {
        let (Some(token), Some((_, write))) = (h.token, rw_mode(h.resource)) else {
            continue;
        };
        let t: Timed = (h.start_ns, h.at_ns, token, h.who);
        if write { &mut writes } else { &mut reads }.push(t);
    }
    let pair = |earlier: &Timed, later: &Timed| TokenPair {
        subject: lock.to_owned(),
        earlier: earlier.3,
        earlier_token: earlier.2,
        later: later.3,
        later_token: later.2,
    };
    let mut found = Vec::new();
    // (W): a write not above a read known before it.
    for (e, l) in dominated(&reads, &writes, true) {
        found.push(pair(&reads[e], &writes[l]));
    }
    // (R): a read below a write known before it.
    for (e, l) in dominated(&writes, &reads, false) {
        found.push(pair(&writes[e], &reads[l]));
    }
    found
}

/// Pairs `(e, l)`: `earlier[e]` has the largest token among `earlier`'s
/// grants known strictly before `later[l]`'s attempt began, and
/// `later[l]`'s token is below it (or, `strict`, not above it). A sweep
/// by start over `later` and by grant over `earlier`: O(n log n).
fn dominated(earlier: &[Timed], later: &[Timed], strict: bool) -> Vec<(usize, usize)> {
    let mut by_known: Vec<usize> = (0..earlier.len()).collect();
    by_known.sort_by_key(|&i| earlier[i].1);
    let mut by_start: Vec<usize> = (0..later.len()).collect();
    by_start.sort_by_key(|&i| later[i].0);
    let (mut admitted, mut best, mut found) = (0, None::<usize>, Vec::new());
    for &l in &by_start {
        while let Some(&e) = by_known
            .get(admitted)
            .filter(|&&e| earlier[e].1 < later[l].0)
        {
            if best.is_none_or(|b| earlier[e].2 > earlier[b].2) {
                best = Some(e);
            }
            admitted += 1;
        }
        if let Some(b) = best {
            let (top, token) = (earlier[b].2, later[l].2);
            if token < top || (strict && token == top) {
                found.push((b, l));
            }
        }
    }
    found
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

    fn rw(lease: u64, write: bool, (start_ns, at_ns): (u64, u64), end: u64, token: u64) -> Event {
        Event::Grant {
            worker: lease as u32,
            resource: rw_resource("r0", write, lease),
            lease,
            start_ns,
            at_ns,
            valid_until_ns: end,
            token: Some(token),
        }
    }

    #[test]
    fn readers_overlap_and_a_writer_beside_anyone_is_caught() {
        // Three readers at once, then a writer alone: clean.
        let mut events = vec![
            rw(1, false, (0, 10), 50, 5),
            rw(2, false, (0, 20), 60, 5),
            rw(3, false, (5, 30), 60, 5),
            rw(4, true, (40, 60), 90, 6),
        ];
        let b = check(&events, Limit::ReadWrite, false);
        assert_eq!((b.excess.count, b.most, b.tokens.count), (0, 3, 0));
        let m = Modes {
            reads: 3,
            writes: 1,
            most_readers: 3,
        };
        assert_eq!(b.modes, Some(m));
        assert_eq!(check(&events, Limit::Permits(2), false).modes, None);
        // A reader that came while the writer held.
        events.push(rw(5, false, (61, 70), 100, 6));
        let b = check(&events, Limit::ReadWrite, false);
        assert_eq!((b.excess.count, b.most), (1, 3));
        let e = &b.excess.first[0];
        assert_eq!((e.group.as_str(), e.at_ns), ("r0", 70));
        assert_eq!(e.holders[0].0, "r0:write");
        // A second writer beside the first: caught here too (and by the
        // per-resource check on `r0:write`).
        let two = [rw(1, true, (0, 10), 50, 1), rw(2, true, (0, 20), 60, 2)];
        assert_eq!(check(&two, Limit::ReadWrite, false).excess.count, 1);
        // Another lock's holds and a mutex's are judged apart.
        let apart = [
            rw(1, true, (0, 10), 50, 1),
            grant(2, "r0", 20, 60),
            Event::Grant {
                worker: 3,
                resource: rw_resource("r1", false, 3),
                lease: 3,
                start_ns: 0,
                at_ns: 20,
                valid_until_ns: 60,
                token: Some(1),
            },
        ];
        assert_eq!(check(&apart, Limit::ReadWrite, false).excess.count, 0);
    }

    #[test]
    fn rw_tokens_check_what_the_design_promises_and_nothing_more() {
        let tokens = |events: &[Event]| {
            let b = check(events, Limit::ReadWrite, false);
            b.tokens
                .first
                .iter()
                .map(|p| (p.earlier.lease, p.later.lease))
                .collect::<Vec<_>>()
        };
        // (R) allows a read to share the last write's token (its
        // generation, or a downgrade's), and reads to share one.
        let clean = [
            rw(1, true, (0, 10), 20, 4),
            rw(2, false, (30, 40), 50, 4),
            rw(3, false, (30, 45), 50, 4),
            rw(4, true, (60, 70), 80, 5),
            // A read below an earlier read: no promise between reads.
            rw(5, false, (90, 95), 99, 5),
        ];
        assert!(tokens(&clean).is_empty(), "{:?}", tokens(&clean));
        // (W): a write equal to a read known before it began.
        let w = [rw(1, false, (0, 10), 20, 7), rw(2, true, (30, 40), 50, 7)];
        assert_eq!(tokens(&w), [(1, 2)]);
        // (R): a read below a write known before it began.
        let r = [rw(1, true, (0, 10), 20, 7), rw(2, false, (30, 40), 50, 6)];
        assert_eq!(tokens(&r), [(1, 2)]);
        // Attempts that overlapped are not ordered: no claim.
        let concurrent = [rw(1, true, (0, 10), 20, 7), rw(2, false, (10, 40), 50, 6)];
        assert!(tokens(&concurrent).is_empty());
        // The earlier grant named is the one with the largest token.
        let largest = [
            rw(1, false, (0, 5), 8, 3),
            rw(2, false, (0, 6), 9, 9),
            rw(3, false, (0, 7), 9, 4),
            rw(4, true, (10, 20), 30, 8),
        ];
        assert_eq!(tokens(&largest), [(2, 4)]);
        // Without tokens (fencing off) nothing is judged.
        let mut off = r.to_vec();
        for e in &mut off {
            if let Event::Grant { token, .. } = e {
                *token = None;
            }
        }
        assert!(tokens(&off).is_empty());
    }
}
