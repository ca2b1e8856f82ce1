//! Settling the token of a granted attempt: the largest fence among the
//! granting nodes, written back first to the granting nodes that reported less when fewer than a
//! quorum reported it (DESIGN.md, "Fencing tokens", has the proof). The
//! write-back is the rare second round of a fenced acquire.

use std::sync::Arc;
use std::time::Instant;

use crate::error::failure::{FailureReason, Phase, QuorumFailure};
use crate::logic::fence::{merge, FencingToken};
use crate::logic::quorum::{quorum, Decision, Tally};
use crate::logic::validity::validity;
use crate::observe::stats::Event;
use crate::protocol::fanout::{FanOut, NodeSet};
use crate::protocol::round::{classify_failure, quorum_failure};
use crate::protocol::shared::{Held, Shared, Target};
use crate::wire::commands::parse_flag;
use crate::wire::scripts::WRITE_BACK;

/// Turns the fences the granting nodes reported (`(node, fence)`) into the
/// token to hand out; `seed` is the clock read before the acquire was sent.
/// The write-back runs within the attempt's validity, and the validity is
/// checked again after it.
pub(crate) async fn settle_token(
    shared: &Shared,
    target: &Target,
    held: &Held,
    start: Instant,
    fences: &[(usize, u64)],
) -> Result<FencingToken, QuorumFailure> {
    let config = &shared.config;
    let nodes = &shared.nodes;
    let values: Vec<u64> = fences.iter().map(|&(_, f)| f).collect();
    let quorum = quorum(nodes.len());
    let Some(merged) = merge(&values) else {
        // A granted round has grants; never reached.
        return Err(quorum_failure(
            Phase::WriteBack,
            target,
            FailureReason::Unavailable,
            Tally::new(nodes.len()),
            start.elapsed(),
            Vec::new(),
        ));
    };
    let token = FencingToken::new(merged.token);
    if !merged.needs_write_back(quorum) {
        return Ok(token);
    }
    shared.counters.count(Event::WriteBack);
    let (mut credited, mut targets): (NodeSet, NodeSet) = (0, 0);
    for &(i, f) in fences {
        if f == merged.token {
            credited |= 1 << i;
        } else {
            targets |= 1 << i;
        }
    }
    // Past this instant a stored token could not make a valid lock.
    let useful_end = start + target.ttl.duration() - target.drift - config.min_validity;
    let deadline = (Instant::now() + config.node_timeout).min(useful_end);
    let fence_key = target.fence.clone().unwrap_or_default();
    let token_arg: Arc<str> = merged.token.to_string().into();
    let vote = shared.vote(true);
    let mut fan = FanOut::start_credited(nodes, targets, credited, deadline, |node, settled| {
        let (key, value, fence_key, token_arg) = (
            held.key.clone(),
            held.value.clone(),
            fence_key.clone(),
            token_arg.clone(),
        );
        async move {
            let args: [&[u8]; 2] = [value.as_bytes(), token_arg.as_bytes()];
            parse_flag(
                node.run_script(
                    &WRITE_BACK,
                    &[&key, &fence_key],
                    &args,
                    &settled,
                    false,
                    vote,
                )
                .await?,
            )
        }
    });
    let decision = fan.decide(Result::is_ok, deadline).await;
    let elapsed = start.elapsed();
    let (tally, failures) = (fan.tally(), fan.failures());
    fan.finish_in_background();
    let reason = match decision {
        Decision::Reached => match validity(target.ttl, elapsed, target.drift, config.min_validity)
        {
            Some(_) => return Ok(token),
            None => FailureReason::ValidityExhausted,
        },
        _ => classify_failure(Phase::WriteBack, tally.nodes(), tally.quorum(), &failures),
    };
    shared.counters.count(Event::WriteBackFailed);
    Err(quorum_failure(
        Phase::WriteBack,
        target,
        reason,
        tally,
        elapsed,
        failures,
    ))
}
