//! The lock's commands as Redis sees them, and the parsers of their
//! replies: the acquire (a plain `SET NX PX`, with a `PTTL` for a waiter's
//! retry, and the fenced script's reply), the probe, the re-seed's reads.
//! Builders return owned `Cmd`/`Pipeline` values; nothing here does I/O.

use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, Pipeline, Value};

use crate::error::failure::NodeErrorKind;
use crate::observe::inspect::Observation;

/// `SET key value NX PX ttl`: the plain acquire. Without fencing it is not
/// a script: a Lua script costs the server ~5× the CPU of the command it
/// wraps.
pub(crate) fn set_nx(key: &str, value: &str, ttl_ms: u64) -> Cmd {
    let mut set = Cmd::with_capacity(6, 3 + key.len() + value.len() + 2 + 2 + 20);
    set.arg("SET")
        .arg(key)
        .arg(value)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms);
    set
}

/// A waiter's retry: the same `SET` and a `PTTL`, pipelined (not a
/// transaction: the `PTTL` only informs the next wait).
pub(crate) fn set_nx_probed(key: &str, value: &str, ttl_ms: u64) -> Pipeline {
    let mut pipe = redis::pipe();
    pipe.add_command(set_nx(key, value, ttl_ms))
        .cmd("PTTL")
        .arg(key);
    pipe
}

/// `PTTL key`.
pub(crate) fn pttl(key: &str) -> Cmd {
    let mut cmd = redis::cmd("PTTL");
    cmd.arg(key);
    cmd
}

/// `LREM queue 1 ticket`: a waiter leaves the fair queue.
pub(crate) fn lrem(queue: &str, ticket: &str) -> Cmd {
    let mut cmd = redis::cmd("LREM");
    cmd.arg(queue).arg(1).arg(ticket);
    cmd
}

/// `MGET keys…`.
pub(crate) fn mget(keys: &[String]) -> Cmd {
    let mut cmd = redis::cmd("MGET");
    for key in keys {
        cmd.arg(key);
    }
    cmd
}

/// The inspection's read: `GET key`, `PTTL key`, and `GET fence` when
/// fencing is on; pipelined, read-only.
pub(crate) fn inspect(key: &str, fence: Option<&str>) -> Pipeline {
    let mut pipe = redis::pipe();
    pipe.cmd("GET").arg(key).cmd("PTTL").arg(key);
    if let Some(fence) = fence {
        pipe.cmd("GET").arg(fence);
    }
    pipe
}

/// `DEL key`: the forced release, whatever the value.
pub(crate) fn del(key: &str) -> Cmd {
    let mut cmd = redis::cmd("DEL");
    cmd.arg(key);
    cmd
}

/// `DEL`'s count: whether the key was there.
pub(crate) fn parse_deleted(reply: Value) -> Result<bool, NodeErrorKind> {
    match reply {
        Value::Int(n) => Ok(n > 0),
        other => Err(unexpected(other)),
    }
}

/// The inspection's replies: `[value or nil, PTTL]` and the fence.
pub(crate) fn parse_inspect(reply: Value) -> Result<Observation, NodeErrorKind> {
    let Value::Array(items) = reply else {
        return Err(unexpected(reply));
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    match items.as_slice() {
        [value, Value::Int(pttl), rest @ ..] if rest.len() <= 1 => Ok(Observation {
            value: text(value),
            pttl: *pttl,
            fence: rest.first().and_then(text).and_then(|f| f.parse().ok()),
        }),
        // Not formatted into the error: the value is the holder's secret.
        _ => Err(unexpected(Value::Nil)),
    }
}

/// `OK` granted; nil held by another owner.
pub(crate) fn parse_set(reply: Value) -> Result<(), NodeErrorKind> {
    match reply {
        Value::Okay => Ok(()),
        Value::SimpleString(ref s) if s == "OK" => Ok(()),
        Value::Nil => Err(NodeErrorKind::HeldByOther { expires_in: None }),
        other => Err(unexpected(other)),
    }
}

/// The fenced acquire's reply, from the script or from the transaction
/// (`wire::transacted`). The script's: the node's new fence when granted
/// (an integer); `{fence}` or `{fence, PTTL}` when the `SET NX` found
/// another owner (`HeldByOther`, with the holder's TTL when probed). The
/// transaction's `EXEC`: `[OK, fence(, PTTL)]` granted, `[nil, fence(,
/// PTTL)]` held by another owner; a fence at 2^53 or past it, or an
/// `INCR` that failed, is the node's error, as the script's would be. A
/// granted fence below [`SEEDED_FROM`](crate::logic::fence::SEEDED_FROM)
/// is returned as it is: the caller asks again (`protocol::attempt`).
pub(crate) fn parse_fenced(reply: Value) -> Result<u64, NodeErrorKind> {
    match reply {
        Value::Int(fence) if fence > 0 => Ok(fence.unsigned_abs()),
        Value::Array(items) => match items.as_slice() {
            // The transaction's `EXEC` (`wire::transacted`): the `SET`'s
            // reply and the `INCR`'s. The script's 2^53 check, here.
            [Value::Okay, Value::Int(fence), ..] if *fence > 0 => {
                let fence = fence.unsigned_abs();
                if fence >= EXACT_BELOW {
                    return Err(past_exact(fence));
                }
                Ok(fence)
            }
            [Value::Nil, Value::Int(fence)] if *fence > 0 => {
                Err(NodeErrorKind::HeldByOther { expires_in: None })
            }
            [Value::Nil, Value::Int(fence), pttl] if *fence > 0 => Err(held_for(pttl)?),
            // The `INCR` failed (not a number, past `i64::MAX`): its error.
            [Value::Okay | Value::Nil, error @ Value::ServerError(_), ..] => {
                Err(NodeErrorKind::Redis(Arc::new(
                    error.clone().extract_error().err().unwrap_or_else(|| {
                        redis::RedisError::from((
                            redis::ErrorKind::UnexpectedReturnType,
                            "no error",
                        ))
                    }),
                )))
            }
            [Value::Int(fence)] if *fence > 0 => {
                Err(NodeErrorKind::HeldByOther { expires_in: None })
            }
            [Value::Int(fence), pttl] if *fence > 0 => Err(held_for(pttl)?),
            _ => Err(unexpected(Value::Array(items))),
        },
        other => Err(unexpected(other)),
    }
}

/// The all-or-nothing acquire's reply (`ACQUIRE_ALL`): `{0, fence…}`
/// when every key was set (one fence per resource, in order; none without
/// fencing), `{i}` or `{i, PTTL}` when the `i`-th key (from 1) was held,
/// and nothing was written (`HeldByOther`, with that key's TTL when
/// probed).
pub(crate) fn parse_all(reply: Value) -> Result<Vec<u64>, NodeErrorKind> {
    let Value::Array(items) = reply else {
        return Err(unexpected(reply));
    };
    match items.as_slice() {
        [Value::Int(0), fences @ ..] => fences
            .iter()
            .map(|f| match f {
                Value::Int(f) if *f > 0 => Ok(f.unsigned_abs()),
                other => Err(unexpected(other.clone())),
            })
            .collect(),
        [Value::Int(i)] if *i > 0 => Err(NodeErrorKind::HeldByOther { expires_in: None }),
        [Value::Int(i), pttl] if *i > 0 => Err(held_for(pttl)?),
        _ => Err(unexpected(Value::Array(items))),
    }
}

/// The plain acquire with a `PTTL`: `[SET reply, PTTL reply]`.
pub(crate) fn parse_probed_set(reply: Value) -> Result<u64, NodeErrorKind> {
    let Value::Array(items) = reply else {
        return Err(unexpected(reply));
    };
    match items.as_slice() {
        [set, pttl] => match parse_set(set.clone()) {
            Ok(()) => Ok(0),
            Err(NodeErrorKind::HeldByOther { .. }) => Err(held_for(pttl)?),
            Err(e) => Err(e),
        },
        _ => Err(unexpected(Value::Array(items))),
    }
}

/// `HeldByOther` with the holder's remaining TTL from a `PTTL` reply (also
/// the read-write lock's refusals, `rwlock::scripts`): -1 is
/// a key without expiry (never frees), -2 a key gone since the `SET` (free
/// now).
pub(crate) fn held_for(pttl: &Value) -> Result<NodeErrorKind, NodeErrorKind> {
    let expires_in = match pttl {
        Value::Int(-2) => Some(Duration::ZERO),
        Value::Int(ms) if *ms >= 0 => Some(Duration::from_millis(ms.unsigned_abs())),
        Value::Int(_) => None,
        other => return Err(unexpected(other.clone())),
    };
    Ok(NodeErrorKind::HeldByOther { expires_in })
}

/// A probe's `PTTL`: `Some` with the remaining TTL (`None` inside for a key
/// without expiry) when held, `None` when free or not understood.
pub(crate) fn parse_held(reply: &Value) -> Option<Option<Duration>> {
    match reply {
        Value::Int(ms) if *ms > 0 => Some(Some(Duration::from_millis(ms.unsigned_abs()))),
        Value::Int(-1) => Some(None),
        _ => None,
    }
}

/// The extend script: 1 extended, 0 absent, -1 another owner's value.
pub(crate) fn parse_extend(reply: Value) -> Result<(), NodeErrorKind> {
    match reply {
        Value::Int(-1) => Err(NodeErrorKind::HeldByOther { expires_in: None }),
        other => parse_flag(other),
    }
}

/// One integer code per key (`RELEASE_ALL`): exactly `n` of them.
pub(crate) fn parse_codes(reply: Value, n: usize) -> Result<Vec<i64>, NodeErrorKind> {
    let Value::Array(items) = reply else {
        return Err(unexpected(reply));
    };
    if items.len() != n {
        return Err(unexpected(Value::Array(items)));
    }
    let mut codes = Vec::with_capacity(n);
    for item in items {
        match item {
            Value::Int(code) => codes.push(code),
            other => return Err(unexpected(other)),
        }
    }
    Ok(codes)
}

/// 1 done; 0 not held by us.
pub(crate) fn parse_flag(reply: Value) -> Result<(), NodeErrorKind> {
    match reply {
        Value::Int(1) => Ok(()),
        Value::Int(0) => Err(NodeErrorKind::NotHeld),
        other => Err(unexpected(other)),
    }
}

/// An `MGET` of fences: each key paired with its value when it is a
/// decimal integer (keys gone or holding anything else are left out).
pub(crate) fn parse_fences(keys: Vec<String>, reply: Value) -> Vec<(String, u64)> {
    let Value::Array(values) = reply else {
        return Vec::new();
    };
    keys.into_iter()
        .zip(values)
        .filter_map(|(key, value)| match value {
            Value::BulkString(b) => std::str::from_utf8(&b)
                .ok()
                .and_then(|s| s.parse().ok())
                .map(|v| (key, v)),
            _ => None,
        })
        .collect()
}

/// Tokens are exact below 2^53: the scripts see numbers as Lua doubles,
/// and so do JSON's users.
const EXACT_BELOW: u64 = 1 << 53;

/// The script's error for a fence at 2^53 or past it, for the transaction.
fn past_exact(fence: u64) -> NodeErrorKind {
    NodeErrorKind::Redis(Arc::new(redis::RedisError::from((
        redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
        "fence at 2^53: tokens past it are not exact",
        format!("the fence moved to {fence}"),
    ))))
}

pub(crate) fn unexpected(reply: Value) -> NodeErrorKind {
    NodeErrorKind::Redis(Arc::new(redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected script reply",
        format!("{reply:?}"),
    ))))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both shapes of the fenced acquire's reply: the script's and the
    /// transaction's `EXEC`, granted, refused (with the holder's TTL when
    /// probed), and the errors a wrong fence gives.
    #[test]
    fn the_fenced_reply_of_the_script_and_of_the_transaction() {
        let f = 1_796_000_000_000_001i64;
        assert_eq!(parse_fenced(Value::Int(f)).unwrap(), f as u64);
        for granted in [
            vec![Value::Okay, Value::Int(f)],
            vec![Value::Okay, Value::Int(f), Value::Int(-2)],
        ] {
            assert_eq!(parse_fenced(Value::Array(granted)).unwrap(), f as u64);
        }
        let held = |items: Vec<Value>| parse_fenced(Value::Array(items)).unwrap_err();
        for refused in [vec![Value::Int(f)], vec![Value::Nil, Value::Int(f)]] {
            assert!(matches!(
                held(refused),
                NodeErrorKind::HeldByOther { expires_in: None }
            ));
        }
        for probed in [
            vec![Value::Int(f), Value::Int(1500)],
            vec![Value::Nil, Value::Int(f), Value::Int(1500)],
        ] {
            assert!(matches!(
                held(probed),
                NodeErrorKind::HeldByOther { expires_in: Some(d) } if d == Duration::from_millis(1500)
            ));
        }
        // Unseeded: returned as it is, for the caller to ask again.
        assert_eq!(
            parse_fenced(Value::Array(vec![Value::Okay, Value::Int(1)])).unwrap(),
            1
        );
        // The node error and its source, as a report shows them.
        let said = |e: &NodeErrorKind| {
            let source = std::error::Error::source(e).map(ToString::to_string);
            format!("{e}: {}", source.unwrap_or_default())
        };
        let past = held(vec![Value::Okay, Value::Int(1 << 53)]);
        assert!(matches!(past, NodeErrorKind::Redis(_)), "{past:?}");
        assert!(said(&past).contains("2^53"), "{}", said(&past));
        let overflow = crate::wire::resp::parse(b"-ERR increment or decrement would overflow\r\n")
            .unwrap()
            .unwrap()
            .0;
        let e = held(vec![Value::Okay, overflow]);
        assert!(matches!(e, NodeErrorKind::Redis(_)), "{e:?}");
        assert!(said(&e).contains("overflow"), "{}", said(&e));
        assert!(matches!(
            held(vec![Value::Okay, Value::Int(0)]),
            NodeErrorKind::Redis(_)
        ));
    }

    #[test]
    fn the_all_or_nothing_acquires_replies_parse() {
        let arr = |v: Vec<i64>| Value::Array(v.into_iter().map(Value::Int).collect());
        assert_eq!(parse_all(arr(vec![0, 7, 9, 8])).unwrap(), vec![7, 9, 8]);
        assert_eq!(parse_all(arr(vec![0])).unwrap(), Vec::<u64>::new());
        assert!(matches!(
            parse_all(arr(vec![2])),
            Err(NodeErrorKind::HeldByOther { expires_in: None })
        ));
        assert!(matches!(
            parse_all(arr(vec![1, 1500])),
            Err(NodeErrorKind::HeldByOther { expires_in: Some(d) }) if d == Duration::from_millis(1500)
        ));
        // A zero fence, a refusal at index 0, a bare integer: not ours.
        assert!(matches!(
            parse_all(arr(vec![0, 0])),
            Err(NodeErrorKind::Redis(_))
        ));
        assert!(matches!(
            parse_all(arr(vec![-1])),
            Err(NodeErrorKind::Redis(_))
        ));
        assert!(matches!(
            parse_all(Value::Int(3)),
            Err(NodeErrorKind::Redis(_))
        ));
    }

    #[test]
    fn set_replies() {
        assert!(parse_set(Value::Okay).is_ok());
        assert!(parse_set(Value::SimpleString("OK".into())).is_ok());
        assert!(matches!(
            parse_set(Value::Nil),
            Err(NodeErrorKind::HeldByOther { expires_in: None })
        ));
        assert!(matches!(
            parse_set(Value::Int(1)),
            Err(NodeErrorKind::Redis(_))
        ));
    }

    #[test]
    fn flag_replies() {
        assert!(parse_flag(Value::Int(1)).is_ok());
        assert!(matches!(
            parse_flag(Value::Int(0)),
            Err(NodeErrorKind::NotHeld)
        ));
        assert!(matches!(
            parse_flag(Value::Okay),
            Err(NodeErrorKind::Redis(_))
        ));
    }

    #[test]
    fn fenced_replies() {
        assert_eq!(parse_fenced(Value::Int(7)).unwrap(), 7);
        assert_eq!(
            parse_fenced(Value::Int(i64::MAX)).unwrap(),
            i64::MAX.unsigned_abs()
        );
        assert!(matches!(
            parse_fenced(Value::Array(vec![Value::Int(8)])),
            Err(NodeErrorKind::HeldByOther { expires_in: None })
        ));
        assert!(matches!(
            parse_fenced(Value::Array(vec![Value::Int(8), Value::Int(1500)])),
            Err(NodeErrorKind::HeldByOther {
                expires_in: Some(d)
            }) if d == Duration::from_millis(1500)
        ));
        for bad in [
            Value::Int(0),
            Value::Int(-1),
            Value::Array(vec![Value::Int(0)]),
            Value::Array(vec![Value::Okay]),
            Value::Array(vec![]),
            Value::Okay,
            Value::Nil,
        ] {
            assert!(
                matches!(parse_fenced(bad.clone()), Err(NodeErrorKind::Redis(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn inspect_replies() {
        let o = parse_inspect(Value::Array(vec![
            Value::BulkString(b"0123abcd:ff".to_vec()),
            Value::Int(1500),
            Value::BulkString(b"42".to_vec()),
        ]))
        .unwrap();
        assert_eq!(
            (o.value.as_deref(), o.pttl, o.fence),
            (Some("0123abcd:ff"), 1500, Some(42))
        );
        let o = parse_inspect(Value::Array(vec![Value::Nil, Value::Int(-2)])).unwrap();
        assert_eq!((o.value, o.pttl, o.fence), (None, -2, None));
        let bad = Value::Array(vec![Value::BulkString(b"0123abcd:secret".to_vec())]);
        let Err(err) = parse_inspect(bad) else {
            panic!("accepted")
        };
        assert!(!format!("{err:?}").contains("secret"));
        assert!(parse_deleted(Value::Int(1)).unwrap());
        assert!(!parse_deleted(Value::Int(0)).unwrap());
        assert!(parse_deleted(Value::Okay).is_err());
    }

    #[test]
    fn probe_and_scan_replies() {
        assert_eq!(
            parse_held(&Value::Int(1500)),
            Some(Some(Duration::from_millis(1500)))
        );
        assert_eq!(parse_held(&Value::Int(-1)), Some(None));
        assert_eq!(parse_held(&Value::Int(-2)), None);
        assert_eq!(parse_held(&Value::Nil), None);
        let fences = parse_fences(
            vec!["a".into(), "b".into(), "c".into()],
            Value::Array(vec![
                Value::BulkString(b"5".to_vec()),
                Value::Nil,
                Value::BulkString(b"x".to_vec()),
            ]),
        );
        assert_eq!(fences, vec![("a".to_owned(), 5)]);
    }
}
