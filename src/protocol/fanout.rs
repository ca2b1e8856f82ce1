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
//!
//! Timers: one per fan-out (the node deadline), not one per node call, and
//! one more for the background task when stragglers remain. A node still
//! silent at the deadline is a `Timeout` vote and is reported to the node
//! (`Node::note_timeout`), which may then skip it until a probe answers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;

use crate::error::failure::{NodeErrorKind, NodeFailure};
use crate::logic::quorum::{Decision, Tally};
use crate::node::{Node, Settled};
use crate::observe::metrics;

type NodeFuture<T> = BoxFuture<'static, (usize, Result<T, NodeErrorKind>)>;

/// The requests of a fan-out still in flight: one node's alone, without
/// the set's allocations and bookkeeping (a single-node client's every
/// round, and the home-first step of a handover), or a set.
enum InFlight<T> {
    One(Option<NodeFuture<T>>),
    Many(FuturesUnordered<NodeFuture<T>>),
}

impl<T> InFlight<T> {
    fn for_count(count: u32) -> Self {
        if count <= 1 {
            InFlight::One(None)
        } else {
            InFlight::Many(FuturesUnordered::new())
        }
    }

    fn push(&mut self, fut: NodeFuture<T>) {
        match self {
            InFlight::One(slot @ None) => *slot = Some(fut),
            InFlight::One(Some(_)) => {
                let set = FuturesUnordered::new();
                if let InFlight::One(Some(first)) = std::mem::replace(self, InFlight::One(None)) {
                    set.push(first);
                }
                set.push(fut);
                *self = InFlight::Many(set);
            }
            InFlight::Many(set) => set.push(fut),
        }
    }

    fn len(&self) -> usize {
        match self {
            InFlight::One(slot) => usize::from(slot.is_some()),
            InFlight::Many(set) => set.len(),
        }
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T> futures::Stream for InFlight<T> {
    type Item = (usize, Result<T, NodeErrorKind>);

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        match self.get_mut() {
            InFlight::One(slot) => match slot {
                None => std::task::Poll::Ready(None),
                Some(fut) => {
                    let answer = std::task::ready!(fut.as_mut().poll(cx));
                    *slot = None;
                    std::task::Poll::Ready(Some(answer))
                }
            },
            InFlight::Many(set) => set.poll_next_unpin(cx),
        }
    }
}

/// A set of node indexes (N ≤ 64 is checked at build).
pub(crate) type NodeSet = u64;

/// The set of the nodes at `indexes`.
pub(crate) fn node_set(indexes: impl IntoIterator<Item = usize>) -> NodeSet {
    indexes
        .into_iter()
        .filter(|&i| i < 64)
        .fold(0, |set, i| set | (1 << i))
}

/// Every node of `n`.
pub(crate) const fn all_nodes(n: usize) -> NodeSet {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

/// The answers gathered so far, per node index.
pub(crate) struct FanOut<T> {
    nodes: Arc<[Arc<Node>]>,
    settled: Settled,
    pending: InFlight<T>,
    answers: Vec<Option<Result<T, NodeErrorKind>>>,
    tally: Tally,
    started: Instant,
    deadline: Instant,
}

impl<T: Send + Default + 'static> FanOut<T> {
    /// Starts `op` on every node in `targets`; the others count as a `no`
    /// vote with [`NodeErrorKind::Skipped`] (a release of a lock whose acquire
    /// never reached them). `op` gets an owned node handle so the futures are
    /// `'static` and can outlive the caller if handed off, and the
    /// [`Settled`] flag to pass to the node. Answers are awaited until
    /// `deadline` at most.
    pub(crate) fn start<F, Fut>(
        nodes: &Arc<[Arc<Node>]>,
        targets: NodeSet,
        deadline: Instant,
        op: F,
    ) -> Self
    where
        F: Fn(Arc<Node>, Settled) -> Fut,
        Fut: std::future::Future<Output = Result<T, NodeErrorKind>> + Send + 'static,
    {
        Self::start_credited(nodes, targets, 0, deadline, op)
    }

    /// As [`start`](Self::start), but the nodes in `credited` (disjoint from
    /// `targets`) already count as `yes` without being asked: the token
    /// write-back, where nodes that reported the token already store it.
    pub(crate) fn start_credited<F, Fut>(
        nodes: &Arc<[Arc<Node>]>,
        targets: NodeSet,
        credited: NodeSet,
        deadline: Instant,
        op: F,
    ) -> Self
    where
        F: Fn(Arc<Node>, Settled) -> Fut,
        Fut: std::future::Future<Output = Result<T, NodeErrorKind>> + Send + 'static,
    {
        Self::start_settled(nodes, targets, credited, deadline, Settled::new(), op)
    }

    /// As [`start_credited`](Self::start_credited), with the flag the
    /// decision sets: [`Settled::NEVER`] for requests that go out however
    /// late and so never look at it (releases; one allocation less per
    /// round).
    pub(crate) fn start_settled<F, Fut>(
        nodes: &Arc<[Arc<Node>]>,
        targets: NodeSet,
        credited: NodeSet,
        deadline: Instant,
        settled: Settled,
        op: F,
    ) -> Self
    where
        F: Fn(Arc<Node>, Settled) -> Fut,
        Fut: std::future::Future<Output = Result<T, NodeErrorKind>> + Send + 'static,
    {
        let started = Instant::now();
        let mut tally = Tally::new(nodes.len());
        let mut answers: Vec<Option<Result<T, NodeErrorKind>>> =
            (0..nodes.len()).map(|_| None).collect();
        let mut pending = InFlight::for_count((targets & all_nodes(nodes.len())).count_ones());
        for (i, node) in nodes.iter().enumerate() {
            if targets & (1 << i) == 0 {
                let yes = credited & (1 << i) != 0;
                answers[i] = Some(if yes {
                    Ok(T::default())
                } else {
                    Err(NodeErrorKind::Skipped)
                });
                tally.record(yes);
                continue;
            }
            // Unconstrained by tokio's cooperative budget: a task that used
            // up its budget would otherwise get `Pending` from the
            // connection queue's `send` on its first poll, although there is
            // room, and its command would be queued later than the ordering
            // rule above assumes (a release then trailing the notice it
            // caused on another node, or a straggler behind a later
            // release). The futures do little work; none loops.
            // `map`, not `async move { (i, fut.await) }`: such a block
            // keeps the future twice (its capture and its awaitee), which
            // doubled the boxed size and copied the request once more on
            // its first poll.
            let fut = tokio::task::unconstrained(op(Arc::clone(node), settled.clone()));
            pending.push(Box::pin(fut.map(move |answer| (i, answer))) as NodeFuture<T>);
        }
        Self {
            nodes: Arc::clone(nodes),
            settled,
            pending,
            answers,
            tally,
            started,
            deadline,
        }
    }

    /// Drives the requests until `is_yes` votes make the outcome certain, or
    /// until `wait_until` (capped at the node deadline). Nodes still silent at
    /// the node deadline count as timed out.
    pub(crate) async fn decide(
        &mut self,
        is_yes: impl Fn(&Result<T, NodeErrorKind>) -> bool,
        wait_until: Instant,
    ) -> Decision {
        let wait_until = wait_until.min(self.deadline);
        self.gather(wait_until, &is_yes, |fan| {
            fan.tally.decision() != Decision::Pending
        })
        .await;
        if self.tally.decision() == Decision::Pending && Instant::now() >= self.deadline {
            self.expire();
        }
        self.settle();
        self.tally.decision()
    }

    fn record(
        &mut self,
        index: usize,
        result: Result<T, NodeErrorKind>,
        is_yes: &impl Fn(&Result<T, NodeErrorKind>) -> bool,
    ) {
        self.tally.record(is_yes(&result));
        if let (Err(kind), Some(node)) = (&result, self.nodes.get(index)) {
            metrics::node_error(node.addr(), kind);
        }
        if let Some(slot) = self.answers.get_mut(index) {
            *slot = Some(result);
        }
    }

    /// Polls every request once, now: each queues its command on its node's
    /// connection (they do on their first poll; see `Node::ready`), so a
    /// command the caller queues after this on the same connections runs
    /// after them on every node. [`decide`](Self::decide) then waits as
    /// usual.
    pub(crate) fn send_now(&mut self, is_yes: impl Fn(&Result<T, NodeErrorKind>) -> bool) {
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        // A wake-up registered with the no-op waker is not lost: the
        // request stays in the set's ready queue, and `decide` polls it.
        while let std::task::Poll::Ready(Some((index, result))) =
            self.pending.poll_next_unpin(&mut cx)
        {
            self.record(index, result, &is_yes);
        }
    }

    /// After a decision, waits for the answers still in flight, up to the
    /// node deadline, recording them (a silent node becomes a timeout).
    pub(crate) async fn hear_rest(&mut self) {
        self.gather(self.deadline, &Result::is_ok, |_| false).await;
        if Instant::now() >= self.deadline {
            self.expire();
        }
    }

    /// Waits for the answers still in flight until `until` (capped at the
    /// node deadline), recording them, without counting the silent as
    /// timed out: they may still answer in the background
    /// ([`finish_in_background`](Self::finish_in_background)).
    pub(crate) async fn hear_until(&mut self, until: Instant) {
        self.gather(until.min(self.deadline), &Result::is_ok, |_| false)
            .await;
    }

    /// As [`hear_until`](Self::hear_until), but stops as soon as `done`
    /// (a decision that one tally cannot make: a multi-resource release,
    /// decided per resource), recording answers with `is_yes`.
    pub(crate) async fn hear_until_done(
        &mut self,
        until: Instant,
        is_yes: impl Fn(&Result<T, NodeErrorKind>) -> bool,
        done: impl Fn(&Self) -> bool,
    ) {
        self.gather(until.min(self.deadline), &is_yes, done).await;
    }

    /// Records answers as they come until `done`, until every request has
    /// answered, or until `until`.
    async fn gather(
        &mut self,
        until: Instant,
        is_yes: &impl Fn(&Result<T, NodeErrorKind>) -> bool,
        done: impl Fn(&Self) -> bool,
    ) {
        let timer = tokio::time::sleep_until(until.into());
        tokio::pin!(timer);
        while !done(self) {
            let next = tokio::select! {
                biased;
                next = self.pending.next() => next,
                () = &mut timer => None,
            };
            let Some((index, result)) = next else {
                break;
            };
            self.record(index, result, is_yes);
        }
    }

    /// The node deadline passed: every unanswered node is a timeout.
    fn expire(&mut self) {
        let budget = self.deadline.saturating_duration_since(self.started);
        for (slot, node) in self.answers.iter_mut().zip(self.nodes.iter()) {
            if slot.is_none() {
                node.note_timeout(self.started);
                let timeout = NodeErrorKind::Timeout(budget);
                metrics::node_error(node.addr(), &timeout);
                *slot = Some(Err(timeout));
                self.tally.record(false);
            }
        }
        // Past their deadline: what they queued stays queued (and runs in
        // order); nothing more is waited for.
        self.pending = InFlight::for_count(0);
    }

    /// From now on, requests that have not yet queued their command give up.
    fn settle(&self) {
        self.settled.set();
    }

    pub(crate) fn tally(&self) -> Tally {
        self.tally
    }

    /// Nodes whose request is still in flight.
    pub(crate) fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Nodes that may have received the command: all but those whose answer
    /// proves it was never sent. Stragglers count as sent.
    pub(crate) fn maybe_sent(&self) -> NodeSet {
        self.answers
            .iter()
            .enumerate()
            .filter(|(_, answer)| !matches!(answer, Some(Err(kind)) if !kind.may_have_been_sent()))
            .fold(0, |set, (i, _)| set | (1 << i))
    }

    /// Every node that answered with a value so far, with its index.
    pub(crate) fn values(&self) -> Vec<(usize, T)>
    where
        T: Clone,
    {
        self.answers
            .iter()
            .enumerate()
            .filter_map(|(i, answer)| match answer {
                Some(Ok(value)) => Some((i, value.clone())),
                _ => None,
            })
            .collect()
    }

    /// Every answered node that failed, in node order.
    pub(crate) fn failures(&self) -> Vec<NodeFailure> {
        self.answers
            .iter()
            .zip(self.nodes.iter())
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

    /// Lets the requests still in flight finish on their own, up to the node
    /// deadline, without making the caller wait for them. A node that stays
    /// silent until then is reported to it as timed out.
    ///
    /// Without a tokio runtime the requests are dropped; what they already
    /// queued on a connection still runs.
    pub(crate) fn finish_in_background(self) {
        self.finish_noting(None);
    }

    /// As [`finish_in_background`](Self::finish_in_background), and every
    /// node that still answers yes is added to `yes` (an acquire's late
    /// grants: the nodes that hold our value).
    pub(crate) fn finish_noting(mut self, yes: Option<Arc<AtomicU64>>) {
        // The answers already in are taken here, and when none is still
        // out no task is spawned (issue 32: a spawn is an allocation of
        // the whole fan-out's size and a task to run; at 5 nodes c=32 the
        // spawns per cycle fell from 2.0 to 1.2).
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        while let std::task::Poll::Ready(Some((index, result))) =
            self.pending.poll_next_unpin(&mut cx)
        {
            self.note_late(index, result, yes.as_deref());
        }
        if self.pending.is_empty() {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(self.drain_noting(yes));
        }
    }

    /// Waits for every request until the node deadline, discarding answers.
    pub(crate) async fn drain(self) {
        self.drain_noting(None).await;
    }

    /// An answer after the decision: a yes is added to `yes`, a failure
    /// is counted, and the node is marked answered, so that `expire` only
    /// blames the silent.
    fn note_late(
        &mut self,
        index: usize,
        result: Result<T, NodeErrorKind>,
        yes: Option<&AtomicU64>,
    ) {
        match (&result, yes) {
            (Ok(_), Some(yes)) => {
                yes.fetch_or(node_set([index]), Ordering::Relaxed);
            }
            (Err(kind), _) => {
                if let Some(node) = self.nodes.get(index) {
                    metrics::node_error(node.addr(), kind);
                }
            }
            _ => {}
        }
        if let Some(slot) = self.answers.get_mut(index) {
            *slot = Some(Err(NodeErrorKind::Skipped));
        }
    }

    async fn drain_noting(mut self, yes: Option<Arc<AtomicU64>>) {
        let timer = tokio::time::sleep_until(self.deadline.into());
        tokio::pin!(timer);
        loop {
            tokio::select! {
                biased;
                next = self.pending.next() => match next {
                    Some((index, result)) => self.note_late(index, result, yes.as_deref()),
                    None => return,
                },
                () = &mut timer => {
                    self.expire();
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(i: usize) -> NodeFuture<u64> {
        Box::pin(async move {
            tokio::task::yield_now().await;
            (i, Ok(i as u64))
        })
    }

    #[tokio::test]
    async fn one_request_or_several_every_answer_comes_once() {
        for count in [0u32, 1, 2, 5] {
            let mut in_flight = InFlight::for_count(count);
            assert!(matches!(in_flight, InFlight::One(_)) == (count <= 1));
            for i in 0..count as usize {
                in_flight.push(answer(i));
            }
            assert_eq!(in_flight.len(), count as usize);
            let mut seen: Vec<usize> = in_flight.map(|(i, _)| i).collect().await;
            seen.sort_unstable();
            assert_eq!(seen, (0..count as usize).collect::<Vec<_>>());
        }
        // More pushed than announced: the single slot becomes a set.
        let mut in_flight = InFlight::for_count(1);
        for i in 0..3 {
            in_flight.push(answer(i));
        }
        assert!(matches!(in_flight, InFlight::Many(_)));
        assert_eq!(in_flight.map(|(i, _)| i).collect::<Vec<_>>().await.len(), 3);
    }
}
