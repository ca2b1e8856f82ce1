//! The user's own store for single-flight values: the [`OnceStore`] trait
//! (a fenced read and write of one record per key), and its adapter to the
//! handle's entry I/O. The lock, the waiting and the notices stay on the
//! lock's nodes; only the value moves.

use std::future::Future;
use std::time::Duration;

use crate::logic::fence::FencingToken;
use crate::store::StoreError;

use super::entries::{Entries, Failed};
use super::entry::Entry;
use super::store::Written;

/// A single-flight record as the user's store returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OnceRecord {
    /// The value last written.
    pub value: Vec<u8>,
    /// The token that wrote it: the record's fence.
    pub token: FencingToken,
    /// How long the value is still fresh, measured by the store (on its
    /// own clock, as `expires_at > now()` in SQL); `Duration::ZERO` once
    /// expired. The store keeps an expired record: its fence still refuses
    /// older tokens, and serve-stale returns its value.
    pub fresh_for: Duration,
    /// How long the value's computation took (XFetch's δ), as written.
    pub delta: Duration,
}

impl OnceRecord {
    /// A record as read back.
    pub fn new(value: Vec<u8>, token: FencingToken, fresh_for: Duration, delta: Duration) -> Self {
        Self {
            value,
            token,
            fresh_for,
            delta,
        }
    }
}

/// Where a single-flight value lives when not on the lock's nodes: for
/// [`SingleFlight::get_or_compute_in`](crate::SingleFlight::get_or_compute_in).
///
/// The contract is the fenced store's: `write` stores the value **only if
/// `token` is ≥ the token the key already holds**, compared and written
/// atomically (one statement, one transaction, one script), and otherwise
/// changes nothing and returns [`StoreError::Stale`]. That comparison is
/// what keeps a computer whose lease ran out from overwriting a newer
/// value. A reader gets the store's own consistency: read-your-writes
/// after the computer's acknowledged write only if the store gives it (one
/// SQL primary does; an asynchronous replica does not).
pub trait OnceStore: Send + Sync {
    /// The record of `key`, fresh or not; `None` when never written.
    fn read(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<OnceRecord>, StoreError>> + Send;

    /// Stores `value` as `key`'s record, fresh for `fresh` (measured by the
    /// store) and computed in `delta`, if `token` ≥ the record's token;
    /// else [`StoreError::Stale`] and nothing changed.
    fn write(
        &self,
        key: &str,
        value: &[u8],
        token: FencingToken,
        fresh: Duration,
        delta: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// A [`OnceStore`] as the handle's entry I/O.
pub(crate) struct User<'a, S> {
    pub(crate) store: &'a S,
    pub(crate) key: &'a str,
}

impl<S: OnceStore> Entries for User<'_, S> {
    fn kind(&self) -> &'static str {
        "user"
    }

    async fn look(&self) -> Result<Option<Entry>, Failed> {
        self.read().await
    }

    async fn read(&self) -> Result<Option<Entry>, Failed> {
        let record = self.store.read(self.key).await.map_err(Failed::Store)?;
        Ok(record.map(|r| Entry {
            fence: r.token.get(),
            value: Some(r.value),
            left_ms: i64::try_from(r.fresh_for.as_millis()).unwrap_or(i64::MAX),
            delta: r.delta,
            error: None,
        }))
    }

    async fn write(&self, token: u64, what: Written<'_>, _keep: Duration) -> Result<(), Failed> {
        let Written::Value {
            value,
            fresh,
            delta,
        } = what
        else {
            // A failed computation leaves the user's store as it was: its
            // error reaches the callers of the computer's process only.
            return Ok(());
        };
        let token = FencingToken::new(token);
        match self.store.write(self.key, value, token, fresh, delta).await {
            Ok(()) => Ok(()),
            Err(StoreError::Stale(stale)) => Err(Failed::Stale(stale.current.get())),
            Err(other) => Err(Failed::Store(other)),
        }
    }
}
