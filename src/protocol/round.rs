//! One quorum round of acquire or extend on all N nodes: start the clock,
//! fan out with one deadline (the node budget), decide at the first certain
//! outcome, and check the validity left. Also how a failed round is named
//! ([`classify_failure`]) and reported ([`quorum_failure`]).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::failure::{FailureReason, NodeErrorKind, NodeFailure, Phase, QuorumFailure};
use crate::logic::quorum::{Decision, Tally};
use crate::logic::validity::{node_budget, validity};
use crate::node::{Node, Settled};
use crate::protocol::fanout::{all_nodes, node_set, FanOut, NodeSet};
use crate::protocol::shared::{Held, Shared, Target};

/// The result of [`round`]: its start on success, the nodes the requests
/// may have reached either way, and the values of the nodes that said yes
/// before the decision.
pub(crate) struct Round<T> {
    pub(crate) outcome: Result<Instant, QuorumFailure>,
    pub(crate) sent: NodeSet,
    pub(crate) values: Vec<(usize, T)>,
    /// On success, the nodes that did not say yes (as far as heard).
    pub(crate) failures: Vec<NodeFailure>,
    /// Nodes that said yes by the decision (or, with `hear_all`, by the
    /// last answer heard): the `granted` of the operation's span.
    pub(crate) granted: usize,
    /// The round's deadline: no request of it is awaited, by the caller or
    /// in the background, past it. A key it set expires by this plus the
    /// TTL (a release must live that long: "releases outlive the key").
    pub(crate) deadline: Instant,
}

/// Runs `op` on every node as one round, for the lock `held`. On success
/// the outcome is the round's start, from which validity is computed.
/// Every yes, before the decision or after it in the background, is noted
/// in `held.ours`: such a node holds our value. `hear_all`: wait (within
/// the round's deadline) for every node's answer after the decision, so
/// that a node reporting another owner is seen even when a majority said
/// yes first.
pub(crate) async fn round<T, F, Fut>(
    shared: &Shared,
    phase: Phase,
    target: &Target,
    held: &Held,
    hear_all: bool,
    op: F,
) -> Round<T>
where
    T: Clone + Default + Send + 'static,
    F: Fn(Arc<Node>, Settled) -> Fut,
    Fut: Future<Output = Result<T, NodeErrorKind>> + Send + 'static,
{
    round_credited(shared, phase, target, held, hear_all, None, op).await
}

/// A yes counted without asking: the home node's vote that the release
/// naming this waiter pre-granted (`protocol::fair`), and the instant from which
/// its key's age is counted (the waiter's ticket joined the queue then,
/// before any release could set the key).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Credited {
    pub(crate) node: usize,
    pub(crate) since: Instant,
}

/// [`round`], with `credited`'s node counted as a yes without being asked,
/// and validity counted from its `since` (the outcome's start) when that
/// is earlier than the round's.
pub(crate) async fn round_credited<T, F, Fut>(
    shared: &Shared,
    phase: Phase,
    target: &Target,
    held: &Held,
    hear_all: bool,
    credited: Option<Credited>,
    op: F,
) -> Round<T>
where
    T: Clone + Default + Send + 'static,
    F: Fn(Arc<Node>, Settled) -> Fut,
    Fut: Future<Output = Result<T, NodeErrorKind>> + Send + 'static,
{
    let config = &shared.config;
    let budget = node_budget(
        config.node_timeout,
        target.ttl,
        target.drift,
        config.min_validity,
    );
    // The clock starts before the first request is sent: elapsed then
    // over-approximates every key's age, which keeps validity safe.
    let sent_at = Instant::now();
    let nodes = &shared.nodes;
    let (credited_set, start) = match credited {
        Some(c) => (node_set([c.node]), c.since.min(sent_at)),
        None => (0, sent_at),
    };
    let targets = all_nodes(nodes.len()) & !credited_set;
    let deadline = sent_at + budget;
    let mut fan = FanOut::start_credited(nodes, targets, credited_set, deadline, op);
    let decision = fan.decide(Result::is_ok, sent_at + budget).await;
    let elapsed = start.elapsed();
    if hear_all && decision == Decision::Reached {
        fan.hear_rest().await;
    }
    let (tally, failures, sent) = (fan.tally(), fan.failures(), fan.maybe_sent());
    let values = fan.values();
    held.note_ours(&values);
    // Stragglers finish in the background: what they queued before the
    // decision is sent (so the lock lands on every healthy node) and is
    // ordered before any release on each connection; the rest give up.
    fan.finish_noting(Some(Arc::clone(&held.ours)));
    let reason = match decision {
        Decision::Reached => {
            match validity(target.ttl, elapsed, target.drift, config.min_validity) {
                Some(_) => {
                    return Round {
                        outcome: Ok(start),
                        sent,
                        values,
                        failures,
                        granted: tally.yes(),
                        deadline,
                    }
                }
                None => FailureReason::ValidityExhausted,
            }
        }
        _ => classify_failure(phase, tally.nodes(), tally.quorum(), &failures),
    };
    Round {
        outcome: Err(quorum_failure(
            phase, target, reason, tally, elapsed, failures,
        )),
        sent,
        values,
        failures: Vec::new(),
        granted: tally.yes(),
        deadline,
    }
}

/// The report of a failed round of one attempt.
pub(crate) fn quorum_failure(
    phase: Phase,
    target: &Target,
    reason: FailureReason,
    tally: Tally,
    elapsed: Duration,
    failures: Vec<NodeFailure>,
) -> QuorumFailure {
    QuorumFailure {
        phase,
        resource: target.resource.to_string(),
        reason,
        granted: tally.yes(),
        quorum: tally.quorum(),
        nodes: tally.nodes(),
        attempts: 1,
        elapsed,
        failures,
    }
}

/// Names a failed round: `Contended` (acquire) or `NotHeld` (extend) when
/// those answers alone make a majority impossible (another owner has it, or
/// it is gone), otherwise the failing nodes are to blame.
pub(crate) fn classify_failure(
    phase: Phase,
    nodes: usize,
    quorum: usize,
    failures: &[NodeFailure],
) -> FailureReason {
    if phase == Phase::WriteBack {
        // Only the granting nodes that lacked the token were asked (the
        // others are `Skipped`): the lock was lost if they all said so.
        let mut asked = failures
            .iter()
            .filter(|f| !matches!(f.kind, NodeErrorKind::Skipped))
            .peekable();
        let lost =
            asked.peek().is_some() && asked.all(|f| matches!(f.kind, NodeErrorKind::NotHeld));
        return if lost {
            FailureReason::NotHeld
        } else {
            FailureReason::Unavailable
        };
    }
    let (is_specific, specific): (fn(&NodeErrorKind) -> bool, _) = match phase {
        Phase::Acquire => (
            |k| matches!(k, NodeErrorKind::HeldByOther { .. }),
            FailureReason::Contended,
        ),
        Phase::Extend | Phase::WriteBack => (
            |k| {
                matches!(
                    k,
                    NodeErrorKind::NotHeld | NodeErrorKind::HeldByOther { .. }
                )
            },
            FailureReason::NotHeld,
        ),
    };
    let count = failures.iter().filter(|f| is_specific(&f.kind)).count();
    if count > nodes - quorum {
        specific
    } else {
        FailureReason::Unavailable
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(kind: NodeErrorKind) -> NodeFailure {
        NodeFailure {
            index: 0,
            addr: String::from("x:1"),
            kind,
        }
    }

    #[test]
    fn failure_classification() {
        let held = || failure(NodeErrorKind::HeldByOther { expires_in: None });
        let timeout = || failure(NodeErrorKind::Timeout(Duration::from_millis(5)));
        // 5 nodes, quorum 3: two holds are not enough to blame contention.
        let c = |f: &[NodeFailure]| classify_failure(Phase::Acquire, 5, 3, f);
        assert_eq!(c(&[held(), held(), held()]), FailureReason::Contended);
        assert_eq!(c(&[held(), held(), timeout()]), FailureReason::Unavailable);
        assert_eq!(
            c(&[timeout(), timeout(), timeout()]),
            FailureReason::Unavailable
        );
        // Extend: "not held" answers, not holds, decide it.
        let gone = || failure(NodeErrorKind::NotHeld);
        let e = |f: &[NodeFailure]| classify_failure(Phase::Extend, 3, 2, f);
        assert_eq!(e(&[gone(), gone()]), FailureReason::NotHeld);
        // Another owner's key counts as not ours.
        assert_eq!(e(&[held(), held()]), FailureReason::NotHeld);
        assert_eq!(e(&[held(), gone()]), FailureReason::NotHeld);
        assert_eq!(e(&[gone(), timeout()]), FailureReason::Unavailable);
        // Write-back: only the nodes asked count; any other failure among
        // them makes it an availability problem.
        let skipped = || failure(NodeErrorKind::Skipped);
        let w = |f: &[NodeFailure]| classify_failure(Phase::WriteBack, 3, 2, f);
        assert_eq!(w(&[skipped(), gone()]), FailureReason::NotHeld);
        assert_eq!(w(&[skipped(), timeout()]), FailureReason::Unavailable);
        assert_eq!(w(&[gone(), timeout()]), FailureReason::Unavailable);
        assert_eq!(w(&[skipped()]), FailureReason::Unavailable);
    }
}
