//! A fenced write on every node, decided at a majority: the family's
//! records (an election's leader record, a single-flight entry) are
//! written by a script that compares the writer's token with the one the
//! key holds and refuses a lower one (`1`, or `{0, current}`). All N at
//! once, each bounded by the node timeout; the nodes still silent at the
//! decision are heard in the background.

use std::sync::Arc;
use std::time::Instant;

use redis::Value;

use crate::error::failure::{NodeErrorKind, NodeFailure};
use crate::logic::quorum::quorum;
use crate::protocol::fanout::{all_nodes, FanOut};
use crate::protocol::shared::Shared;
use crate::wire::commands::unexpected;
use crate::wire::outgoing::PackedOnce;
use crate::wire::scripts::Script;

/// Too few nodes answered (a read) or accepted (a write).
#[derive(Debug, Clone)]
pub(crate) struct Short {
    pub(crate) answered: usize,
    pub(crate) quorum: usize,
    pub(crate) failures: Vec<NodeFailure>,
}

/// Why a fenced write did not land on a majority.
#[derive(Debug)]
pub(crate) enum WriteFailed {
    /// A node that answered in time refused it: it holds this higher
    /// token. A refusal anywhere wins over acceptances elsewhere: a newer
    /// writer exists.
    Stale(u64),
    /// Too few nodes accepted.
    Short(Short),
}

/// One node's answer to the write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Answer {
    /// Stored.
    #[default]
    Accepted,
    /// Refused: the key holds this higher token.
    Refused(u64),
}

/// Runs `script` on `key` with `args` on every node; `Ok` once a majority
/// stored it.
pub(crate) async fn write_at_majority(
    shared: &Shared,
    script: &'static Script,
    key: &str,
    args: &[&[u8]],
) -> Result<(), WriteFailed> {
    // Built and packed once for every node.
    let evalsha = Arc::new(PackedOnce::new(
        script.evalsha(&[key], args),
        shared.nodes.len(),
    ));
    let deadline = Instant::now() + shared.config.node_timeout;
    let mut fan: FanOut<Answer> = FanOut::start(
        &shared.nodes,
        all_nodes(shared.nodes.len()),
        deadline,
        |node, settled| {
            let evalsha = Arc::clone(&evalsha);
            async move {
                let reply = node
                    .run_script_prepared(script, &evalsha, &settled, false, None)
                    .await?;
                parse_answer(reply)
            }
        },
    );
    fan.decide(|a| matches!(a, Ok(Answer::Accepted)), deadline)
        .await;
    let values = fan.values();
    let refused = values
        .iter()
        .filter_map(|(_, a)| match a {
            Answer::Refused(current) => Some(*current),
            Answer::Accepted => None,
        })
        .max();
    let accepted = values
        .iter()
        .filter(|(_, a)| *a == Answer::Accepted)
        .count();
    let failures = fan.failures();
    fan.finish_in_background();
    if let Some(current) = refused {
        return Err(WriteFailed::Stale(current));
    }
    let needed = quorum(shared.nodes.len());
    if accepted < needed {
        return Err(WriteFailed::Short(Short {
            answered: accepted,
            quorum: needed,
            failures,
        }));
    }
    Ok(())
}

/// The fenced write's reply: `1`, or `{0, current}`.
fn parse_answer(reply: Value) -> Result<Answer, NodeErrorKind> {
    match &reply {
        Value::Int(1) => Ok(Answer::Accepted),
        Value::Array(items) if items.len() == 2 => match parse_u64(&items[1]) {
            Some(current) => Ok(Answer::Refused(current)),
            None => Err(unexpected(reply)),
        },
        _ => Err(unexpected(reply)),
    }
}

/// A token as the scripts return it: a decimal string (or an integer).
pub(crate) fn parse_u64(v: &Value) -> Option<u64> {
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
        assert_eq!(parse_answer(Value::Int(1)).ok(), Some(Answer::Accepted));
        let refused = Value::Array(vec![Value::Int(0), Value::BulkString(b"42".to_vec())]);
        assert_eq!(parse_answer(refused).ok(), Some(Answer::Refused(42)));
        assert!(parse_answer(Value::Nil).is_err());
        assert!(parse_answer(Value::Array(vec![Value::Int(0), Value::Nil])).is_err());
        assert_eq!(parse_u64(&Value::Int(-1)), None);
    }
}
