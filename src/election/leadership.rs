//! The leadership a won campaign hands out: [`Leadership`], the mutex's
//! guard (with its watchdog) plus the term and the published value.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use tracing::Instrument;

use crate::error::lost::LostLock;
use crate::lease::Lease;
use crate::logic::fence::FencingToken;
use crate::mutex::guard::LockGuard;
use crate::protocol::release::Released;
use crate::protocol::shared::Shared;

use super::error::ElectionError;
use super::publish::publish;

/// Leadership of an election, won by
/// [`Election::campaign`](crate::Election::campaign). It is the election's
/// lock, auto-extended by its watchdog while this value lives.
///
/// Resign with [`resign`](Self::resign); dropping it instead resigns in the
/// background (never blocking), as dropping a [`LockGuard`] releases. A
/// leader that cannot extend learns it from [`lost`](Self::lost) before its
/// lease runs out, hence before another candidate can be elected.
#[must_use = "dropping the leadership resigns at once"]
pub struct Leadership {
    shared: Arc<Shared>,
    election: Arc<str>,
    record_key: Arc<str>,
    guard: LockGuard,
    term: FencingToken,
    value: Vec<u8>,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("election", &self.election)
            .field("term", &self.term)
            .field("guard", &self.guard)
            .finish_non_exhaustive()
    }
}

impl Leadership {
    pub(crate) fn new(
        shared: Arc<Shared>,
        election: Arc<str>,
        record_key: Arc<str>,
        guard: LockGuard,
        term: FencingToken,
        value: Vec<u8>,
    ) -> Self {
        Self {
            shared,
            election,
            record_key,
            guard,
            term,
            value,
        }
    }

    /// The election's name.
    pub fn election(&self) -> &str {
        &self.election
    }

    /// The term: the leadership's fencing token, strictly larger for every
    /// later leader of this election. Pass it with every write the leader
    /// makes to storage that checks tokens
    /// ([`FencedStore`](crate::FencedStore), the SQL stores).
    pub fn term(&self) -> FencingToken {
        self.term
    }

    /// The value this leader published last.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// A read-only view of the leadership's lock: its validity, its loss.
    pub fn lease(&self) -> Lease {
        self.guard.lease()
    }

    /// Resolves when the leadership is lost (the watchdog could not extend
    /// the lock in time, found it gone or taken) or resigned; see
    /// [`Lease::lost`]. With the watchdog's timing it resolves before the
    /// validity runs out, so before the lock's keys can expire and another
    /// candidate be elected.
    pub fn lost(&self) -> impl Future<Output = LostLock> + Send + 'static {
        self.guard.lost()
    }

    /// Publishes `value` as this leader's, on every node, fenced by the
    /// term: a record already written by a later leader refuses it
    /// ([`ElectionError::Superseded`], nothing written). A leadership
    /// already known lost is refused without a round trip
    /// ([`ElectionError::Lost`]). Returns once a majority stored it,
    /// within one node timeout.
    pub async fn proclaim(&mut self, value: impl Into<Vec<u8>>) -> Result<(), ElectionError> {
        let value = value.into();
        let lease = self.guard.lease();
        if let Some(loss) = lease.loss() {
            return Err(ElectionError::Lost(Box::new(loss)));
        }
        if !lease.is_valid() {
            let loss = lease.lost().await;
            return Err(ElectionError::Lost(Box::new(loss)));
        }
        let span = tracing::debug_span!(
            "proclaim",
            election = %self.election,
            term = self.term.get()
        );
        publish(
            &self.shared,
            &self.election,
            &self.record_key,
            self.term,
            &value,
        )
        .instrument(span)
        .await?;
        self.value = value;
        Ok(())
    }

    /// Resigns: stops the watchdog and releases the lock; a candidate
    /// waiting for it is woken by the release notice. The record stays
    /// (the next leader's overwrites it, with a larger term); the reported
    /// leader ends with the lock. See [`LockGuard::release`].
    pub async fn resign(self) -> Released {
        self.guard.release().await
    }
}
