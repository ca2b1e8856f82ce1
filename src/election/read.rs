//! The read of who leads: the lock's inspection (`GET`, `PTTL` of the lock
//! key, the fence) and the fenced read of the record, both sent to every
//! node at once and awaited together, each bounded by the node timeout.

use std::time::Instant;

use redis::Value;

use crate::error::failure::NodeErrorKind;
use crate::logic::quorum::quorum;
use crate::node::Settled;
use crate::protocol::fanout::{all_nodes, FanOut};
use crate::protocol::inspect::inspect;
use crate::protocol::shared::Shared;
use crate::wire::commands::unexpected;
use crate::wire::scripts::FENCED_READ;

use super::error::ElectionError;
use super::leader::{choose, Leader};
use super::record::{decode, Record};
use crate::protocol::majority_write::parse_u64 as parse_term;

/// The leader of the election whose lock resource is `resource` and
/// record key `key`; see [`Election::leader`](crate::Election::leader).
pub(crate) async fn read_leader(
    shared: &Shared,
    election: &str,
    resource: &str,
    key: &str,
) -> Result<Option<Leader>, ElectionError> {
    let deadline = Instant::now() + shared.config.node_timeout;
    let mut fan: FanOut<Option<Record>> = FanOut::start(
        &shared.nodes,
        all_nodes(shared.nodes.len()),
        deadline,
        |node, _| {
            let evalsha = FENCED_READ.evalsha(&[key], &[]);
            async move {
                let reply = node
                    .run_script_prepared(&FENCED_READ, &evalsha, &Settled::NEVER, false, None)
                    .await?;
                parse_record(reply)
            }
        },
    );
    let (inspection, ()) = tokio::join!(inspect(shared, resource), fan.hear_rest());
    let inspection = inspection.map_err(|source| ElectionError::Lock {
        election: election.to_owned(),
        source: Box::new(source),
    })?;
    let records = fan.values();
    let needed = quorum(shared.nodes.len());
    // The leader's record is on a majority: read from fewer, the newest
    // record seen may be an earlier leader's.
    let answered = inspection.answered().min(records.len());
    if answered < needed {
        return Err(ElectionError::Unavailable {
            election: election.to_owned(),
            phase: "read",
            answered,
            quorum: needed,
            failures: fan.failures(),
        });
    }
    Ok(choose(
        &inspection,
        records.into_iter().filter_map(|(_, r)| r),
        &shared.id_text,
    ))
}

/// The fenced read's reply: nil, or `{value, fence}`; a value not written
/// by an election reads as no record.
fn parse_record(reply: Value) -> Result<Option<Record>, NodeErrorKind> {
    match &reply {
        Value::Nil => Ok(None),
        Value::Array(items) if items.len() == 2 => match (&items[0], parse_term(&items[1])) {
            (Value::BulkString(stored), Some(term)) => Ok(decode(stored, term)),
            _ => Err(unexpected(reply)),
        },
        _ => Err(unexpected(reply)),
    }
}
