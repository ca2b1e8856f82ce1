//! A fan-out's requests in flight: a handful of futures (one per node,
//! N ≤ 64, usually 1 to 7) polled together, each poll polling every one
//! still pending. `FuturesUnordered` polls only the woken ones, but pays an
//! `Arc`'d task and its atomics per future and per wake-up; for five
//! futures that cost more than polling them all (issue 32: its `push`,
//! `wake_by_ref` and `poll_next` came to 5–6 % of a 5-node cycle's client
//! CPU in `perf`). Every future sees the caller's latest waker at each
//! poll, so no wake-up is lost: one registered with an earlier waker (a
//! no-op one, `FanOut::send_now`) is superseded by the next poll, which
//! polls that future again.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::stream::Stream;

/// Unpin futures polled together; yields each one's output once, in no
/// particular order.
pub(crate) struct Polled<F> {
    futures: Vec<F>,
}

impl<F> Polled<F> {
    pub(crate) fn with_capacity(n: usize) -> Self {
        Self {
            futures: Vec::with_capacity(n),
        }
    }

    pub(crate) fn push(&mut self, future: F) {
        self.futures.push(future);
    }

    /// The futures not yet finished.
    pub(crate) fn len(&self) -> usize {
        self.futures.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.futures.is_empty()
    }
}

impl<F: Future + Unpin> Stream for Polled<F> {
    type Item = F::Output;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<F::Output>> {
        let futures = &mut self.get_mut().futures;
        if futures.is_empty() {
            return Poll::Ready(None);
        }
        for i in 0..futures.len() {
            if let Poll::Ready(output) = Pin::new(&mut futures[i]).poll(cx) {
                // Finished futures are never polled again.
                futures.swap_remove(i);
                return Poll::Ready(Some(output));
            }
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[tokio::test]
    async fn yields_every_output_once_and_then_ends() {
        let mut set = Polled::with_capacity(3);
        for (i, delay) in [(0u8, 30u64), (1, 10), (2, 20)] {
            set.push(Box::pin(async move {
                tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
                i
            }));
        }
        let mut seen = Vec::new();
        while let Some(i) = set.next().await {
            seen.push(i);
        }
        // Each once; the timers fire in their order.
        assert_eq!(seen, [1, 2, 0]);
        assert!(set.is_empty());
        assert_eq!(set.next().await, None);
    }

    #[tokio::test]
    async fn a_wake_registered_with_an_earlier_waker_is_not_lost() {
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let mut set = Polled::with_capacity(1);
        set.push(Box::pin(async move { rx.await.unwrap_or(0) }));
        // Polled once with a no-op waker (as `FanOut::send_now` does) …
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut set).poll_next(&mut cx).is_pending());
        // … then the value comes, and the real poll still sees it.
        tx.send(7).unwrap();
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), set.next()).await;
        assert_eq!(got, Ok(Some(7)));
        assert_eq!(set.len(), 0);
    }
}
