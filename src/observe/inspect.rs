//! What [`Client::inspect`](crate::Client::inspect) reports: per node, who
//! holds a resource's lock key and for how long, and the resource's fence;
//! and the summary over all N nodes (held on a majority? by whom? for how
//! long at least?). Pure: the summary is computed from per-node
//! observations, tested here without Redis.
//!
//! A lock value is `{tag}:{secret}` (see `resource::lock_value`): the tag
//! names the client that wrote it, the secret authorises release and
//! extend. Only the tag leaves this module: the observations that carry the
//! whole value are crate-private and never printed, and the public types
//! hold the tag alone, so no `Debug`, `Display` or serialisation of an
//! inspection can reveal what would let its reader release someone else's
//! lock.

use std::fmt;
use std::time::Duration;

use crate::error::failure::NodeErrorKind;
use crate::logic::quorum::quorum;

/// Who holds a lock key on a node, or on a majority of nodes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Holder {
    /// A client with this client's tag ([`Client::id`](crate::Client::id)):
    /// this client or one of its clones.
    Us,
    /// Another client, named by the tag its lock values carry (the 16 hex
    /// digits [`Client::id`](crate::Client::id) returns on that client; 8
    /// for clients of redfence before 64-bit tags), or
    /// `None` for a value not written by redfence (no tag to show).
    Other {
        /// The holder's client tag.
        tag: Option<String>,
    },
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Holder::Us => f.write_str("this client"),
            Holder::Other { tag: Some(tag) } => write!(f, "client {tag}"),
            Holder::Other { tag: None } => f.write_str("a value not written by redfence"),
        }
    }
}

/// One node's view of a resource, as read by one round trip (`GET` and
/// `PTTL` of the lock key, `GET` of the fence key).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NodeInspection {
    /// Index in the configured node list.
    pub index: usize,
    /// The node's address (without credentials).
    pub addr: String,
    /// The lock key's holder; `None` when the key is absent (or the node
    /// failed: see `error`).
    pub holder: Option<Holder>,
    /// The key's remaining TTL as the node reported it; `None` when the
    /// key is absent, or present without expiry (set by hand: it never
    /// frees), or the node failed.
    pub expires_in: Option<Duration>,
    /// The fence of the resource's bucket on this node (with fencing on,
    /// and when the node has one).
    pub fence: Option<u64>,
    /// Why the node gave no answer (timeout, connection, …); the other
    /// fields are then empty.
    pub error: Option<NodeErrorKind>,
}

impl NodeInspection {
    /// Whether the lock key is present on this node.
    pub fn is_held(&self) -> bool {
        self.holder.is_some()
    }
}

impl fmt::Display for NodeInspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {} ({}): ", self.index, self.addr)?;
        if let Some(error) = &self.error {
            return write!(f, "failed: {error}");
        }
        match (&self.holder, self.expires_in) {
            (None, _) => f.write_str("free")?,
            (Some(holder), Some(ttl)) => write!(f, "held by {holder}, expires in {ttl:?}")?,
            (Some(holder), None) => write!(f, "held by {holder}, no expiry")?,
        }
        if let Some(fence) = self.fence {
            write!(f, ", fence {fence}")?;
        }
        Ok(())
    }
}

/// A resource's lock as seen on all N nodes at one moment: the per-node
/// detail and the summary. A snapshot, not a lock: by the time it is read
/// the holder may have released or another may have acquired.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Inspection {
    /// The resource, as given.
    pub resource: String,
    /// Its lock key.
    pub key: String,
    /// Its fence key (shared with its bucket), when fencing is on.
    pub fence_key: Option<String>,
    /// Votes a lock needs: ⌊N/2⌋ + 1.
    pub quorum: usize,
    /// Every node, in node order.
    pub nodes: Vec<NodeInspection>,
    /// The holder of one same lock value on at least a quorum of nodes:
    /// the current owner of the lock. `None` when no value is on a
    /// majority (free, expired on most nodes, a split vote, too many nodes
    /// failed to answer).
    pub holder: Option<Holder>,
    /// How many nodes hold the majority holder's value (0 without one).
    pub held_on: usize,
    /// With a majority holder: the time for which its value stays on a
    /// quorum of nodes at least, unless released or extended (the
    /// quorum-th longest of their TTLs, less the inspection's round trip).
    /// `Duration::MAX` when keys without expiry make up that quorum.
    pub valid_for_at_least: Option<Duration>,
    /// The largest fence among the nodes that answered. When a majority
    /// answered, it is at least every token handed out for this resource
    /// (a token is stored on a majority, and two majorities meet).
    pub fence: Option<u64>,
}

impl Inspection {
    /// Whether a majority of nodes hold one value: the lock is taken.
    pub fn is_held(&self) -> bool {
        self.holder.is_some()
    }

    /// Nodes that answered.
    pub fn answered(&self) -> usize {
        self.nodes.iter().filter(|n| n.error.is_none()).count()
    }
}

impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: ", self.resource)?;
        match (&self.holder, self.valid_for_at_least) {
            (Some(holder), Some(d)) if d == Duration::MAX => write!(
                f,
                "held by {holder} on {}/{} nodes, no expiry",
                self.held_on,
                self.nodes.len()
            )?,
            (Some(holder), valid) => write!(
                f,
                "held by {holder} on {}/{} nodes for at least {:?}",
                self.held_on,
                self.nodes.len(),
                valid.unwrap_or_default()
            )?,
            (None, _) => {
                let keys = self.nodes.iter().filter(|n| n.is_held()).count();
                write!(
                    f,
                    "not held on a majority ({keys}/{} nodes have a key)",
                    self.nodes.len()
                )?;
            }
        }
        if let Some(fence) = self.fence {
            write!(f, ", fence {fence}")?;
        }
        for node in &self.nodes {
            write!(f, "\n  {node}")?;
        }
        Ok(())
    }
}

/// What one node answered, before it is judged. Carries the whole lock
/// value, so it is crate-private and has no `Debug`: only [`summarise`]
/// reads the value, to tell acquisitions apart.
#[derive(Clone, Default)]
pub(crate) struct Observation {
    /// The lock key's value, if present.
    pub(crate) value: Option<String>,
    /// The `PTTL` reply: ms left, -1 no expiry, -2 absent.
    pub(crate) pttl: i64,
    /// The fence key's value, when it is a decimal integer.
    pub(crate) fence: Option<u64>,
}

/// The tag of a lock value: what precedes the `:`, when it looks like one
/// of ours (lowercase hex digits).
pub(crate) fn value_tag(value: &str) -> Option<&str> {
    let (tag, _secret) = value.split_once(':')?;
    // 16 hex digits; 8 in values of clients before issue 31.
    let is_tag =
        matches!(tag.len(), 8 | 16) && tag.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    is_tag.then_some(tag)
}

/// One node's answer or failure, with its place in the node list.
pub(crate) struct Seen {
    pub(crate) index: usize,
    pub(crate) addr: String,
    pub(crate) answer: Result<Observation, NodeErrorKind>,
}

/// Builds the inspection from every node's answer. `own_tag` is this
/// client's tag; `elapsed` the time the round took (deducted from the
/// summary's validity, since the TTLs were read at some point during it).
pub(crate) fn summarise(
    resource: &str,
    key: &str,
    fence_key: Option<&str>,
    own_tag: &str,
    mut seen: Vec<Seen>,
    elapsed: Duration,
) -> Inspection {
    seen.sort_by_key(|s| s.index);
    let holder_of = |value: &str| match value_tag(value) {
        Some(tag) if tag == own_tag => Holder::Us,
        tag => Holder::Other {
            tag: tag.map(str::to_owned),
        },
    };
    // A key read by GET and gone by PTTL (it expired in between) is free.
    fn present(o: &Observation) -> Option<&str> {
        o.value.as_deref().filter(|_| o.pttl != -2)
    }
    let quorum = quorum(seen.len());

    // Group by the whole value: two acquisitions of one client share a tag
    // but are different locks.
    let mut groups: Vec<(&str, Vec<i64>)> = Vec::new();
    for s in &seen {
        let Ok(o) = &s.answer else { continue };
        let Some(value) = present(o) else { continue };
        match groups.iter_mut().find(|(v, _)| *v == value) {
            Some((_, ttls)) => ttls.push(o.pttl),
            None => groups.push((value, vec![o.pttl])),
        }
    }
    let majority = groups.iter().find(|(_, ttls)| ttls.len() >= quorum);
    let (holder, held_on, valid_for_at_least) = match majority {
        Some((value, ttls)) => {
            // Longest first; no expiry (-1) is the longest of all.
            let mut left: Vec<Duration> = ttls
                .iter()
                .map(|&ms| match u64::try_from(ms) {
                    Ok(ms) => Duration::from_millis(ms),
                    Err(_) => Duration::MAX,
                })
                .collect();
            left.sort_unstable_by(|a, b| b.cmp(a));
            let nth = left
                .get(quorum.saturating_sub(1))
                .copied()
                .unwrap_or_default();
            let valid = if nth == Duration::MAX {
                nth
            } else {
                nth.saturating_sub(elapsed)
            };
            (Some(holder_of(value)), ttls.len(), Some(valid))
        }
        None => (None, 0, None),
    };

    let fence = seen
        .iter()
        .filter_map(|s| s.answer.as_ref().ok()?.fence)
        .max();
    let nodes = seen
        .into_iter()
        .map(|s| match s.answer {
            Ok(o) => {
                let held = present(&o).map(holder_of);
                NodeInspection {
                    index: s.index,
                    addr: s.addr,
                    expires_in: held
                        .as_ref()
                        .and_then(|_| u64::try_from(o.pttl).ok())
                        .map(Duration::from_millis),
                    holder: held,
                    fence: o.fence,
                    error: None,
                }
            }
            Err(error) => NodeInspection {
                index: s.index,
                addr: s.addr,
                holder: None,
                expires_in: None,
                fence: None,
                error: Some(error),
            },
        })
        .collect();
    Inspection {
        resource: resource.to_owned(),
        key: key.to_owned(),
        fence_key: fence_key.map(str::to_owned),
        quorum,
        nodes,
        holder,
        held_on,
        valid_for_at_least,
        fence,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: &str = "0123abcd";
    const SECRET: &str = "00112233445566778899aabbccddeeff";

    fn held(tag: &str, secret: &str, pttl: i64, fence: Option<u64>) -> Observation {
        Observation {
            value: Some(format!("{tag}:{secret}")),
            pttl,
            fence,
        }
    }

    fn free(fence: Option<u64>) -> Observation {
        Observation {
            value: None,
            pttl: -2,
            fence,
        }
    }

    fn seen(answers: Vec<Result<Observation, NodeErrorKind>>) -> Vec<Seen> {
        answers
            .into_iter()
            .enumerate()
            .map(|(index, answer)| Seen {
                index,
                addr: format!("127.0.0.1:{}", 7000 + index),
                answer,
            })
            .collect()
    }

    fn run(answers: Vec<Result<Observation, NodeErrorKind>>) -> Inspection {
        summarise(
            "job",
            "redfence:lock:job",
            Some("redfence:fence:{1}"),
            US,
            seen(answers),
            Duration::from_millis(2),
        )
    }

    #[test]
    fn free_everywhere() {
        let i = run(vec![Ok(free(Some(3))), Ok(free(Some(5))), Ok(free(None))]);
        assert!(!i.is_held());
        assert_eq!(
            (i.held_on, i.valid_for_at_least, i.fence),
            (0, None, Some(5))
        );
        assert!(i
            .nodes
            .iter()
            .all(|n| !n.is_held() && n.expires_in.is_none()));
        assert_eq!(i.answered(), 3);
    }

    #[test]
    fn held_by_us_on_all_reports_the_quorum_th_longest_ttl() {
        let i = run(vec![
            Ok(held(US, SECRET, 9000, Some(7))),
            Ok(held(US, SECRET, 8000, Some(7))),
            Ok(held(US, SECRET, 1000, Some(6))),
        ]);
        assert_eq!(i.holder, Some(Holder::Us));
        assert_eq!(i.held_on, 3);
        // The second longest of three TTLs, less the round trip.
        assert_eq!(i.valid_for_at_least, Some(Duration::from_millis(7998)));
        assert_eq!(i.fence, Some(7));
        assert_eq!(i.nodes[2].expires_in, Some(Duration::from_millis(1000)));
    }

    #[test]
    fn another_clients_tag_is_shown_and_a_foreign_value_has_none() {
        let i = run(vec![
            Ok(held("deadbeef", SECRET, 500, None)),
            Ok(held("deadbeef", SECRET, 500, None)),
            Ok(Observation {
                value: Some("hand-written".into()),
                pttl: -1,
                fence: None,
            }),
        ]);
        assert_eq!(
            i.holder,
            Some(Holder::Other {
                tag: Some("deadbeef".into())
            })
        );
        assert_eq!(i.nodes[2].holder, Some(Holder::Other { tag: None }));
        assert_eq!(i.nodes[2].expires_in, None);
    }

    #[test]
    fn a_minority_or_a_split_vote_is_not_held() {
        let minority = run(vec![
            Ok(held(US, SECRET, 500, None)),
            Ok(free(None)),
            Ok(free(None)),
        ]);
        assert!(!minority.is_held());
        assert!(minority.nodes[0].is_held());
        // One client, two acquisitions: same tag, different values.
        let other = "ffffffffffffffffffffffffffffffff";
        let split = run(vec![
            Ok(held(US, SECRET, 500, None)),
            Ok(held(US, other, 500, None)),
            Err(NodeErrorKind::Timeout(Duration::from_millis(100))),
        ]);
        assert!(!split.is_held());
        assert_eq!(split.answered(), 2);
        assert!(split.nodes[2].error.is_some());
    }

    #[test]
    fn failed_nodes_count_against_the_majority() {
        let i = run(vec![
            Ok(held(US, SECRET, 500, None)),
            Err(NodeErrorKind::Timeout(Duration::from_millis(100))),
            Err(NodeErrorKind::Timeout(Duration::from_millis(100))),
        ]);
        assert!(!i.is_held());
        // A key that expired between GET and PTTL is free.
        let gone = run(vec![Ok(Observation {
            value: Some(format!("{US}:{SECRET}")),
            pttl: -2,
            fence: None,
        })]);
        assert!(!gone.is_held() && !gone.nodes[0].is_held());
    }

    #[test]
    fn keys_without_expiry_make_the_validity_unbounded() {
        let i = run(vec![
            Ok(held(US, SECRET, -1, None)),
            Ok(held(US, SECRET, -1, None)),
            Ok(free(None)),
        ]);
        assert_eq!(i.valid_for_at_least, Some(Duration::MAX));
        assert!(i.to_string().contains("no expiry"), "{i}");
    }

    #[test]
    fn the_secret_never_appears_in_debug_or_display() {
        let i = run(vec![
            Ok(held(US, SECRET, 500, Some(1))),
            Ok(held("deadbeef", SECRET, 500, Some(1))),
            Ok(held(US, SECRET, 500, Some(1))),
        ]);
        for text in [format!("{i:?}"), format!("{i}"), format!("{i:#?}")] {
            assert!(!text.contains(SECRET), "{text}");
            assert!(text.contains("deadbeef"), "{text}");
        }
        // The negative control: the value itself does contain it.
        assert!(format!("{US}:{SECRET}").contains(SECRET));
    }

    #[test]
    fn tags() {
        assert_eq!(value_tag("0123abcd:xyz"), Some("0123abcd"));
        assert_eq!(value_tag("0123ABCD:xyz"), None);
        assert_eq!(value_tag("0123abc:xyz"), None);
        assert_eq!(value_tag("0123abcd"), None);
    }
}
