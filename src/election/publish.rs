//! The leader's write of its record: one fenced write per node, all N at
//! once, each bounded by the node timeout, decided at a majority. The
//! fenced-write script compares the term with the record's and refuses a
//! lower one, so a leader whose lease ran out cannot overwrite a newer
//! leader's record on any node.

use crate::logic::fence::FencingToken;
use crate::protocol::majority_write::{write_at_majority, WriteFailed};
use crate::protocol::shared::Shared;
use crate::wire::scripts::FENCED_WRITE;

use super::error::ElectionError;
use super::record::encode;

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
    let token = term.get().to_string();
    match write_at_majority(shared, &FENCED_WRITE, key, &[&stored, token.as_bytes()]).await {
        Ok(()) => Ok(()),
        Err(WriteFailed::Stale(current)) => Err(ElectionError::Superseded {
            election: election.to_owned(),
            term,
            current: FencingToken::new(current),
        }),
        Err(WriteFailed::Short(short)) => Err(ElectionError::Unavailable {
            election: election.to_owned(),
            phase: "publish",
            answered: short.answered,
            quorum: short.quorum,
            failures: short.failures,
        }),
    }
}
