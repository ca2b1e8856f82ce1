//! The read-write lock's scripts (`lua/` beside this file) and the
//! parsers of their replies. Extend, release and the token's write-back are
//! the mutex's own scripts: every rw entry (the writer's key, each
//! reader's entry) is a string key holding its owner's value with a TTL,
//! as a mutex's lock key is.

use std::sync::LazyLock;

use redis::Value;

use super::view::RwObservation;
use crate::error::failure::NodeErrorKind;
use crate::wire::commands::{held_for, unexpected};
use crate::wire::scripts::Script;

/// A script whose `EVAL` after `NOSCRIPT` must not go out once its round
/// decided: a late grant would outlive its release (as the mutex's
/// acquire).
fn acquiring(name: &'static str, source: &'static str) -> Script {
    let mut script = Script::new(name, source);
    script.eval_when_decided = false;
    script
}

/// A reader's admission: one `MGET` of the writer key, the waiting
/// writer's marker and the fence; refused while a writer holds or waits;
/// else sets this reader's entry (`SET PX`), adds its name to the index
/// (pruning the names whose keys are gone when asked: one read in 8) and
/// returns the fence as it stands (the generation seen; seeded
/// from the clock when absent), or 0 without fencing. Refused: `{0, PTTL
/// of what blocks}`.
///
/// KEYS: writer, readers, waiting, entry[, fence]. ARGV: value, ttl ms,
/// seed, "1" to prune or "".
pub(crate) static READ: LazyLock<Script> =
    LazyLock::new(|| acquiring("rw-read", include_str!("lua/read.lua")));

/// A writer's admission: refused while a writer or any live reader holds
/// (and then, given a marker id, sets the waiting marker unless another
/// writer's is there); else `SET PX` of the writer key, deletes its own
/// marker, and `INCR`s the fence as the mutex's acquire does (seeded when
/// absent). Returns the new fence (0 without fencing), `{0, PTTL}` when
/// refused (the longest reader's, or the writer's).
///
/// KEYS: writer, readers, waiting[, fence]. ARGV: value, ttl ms, seed,
/// marker id or "", marker life ms.
pub(crate) static WRITE: LazyLock<Script> =
    LazyLock::new(|| acquiring("rw-write", include_str!("lua/write.lua")));

/// The downgrade: where the writer key holds our value, deletes it and
/// sets a reader entry with the same value in the same script. 1 when
/// converted, 0 when the writer key is not ours there.
///
/// KEYS: writer, readers, entry. ARGV: value, ttl ms.
pub(crate) static DOWNGRADE: LazyLock<Script> =
    LazyLock::new(|| Script::new("rw-downgrade", include_str!("lua/downgrade.lua")));

/// The inspection, read-only (`GET`, `PTTL`, `SMEMBERS`): the writer
/// key, the waiting writer's marker, the fence, the size of the readers'
/// index and up to ARGV[1] live reader entries; dead names are skipped,
/// not pruned.
///
/// KEYS: writer, readers, waiting[, fence]. ARGV: the most entries.
/// Reply: `{writer, its PTTL, marker, its PTTL, fence, names, {value,
/// PTTL, …}}`, nil for what is absent.
pub(crate) static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new("rw-inspect", include_str!("lua/inspect.lua")));

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

    #[test]
    fn scripts_know_the_commands_they_run() {
        assert_eq!(
            READ.commands(),
            ["MGET", "PTTL", "SMEMBERS", "EXISTS", "DEL", "SREM", "SET", "SADD"]
        );
        assert_eq!(
            WRITE.commands(),
            ["GET", "SET", "PTTL", "SMEMBERS", "EXISTS", "DEL", "SREM", "INCR", "INCRBY"]
        );
        assert_eq!(DOWNGRADE.commands(), ["GET", "DEL", "SET", "SADD"]);
        assert_eq!(INSPECT.commands(), ["GET", "PTTL", "SMEMBERS"]);
        assert!(!READ.eval_when_decided && !WRITE.eval_when_decided);
    }
}
