//! A configured read or write request: which lock, which mode, for how
//! long, how to wait. Waiting polls under the retry policy (the attempt's
//! refusal carries when the blocker's keys run out, which can wake it
//! earlier), until its deadline. A waiting writer marks the lock so that
//! no new reader is admitted meanwhile (`marker`).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::field::{self, Empty};
use tracing::{Instrument, Span};

use super::admit::admit;
use super::guard::RwGuard;
use super::keys::RwKeys;
use super::marker::{marker_life, Marker};
use super::target::{rw_target, RwMode};
use crate::error::Error;
use crate::lease::Lease;
use crate::logic::validity::later;
use crate::mutex::guard::LockGuard;
use crate::mutex::request::run_holding;
use crate::protocol::fair::{holder_expiry, hopeless, log_failure};
use crate::protocol::shared::Shared;
use crate::settings::autoextend::{AutoExtend, Schedule};
use crate::settings::retry::{jitter, Retry};

/// A read or write request, made by [`RwLock::read`](crate::RwLock::read)
/// or [`RwLock::write`](crate::RwLock::write). Nothing is sent until one
/// of the consuming methods runs.
#[derive(Debug, Clone)]
#[must_use = "a read-write lock request does nothing until acquired"]
pub struct RwRequest {
    shared: Arc<Shared>,
    keys: Arc<RwKeys>,
    mode: RwMode,
    ttl: Duration,
    retry: Retry,
    auto_extend: Option<AutoExtend>,
}

impl RwRequest {
    pub(crate) fn new(shared: Arc<Shared>, keys: Arc<RwKeys>, mode: RwMode, ttl: Duration) -> Self {
        let config = &shared.config;
        Self {
            retry: config.retry,
            auto_extend: config.auto_extend,
            shared,
            keys,
            mode,
            ttl,
        }
    }

    /// The retry policy for [`acquire`](Self::acquire) and
    /// [`run`](Self::run): its deadline, pause and attempt limit. Defaults
    /// to the client's.
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// Extend the hold automatically while its guard lives; see
    /// [`AutoExtend`]. Defaults to the client's setting.
    pub fn auto_extend(mut self, auto: AutoExtend) -> Self {
        self.auto_extend = Some(auto);
        self
    }

    /// No auto-extension for this request, whatever the client's default.
    pub fn manual_extend(mut self) -> Self {
        self.auto_extend = None;
        self
    }

    /// The mode asked for.
    pub fn mode(&self) -> RwMode {
        self.mode
    }

    /// A fresh attempt's target and the watchdog's schedule: all that can
    /// be refused before a round trip.
    fn checked(&self) -> Result<(crate::protocol::shared::Target, Option<Schedule>), Error> {
        let target = rw_target(
            &self.shared,
            &self.keys,
            self.mode,
            rand::random(),
            self.ttl,
        )?;
        let node_timeout = self.shared.config.node_timeout;
        let schedule = self
            .auto_extend
            .map(|auto| auto.schedule(target.ttl.duration(), target.drift, node_timeout))
            .transpose()?;
        Ok((target, schedule))
    }

    fn guard(
        &self,
        target: &crate::protocol::shared::Target,
        grant: crate::protocol::shared::Grant,
        schedule: Option<Schedule>,
    ) -> RwGuard {
        let guard = LockGuard::new(Arc::clone(&self.shared), target, grant, schedule);
        RwGuard::new(
            guard,
            self.mode,
            Arc::clone(&self.shared),
            Arc::clone(&self.keys),
            self.ttl,
            schedule,
        )
    }

    /// Acquires, waiting until the policy's deadline or its number of
    /// attempts. While refused, the next attempt comes after the policy's
    /// jittered pause, or when the blocker's keys run out if sooner, never
    /// after the deadline.
    ///
    /// **Writers first.** A waiting writer's refused attempts set a marker
    /// on the nodes that refused it (bounded life, refreshed by each
    /// attempt, removed when it is granted or gives up, or when this
    /// future is dropped); no node admits a new reader while it is there.
    /// The readers in place finish, and the writer gets in: a stream of
    /// readers cannot starve it. Readers wait for the writers, not the
    /// other way round.
    ///
    /// A reader of this lock holding it in this process and asking for the
    /// write lock waits for itself: the deadline ends that wait (and its
    /// marker stops new readers meanwhile). Use
    /// [`RwGuard::upgrade`], which refuses at once.
    ///
    /// On failure, [`Error::NotAcquired`] carries the last attempt's
    /// per-node detail and the number of attempts.
    pub async fn acquire(self) -> Result<RwGuard, Error> {
        let started = Instant::now();
        let span = self.span();
        let result = self.acquire_inner(started).instrument(span.clone()).await;
        record(&span, started, result.is_ok());
        result
    }

    async fn acquire_inner(&self, started: Instant) -> Result<RwGuard, Error> {
        let deadline = self.retry.deadline(started);
        let (mut target, schedule) = self.checked()?;
        let mut marker = (self.mode == RwMode::Write).then(|| {
            let config = &self.shared.config;
            let life = marker_life(target.ttl.duration(), &self.retry, config.node_timeout);
            Marker::new(&self.shared, self.keys.waiting.clone(), &target, life)
        });
        let mut attempts: u32 = 0;
        loop {
            attempts += 1;
            // The first attempt goes unmarked: a writer that gets in at
            // once leaves no marker to clean up.
            let mark = marker
                .as_mut()
                .filter(|_| attempts > 1)
                .map(|m| m.mark().clone());
            match admit(&self.shared, &self.keys, &target, self.mode, mark.as_ref()).await {
                Ok(grant) => return Ok(self.guard(&target, grant, schedule)),
                Err(mut failure) => {
                    log_failure(attempts, &failure);
                    let now = Instant::now();
                    if hopeless(&failure) || !self.retry.allows_another(attempts) || now >= deadline
                    {
                        failure.attempts = attempts;
                        failure.elapsed = started.elapsed();
                        return Err(Error::NotAcquired(Box::new(failure)));
                    }
                    let fallback = later(now, self.retry.pause(attempts, jitter));
                    let wake_at = holder_expiry(&failure, now)
                        .map_or(fallback, |e| e.min(fallback))
                        .min(deadline);
                    tokio::time::sleep_until(wake_at.into()).await;
                }
            }
            if self.mode == RwMode::Read {
                // A fresh entry per attempt: a failed attempt's cleanup
                // deletes its own, by its own value.
                target.key = self.keys.entry(rand::random());
            }
        }
    }

    /// One attempt, no waiting and no writer's marker. `Ok(None)` when the
    /// lock is held in the other mode (or a writer waits, for a reader);
    /// an error when nodes failed, as
    /// [`LockRequest::try_acquire`](crate::LockRequest::try_acquire).
    pub async fn try_acquire(self) -> Result<Option<RwGuard>, Error> {
        let started = Instant::now();
        let span = self.span();
        let tried = async {
            let (target, schedule) = self.checked()?;
            match admit(&self.shared, &self.keys, &target, self.mode, None).await {
                Ok(grant) => Ok(self.guard(&target, grant, schedule)),
                Err(mut failure) => {
                    failure.elapsed = started.elapsed();
                    Err(Error::NotAcquired(Box::new(failure)))
                }
            }
        }
        .instrument(span.clone())
        .await;
        record(&span, started, tried.is_ok());
        match tried {
            Ok(guard) => Ok(Some(guard)),
            Err(error) if error.is_contended() => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Acquires (as [`acquire`](Self::acquire)), runs `f` holding the
    /// lock, then releases, also when `f` fails or panics; with
    /// auto-extension `f` is cancelled when the hold is lost
    /// ([`Error::LockLost`]). The contract of
    /// [`LockRequest::run`](crate::LockRequest::run).
    pub async fn run<F, Fut, T>(self, f: F) -> Result<T, Error>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = T>,
    {
        let cancel_on_loss = self.auto_extend.is_some();
        let guard = self.acquire().await?;
        run_holding(guard.into_guard(), cancel_on_loss, f).await
    }

    fn span(&self) -> Span {
        tracing::debug_span!(
            "rw_acquire",
            rwlock = %self.keys.name,
            mode = ?self.mode,
            ttl = ?self.ttl,
            elapsed = Empty,
            outcome = Empty,
        )
    }
}

fn record(span: &Span, started: Instant, acquired: bool) {
    span.record("elapsed", field::debug(started.elapsed()))
        .record("outcome", if acquired { "acquired" } else { "failed" });
}
