//! The entry's I/O: the read (every node at once, decided at a majority
//! of answers, the newest of them) and the computer's fenced write (every
//! node at once, decided at a majority of acceptances). Each request is
//! bounded by the node timeout; nodes still silent at the decision are
//! heard in the background.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use redis::Value;

use crate::error::failure::NodeErrorKind;
use crate::logic::quorum::quorum;
use crate::node::Settled;
use crate::protocol::fanout::{all_nodes, FanOut};
use crate::protocol::majority_write::{parse_u64, write_at_majority};
pub(crate) use crate::protocol::majority_write::{Short, WriteFailed};
use crate::protocol::shared::Shared;
use crate::wire::commands::unexpected;

use super::batch::Batches;
use super::entry::{newest, Entry};
use super::scripts::{ONCE_READ, ONCE_WRITE};

/// The newest entry among a majority's answers (`Ok(None)`: never
/// written, or expired from the nodes).
pub(crate) async fn read_entry(shared: &Shared, key: &str) -> Result<Option<Entry>, Short> {
    let deadline = Instant::now() + shared.config.node_timeout;
    let evalsha = ONCE_READ.evalsha(&[key], &[]);
    let mut fan: FanOut<Option<Entry>> = FanOut::start(
        &shared.nodes,
        all_nodes(shared.nodes.len()),
        deadline,
        |node, _| {
            let evalsha = evalsha.clone();
            async move {
                let reply = node
                    .run_script_prepared(&ONCE_READ, &evalsha, &Settled::NEVER, false, None)
                    .await?;
                parse_entry(reply)
            }
        },
    );
    fan.decide(Result::is_ok, deadline).await;
    let entries = fan.values();
    let needed = quorum(shared.nodes.len());
    if entries.len() < needed {
        let failures = fan.failures();
        fan.finish_in_background();
        return Err(Short {
            answered: entries.len(),
            quorum: needed,
            failures,
        });
    }
    fan.finish_in_background();
    Ok(newest(entries.into_iter().filter_map(|(_, e)| e)))
}

/// The process's read batches of every entry.
static READS: LazyLock<Batches<Result<Option<Entry>, Short>>> = LazyLock::new(Batches::new);

/// [`read_entry`], shared with the callers of the same client that read
/// `key` at the same time, never taking a read that began before this
/// call (`batch.rs`): the same guarantee as a read of one's own.
pub(crate) async fn read_entry_batched(shared: &Shared, key: &str) -> Result<Option<Entry>, Short> {
    let name = format!("{}\0{}", shared.id_text, key);
    READS.read(&name, || read_entry(shared, key)).await
}

/// What the computer writes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Written<'a> {
    /// The computed value, fresh for `fresh`, computed in `delta`.
    Value {
        value: &'a [u8],
        fresh: Duration,
        delta: Duration,
    },
    /// The computation's error, shown to its waiters for `fresh`.
    Error { message: &'a str, fresh: Duration },
}

/// Writes `what` with `token` on every node; `keep` is how long the entry
/// stays on a node after this write. `Ok` once a majority stored it.
pub(crate) async fn write_entry(
    shared: &Shared,
    key: &str,
    token: u64,
    what: Written<'_>,
    keep: Duration,
) -> Result<(), WriteFailed> {
    let (payload, fresh, kind, delta) = match what {
        Written::Value {
            value,
            fresh,
            delta,
        } => (value, fresh, &b"value"[..], delta),
        Written::Error { message, fresh } => {
            (message.as_bytes(), fresh, &b"error"[..], Duration::ZERO)
        }
    };
    let fresh_ms = millis(fresh);
    // The entry outlives its freshness by `keep`: the stale value (for
    // serve-stale) and, above all, the fence stay.
    let keep_ms = millis(keep).saturating_add(fresh_ms).max(1);
    let token = token.to_string();
    let fresh_ms = fresh_ms.to_string();
    let keep_ms = keep_ms.to_string();
    let delta_ms = millis(delta).to_string();
    let args: [&[u8]; 6] = [
        payload,
        token.as_bytes(),
        fresh_ms.as_bytes(),
        keep_ms.as_bytes(),
        kind,
        delta_ms.as_bytes(),
    ];
    write_at_majority(shared, &ONCE_WRITE, key, &args).await
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The read's reply: nil, or the six fields of `read.lua`.
fn parse_entry(reply: Value) -> Result<Option<Entry>, NodeErrorKind> {
    let Value::Array(items) = &reply else {
        return match reply {
            Value::Nil => Ok(None),
            other => Err(unexpected(other)),
        };
    };
    let [value, fence, left, delta, error, error_left] = items.as_slice() else {
        return Err(unexpected(reply));
    };
    let Some(fence) = parse_u64(fence) else {
        return Err(unexpected(reply));
    };
    let bytes = |v: &Value| match v {
        Value::BulkString(b) => Some(b.clone()),
        _ => None,
    };
    let int = |v: &Value| match v {
        Value::Int(i) => Some(*i),
        _ => None,
    };
    let error = match (bytes(error), int(error_left)) {
        (Some(message), Some(left)) => Some((String::from_utf8_lossy(&message).into_owned(), left)),
        _ => None,
    };
    Ok(Some(Entry {
        fence,
        value: bytes(value),
        left_ms: int(left).unwrap_or(0),
        delta: Duration::from_millis(parse_u64(delta).unwrap_or(0)),
        error,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(b: &[u8]) -> Value {
        Value::BulkString(b.to_vec())
    }

    #[test]
    fn read_replies() {
        assert_eq!(parse_entry(Value::Nil).ok(), Some(None));
        let full = Value::Array(vec![
            bulk(b"v"),
            bulk(b"7"),
            Value::Int(-3),
            bulk(b"20"),
            bulk(b"db down"),
            Value::Int(900),
        ]);
        let entry = parse_entry(full).unwrap().unwrap();
        assert_eq!(entry.fence, 7);
        assert_eq!(entry.value.as_deref(), Some(&b"v"[..]));
        assert_eq!(entry.left_ms, -3);
        assert_eq!(entry.delta, Duration::from_millis(20));
        assert_eq!(entry.error, Some(("db down".into(), 900)));
        let error_only = Value::Array(vec![
            Value::Nil,
            bulk(b"8"),
            Value::Nil,
            Value::Nil,
            bulk(b"x"),
            Value::Int(5),
        ]);
        let entry = parse_entry(error_only).unwrap().unwrap();
        assert_eq!((entry.value, entry.left_ms), (None, 0));
        assert!(parse_entry(Value::Array(vec![Value::Nil])).is_err());
        assert!(parse_entry(Value::Int(3)).is_err());
    }
}
