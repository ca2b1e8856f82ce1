//! The downgrade: a writer becomes a reader without a gap. On each node
//! one script deletes the writer key holding our value and sets a reader
//! entry with the same value (`RW_DOWNGRADE`), so no node ever holds neither
//! for us; a majority converting makes the read lease, with validity from
//! the round's start, as an extend's. The writer's keys left anywhere (a
//! node that did not convert) are released in the background, and a
//! conversion that falls short releases the new entries too.

use std::sync::Arc;

use super::keys::RwKeys;
use super::target::{after_round, entry_held};
use crate::error::failure::{Phase, QuorumFailure};
use crate::logic::fence::FencingToken;
use crate::protocol::release::ReleaseOnDrop;
use crate::protocol::round::round;
use crate::protocol::shared::{Grant, Held, Shared, Target};
use crate::wire::commands::parse_flag;
use crate::wire::outgoing::PackedOnce;
use crate::wire::scripts::RW_DOWNGRADE;

/// Converts the writer's hold `write` into a reader's entry (`target`, a
/// reader's, from `rw_target`), keeping the write's token: the read's
/// generation is the one it wrote.
pub(crate) async fn downgrade(
    shared: &Arc<Shared>,
    keys: &RwKeys,
    target: &Target,
    write: &Held,
    token: Option<FencingToken>,
) -> Result<Grant, QuorumFailure> {
    // Armed for good: whatever happens, the writer key is deleted (compare
    // and delete) wherever it is left.
    let _write = ReleaseOnDrop::new(shared, write);
    let mut held = entry_held(shared, target, write.value.clone());
    held.sent = write.sent;
    let mut cleanup = ReleaseOnDrop::new(shared, &held);
    let ttl = target.ttl.millis().to_string();
    let args: [&[u8]; 2] = [held.value.as_bytes(), ttl.as_bytes()];
    let evalsha = Arc::new(PackedOnce::new(
        RW_DOWNGRADE.evalsha(&[&keys.writer, &keys.readers, &target.key], &args),
        shared.nodes.len(),
    ));
    let vote = shared.vote(false);
    let round = round(
        shared,
        Phase::Extend,
        target,
        &held,
        false,
        |node, settled| {
            let evalsha = Arc::clone(&evalsha);
            async move {
                parse_flag(
                    node.run_script_prepared(&RW_DOWNGRADE, &evalsha, &settled, false, vote)
                        .await?,
                )
            }
        },
    )
    .await;
    after_round(&mut held, target, round.sent, round.deadline);
    cleanup.update(&held);
    let start = round.outcome?;
    cleanup.disarm();
    held.granted = true;
    Ok(Grant {
        valid_until: start + target.ttl.duration() - target.drift,
        held,
        token,
        granted: round.granted,
    })
}
