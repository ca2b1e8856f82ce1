//! The parsers of the read-write lock's script replies. The scripts
//! themselves (`RW_READ`, `RW_WRITE`, `RW_DOWNGRADE`, `RW_INSPECT`) are
//! `wire::scripts`', beside every other script, so that a connection's
//! handshake loads the admissions and the downgrade with the lock's.
//! Extend, release and the token's write-back are the mutex's own
//! scripts: every rw entry (the writer's key, each reader's entry) is a
//! string key holding its owner's value with a TTL, as a mutex's lock key
//! is.

use redis::Value;

use super::view::RwObservation;
use crate::error::failure::NodeErrorKind;
use crate::wire::commands::{held_for, unexpected};

/// The inspection's reply. Values are holders' secrets: never formatted
/// into an error.
pub(crate) fn parse_inspect(reply: Value) -> Result<RwObservation, NodeErrorKind> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let Value::Array(items) = reply else {
        return Err(unexpected(Value::Nil));
    };
    let [writer, Value::Int(wt), waiting, Value::Int(xt), fence, Value::Int(names), Value::Array(entries)] =
        items.as_slice()
    else {
        return Err(unexpected(Value::Nil));
    };
    // A key read by GET and gone by PTTL (it expired between) is absent.
    let present = |v: &Value, pttl: i64| text(v).filter(|_| pttl != -2).map(|v| (v, pttl));
    let mut readers = Vec::with_capacity(entries.len() / 2);
    for e in entries.chunks(2) {
        match e {
            [value, Value::Int(pttl)] => readers.extend(present(value, *pttl)),
            _ => return Err(unexpected(Value::Nil)),
        }
    }
    Ok(RwObservation {
        writer: present(writer, *wt),
        waiting: present(waiting, *xt),
        fence: text(fence).and_then(|f| f.parse().ok()),
        indexed: usize::try_from(*names).unwrap_or(0),
        readers,
    })
}

/// A read or write admission's reply: the fence (0 without fencing), or
/// `HeldByOther` with the blocker's remaining TTL.
pub(crate) fn parse_admit(reply: Value) -> Result<u64, NodeErrorKind> {
    match reply {
        Value::Int(fence) if fence >= 0 => Ok(fence.unsigned_abs()),
        Value::Array(items) => match items.as_slice() {
            [Value::Int(0), pttl] => Err(held_for(pttl)?),
            _ => Err(unexpected(Value::Array(items))),
        },
        other => Err(unexpected(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn replies() {
        assert_eq!(parse_admit(Value::Int(42)).ok(), Some(42));
        assert_eq!(parse_admit(Value::Int(0)).ok(), Some(0));
        let refused = parse_admit(Value::Array(vec![Value::Int(0), Value::Int(1500)]));
        assert!(matches!(
            refused,
            Err(NodeErrorKind::HeldByOther { expires_in: Some(d) }) if d == Duration::from_millis(1500)
        ));
        assert!(parse_admit(Value::Nil).is_err());
        assert!(parse_admit(Value::Int(-3)).is_err());
    }

    #[test]
    fn the_inspections_reply_parses_and_skips_what_expired_between() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = Value::Array(vec![
            bulk("aaaaaaaaaaaaaaaa:1"),
            Value::Int(900),
            Value::Nil,
            Value::Int(-2),
            bulk("42"),
            Value::Int(3),
            Value::Array(vec![
                bulk("bbbbbbbbbbbbbbbb:2"),
                Value::Int(500),
                bulk("cccccccccccccccc:3"),
                Value::Int(-2),
            ]),
        ]);
        let o = parse_inspect(reply).expect("parses");
        assert_eq!(o.writer, Some(("aaaaaaaaaaaaaaaa:1".into(), 900)));
        assert!(o.waiting.is_none());
        assert_eq!((o.fence, o.indexed), (Some(42), 3));
        assert_eq!(o.readers, [("bbbbbbbbbbbbbbbb:2".to_owned(), 500)]);
        assert!(parse_inspect(Value::Int(1)).is_err());
        assert!(parse_inspect(Value::Array(vec![Value::Nil])).is_err());
    }
}
