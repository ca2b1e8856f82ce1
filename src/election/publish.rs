//! The leader's write of its record: one fenced write per node, all N at
//! once, each bounded by the node timeout, decided at a majority. The
//! fenced-write script compares the term with the record's and refuses a
//! lower one, so a leader whose lease ran out cannot overwrite a newer
//! leader's record on any node.

use std::time::Instant;

use redis::Value;

use crate::error::failure::NodeErrorKind;
use crate::logic::fence::FencingToken;
use crate::logic::quorum::quorum;
use crate::protocol::fanout::{all_nodes, FanOut};
use crate::protocol::shared::Shared;
use crate::wire::commands::unexpected;
use crate::wire::scripts::FENCED_WRITE;

use super::error::ElectionError;
use super::record::encode;

/// One node's answer to the write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Written {
    /// Stored.
    #[default]
    Accepted,
    /// Refused: the record holds this higher term.
    Refused(u64),
}

/// Writes `{tag}:{value}` with `term` to `key` on every node; `Ok` once a
/// majority stored it. A refusal by any node that answered in time is
/// [`ElectionError::Superseded`]; a majority out of reach otherwise,
/// [`ElectionError::Unavailable`]. Nodes still silent at the decision are
/// heard in the background, up to the node timeout.
pub(crate) async fn publish(
    shared: &Shared,
    election: &str,
    key: &str,
    term: FencingToken,
    value: &[u8],
) -> Result<(), ElectionError> {
    let stored = encode(&shared.id_text, value);
    let evalsha = FENCED_WRITE.evalsha(&[key], &[&stored, term.get().to_string().as_bytes()]);
    let deadline = Instant::now() + shared.config.node_timeout;
    let mut fan: FanOut<Written> = FanOut::start(
        &shared.nodes,
        all_nodes(shared.nodes.len()),
        deadline,
        |node, settled| {
            let evalsha = evalsha.clone();
            async move {
                let reply = node
                    .run_script_prepared(&FENCED_WRITE, &evalsha, &settled, false, None)
                    .await?;
                parse_written(reply)
            }
        },
    );
    fan.decide(|a| matches!(a, Ok(Written::Accepted)), deadline)
        .await;
    let values = fan.values();
    let refused = values
        .iter()
        .filter_map(|(_, w)| match w {
            Written::Refused(current) => Some(*current),
            Written::Accepted => None,
        })
        .max();
    let accepted = values
        .iter()
        .filter(|(_, w)| *w == Written::Accepted)
        .count();
    let failures = fan.failures();
    fan.finish_in_background();
    if let Some(current) = refused {
        return Err(ElectionError::Superseded {
            election: election.to_owned(),
            term,
            current: FencingToken::new(current),
        });
    }
    let needed = quorum(shared.nodes.len());
    if accepted < needed {
        return Err(ElectionError::Unavailable {
            election: election.to_owned(),
            phase: "publish",
            answered: accepted,
            quorum: needed,
            failures,
        });
    }
    Ok(())
}

/// The fenced write's reply: `1`, or `{0, current}`.
fn parse_written(reply: Value) -> Result<Written, NodeErrorKind> {
    match &reply {
        Value::Int(1) => Ok(Written::Accepted),
        Value::Array(items) if items.len() == 2 => match parse_term(&items[1]) {
            Some(current) => Ok(Written::Refused(current)),
            None => Err(unexpected(reply)),
        },
        _ => Err(unexpected(reply)),
    }
}

/// A term as the scripts return it: a decimal string (or an integer).
pub(crate) fn parse_term(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies() {
        assert_eq!(parse_written(Value::Int(1)).ok(), Some(Written::Accepted));
        let refused = Value::Array(vec![Value::Int(0), Value::BulkString(b"42".to_vec())]);
        assert_eq!(parse_written(refused).ok(), Some(Written::Refused(42)));
        assert!(parse_written(Value::Nil).is_err());
        assert!(parse_written(Value::Array(vec![Value::Int(0), Value::Nil])).is_err());
        assert_eq!(parse_term(&Value::Int(-1)), None);
    }
}
