//! The leader record and the names an election derives: the lock's
//! resource (`election:{name}`) and the record's Redis key beside the lock
//! key. Pure: no I/O, tested here without Redis.
//!
//! The record is a fenced-store hash (`value`, `fence`: the same script and
//! layout as [`FencedStore`](crate::FencedStore)) whose fence is the
//! leader's term. Its value is `{tag}:{published value}`: the tag of the
//! leader's client, so that a reader can tell the record of the lock's
//! current holder from the record of an earlier leader (a holder that has
//! not published yet).

use crate::observe::inspect::value_tag;

/// What an election's lock resource starts with.
pub(crate) const RESOURCE_PREFIX: &str = "election:";

/// The lock resource of election `name`.
pub(crate) fn resource(name: &str) -> String {
    format!("{RESOURCE_PREFIX}{name}")
}

/// The record's key: the lock key with its kind `lock:` replaced by
/// `leader:` (`{prefix}leader:election:{name}`, or with the cluster
/// layout's hash tag, which then puts the record in the lock key's slot).
pub(crate) fn record_key(prefix: &str, lock_key: &str) -> String {
    match lock_key
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix("lock:"))
    {
        Some(rest) => format!("{prefix}leader:{rest}"),
        // Not reached: every lock key is `{prefix}lock:…`.
        None => format!("{prefix}leader:{lock_key}"),
    }
}

/// The record's stored value: the leader's client tag, `:`, its value.
pub(crate) fn encode(tag: &str, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(tag.len() + 1 + value.len());
    out.extend_from_slice(tag.as_bytes());
    out.push(b':');
    out.extend_from_slice(value);
    out
}

/// One node's record, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// The term (the fence of the record's last accepted write).
    pub(crate) term: u64,
    /// The tag of the client that wrote it.
    pub(crate) tag: String,
    /// The published value.
    pub(crate) value: Vec<u8>,
}

/// Decodes a stored value written with `term`; `None` for a value not
/// written by an election (no tag before the first `:`).
pub(crate) fn decode(stored: &[u8], term: u64) -> Option<Record> {
    let colon = stored.iter().position(|&b| b == b':')?;
    let head = std::str::from_utf8(stored.get(..=colon)?).ok()?;
    // `value_tag` reads `{tag}:{rest}`: give it the tag and its colon.
    let tag = value_tag(head)?;
    Some(Record {
        term,
        tag: tag.to_owned(),
        value: stored.get(colon + 1..)?.to_vec(),
    })
}

/// The record with the highest term among the nodes' answers.
pub(crate) fn newest(records: impl IntoIterator<Item = Record>) -> Option<Record> {
    records.into_iter().max_by_key(|r| r.term)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAG: &str = "0123456789abcdef";

    #[test]
    fn names() {
        assert_eq!(resource("relay"), "election:relay");
        assert_eq!(
            record_key("redfence:", "redfence:lock:election:relay"),
            "redfence:leader:election:relay"
        );
        // The cluster layout's hash tag stays where it was.
        assert_eq!(
            record_key("p:", "p:lock:{42}election:relay"),
            "p:leader:{42}election:relay"
        );
        assert_eq!(record_key("p:", "odd"), "p:leader:odd");
    }

    #[test]
    fn records_round_trip_with_any_value() {
        for value in [&b""[..], b"10.0.0.7:8080", b"a:b:c", &[0, 255, b':']] {
            let stored = encode(TAG, value);
            let record = decode(&stored, 7).unwrap();
            assert_eq!(record.term, 7);
            assert_eq!(record.tag, TAG);
            assert_eq!(record.value, value);
        }
    }

    #[test]
    fn foreign_values_are_not_records() {
        for stored in [&b""[..], b"no colon", b"UPPER:x", b"short:x", &[0xff, b':']] {
            assert_eq!(decode(stored, 1), None, "{stored:?}");
        }
    }

    #[test]
    fn the_newest_record_has_the_highest_term() {
        let r = |term| Record {
            term,
            tag: TAG.into(),
            value: vec![],
        };
        assert_eq!(newest([r(3), r(9), r(5)]).map(|r| r.term), Some(9));
        assert_eq!(newest(Vec::new()), None);
    }
}
