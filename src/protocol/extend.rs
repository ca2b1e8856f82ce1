//! Extend: compare-and-pexpire on a majority of all N nodes, with validity
//! recomputed from this extend's own start. Never deletes anything on
//! failure: an extend that falls short leaves the lock to expire on its old
//! schedule.

use std::sync::Arc;
use std::time::Instant;

use crate::error::failure::{NodeFailure, Phase, QuorumFailure};
use crate::logic::validity::later;
use crate::protocol::round::round;
use crate::protocol::shared::{Held, Shared, Target};
use crate::wire::commands::parse_extend;
use crate::wire::outgoing::PackedOnce;
use crate::wire::scripts::{Script, EXTEND, EXTEND_ALL};

/// A successful extend: the new deadline and expiry, and the nodes that
/// did not extend (as far as heard). The nodes that did are noted in
/// `Held::ours`.
pub(crate) struct Extended {
    pub(crate) valid_until: Instant,
    pub(crate) expires_at: Instant,
    pub(crate) failures: Vec<NodeFailure>,
    /// Nodes that extended, as far as heard (for the extend's span).
    pub(crate) granted: usize,
}

/// Resets `held`'s TTL to `target`'s on a majority of all N nodes.
///
/// `hear_all`: wait (within the round's deadline) for every node's answer
/// after the decision, so that a node reporting another owner is seen even
/// when a majority extended first (the watchdog; a caller's own extend
/// returns at the decision).
pub(crate) async fn extend(
    shared: &Shared,
    target: &Target,
    held: &Held,
    hear_all: bool,
) -> Result<Extended, QuorumFailure> {
    extend_keys(shared, target, held, &[], hear_all).await
}

/// [`extend`] of a multi-resource set: `keys`, every lock key of the set
/// (all holding `held.value`), in one `EXTEND_ALL` script per node, which
/// extends them all or none there; `target` names the set and carries the
/// TTL. A node counts as extended only when every key was.
pub(crate) async fn extend_all(
    shared: &Shared,
    target: &Target,
    held: &Held,
    keys: &[Arc<str>],
    hear_all: bool,
) -> Result<Extended, QuorumFailure> {
    extend_keys(shared, target, held, keys, hear_all).await
}

/// `keys` empty: the mutex's `EXTEND` of `held.key`; else `EXTEND_ALL`.
async fn extend_keys(
    shared: &Shared,
    target: &Target,
    held: &Held,
    keys: &[Arc<str>],
    hear_all: bool,
) -> Result<Extended, QuorumFailure> {
    let ttl_arg = target.ttl.millis().to_string();
    let args: [&[u8]; 2] = [held.value.as_bytes(), ttl_arg.as_bytes()];
    // Built and packed once for every node.
    let (script, evalsha): (&'static Script, _) = if keys.is_empty() {
        (&EXTEND, EXTEND.evalsha(&[&held.key], &args))
    } else {
        let keys: Vec<&str> = keys.iter().map(|k| &**k).collect();
        (&EXTEND_ALL, EXTEND_ALL.evalsha(&keys, &args))
    };
    let evalsha = Arc::new(PackedOnce::new(evalsha, shared.nodes.len()));
    let vote = shared.vote(false);
    let round = round(
        shared,
        Phase::Extend,
        target,
        held,
        hear_all,
        |node, settled| {
            let evalsha = Arc::clone(&evalsha);
            async move {
                let reply = node
                    .run_script_prepared(script, &evalsha, &settled, false, vote)
                    .await?;
                parse_extend(reply)
            }
        },
    )
    .await;
    let start = round.outcome?;
    Ok(Extended {
        valid_until: start + target.ttl.duration() - target.drift,
        // An upper bound: a node may run the extend as late as the
        // round's deadline (the validity's lower bound is its start).
        expires_at: later(round.deadline, target.ttl.duration()),
        failures: round.failures,
        granted: round.granted,
    })
}
