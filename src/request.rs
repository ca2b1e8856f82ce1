//! A configured lock request: what to lock, for how long, and how to wait.
//! New per-acquisition options (auto-extension, waiting by notification)
//! become methods here without changing the client's shortcuts.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use futures::FutureExt;
use tracing::Instrument;

use crate::client::Client;
use crate::error::{Error, FailureReason, QuorumFailure};
use crate::guard::{Lease, LockGuard};
use crate::retry::{jitter, Retry};

/// A lock request, made by [`Client::lock`]. Nothing is sent until one of
/// the consuming methods runs.
#[derive(Debug, Clone)]
#[must_use = "a lock request does nothing until acquired"]
pub struct LockRequest {
    client: Client,
    resource: String,
    ttl: Duration,
    retry: Retry,
}

impl LockRequest {
    pub(crate) fn new(client: Client, resource: String, ttl: Duration, retry: Retry) -> Self {
        Self {
            client,
            resource,
            ttl,
            retry,
        }
    }

    /// The retry policy for [`acquire`](Self::acquire) and
    /// [`run`](Self::run). Defaults to the client's.
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// Acquires the lock, retrying with jittered pauses until the policy's
    /// deadline or attempt limit. On failure, [`Error::NotAcquired`] carries
    /// the last attempt's per-node detail and the number of attempts.
    ///
    /// A configuration problem that retrying cannot fix (wrong password,
    /// a replica, two URLs for one server) on enough nodes to make a
    /// majority impossible ends the wait at once.
    pub async fn acquire(self) -> Result<LockGuard, Error> {
        let target = self.client.target(&self.resource, self.ttl)?;
        let span = tracing::debug_span!("acquire", resource = %self.resource, ttl = ?self.ttl);
        async {
            let started = Instant::now();
            let mut attempts = 0u32;
            loop {
                attempts += 1;
                match self.client.attempt(&target).await {
                    Ok(grant) => {
                        tracing::debug!(attempts, elapsed = ?started.elapsed(), "acquired");
                        return Ok(self.client.guard(&target, grant));
                    }
                    Err(mut failure) => {
                        tracing::debug!(attempts, granted = failure.granted, quorum = failure.quorum, reason = %failure.reason, "attempt failed");
                        let next = if hopeless(&failure) {
                            None
                        } else {
                            self.retry.next_delay(attempts, started.elapsed(), jitter)
                        };
                        let Some(pause) = next else {
                            failure.attempts = attempts;
                            failure.elapsed = started.elapsed();
                            return Err(Error::NotAcquired(Box::new(failure)));
                        };
                        tokio::time::sleep(pause).await;
                    }
                }
            }
        }
        .instrument(span)
        .await
    }

    /// One attempt, no waiting. `Ok(None)` when the lock is held by another
    /// owner ([`FailureReason::Contended`]): the batch-job "someone else is
    /// on it, skip" case. Other failures (nodes down, validity used up) are
    /// errors, because skipping on them would skip work nobody is doing.
    pub async fn try_acquire(self) -> Result<Option<LockGuard>, Error> {
        let target = self.client.target(&self.resource, self.ttl)?;
        match self.client.attempt(&target).await {
            Ok(grant) => Ok(Some(self.client.guard(&target, grant))),
            Err(failure) if failure.reason == FailureReason::Contended => Ok(None),
            Err(failure) => Err(Error::NotAcquired(Box::new(failure))),
        }
    }

    /// Acquires (as [`acquire`](Self::acquire)), runs `f` to completion
    /// under the lock, and only then releases, also when `f` returns an
    /// error or panics (the panic is resumed after the release).
    ///
    /// If the future returned by `run` is itself dropped mid-way, `f`'s
    /// future is dropped first and the lock is released in the background
    /// after it.
    pub async fn run<F, Fut, T>(self, f: F) -> Result<T, Error>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.acquire().await?;
        let outcome = AssertUnwindSafe(f(guard.lease())).catch_unwind().await;
        let released = guard.release().await;
        if released.confirmed < released.nodes {
            tracing::debug!(
                confirmed = released.confirmed,
                nodes = released.nodes,
                "release not confirmed everywhere"
            );
        }
        match outcome {
            Ok(value) => Ok(value),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// True when the permanent failures (auth, replica, duplicate server) alone
/// rule out a majority: waiting cannot help.
fn hopeless(failure: &QuorumFailure) -> bool {
    let permanent = failure
        .failures
        .iter()
        .filter(|f| f.kind.is_permanent())
        .count();
    permanent > failure.nodes - failure.quorum
}
