//! Sending one operation to all N nodes at once and stopping at the first
//! certain outcome.
//!
//! All N requests are started on the first poll (one round trip, not N), and
//! the tally decides as soon as a majority said yes or a majority became
//! impossible. Requests still in flight at that point are *not* awaited: the
//! caller either drops them (their command is already enqueued on the node's
//! connection, so whatever it does there is ordered before any later command
//! of ours) or hands them to a background task.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};

use crate::error::{NodeErrorKind, NodeFailure};
use crate::node::Node;
use crate::quorum::{Decision, Tally};

type NodeFuture<T> = BoxFuture<'static, (usize, Result<T, NodeErrorKind>)>;

/// The answers gathered so far, per node index.
pub(crate) struct FanOut<T> {
    nodes: Vec<Arc<Node>>,
    pending: FuturesUnordered<NodeFuture<T>>,
    answers: Vec<Option<Result<T, NodeErrorKind>>>,
    tally: Tally,
}

impl<T: Send + 'static> FanOut<T> {
    /// Starts `op` on every node. `op` gets an owned node handle so the
    /// futures are `'static` and can outlive the caller if handed off.
    pub(crate) fn start<F, Fut>(nodes: &[Arc<Node>], op: F) -> Self
    where
        F: Fn(Arc<Node>) -> Fut,
        Fut: std::future::Future<Output = Result<T, NodeErrorKind>> + Send + 'static,
    {
        let pending = nodes
            .iter()
            .map(|node| {
                let index = node.index();
                let fut = op(Arc::clone(node));
                Box::pin(async move { (index, fut.await) }) as NodeFuture<T>
            })
            .collect();
        Self {
            nodes: nodes.to_vec(),
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
        self.tally.decision()
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
