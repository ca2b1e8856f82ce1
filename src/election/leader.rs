//! Who leads an election, as [`Election::leader`](crate::Election::leader)
//! reports it: [`Leader`], and the pure rule that picks it from one read
//! of the lock and the records.

use std::time::Duration;

use crate::logic::fence::FencingToken;
use crate::observe::inspect::{Holder, Inspection};

use super::record::{newest, Record};

/// The leader of an election at the moment it was read: its term, its
/// published value, and who holds the leadership's lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The term: the fencing token of the leadership, strictly larger for
    /// every later leader.
    pub term: FencingToken,
    /// The value the leader published (at
    /// [`campaign`](crate::Election::campaign) or its last
    /// [`proclaim`](crate::Leadership::proclaim)).
    pub value: Vec<u8>,
    /// The client holding the leadership's lock.
    pub holder: Holder,
    /// How long the lock stays on a majority at least, unless released
    /// or extended (the leader's watchdog extends it every third of it).
    pub valid_for_at_least: Duration,
}

impl Leader {
    /// The value as text, when it is UTF-8.
    pub fn value_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.value).ok()
    }
}

/// The leader, if the lock is held on a majority and the newest record is
/// its holder's: a holder whose record is not written yet (it won a moment
/// ago, or its publish failed) and an earlier leader's record are no
/// leader. `own_tag` is this client's tag ([`Holder::Us`]).
pub(crate) fn choose(
    inspection: &Inspection,
    records: impl IntoIterator<Item = Record>,
    own_tag: &str,
) -> Option<Leader> {
    let holder = inspection.holder.clone()?;
    let holder_tag = match &holder {
        Holder::Us => own_tag,
        Holder::Other { tag: Some(tag) } => tag.as_str(),
        Holder::Other { tag: None } => return None,
    };
    let record = newest(records)?;
    if record.tag != holder_tag {
        return None;
    }
    // The holder's token is at most the bucket's fence: a record with a
    // higher term than any token handed out was not written by a leader.
    if inspection.fence.is_some_and(|fence| record.term > fence) {
        return None;
    }
    Some(Leader {
        term: FencingToken::new(record.term),
        value: record.value,
        holder,
        valid_for_at_least: inspection.valid_for_at_least.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::inspect::{summarise, Observation, Seen};

    const US: &str = "00000000000000aa";
    const THEM: &str = "00000000000000bb";

    fn inspection(value: Option<&str>, fence: u64) -> Inspection {
        let seen = (0..3)
            .map(|index| Seen {
                index,
                addr: format!("127.0.0.1:{}", 7000 + index),
                answer: Ok(Observation {
                    value: value.map(str::to_owned),
                    pttl: if value.is_some() { 5000 } else { -2 },
                    fence: Some(fence),
                }),
            })
            .collect();
        summarise("election:e", "k", Some("f"), US, seen, Duration::ZERO)
    }

    fn record(term: u64, tag: &str, value: &str) -> Record {
        Record {
            term,
            tag: tag.into(),
            value: value.into(),
        }
    }

    #[test]
    fn the_holders_newest_record_is_the_leader() {
        let held = inspection(Some(&format!("{THEM}:secret")), 12);
        let leader = choose(&held, [record(9, US, "old"), record(12, THEM, "new")], US).unwrap();
        assert_eq!(leader.term.get(), 12);
        assert_eq!(leader.value_str(), Some("new"));
        assert_eq!(
            leader.holder,
            Holder::Other {
                tag: Some(THEM.into())
            }
        );
        assert_eq!(leader.valid_for_at_least, Duration::from_millis(5000));
        let ours = inspection(Some(&format!("{US}:secret")), 12);
        assert_eq!(
            choose(&ours, [record(12, US, "me")], US).map(|l| l.holder),
            Some(Holder::Us)
        );
    }

    #[test]
    fn no_leader_without_a_majority_or_with_an_earlier_leaders_record() {
        let free = inspection(None, 12);
        assert_eq!(choose(&free, [record(12, US, "x")], US), None);
        // Held by them; the newest record is ours: they have not published.
        let held = inspection(Some(&format!("{THEM}:secret")), 14);
        assert_eq!(choose(&held, [record(12, US, "x")], US), None);
        assert_eq!(choose(&held, Vec::new(), US), None);
        // A record above every token handed out was not a leader's.
        assert_eq!(choose(&held, [record(15, THEM, "x")], US), None);
        // A hand-written lock value names no client.
        let foreign = inspection(Some("hand-written"), 14);
        assert_eq!(choose(&foreign, [record(12, THEM, "x")], US), None);
    }
}
