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

use super::handle::Election;
use super::leader::Leader;

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
    pub(crate) fn new(election: Election) -> Self {
        let name = election.name().to_owned();
        let leaders = futures::stream::unfold((election, None), |(election, last)| async move {
            loop {
                match election.leader().await {
                    Ok(Some(leader)) if last.is_none_or(|l| leader.term.get() > l) => {
                        let term = leader.term.get();
                        return Some((leader, (election, Some(term))));
                    }
                    Ok(_) => {}
                    Err(error) => tracing::debug!(%error, "observe: leader not read"),
                }
                tokio::time::sleep(election.interval()).await;
            }
        });
        Self {
            election: name,
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
