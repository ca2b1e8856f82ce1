//! A configured lock request: what to lock, for how long, and how to wait.
//! New per-acquisition options (auto-extension, waiting by notification)
//! become methods here without changing the client's shortcuts.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use tracing::field::{self, Empty};
use tracing::Span;

use crate::error::failure::QuorumFailure;
use crate::error::lost::LostLock;
use crate::error::Error;
use crate::lease::Lease;
use crate::logic::quorum::quorum;
use crate::logic::validity::later;
use crate::mutex::guard::LockGuard;
use crate::observe::metrics;
use crate::observe::span::{unseen, within};
use crate::protocol::attempt::{attempt, attempt_outside, probe};
use crate::protocol::fair::{holder_expiry, hopeless, log_failure, wait_fair, Fair, EXPIRY_SPREAD};
use crate::protocol::queue::mark_waiting;
use crate::protocol::release::Released;
use crate::protocol::shared::{Grant, Shared, Target};
use crate::settings::autoextend::{AutoExtend, Schedule};
use crate::settings::retry::{jitter, Retry};
use crate::waiting::notify::Place;

/// Widest spread of the retries after a heard release.
const MAX_RELEASE_SPREAD: Duration = Duration::from_millis(50);

/// The spread's unit for a waiter that has not made an attempt of its own
/// yet (it queued behind this client's other waiters): about one loopback
/// or same-zone attempt.
const FIRST_SPREAD_UNIT: Duration = Duration::from_millis(1);

/// A lock request, made by [`Client::lock`](crate::Client::lock). Nothing is sent until one of
/// the consuming methods runs.
#[derive(Debug, Clone)]
#[must_use = "a lock request does nothing until acquired"]
pub struct LockRequest {
    shared: Arc<Shared>,
    resource: String,
    ttl: Duration,
    retry: Retry,
    auto_extend: Option<AutoExtend>,
    wake_on_release: bool,
    fair: bool,
}

impl LockRequest {
    pub(crate) fn new(shared: Arc<Shared>, resource: String, ttl: Duration) -> Self {
        let config = &shared.config;
        Self {
            retry: config.retry,
            auto_extend: config.auto_extend,
            wake_on_release: config.wake_on_release,
            fair: config.fair,
            shared,
            resource,
            ttl,
        }
    }

    /// The validated target and, when auto-extended, the watchdog's
    /// schedule: everything that can be refused before a round trip.
    fn checked(&self) -> Result<(Target, Option<Schedule>), Error> {
        let target = self.shared.target(&self.resource, self.ttl)?;
        let node_timeout = self.shared.config.node_timeout;
        let schedule = self
            .auto_extend
            .map(|auto| auto.schedule(target.ttl.duration(), target.drift, node_timeout))
            .transpose()?;
        Ok((target, schedule))
    }

    fn guard(&self, target: &Target, grant: Grant, schedule: Option<Schedule>) -> LockGuard {
        LockGuard::new(Arc::clone(&self.shared), target, grant, schedule)
    }

    /// The retry policy for [`acquire`](Self::acquire) and
    /// [`run`](Self::run). Defaults to the client's.
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// Extend the lock automatically while the guard lives; see
    /// [`AutoExtend`]. With it, [`run`](Self::run) cancels the closure's
    /// future when the lock is lost. Defaults to the client's setting
    /// ([`Builder::auto_extend`](crate::Builder::auto_extend), off unless set).
    pub fn auto_extend(mut self, auto: AutoExtend) -> Self {
        self.auto_extend = Some(auto);
        self
    }

    /// No auto-extension for this request, whatever the client's default.
    pub fn manual_extend(mut self) -> Self {
        self.auto_extend = None;
        self
    }

    /// Whether waiting sleeps until a release is heard (`true`) or polls
    /// under the retry policy (`false`); see
    /// [`Builder::wake_on_release`](crate::Builder::wake_on_release).
    /// Defaults to the client's setting (`true` unless set).
    pub fn wake_on_release(mut self, enabled: bool) -> Self {
        self.wake_on_release = enabled;
        self
    }

    /// Whether waiting takes turns through the fair queue (with
    /// [`wake_on_release`](Self::wake_on_release)); see
    /// [`Builder::fair`](crate::Builder::fair). Defaults to the client's
    /// setting (`true` unless set).
    pub fn fair(mut self, enabled: bool) -> Self {
        self.fair = enabled;
        self
    }

    /// Acquires the lock, waiting until the policy's deadline or attempt
    /// limit. While another owner holds it, the wait ends when the holder's
    /// release is heard, when its keys' TTL runs out, or after the policy's
    /// jittered delay (a lost notification never makes the wait longer than
    /// that), whichever is first; with
    /// [`wake_on_release(false)`](Self::wake_on_release), after the delay
    /// only. On failure, [`Error::NotAcquired`] carries the last attempt's
    /// per-node detail and the number of attempts.
    ///
    /// A configuration problem that retrying cannot fix (wrong password,
    /// a replica, two URLs for one server) on enough nodes to make a
    /// majority impossible ends the wait at once.
    pub async fn acquire(self) -> Result<LockGuard, Error> {
        let started = Instant::now();
        let span = tracing::debug_span!(
            "acquire",
            resource = %self.resource,
            ttl = ?self.ttl,
            wake_on_release = self.wake_on_release,
            attempts = Empty,
            granted = Empty,
            quorum = Empty,
            elapsed = Empty,
            outcome = Empty,
            reason = Empty,
        );
        let waited = async {
            let (target, schedule) = self.checked()?;
            let waited = if self.wake_on_release && self.fair {
                match wait_fair(&self.shared, &target, &self.retry).await {
                    Fair::Done(done) => done,
                    // The queue's home stopped answering: the classic
                    // competition, for the rest of the wait.
                    Fair::Classic { attempts, deadline } => {
                        let rest = deadline.saturating_duration_since(Instant::now());
                        let classic = Self {
                            retry: self.retry.with_max_wait(rest),
                            ..self.clone()
                        };
                        Box::pin(classic.wait_notified(&target))
                            .await
                            .map(|(grant, more)| (grant, attempts + more))
                            .map_err(|mut failure| {
                                failure.attempts += attempts;
                                failure
                            })
                    }
                }
            } else if self.wake_on_release {
                Box::pin(self.wait_notified(&target)).await
            } else {
                Box::pin(self.wait_polling(&target)).await
            };
            let (grant, attempts) =
                waited.map_err(|failure| Error::NotAcquired(Box::new(failure)))?;
            Ok((target, schedule, grant, attempts))
        };
        let waited = within(waited, &span).await;
        match waited {
            Ok((target, schedule, grant, attempts)) => {
                self.acquired(&span, started, attempts, &grant);
                Ok(self.guard(&target, grant, schedule))
            }
            Err(error) => {
                not_acquired(&span, started, &error);
                Err(error)
            }
        }
    }

    /// Records a grant on the acquisition's span and in the metrics.
    fn acquired(&self, span: &Span, started: Instant, attempts: u32, grant: &Grant) {
        let elapsed = started.elapsed();
        if !unseen(span) {
            span.record("attempts", attempts)
                .record("granted", grant.granted)
                .record("quorum", quorum(self.shared.nodes.len()))
                .record("elapsed", field::debug(elapsed))
                .record("outcome", "acquired");
        }
        metrics::acquired(elapsed, attempts);
    }

    /// Retries after the policy's jittered pauses.
    async fn wait_polling(&self, target: &Target) -> Result<(Grant, u32), QuorumFailure> {
        let started = Instant::now();
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            // Outside the fair queue: a refusal on its home claims the
            // next turn there, for this waiter's pause and a node timeout
            // to come back (DESIGN.md, section 2, "Outside turns").
            let reserve = self
                .retry
                .pause(attempts, |window| window)
                .saturating_add(self.shared.config.node_timeout.saturating_mul(2));
            match attempt_outside(&self.shared, target, false, reserve).await {
                Ok(grant) => {
                    tracing::debug!(attempts, elapsed = ?started.elapsed(), "acquired");
                    return Ok((grant, attempts));
                }
                Err(mut failure) => {
                    log_failure(attempts, &failure);
                    let next = if hopeless(&failure) {
                        None
                    } else {
                        self.retry.next_delay(attempts, started.elapsed(), jitter)
                    };
                    let Some(pause) = next else {
                        failure.attempts = attempts;
                        failure.elapsed = started.elapsed();
                        return Err(failure);
                    };
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// Retries when a release is heard, the holder's TTL ran out, or the
    /// policy's pause passed; see the `notify` module.
    async fn wait_notified(&self, target: &Target) -> Result<(Grant, u32), QuorumFailure> {
        let started = Instant::now();
        let deadline = self.retry.deadline(started);
        let mut attempts = 0u32;
        // The release counter when this waiter last started an attempt as
        // head; `None` until it is head.
        let mut heard: Option<u64> = None;
        // Other tasks of this client already wait for this lock: take a
        // turn behind them instead of an attempt ahead of them (a task that
        // just released and comes straight back would otherwise win every
        // time). The first attempt then comes when this waiter is head and
        // a release is heard (or the head's timers fire), at the latest at
        // the deadline.
        let mut place = self
            .shared
            .waits
            .join_if_waiting(&self.shared.nodes, &target.key);
        if let Some(place) = &place {
            self.await_retry(
                target,
                place,
                &mut heard,
                None,
                started,
                deadline,
                deadline,
                1,
                FIRST_SPREAD_UNIT,
            )
            .await;
        }
        loop {
            attempts += 1;
            heard = place
                .as_ref()
                .and_then(Place::head)
                .map(|h| h.heard)
                .or(heard);
            let probe = place.is_some();
            let attempt_start = Instant::now();
            // Outside the fair queue (`fair(false)`, or its home stopped
            // answering): a refusal on the home claims the next turn there,
            // which a notice reaches at once (DESIGN.md, section 2,
            // "Outside turns").
            let reserve = self.shared.config.node_timeout.saturating_mul(3);
            let result = attempt_outside(&self.shared, target, probe, reserve).await;
            // How long an attempt takes: the unit of the spread below.
            let attempt_time = attempt_start.elapsed();
            let mut failure = match result {
                Ok(grant) => {
                    tracing::debug!(attempts, elapsed = ?started.elapsed(), "acquired");
                    if let Some(place) = place {
                        place.acquired(grant.held.expires_at);
                    }
                    return Ok((grant, attempts));
                }
                Err(failure) => failure,
            };
            log_failure(attempts, &failure);
            let now = Instant::now();
            if hopeless(&failure) || !self.retry.allows_another(attempts) || now >= deadline {
                failure.attempts = attempts;
                failure.elapsed = started.elapsed();
                return Err(failure);
            }
            let fresh = place.is_none();
            if fresh {
                // From now on releases of the resource publish their
                // notices on every node (the waiting marker).
                let life = deadline
                    .saturating_duration_since(now)
                    .saturating_add(target.ttl.duration());
                mark_waiting(&self.shared, &[target], life).await;
            }
            let place = place
                .get_or_insert_with(|| self.shared.waits.join(&self.shared.nodes, &target.key));
            let fallback = later(now, self.retry.pause(attempts, jitter));
            let expiry = holder_expiry(&failure, now);
            let wake_at = expiry.map_or(fallback, |e| e.min(fallback)).min(deadline);
            let fresh = fresh.then_some(attempt_start);
            self.await_retry(
                target,
                place,
                &mut heard,
                fresh,
                attempt_start,
                wake_at,
                deadline,
                attempts,
                attempt_time,
            )
            .await;
            if Instant::now() >= deadline {
                failure.attempts = attempts;
                failure.elapsed = started.elapsed();
                return Err(failure);
            }
        }
    }

    /// Waits in the queue until this waiter should attempt: as head, when a
    /// release is heard (after the spread and a one-node look when other
    /// clients heard it too), at `wake_at`, or at the deadline. See
    /// [`wait_turn`](Self::wait_turn) for `heard`, `fresh` and `began`;
    /// `attempt_time` is the unit of the spread.
    #[allow(clippy::too_many_arguments)]
    async fn await_retry(
        &self,
        target: &Target,
        place: &Place,
        heard: &mut Option<u64>,
        mut fresh: Option<Instant>,
        mut began: Instant,
        mut wake_at: Instant,
        deadline: Instant,
        attempts: u32,
        attempt_time: Duration,
    ) {
        loop {
            let woken = self
                .wait_turn(place, heard, fresh, began, wake_at, deadline, attempts)
                .await;
            fresh = None;
            // From here a settle counts only if it comes after this look.
            began = Instant::now();
            let Woken::Release { competitors } = woken else {
                return;
            };
            if competitors <= 1 {
                return;
            }
            // Every client waiting on this resource heard the release, and
            // each one's head retries: spread over as many attempt times as
            // there are other clients, the first retry usually lands alone
            // instead of splitting the votes with the rest.
            let others = u32::try_from(competitors - 1).unwrap_or(u32::MAX);
            let spread = attempt_time.saturating_mul(others).min(MAX_RELEASE_SPREAD);
            tokio::time::sleep_until(deadline.min(Instant::now() + jitter(spread)).into()).await;
            if Instant::now() >= deadline {
                return;
            }
            // Then look before leaping: one `PTTL` on one node (one command
            // instead of an acquire on every node). When another client
            // already took the lock, wait for its release instead of sending
            // a full attempt that is bound to fail: K clients would
            // otherwise cost K full attempts per release.
            // Counted from before the probe: a release heard during it wakes
            // this waiter again.
            let before = place.head().map(|h| h.heard);
            let Some(held_for) = probe(&self.shared, target).await else {
                return;
            };
            *heard = before.or(*heard);
            let now = Instant::now();
            let fallback = later(now, self.retry.pause(attempts, jitter));
            let expiry = held_for.map(|d| later(now, d.saturating_add(jitter(EXPIRY_SPREAD))));
            wake_at = expiry.map_or(fallback, |e| e.min(fallback)).min(deadline);
        }
    }

    /// Sleeps in the queue until this waiter is head and a release is
    /// heard, or (as head) until `wake_at`, or until the deadline. `heard`
    /// is the release counter this waiter compares against (`None` while
    /// not head). `fresh` is the start of the attempt this waiter just
    /// made before joining: `wake_at` was computed from it, so it holds if
    /// this waiter is head at once, and a release the queue heard after it
    /// began (a lingering queue hears releases while nobody waits) means
    /// the lock may be free already. `began` is when the last refused
    /// attempt (or look) began: a release settled on a majority after it
    /// (`Queue::settled`) wakes this head once more.
    #[allow(clippy::too_many_arguments)]
    async fn wait_turn(
        &self,
        place: &Place,
        heard: &mut Option<u64>,
        fresh: Option<Instant>,
        began: Instant,
        mut wake_at: Instant,
        deadline: Instant,
        attempts: u32,
    ) -> Woken {
        let mut fresh = fresh;
        loop {
            match place.head() {
                // A release settled on a majority after the refused
                // attempt began: that attempt may have met nodes that had
                // not deleted yet (it was woken by the notice's first
                // copy), and the later copies wake nobody. Once more.
                Some(head) if heard.is_some() && head.last_settled.is_some_and(|t| t > began) => {
                    *heard = Some(head.heard);
                    return Woken::Release {
                        competitors: head.competitors,
                    };
                }
                Some(head) if heard.is_some_and(|h| h != head.heard) => {
                    return Woken::Release {
                        competitors: head.competitors,
                    };
                }
                Some(head)
                    if heard.is_none()
                        && fresh
                            .is_some_and(|began| head.last_heard.is_some_and(|t| t > began)) =>
                {
                    *heard = Some(head.heard);
                    return Woken::Release {
                        competitors: head.competitors,
                    };
                }
                Some(head) if heard.is_none() => {
                    // Just became head (or joined an empty queue): the lock
                    // is most likely held by the waiter before; wait for its
                    // release, its expiry, or a fallback counted from now
                    // (the one computed at this waiter's last attempt may be
                    // long past).
                    *heard = Some(head.since);
                    let fallback = later(Instant::now(), self.retry.pause(attempts, jitter));
                    let holder = head.holder_until.map(|t| later(t, jitter(EXPIRY_SPREAD)));
                    if fresh.is_none() {
                        wake_at = fallback.min(deadline);
                    }
                    wake_at = holder.map_or(wake_at, |h| h.min(wake_at));
                }
                Some(_) => {}
                None => {
                    *heard = None;
                    fresh = None;
                }
            }
            let until = if heard.is_some() { wake_at } else { deadline };
            if Instant::now() >= until {
                return Woken::Timer;
            }
            place.wait(until).await;
        }
    }

    /// One attempt, no waiting. `Ok(None)` when the lock is held by another
    /// owner ([`FailureReason::Contended`](crate::FailureReason::Contended)):
    /// the batch-job "someone else is on it, skip" case. Other failures (nodes down, validity used up) are
    /// errors, because skipping on them would skip work nobody is doing.
    pub async fn try_acquire(self) -> Result<Option<LockGuard>, Error> {
        let started = Instant::now();
        let span = tracing::debug_span!(
            "try_acquire",
            resource = %self.resource,
            ttl = ?self.ttl,
            attempts = 1,
            granted = Empty,
            quorum = Empty,
            elapsed = Empty,
            outcome = Empty,
            reason = Empty,
        );
        let tried = async {
            let (target, schedule) = self.checked()?;
            let grant = attempt(&self.shared, &target, false)
                .await
                .map_err(|failure| Error::NotAcquired(Box::new(failure)))?;
            Ok((target, schedule, grant))
        };
        let tried = within(tried, &span).await;
        match tried {
            Ok((target, schedule, grant)) => {
                self.acquired(&span, started, 1, &grant);
                Ok(Some(self.guard(&target, grant, schedule)))
            }
            Err(error) => {
                not_acquired(&span, started, &error);
                if error.is_contended() {
                    Ok(None)
                } else {
                    Err(error)
                }
            }
        }
    }

    /// Acquires (as [`acquire`](Self::acquire)), runs `f` to completion
    /// under the lock, and only then releases, also when `f` returns an
    /// error or panics (the panic is resumed after the release).
    ///
    /// With [auto-extension](Self::auto_extend), `f`'s future is dropped
    /// (cancelled at its current await point) as soon as the lease is lost,
    /// and `run` returns [`Error::LockLost`] with the reason: distinct from
    /// [`Error::NotAcquired`], because `f` ran for a while under the lock.
    /// Without it `f` always runs to completion; it can watch
    /// [`Lease::lost`] itself.
    ///
    /// If the future returned by `run` is itself dropped mid-way, `f`'s
    /// future is dropped first and the lock is released in the background
    /// after it.
    pub async fn run<F, Fut, T>(self, f: F) -> Result<T, Error>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = T>,
    {
        let cancel_on_loss = self.auto_extend.is_some();
        let guard = self.acquire().await?;
        run_holding(guard, cancel_on_loss, f).await
    }
}

/// The body of [`LockRequest::run`] once the lock is held, shared with
/// the family's scoped forms (a semaphore's permit is a slot's guard):
/// runs `f`, cancelled when the lease is lost if `cancel_on_loss`, then
/// releases, also when `f` panics (resumed after the release).
pub(crate) async fn run_holding<F, Fut, T>(
    guard: LockGuard,
    cancel_on_loss: bool,
    f: F,
) -> Result<T, Error>
where
    F: FnOnce(Lease) -> Fut,
    Fut: Future<Output = T>,
{
    let lease = guard.lease();
    let lost = lease.lost();
    run_scoped(lease, lost, cancel_on_loss, f, || async move {
        note_release(&guard.release().await);
    })
    .await
}

/// [`run_holding`] for any hold: `f` gets `view`, is cancelled when `lost`
/// resolves if `cancel_on_loss`, and `release` runs after it, also when
/// `f` panics (resumed after the release). A multi-resource lock's scoped
/// form passes every resource's lease and the first loss among them.
pub(crate) async fn run_scoped<V, L, F, Fut, T, R, RFut>(
    view: V,
    lost: L,
    cancel_on_loss: bool,
    f: F,
    release: R,
) -> Result<T, Error>
where
    L: Future<Output = LostLock>,
    F: FnOnce(V) -> Fut,
    Fut: Future<Output = T>,
    R: FnOnce() -> RFut,
    RFut: Future<Output = ()>,
{
    let work = AssertUnwindSafe(f(view)).catch_unwind();
    let outcome = if cancel_on_loss {
        tokio::pin!(work);
        tokio::select! {
            // A finished `f` wins a tie: its result is not thrown away.
            biased;
            outcome = &mut work => Ok(outcome),
            lost = lost => Err(lost),
        }
    } else {
        Ok(work.await)
    };
    release().await;
    match outcome {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(lost) => Err(Error::LockLost(Box::new(lost))),
    }
}

/// Logs a scoped form's release that a majority did not confirm.
pub(crate) fn note_release(released: &Released) {
    if released.confirmed + released.handed_over < released.nodes {
        tracing::debug!(
            confirmed = released.confirmed,
            nodes = released.nodes,
            "release not confirmed everywhere"
        );
    }
}

/// Why a waiter stopped sleeping.
enum Woken {
    /// A release was heard, with how many clients heard it.
    Release { competitors: u64 },
    /// Its own timer (holder's expiry, fallback) or the deadline.
    Timer,
}

/// Records a failed acquisition on its span and in the metrics: the last
/// attempt's votes for a quorum failure, the error's message otherwise.
fn not_acquired(span: &Span, started: Instant, error: &Error) {
    let elapsed = started.elapsed();
    let attempts = error.quorum_failure().map_or(0, |failure| {
        span.record("granted", failure.granted)
            .record("quorum", failure.quorum)
            .record("reason", field::display(failure.reason));
        failure.attempts
    });
    if error.quorum_failure().is_none() {
        span.record("reason", field::display(error));
    }
    span.record("attempts", attempts)
        .record("elapsed", field::debug(elapsed))
        .record("outcome", "failed");
    span.in_scope(|| tracing::debug!(%error, "not acquired"));
    metrics::acquire_failed(elapsed, attempts, error);
}
