//! What [`RwLock::inspect`](crate::RwLock::inspect) reports: per node,
//! the writer key, the live reader entries and the waiting writer's
//! marker, each with its holder's client tag and TTL, and the fence; and
//! the summary over all N nodes (the write and the reads held on a
//! majority). Pure: built from per-node observations, tested here without
//! Redis.
//!
//! As for the mutex's inspection (`observe::inspect`), only the tag of a
//! value leaves this module: the observations carrying whole values are
//! crate-private and have no `Debug`.

use std::fmt;
use std::time::Duration;

use crate::error::failure::NodeErrorKind;
use crate::logic::quorum::quorum;
use crate::observe::inspect::{value_tag, Holder};

/// One entry on one node: a hold (the writer key, a reader's entry) or a
/// waiting writer's marker.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwEntry {
    /// Whose value it holds.
    pub holder: Holder,
    /// Its remaining TTL as the node reported it; `None` for a key
    /// without expiry (set by hand).
    pub expires_in: Option<Duration>,
}

/// One node's view of a read-write lock, read by one script (`GET` and
/// `PTTL` only: nothing is written, not even the index's pruning).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RwNodeInspection {
    /// Index in the configured node list.
    pub index: usize,
    /// The node's address (without credentials).
    pub addr: String,
    /// The writer key, when present.
    pub writer: Option<RwEntry>,
    /// The live reader entries (at most [`RwInspection::MAX_READERS`]).
    pub readers: Vec<RwEntry>,
    /// Names in the readers' index, live or not: it is pruned of dead
    /// names only by later admissions.
    pub indexed: usize,
    /// A waiting writer's marker: while it lives this node admits no new
    /// reader.
    pub waiting_writer: Option<RwEntry>,
    /// The fence of the lock's bucket on this node (with fencing on, and
    /// when the node has one).
    pub fence: Option<u64>,
    /// Why the node gave no answer; the other fields are then empty.
    pub error: Option<NodeErrorKind>,
}

/// A hold present on a majority of nodes: the lock's write, or one read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwHold {
    /// Whose.
    pub holder: Holder,
    /// On how many nodes its value is.
    pub held_on: usize,
    /// The time for which its value stays on a quorum of nodes at least,
    /// unless released or extended (the quorum-th longest of its TTLs,
    /// less the inspection's round trip); `Duration::MAX` when keys
    /// without expiry make up that quorum.
    pub valid_for_at_least: Duration,
}

/// A read-write lock as seen on all N nodes at one moment. A snapshot,
/// not a lock: by the time it is read, holds may have come and gone.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RwInspection {
    /// The lock's name.
    pub name: String,
    /// Votes a hold needs: ⌊N/2⌋ + 1.
    pub quorum: usize,
    /// Every node, in node order.
    pub nodes: Vec<RwNodeInspection>,
    /// The write held on a majority, if any.
    pub writer: Option<RwHold>,
    /// Every read held on a majority, the longest-lived first.
    pub readers: Vec<RwHold>,
    /// Nodes on which a waiting writer's marker lives (no new reader is
    /// admitted there meanwhile).
    pub writer_waiting_on: usize,
    /// The largest fence among the nodes that answered: with a majority
    /// answering, at least every token handed out for the lock.
    pub fence: Option<u64>,
}

impl RwInspection {
    /// The most reader entries read per node: a bound on the reply of a
    /// lock with very many readers.
    pub const MAX_READERS: usize = 1000;

    /// Nodes that answered.
    pub fn answered(&self) -> usize {
        self.nodes.iter().filter(|n| n.error.is_none()).count()
    }

    /// Whether a write or a read is held on a majority.
    pub fn is_held(&self) -> bool {
        self.writer.is_some() || !self.readers.is_empty()
    }
}

impl fmt::Display for RwEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.expires_in {
            Some(ttl) => write!(f, "{} (expires in {ttl:?})", self.holder),
            None => write!(f, "{} (no expiry)", self.holder),
        }
    }
}

impl fmt::Display for RwInspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: ", self.name)?;
        match &self.writer {
            Some(w) => write!(f, "written by {} on {} nodes", w.holder, w.held_on)?,
            None => write!(f, "{} reader(s) on a majority", self.readers.len())?,
        }
        if self.writer_waiting_on > 0 {
            write!(f, ", a writer waits on {} node(s)", self.writer_waiting_on)?;
        }
        if let Some(fence) = self.fence {
            write!(f, ", fence {fence}")?;
        }
        for n in &self.nodes {
            write!(f, "\n  node {} ({}): ", n.index, n.addr)?;
            if let Some(e) = &n.error {
                write!(f, "failed: {e}")?;
                continue;
            }
            match &n.writer {
                Some(w) => write!(f, "writer {w}")?,
                None => f.write_str("no writer")?,
            }
            write!(f, ", {} reader(s)", n.readers.len())?;
            if let Some(x) = &n.waiting_writer {
                write!(f, ", writer waiting: {x}")?;
            }
        }
        Ok(())
    }
}

/// One node's answer, before it is judged. Carries whole values, so it is
/// crate-private and has no `Debug`.
#[derive(Clone, Default)]
pub(crate) struct RwObservation {
    /// The writer key's value and `PTTL`.
    pub(crate) writer: Option<(String, i64)>,
    /// The waiting writer's marker and its `PTTL`.
    pub(crate) waiting: Option<(String, i64)>,
    pub(crate) fence: Option<u64>,
    /// Names in the readers' index.
    pub(crate) indexed: usize,
    /// Live reader entries: value and `PTTL`.
    pub(crate) readers: Vec<(String, i64)>,
}

/// One node's answer or failure, with its place in the node list.
pub(crate) struct RwSeen {
    pub(crate) index: usize,
    pub(crate) addr: String,
    pub(crate) answer: Result<RwObservation, NodeErrorKind>,
}

/// Builds the inspection of lock `name` from every node's answer.
/// `own_tag` is this client's tag; `elapsed` the round's time, deducted
/// from the holds' validity.
pub(crate) fn summarise(
    name: &str,
    own_tag: &str,
    mut seen: Vec<RwSeen>,
    elapsed: Duration,
) -> RwInspection {
    seen.sort_by_key(|s| s.index);
    let holder_of = |value: &str| match value_tag(value) {
        Some(tag) if tag == own_tag => Holder::Us,
        tag => Holder::Other {
            tag: tag.map(str::to_owned),
        },
    };
    let entry = |(value, pttl): &(String, i64)| RwEntry {
        holder: holder_of(value),
        expires_in: u64::try_from(*pttl).ok().map(Duration::from_millis),
    };
    let quorum = quorum(seen.len());
    // Holds grouped by whole value: every attempt has a value of its own.
    let (mut writes, mut reads): (Groups<'_>, Groups<'_>) = (Vec::new(), Vec::new());
    for s in &seen {
        let Ok(o) = &s.answer else { continue };
        if let Some((value, pttl)) = &o.writer {
            group(&mut writes, value, *pttl);
        }
        for (value, pttl) in &o.readers {
            group(&mut reads, value, *pttl);
        }
    }
    let held = |groups: Groups<'_>| -> Vec<RwHold> {
        let mut holds: Vec<RwHold> = groups
            .into_iter()
            .filter(|(_, ttls)| ttls.len() >= quorum)
            .map(|(value, ttls)| RwHold {
                holder: holder_of(value),
                held_on: ttls.len(),
                valid_for_at_least: at_least(&ttls, quorum, elapsed),
            })
            .collect();
        holds.sort_by_key(|h| std::cmp::Reverse(h.valid_for_at_least));
        holds
    };
    let writer = held(writes).into_iter().next();
    let readers = held(reads);
    let fence = seen
        .iter()
        .filter_map(|s| s.answer.as_ref().ok()?.fence)
        .max();
    let nodes: Vec<RwNodeInspection> = seen
        .into_iter()
        .map(|s| match s.answer {
            Ok(o) => RwNodeInspection {
                index: s.index,
                addr: s.addr,
                writer: o.writer.as_ref().map(entry),
                readers: o.readers.iter().map(entry).collect(),
                indexed: o.indexed,
                waiting_writer: o.waiting.as_ref().map(entry),
                fence: o.fence,
                error: None,
            },
            Err(error) => RwNodeInspection {
                index: s.index,
                addr: s.addr,
                writer: None,
                readers: Vec::new(),
                indexed: 0,
                waiting_writer: None,
                fence: None,
                error: Some(error),
            },
        })
        .collect();
    let writer_waiting_on = nodes.iter().filter(|n| n.waiting_writer.is_some()).count();
    RwInspection {
        name: name.to_owned(),
        quorum,
        nodes,
        writer,
        readers,
        writer_waiting_on,
        fence,
    }
}

/// Values and the `PTTL`s of the nodes holding each.
type Groups<'a> = Vec<(&'a str, Vec<i64>)>;

fn group<'a>(groups: &mut Groups<'a>, value: &'a str, pttl: i64) {
    match groups.iter_mut().find(|(v, _)| *v == value) {
        Some((_, ttls)) => ttls.push(pttl),
        None => groups.push((value, vec![pttl])),
    }
}

/// The quorum-th longest of `ttls` (ms, -1 no expiry: the longest of all),
/// less `elapsed`.
fn at_least(ttls: &[i64], quorum: usize, elapsed: Duration) -> Duration {
    let mut left: Vec<Duration> = ttls
        .iter()
        .map(|&ms| u64::try_from(ms).map_or(Duration::MAX, Duration::from_millis))
        .collect();
    left.sort_unstable_by(|a, b| b.cmp(a));
    let nth = left
        .get(quorum.saturating_sub(1))
        .copied()
        .unwrap_or_default();
    if nth == Duration::MAX {
        nth
    } else {
        nth.saturating_sub(elapsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: &str = "0123456789abcdef";
    const THEM: &str = "fedcba9876543210";

    fn v(tag: &str, n: u32) -> String {
        format!("{tag}:{n:032x}")
    }

    fn node(o: RwObservation) -> Result<RwObservation, NodeErrorKind> {
        Ok(o)
    }

    fn run(answers: Vec<Result<RwObservation, NodeErrorKind>>) -> RwInspection {
        let seen = answers
            .into_iter()
            .enumerate()
            .map(|(index, answer)| RwSeen {
                index,
                addr: format!("127.0.0.1:{}", 7000 + index),
                answer,
            })
            .collect();
        summarise("prices", US, seen, Duration::from_millis(2))
    }

    #[test]
    fn readers_on_a_majority_are_reads_and_a_minority_is_not() {
        let reading = |fence| RwObservation {
            readers: vec![(v(US, 1), 9000), (v(THEM, 2), 5000)],
            indexed: 3,
            fence: Some(fence),
            ..RwObservation::default()
        };
        let only_one = RwObservation {
            readers: vec![(v(THEM, 3), 5000)],
            ..RwObservation::default()
        };
        let i = run(vec![
            node(reading(7)),
            node(reading(8)),
            node(only_one),
            Err(NodeErrorKind::Timeout(Duration::from_millis(50))),
            node(reading(6)),
        ]);
        assert_eq!((i.quorum, i.answered()), (3, 4));
        assert!(i.writer.is_none() && i.is_held());
        // Value 3 is on one node only: not a read.
        let who: Vec<_> = i.readers.iter().map(|r| r.holder.clone()).collect();
        assert_eq!(
            who,
            [
                Holder::Us,
                Holder::Other {
                    tag: Some(THEM.into())
                }
            ]
        );
        assert_eq!(i.readers[0].held_on, 3);
        assert_eq!(i.fence, Some(8));
        assert_eq!(i.nodes[0].readers.len(), 2);
        assert_eq!(i.nodes[0].indexed, 3);
        assert!(i.nodes[3].error.is_some());
    }

    #[test]
    fn a_write_on_a_majority_and_a_waiting_writer_are_shown() {
        let w = |pttl| RwObservation {
            writer: Some((v(THEM, 9), pttl)),
            waiting: Some((v(US, 4), 3000)),
            ..RwObservation::default()
        };
        let i = run(vec![node(w(4000)), node(w(2000)), node(w(-1))]);
        let writer = i.writer.clone().expect("a write on 3 of 3");
        assert_eq!(writer.held_on, 3);
        // The second longest of (no expiry, 4000, 2000), less 2 ms.
        assert_eq!(writer.valid_for_at_least, Duration::from_millis(3998));
        assert_eq!(i.writer_waiting_on, 3);
        assert_eq!(i.nodes[2].writer.as_ref().map(|e| e.expires_in), Some(None));
        assert_eq!(
            i.nodes[0].waiting_writer.as_ref().map(|e| &e.holder),
            Some(&Holder::Us)
        );
        let text = i.to_string();
        assert!(text.starts_with("\"prices\": written by client fedcba9876543210 on 3 nodes, a writer waits on 3 node(s)"), "{text}");
        // The secret part of a value never shows.
        assert!(!text.contains(&format!("{:032x}", 9)), "{text}");
    }

    #[test]
    fn a_split_write_is_not_held() {
        let w = |n| RwObservation {
            writer: Some((v(THEM, n), 1000)),
            ..RwObservation::default()
        };
        let i = run(vec![node(w(1)), node(w(2)), node(RwObservation::default())]);
        assert!(i.writer.is_none() && !i.is_held());
        assert_eq!(i.nodes.iter().filter(|n| n.writer.is_some()).count(), 2);
    }
}
