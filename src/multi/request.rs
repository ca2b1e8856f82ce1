//! A configured multi-resource request: which resources, for how long,
//! how to wait. An attempt is one all-or-nothing script per node
//! (`attempt`); a waiting acquire sleeps until a release of any resource
//! of the set is heard (or a holder's keys run out, or the retry policy's
//! jittered pause passes) and attempts again, until the deadline.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::field::{self, Empty};
use tracing::{Instrument, Span};

use super::attempt::{attempt_all, Set};
use super::guard::MultiGuard;
use super::set::{check, other_slot};
use crate::error::set::ResourceSetError;
use crate::error::Error;
use crate::lease::Lease;
use crate::logic::validity::later;
use crate::mutex::guard::LockGuard;
use crate::mutex::request::{note_release, run_scoped};
use crate::node::slot::key_slot;
use crate::node::Kind;
use crate::observe::metrics;
use crate::protocol::fair::{holder_expiry, hopeless, log_failure};
use crate::protocol::queue::mark_waiting;
use crate::protocol::shared::{Grant, Shared};
use crate::settings::autoextend::{AutoExtend, Schedule};
use crate::settings::retry::{jitter, Retry};
use crate::waiting::any::wait_any;
use crate::waiting::notify::Place;

/// A multi-resource lock request, made by
/// [`Client::lock_set`](crate::Client::lock_set). Nothing is sent until one
/// of the consuming methods runs.
#[derive(Debug, Clone)]
#[must_use = "a lock request does nothing until acquired"]
pub struct MultiRequest {
    shared: Arc<Shared>,
    resources: Arc<[String]>,
    ttl: Duration,
    retry: Retry,
    auto_extend: Option<AutoExtend>,
    wake_on_release: bool,
}

impl MultiRequest {
    pub(crate) fn new(shared: Arc<Shared>, resources: Arc<[String]>, ttl: Duration) -> Self {
        let config = &shared.config;
        Self {
            retry: config.retry,
            auto_extend: config.auto_extend,
            wake_on_release: config.wake_on_release,
            shared,
            resources,
            ttl,
        }
    }

    /// The retry policy for [`acquire`](Self::acquire) and
    /// [`run`](Self::run): its deadline, pauses and attempt limit. Defaults
    /// to the client's.
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// Extend every resource automatically while the guard lives (one
    /// watchdog for the set, each extension every resource at once); see
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

    /// Whether waiting sleeps until a release of any resource of the set
    /// is heard (`true`) or polls under the retry policy (`false`).
    /// Defaults to the client's setting (`true` unless set).
    pub fn wake_on_release(mut self, enabled: bool) -> Self {
        self.wake_on_release = enabled;
        self
    }

    /// Everything that can be refused before a round trip: the set (empty,
    /// too many, a resource twice), each name and the TTL (the mutex's
    /// checks), a set spanning hash slots with a Redis Cluster node, and
    /// the watchdog's schedule.
    fn checked(&self) -> Result<(Set, Option<Schedule>), Error> {
        check(&self.resources).map_err(Error::InvalidResourceSet)?;
        let targets = self
            .resources
            .iter()
            .map(|resource| self.shared.target(resource, self.ttl))
            .collect::<Result<Vec<_>, _>>()?;
        let clustered = self
            .shared
            .nodes
            .iter()
            .any(|node| matches!(node.kind(), Kind::Cluster(_)));
        if clustered {
            let slots: Vec<Vec<u16>> = targets
                .iter()
                .map(|t| {
                    std::iter::once(&t.key)
                        .chain(&t.fence)
                        .map(|key| key_slot(key.as_bytes()))
                        .collect()
                })
                .collect();
            if let Some(i) = other_slot(&slots) {
                return Err(Error::InvalidResourceSet(ResourceSetError::CrossSlot {
                    first: self.resources[0].clone(),
                    other: self.resources[i].clone(),
                }));
            }
        }
        let set = Set::new(targets).ok_or(Error::InvalidResourceSet(ResourceSetError::Empty))?;
        let node_timeout = self.shared.config.node_timeout;
        let schedule = self
            .auto_extend
            .map(|auto| auto.schedule(set.whole.ttl.duration(), set.whole.drift, node_timeout))
            .transpose()?;
        Ok((set, schedule))
    }

    fn guard(&self, set: &Set, grants: Vec<Grant>, schedule: Option<Schedule>) -> MultiGuard {
        let guards = set
            .targets
            .iter()
            .zip(grants)
            .map(|(target, grant)| {
                LockGuard::in_set(Arc::clone(&self.shared), target, grant, schedule.is_some())
            })
            .collect();
        MultiGuard::new(Arc::clone(&self.shared), guards, schedule)
    }

    /// Acquires every resource of the set, all or nothing, waiting until
    /// the policy's deadline or attempt limit. While any is held by
    /// another owner, the wait ends when a release of any resource of the
    /// set is heard, when the holder's keys run out, or after the policy's
    /// jittered pause (a lost notice never makes the wait longer than
    /// that), whichever is first, never after the deadline.
    ///
    /// **Never a deadlock.** A refused attempt holds nothing: on each node
    /// the script sets every key or none, and an attempt without a
    /// majority releases what it set. So two callers locking overlapping
    /// sets in opposite orders never wait for each other while holding;
    /// the order of the resources does not matter. They can still keep
    /// splitting the votes (each taking some nodes), as two mutex callers
    /// can: the jittered pauses make that short, and the deadline bounds
    /// it.
    ///
    /// **No fair queue.** A waiter for a set waits for any of its
    /// resources: it takes no turns in the resources' fair queues, and a
    /// mutex waiter in such a queue may be served first. Bounded by the
    /// deadline.
    ///
    /// On failure, [`Error::NotAcquired`] carries the last attempt's
    /// per-node detail (under the resources' names joined) and the number
    /// of attempts; a bad set is [`Error::InvalidResourceSet`].
    pub async fn acquire(self) -> Result<MultiGuard, Error> {
        let started = Instant::now();
        let span = self.span("lock_all");
        let waited = self.acquire_inner(started).instrument(span.clone()).await;
        self.finish(&span, started, waited)
    }

    async fn acquire_inner(&self, started: Instant) -> Result<(MultiGuard, u32), Error> {
        let (set, schedule) = self.checked()?;
        let deadline = self.retry.deadline(started);
        let mut attempts = 0u32;
        // One place per resource, from the first refused attempt on.
        let mut places: Vec<Place> = Vec::new();
        loop {
            attempts += 1;
            let probe = !places.is_empty();
            let began = Instant::now();
            let mut failure = match attempt_all(&self.shared, &set, probe).await {
                Ok(grants) => {
                    let expires_at = grants.first().map(|g| g.held.expires_at);
                    if let Some(expires_at) = expires_at {
                        // Each resource's next waiter of this client waits
                        // for this holder's release.
                        for place in places {
                            place.acquired(expires_at);
                        }
                    }
                    return Ok((self.guard(&set, grants, schedule), attempts));
                }
                Err(failure) => failure,
            };
            log_failure(attempts, &failure);
            let now = Instant::now();
            if hopeless(&failure) || !self.retry.allows_another(attempts) || now >= deadline {
                failure.attempts = attempts;
                failure.elapsed = started.elapsed();
                return Err(Error::NotAcquired(Box::new(failure)));
            }
            let fallback = later(now, self.retry.pause(attempts, jitter));
            let expiry = holder_expiry(&failure, now);
            let wake_at = expiry.map_or(fallback, |e| e.min(fallback)).min(deadline);
            if !self.wake_on_release {
                tokio::time::sleep_until(wake_at.into()).await;
                continue;
            }
            if places.is_empty() {
                // From now on releases of the resources publish notices
                // on every node (the waiting marker), heard by our
                // subscriptions to each resource's channel.
                let life = deadline
                    .saturating_duration_since(now)
                    .saturating_add(self.ttl);
                let targets: Vec<_> = set.targets.iter().collect();
                mark_waiting(&self.shared, &targets, life).await;
                for target in &set.targets {
                    places.push(self.shared.waits.join(&self.shared.nodes, &target.key));
                }
            }
            wait_any(&places, wake_at, began).await;
        }
    }

    /// One attempt, no waiting. `Ok(None)` when another owner holds any
    /// resource of the set (and nothing was taken); an error when nodes
    /// failed, as [`LockRequest::try_acquire`](crate::LockRequest::try_acquire).
    pub async fn try_acquire(self) -> Result<Option<MultiGuard>, Error> {
        let started = Instant::now();
        let span = self.span("try_lock_all");
        let tried = async {
            let (set, schedule) = self.checked()?;
            match attempt_all(&self.shared, &set, false).await {
                Ok(grants) => Ok((self.guard(&set, grants, schedule), 1)),
                Err(mut failure) => {
                    failure.elapsed = started.elapsed();
                    Err(Error::NotAcquired(Box::new(failure)))
                }
            }
        }
        .instrument(span.clone())
        .await;
        match self.finish(&span, started, tried) {
            Ok(guard) => Ok(Some(guard)),
            Err(error) if error.is_contended() => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Acquires the set (as [`acquire`](Self::acquire)), runs `f` to
    /// completion holding it, then releases every resource, also when `f`
    /// fails or panics; with auto-extension `f` is cancelled as soon as any
    /// resource is lost ([`Error::LockLost`]). `f` gets one [`Lease`] per
    /// resource, in the order given: each carries its resource's token.
    /// The same contract as [`LockRequest::run`](crate::LockRequest::run).
    pub async fn run<F, Fut, T>(self, f: F) -> Result<T, Error>
    where
        F: FnOnce(Vec<Lease>) -> Fut,
        Fut: Future<Output = T>,
    {
        let cancel_on_loss = self.auto_extend.is_some();
        let guard = self.acquire().await?;
        let (leases, lost) = (guard.leases(), guard.lost());
        run_scoped(leases, lost, cancel_on_loss, f, || async move {
            for released in guard.release().await {
                note_release(&released);
            }
        })
        .await
    }

    fn span(&self, name: &'static str) -> Span {
        let span = match name {
            "try_lock_all" => tracing::debug_span!(
                "try_lock_all",
                resources = self.resources.len(),
                first = Empty,
                ttl = ?self.ttl,
                attempts = Empty,
                elapsed = Empty,
                outcome = Empty,
            ),
            _ => tracing::debug_span!(
                "lock_all",
                resources = self.resources.len(),
                first = Empty,
                ttl = ?self.ttl,
                attempts = Empty,
                elapsed = Empty,
                outcome = Empty,
            ),
        };
        if let Some(first) = self.resources.first() {
            span.record("first", first.as_str());
        }
        span
    }

    /// Records the outcome on the span and in the metrics.
    fn finish(
        &self,
        span: &Span,
        started: Instant,
        result: Result<(MultiGuard, u32), Error>,
    ) -> Result<MultiGuard, Error> {
        let elapsed = started.elapsed();
        span.record("elapsed", field::debug(elapsed));
        match result {
            Ok((guard, attempts)) => {
                span.record("attempts", attempts)
                    .record("outcome", "acquired");
                metrics::acquired(elapsed, attempts);
                Ok(guard)
            }
            Err(error) => {
                let attempts = error.quorum_failure().map_or(0, |f| f.attempts);
                span.record("attempts", attempts)
                    .record("outcome", "failed");
                span.in_scope(|| tracing::debug!(%error, "not acquired"));
                metrics::acquire_failed(elapsed, attempts, &error);
                Err(error)
            }
        }
    }
}
