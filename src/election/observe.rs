//! [`Observer`]: the stream of an election's leaders, one re-read of the
//! leader per interval.
//!
//! Why polling, not the release notices: a client hears a resource's
//! notices only for a waiter in its queue, and an observer in that queue
//! would be a waiter: a campaign of the same client would queue behind it.
//! A notice would also tell only of releases, not of a leader whose lease
//! expired (killed) or of the next leader's record. One read per interval
//! (two commands per node) is the price.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::stream::{BoxStream, Stream, StreamExt};

use std::sync::Arc;
use std::time::Duration;

use crate::protocol::shared::Shared;

use super::leader::Leader;
use super::read::read_leader;

/// The leaders of an election: the current one, then each new one once,
/// terms strictly increasing; made by
/// [`Election::observe`](crate::Election::observe). A
/// [`Stream`](futures::Stream) that never ends; or call
/// [`next_leader`](Self::next_leader). Dropping it stops the reads.
#[must_use = "an observer reads nothing until polled"]
pub struct Observer {
    election: String,
    leaders: BoxStream<'static, Leader>,
}

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observer")
            .field("election", &self.election)
            .finish_non_exhaustive()
    }
}

impl Observer {
    /// The leaders of the election `name` (lock resource `resource`,
    /// record `key`), read every `interval`.
    pub(crate) fn new(
        shared: Arc<Shared>,
        name: Arc<str>,
        resource: Arc<str>,
        key: Arc<str>,
        interval: Duration,
    ) -> Self {
        let election = name.to_string();
        let state = (shared, name, resource, key, None::<u64>);
        let leaders = futures::stream::unfold(state, move |state| async move {
            let (shared, name, resource, key, last) = state;
            loop {
                match read_leader(&shared, &name, &resource, &key).await {
                    Ok(Some(leader)) if last.is_none_or(|l| leader.term.get() > l) => {
                        let term = leader.term.get();
                        return Some((leader, (shared, name, resource, key, Some(term))));
                    }
                    Ok(_) => {}
                    Err(error) => tracing::debug!(%error, "observe: leader not read"),
                }
                tokio::time::sleep(interval).await;
            }
        });
        Self {
            election,
            leaders: leaders.boxed(),
        }
    }

    /// The next leader: a term larger than every one returned before.
    pub async fn next_leader(&mut self) -> Leader {
        loop {
            if let Some(leader) = self.leaders.next().await {
                return leader;
            }
            // The stream never ends; were it to, it would end for good.
            std::future::pending::<()>().await;
        }
    }
}

impl Stream for Observer {
    type Item = Leader;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Leader>> {
        self.leaders.poll_next_unpin(cx)
    }
}
