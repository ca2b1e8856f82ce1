//! Sending one operation to all N nodes at once and stopping at the first
//! certain outcome.
//!
//! All N requests are started on the first poll (one round trip, not N), and
//! the tally decides as soon as a majority said yes or a majority became
//! impossible. Requests still in flight at that point are *not* awaited by
//! the caller; they are handed to a background task so that commands already
//! queued on a connection are really sent (redis-rs skips a queued command
//! whose caller went away) and the lock lands on every healthy node, not just
//! a bare majority.
//!
//! The ordering rule that keeps stragglers from leaking keys: at the
//! decision the fan-out is *settled*, and a straggler that only then obtains
//! its connection (it was waiting for a connect) gives up instead of sending.
//! So every command of a settled fan-out was queued before the decision,
//! hence before any later command of ours (a release) on the same
//! connection, and Redis runs them in that order.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};

use crate::error::{NodeErrorKind, NodeFailure};
use crate::node::Node;
use crate::quorum::{Decision, Tally};

type NodeFuture<T> = BoxFuture<'static, (usize, Result<T, NodeErrorKind>)>;

/// Set when the fan-out has decided; see the module docs.
#[derive(Debug, Clone, Default)]
pub(crate) struct Settled(Arc<AtomicBool>);

impl Settled {
    pub(crate) fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn set(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// The answers gathered so far, per node index.
pub(crate) struct FanOut<T> {
    nodes: Vec<Arc<Node>>,
    settled: Settled,
    pending: FuturesUnordered<NodeFuture<T>>,
    answers: Vec<Option<Result<T, NodeErrorKind>>>,
    tally: Tally,
}

impl<T: Send + 'static> FanOut<T> {
    /// Starts `op` on every node. `op` gets an owned node handle so the
    /// futures are `'static` and can outlive the caller if handed off, and
    /// the [`Settled`] flag to pass to [`Node::run_script`].
    pub(crate) fn start<F, Fut>(nodes: &[Arc<Node>], op: F) -> Self
    where
        F: Fn(Arc<Node>, Settled) -> Fut,
        Fut: std::future::Future<Output = Result<T, NodeErrorKind>> + Send + 'static,
    {
        let settled = Settled::default();
        let pending = nodes
            .iter()
            .map(|node| {
                let index = node.index();
                let fut = op(Arc::clone(node), settled.clone());
                Box::pin(async move { (index, fut.await) }) as NodeFuture<T>
            })
            .collect();
        Self {
            nodes: nodes.to_vec(),
            settled,
            pending,
            answers: (0..nodes.len()).map(|_| None).collect(),
            tally: Tally::new(nodes.len()),
        }
    }

    /// Drives the requests until `is_yes` votes make the outcome certain.
    pub(crate) async fn decide(
        &mut self,
        is_yes: impl Fn(&Result<T, NodeErrorKind>) -> bool,
    ) -> Decision {
        while self.tally.decision() == Decision::Pending {
            let Some((index, result)) = self.pending.next().await else {
                break;
            };
            self.tally.record(is_yes(&result));
            if let Some(slot) = self.answers.get_mut(index) {
                *slot = Some(result);
            }
        }
        self.settle();
        self.tally.decision()
    }

    /// From now on, requests that have not yet queued their command give up.
    /// Called at the decision, and by the caller when it stops waiting.
    pub(crate) fn settle(&self) {
        self.settled.set();
    }

    pub(crate) fn tally(&self) -> Tally {
        self.tally
    }

    /// Nodes whose request is still in flight.
    pub(crate) fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Every answered node that failed, in node order.
    pub(crate) fn failures(&self) -> Vec<NodeFailure> {
        self.answers
            .iter()
            .zip(&self.nodes)
            .filter_map(|(answer, node)| match answer {
                Some(Err(kind)) => Some(NodeFailure {
                    index: node.index(),
                    addr: node.addr().to_owned(),
                    kind: kind.clone(),
                }),
                _ => None,
            })
            .collect()
    }

    /// Lets the requests still in flight finish on their own (each is bounded
    /// by its deadline), without making the caller wait for them.
    ///
    /// Without a tokio runtime the requests are dropped; what they already
    /// queued on a connection still runs.
    pub(crate) fn finish_in_background(self) {
        if self.pending.is_empty() {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(self.drain());
        }
    }

    /// Waits for every request, discarding the answers.
    pub(crate) async fn drain(mut self) {
        while self.pending.next().await.is_some() {}
    }
}
