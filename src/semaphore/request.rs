//! A configured permit request: which semaphore, for how long, how to
//! wait. A pass tries the slots from a random one, up to all K, and stops
//! at the first grant; a refused request then waits for its turn in the
//! semaphore's line (a fair-queue mutex, `{name}:queue`), and once at its
//! head sleeps until a release of any slot is heard (or a holder's keys
//! run out, or the retry policy's pause passes) and makes another pass,
//! starting with the released slot, until the deadline.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::field::{self, Empty};
use tracing::{Instrument, Span};

use super::permit::Permit;
use super::slots::{pass_order, queue_resource};
use crate::error::failure::{FailureReason, NodeErrorKind, Phase, QuorumFailure};
use crate::error::Error;
use crate::lease::Lease;
use crate::logic::quorum::quorum;
use crate::logic::validity::later;
use crate::mutex::guard::LockGuard;
use crate::mutex::request::{run_holding, LockRequest};
use crate::protocol::attempt::{attempt, attempt_pregranted};
use crate::protocol::fair::{holder_expiry, hopeless, log_failure};
use crate::protocol::queue::{claim_waiting, mark_waiting, unclaim, unclaim_now};
use crate::protocol::shared::{Grant, Shared, Target};
use crate::settings::autoextend::{AutoExtend, Schedule};
use crate::settings::retry::{jitter, Retry};
use crate::waiting::any::wait_any;
use crate::waiting::notify::Place;

/// A permit request, made by [`Semaphore::permit`](crate::Semaphore::permit).
/// Nothing is sent until one of the consuming methods runs.
#[derive(Debug, Clone)]
#[must_use = "a permit request does nothing until acquired"]
pub struct SemaphoreRequest {
    shared: Arc<Shared>,
    name: Arc<str>,
    /// One resource name per slot, `{name}:permit:{i}`.
    slots: Arc<[String]>,
    ttl: Duration,
    retry: Retry,
    auto_extend: Option<AutoExtend>,
    wake_on_release: bool,
    fair: bool,
}

/// How long the line's lease lasts (auto-extended while its holder waits):
/// a waiter that dies while it is its turn holds the others up for at most
/// this long. Twenty node timeouts, at least 2 s, and never more than the
/// permit's own TTL: the restart guard's window is the longest TTL a
/// client requests, and the line must not widen it.
fn line_ttl(shared: &Shared, ttl: Duration) -> Duration {
    node_timeouts(
        shared,
        20,
        Duration::from_secs(2),
        Duration::from_secs(3600),
    )
    .min(ttl)
}

/// `n` node timeouts, within `[least, most]`.
fn node_timeouts(shared: &Shared, n: u32, least: Duration, most: Duration) -> Duration {
    shared
        .config
        .node_timeout
        .checked_mul(n)
        .unwrap_or(Duration::MAX)
        .clamp(least, most)
}

/// Whether a refused attempt saw the slot held somewhere: with a node down
/// a held slot fails as `Unavailable`, not `Contended`.
fn saw_holder(failure: &QuorumFailure) -> bool {
    failure.reason == FailureReason::Contended
        || failure
            .failures
            .iter()
            .any(|f| matches!(f.kind, NodeErrorKind::HeldByOther { .. }))
}

/// How long a release keeps a freed slot for the claim of the waiter
/// whose turn it is: four node timeouts (its notice, its pass), at least
/// 100 ms. A claimant that died costs each release that long.
fn keep_for(shared: &Shared) -> Duration {
    node_timeouts(
        shared,
        4,
        Duration::from_millis(100),
        Duration::from_secs(10),
    )
}

/// The claim of the waiter whose turn it is (`c:{ms}:{claimant}` in the
/// slots' markers): a release keeps the freed key as `r:{claimant}`, which
/// this waiter's attempts take as free by its SHA1 (`hash`). Dropped, it
/// is taken back in the background.
struct Claim {
    shared: Arc<Shared>,
    value: String,
    /// `r:{claimant}`, what a release keeps a slot as.
    kept: String,
    hash: String,
    slots: Vec<Target>,
}

impl Claim {
    /// Takes the claim back now (the waiter got its permit).
    async fn take_back(mut self) {
        let slots = std::mem::take(&mut self.slots);
        let targets: Vec<&Target> = slots.iter().collect();
        unclaim_now(&self.shared, &targets, &self.value, &self.kept).await;
    }
}

impl Drop for Claim {
    /// A waiter that gave up or was cancelled: in the background.
    fn drop(&mut self) {
        if !self.slots.is_empty() {
            unclaim(
                &self.shared,
                std::mem::take(&mut self.slots),
                std::mem::take(&mut self.value),
                std::mem::take(&mut self.kept),
            );
        }
    }
}

/// The slots' targets, made when first tried, and the next pass's start.
struct Targets {
    slots: Vec<Option<Target>>,
    start: u32,
}

/// How one pass over the slots ended without a grant.
struct Refused {
    failure: QuorumFailure,
    /// When the earliest holder met in the pass frees its slot, if known.
    expiry: Option<Instant>,
}

impl SemaphoreRequest {
    pub(crate) fn new(
        shared: Arc<Shared>,
        name: Arc<str>,
        slots: Arc<[String]>,
        ttl: Duration,
    ) -> Self {
        let config = &shared.config;
        Self {
            retry: config.retry,
            auto_extend: config.auto_extend,
            wake_on_release: config.wake_on_release,
            fair: config.fair,
            shared,
            name,
            slots,
            ttl,
        }
    }

    /// The retry policy for [`acquire`](Self::acquire) and
    /// [`run`](Self::run): its deadline and pause, and its attempt limit
    /// counted in passes (one pass tries up to K slots). Defaults to the
    /// client's.
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// Extend the permit automatically while its guard lives; see
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

    /// Whether waiting sleeps until a release of any slot is heard
    /// (`true`) or polls under the retry policy (`false`). Defaults to the
    /// client's setting (`true` unless set).
    pub fn wake_on_release(mut self, enabled: bool) -> Self {
        self.wake_on_release = enabled;
        self
    }

    /// Whether waiters take turns (`true`): they stand in the semaphore's
    /// line, in arrival order across processes, and only the one at its
    /// head tries the slots, so a release costs one retry however many
    /// wait. `false`: every waiting client retries on every release and
    /// the first to land wins. Defaults to the client's
    /// [`Builder::fair`](crate::Builder::fair) (`true` unless set); only
    /// with waiting by notification.
    pub fn fair(mut self, enabled: bool) -> Self {
        self.fair = enabled;
        self
    }

    /// The first slot of a pass (random), its validated target and the
    /// watchdog's schedule: all that can be refused before a round trip.
    /// The other slots' targets are made when tried (`Targets`): a free
    /// permit costs one target, as a mutex acquire does.
    fn checked(&self) -> Result<(Targets, Option<Schedule>), Error> {
        let mut targets = Targets {
            slots: vec![None; self.slots.len()],
            start: rand::random(),
        };
        let permits = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
        let first = targets.start % permits.max(1);
        let target = self.shared.target(&self.slots[first as usize], self.ttl)?;
        let node_timeout = self.shared.config.node_timeout;
        let schedule = self
            .auto_extend
            .map(|auto| auto.schedule(target.ttl.duration(), target.drift, node_timeout))
            .transpose()?;
        targets.slots[first as usize] = Some(target);
        Ok((targets, schedule))
    }

    /// Slot `slot`'s target, made on first use. The name and the TTL were
    /// checked with the pass's first slot, so this does not fail for a slot
    /// below K.
    fn target<'a>(&self, targets: &'a mut Targets, slot: u32) -> Option<&'a Target> {
        let entry = targets.slots.get_mut(slot as usize)?;
        if entry.is_none() {
            *entry = self
                .shared
                .target(self.slots.get(slot as usize)?, self.ttl)
                .ok();
        }
        entry.as_ref()
    }

    fn permit(
        &self,
        targets: &mut Targets,
        slot: u32,
        grant: Grant,
        schedule: Option<Schedule>,
    ) -> Option<Permit> {
        let target = self.target(targets, slot)?;
        let guard = LockGuard::new(Arc::clone(&self.shared), target, grant, schedule);
        Some(Permit::new(guard, self.name.clone(), slot))
    }

    /// One pass: the slots from a random one, at most K attempts, stopping
    /// at the first grant, at a failure that saw no holder (nodes down are
    /// down for every slot: trying the others would multiply the
    /// timeouts), or when the deadline passed.
    async fn pass(
        &self,
        targets: &mut Targets,
        probe: bool,
        attempts: &mut u32,
        deadline: Option<Instant>,
        claim: Option<&Claim>,
    ) -> Result<(u32, Grant), Refused> {
        let permits = u32::try_from(targets.slots.len()).unwrap_or(u32::MAX);
        // Later passes start elsewhere: spreads the retries of waiters.
        let start = std::mem::replace(&mut targets.start, rand::random());
        let mut expiry: Option<Instant> = None;
        let mut last: Option<QuorumFailure> = None;
        for slot in pass_order(start, permits) {
            let Some(target) = self.target(targets, slot) else {
                continue;
            };
            *attempts += 1;
            // A key a release kept for our claim counts as free.
            let tried = match claim {
                Some(claim) => {
                    attempt_pregranted(&self.shared, target, probe, None, Some(&claim.hash), None)
                        .await
                }
                None => attempt(&self.shared, target, probe).await,
            };
            match tried {
                Ok(grant) => return Ok((slot, grant)),
                Err(failure) => {
                    log_failure(*attempts, &failure);
                    let now = Instant::now();
                    if let Some(e) = holder_expiry(&failure, now) {
                        expiry = Some(expiry.map_or(e, |x| x.min(e)));
                    }
                    // Another slot is worth a try while this one was seen
                    // held somewhere.
                    let stop = !saw_holder(&failure)
                        || hopeless(&failure)
                        || deadline.is_some_and(|d| now >= d);
                    last = Some(failure);
                    if stop {
                        break;
                    }
                }
            }
        }
        match last {
            Some(failure) => Err(Refused { failure, expiry }),
            // K ≥ 1 is checked when the semaphore is made: unreachable.
            None => Err(Refused {
                failure: QuorumFailure {
                    phase: Phase::Acquire,
                    resource: self.name.to_string(),
                    reason: FailureReason::Contended,
                    granted: 0,
                    quorum: quorum(self.shared.nodes.len()),
                    nodes: self.shared.nodes.len(),
                    attempts: 0,
                    elapsed: Duration::ZERO,
                    failures: Vec::new(),
                },
                expiry,
            }),
        }
    }

    /// Acquires a permit, waiting until the policy's deadline or its
    /// number of passes. While all K are held, the wait ends when a release
    /// of any slot is heard, when a holder's keys run out, or after the
    /// policy's jittered delay (a lost notice never makes the wait longer
    /// than that), whichever is first, never after the deadline.
    ///
    /// **Waiters take turns** ([`fair`](Self::fair), on by default). A
    /// request refused by its first pass stands in the semaphore's line:
    /// the fair queue of a mutex of this crate, `{name}:queue`, whose
    /// holder is the one waiter that tries the slots. Waiters of every
    /// process are served in the order they joined the line, and a release
    /// costs one retry however many wait. The line orders who tries; the
    /// slots' quorums still decide who holds, so when the line fails (its
    /// holder died: at most its lease of 20 node timeouts, at least 2 s,
    /// auto-extended while it waits; nodes unreachable: the request waits
    /// unordered) order and time suffer, never the bound. A request's
    /// *first* pass does not queue: a newcomer that finds a slot free
    /// takes it, even with others in line (a release and a newcomer's
    /// pass can meet before the line's head retries).
    ///
    /// On failure, [`Error::NotAcquired`] carries the last attempt's
    /// per-node detail and the number of attempts (slot tries).
    pub async fn acquire(self) -> Result<Permit, Error> {
        let started = Instant::now();
        let span = self.span("semaphore_acquire");
        let waited = self.acquire_inner(started).instrument(span.clone()).await;
        self.finish(&span, started, waited)
    }

    async fn acquire_inner(&self, started: Instant) -> Result<Permit, Error> {
        let (mut targets, schedule) = self.checked()?;
        let deadline = self.retry.deadline(started);
        let mut attempts = 0u32;
        let mut passes = 0u32;
        // Subscribed to every slot from the first refused pass on (the
        // waiter whose turn it is: before its first pass of the turn).
        let mut places: Vec<Place> = Vec::new();
        // The semaphore's waiting line: held while this waiter is the one
        // that tries; released (in the background, handed to the next
        // waiter) when this one has its permit or gives up.
        let mut turn: Option<LockGuard> = None;
        let mut claim: Option<Claim> = None;
        let mut queued = false;
        loop {
            passes += 1;
            let probe = !places.is_empty();
            let began = Instant::now();
            let refused = match self
                .pass(
                    &mut targets,
                    probe,
                    &mut attempts,
                    Some(deadline),
                    claim.as_ref(),
                )
                .await
            {
                Ok((slot, grant)) => {
                    let expires_at = grant.held.expires_at;
                    if places.len() == self.slots.len() {
                        // The slot's next waiter of this client waits for
                        // this holder's release.
                        places.swap_remove(slot as usize).acquired(expires_at);
                    }
                    // The guard first: cut off from here on, its drop
                    // releases the permit.
                    let permit = self.permit(&mut targets, slot, grant, schedule);
                    // Our claim taken back before the permit is the
                    // caller's to release (a release that met the claim
                    // would keep its slot for nobody), and the slots kept
                    // for us that we did not take freed; then the next
                    // waiter's turn, so that its first pass finds them free.
                    if let Some(claim) = claim {
                        claim.take_back().await;
                    }
                    drop(turn);
                    return permit.ok_or_else(|| Error::InvalidPermits {
                        permits: 0,
                        reason: "slot out of range",
                    });
                }
                Err(refused) => refused,
            };
            let Refused {
                mut failure,
                expiry,
            } = refused;
            let now = Instant::now();
            if hopeless(&failure) || !self.retry.allows_another(passes) || now >= deadline {
                failure.attempts = attempts;
                failure.elapsed = started.elapsed();
                return Err(Error::NotAcquired(Box::new(failure)));
            }
            // The line orders waiters for held slots; a pass refused for
            // want of nodes (down, or sitting out the restart guard's
            // window) waits on its timers, as the slots' holders would.
            if self.fair && self.wake_on_release && !queued && saw_holder(&failure) {
                queued = true;
                match self.take_turn(deadline).await {
                    Ok(Some(guard)) => {
                        turn = Some(guard);
                        // Heard (and, with fencing, kept for us) from now
                        // on, then a pass at once: slots released while
                        // this waiter stood in line are free now.
                        claim = self.claim(&mut targets);
                        self.listen(&mut targets, &mut places, deadline, claim.as_ref())
                            .await;
                        continue;
                    }
                    Ok(None) => {
                        failure.attempts = attempts;
                        failure.elapsed = started.elapsed();
                        return Err(Error::NotAcquired(Box::new(failure)));
                    }
                    // The line cannot be kept (nodes down, a setting it
                    // cannot use): wait unordered, as `fair(false)` does.
                    Err(()) => {}
                }
            }
            let fallback = later(now, self.retry.pause(passes, jitter));
            let wake_at = expiry.map_or(fallback, |e| e.min(fallback)).min(deadline);
            if !self.wake_on_release {
                tokio::time::sleep_until(wake_at.into()).await;
                continue;
            }
            self.listen(&mut targets, &mut places, deadline, None).await;
            if let Some(slot) = wait_any(&places, wake_at, began).await {
                // The next pass begins with the slot whose release was heard.
                targets.start = u32::try_from(slot).unwrap_or(0);
            }
        }
    }

    /// From the first wait on: marks every slot as waited for (so that
    /// their releases publish notices on every node; with `claim`, the
    /// marker is the claim, and they keep the freed key for it) and
    /// subscribes to their channels. Once per request, and once more with
    /// the claim when a waiter that first waited unordered (its nodes
    /// were down then) gets its turn.
    async fn listen(
        &self,
        targets: &mut Targets,
        places: &mut Vec<Place>,
        deadline: Instant,
        claim: Option<&Claim>,
    ) {
        if !places.is_empty() && claim.is_none() {
            return;
        }
        let life = deadline
            .saturating_duration_since(Instant::now())
            .saturating_add(self.ttl);
        for slot in 0..self.permits() {
            self.target(targets, slot);
        }
        let marked: Vec<_> = targets.slots.iter().flatten().collect();
        match claim {
            Some(claim) => claim_waiting(&self.shared, &marked, life, &claim.value).await,
            None => mark_waiting(&self.shared, &marked, life).await,
        }
        if places.is_empty() {
            for target in marked {
                places.push(self.shared.waits.join(&self.shared.nodes, &target.key));
            }
        }
    }

    /// A claim on every slot for the waiter whose turn it is, with
    /// fencing only (without it an attempt is a plain `SET NX`, which
    /// cannot take a kept key as free).
    fn claim(&self, targets: &mut Targets) -> Option<Claim> {
        for slot in 0..self.permits() {
            self.target(targets, slot);
        }
        let slots: Vec<Target> = targets.slots.iter().flatten().cloned().collect();
        if slots.iter().any(|t| t.fence.is_none()) {
            return None;
        }
        let claimant = format!("{}.{:016x}", self.shared.id_text, rand::random::<u64>());
        let keep = u64::try_from(keep_for(&self.shared).as_millis()).unwrap_or(u64::MAX);
        let kept = format!("r:{claimant}");
        Some(Claim {
            shared: Arc::clone(&self.shared),
            value: format!("c:{keep}:{claimant}"),
            hash: sha1_smol::Sha1::from(kept.as_str()).digest().to_string(),
            kept,
            slots,
        })
    }

    /// Waits in the semaphore's line (the fair queue of the mutex
    /// `{name}:queue`, held only by the waiter whose turn it is) until this
    /// waiter's turn: `Ok(Some)` with the line's guard, `Ok(None)` when the
    /// deadline came first, `Err` when the line cannot be used (nodes
    /// unreachable, a setting refused): the caller then waits unordered.
    async fn take_turn(&self, deadline: Instant) -> Result<Option<LockGuard>, ()> {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = LockRequest::new(
            Arc::clone(&self.shared),
            queue_resource(&self.name),
            line_ttl(&self.shared, self.ttl),
        )
        .retry(Retry::new().with_max_wait(left))
        .auto_extend(AutoExtend::new())
        .fair(true)
        .wake_on_release(true);
        match line.acquire().await {
            Ok(guard) => Ok(Some(guard)),
            Err(error) if error.is_contended() => Ok(None),
            Err(_) => Err(()),
        }
    }

    /// One pass, no waiting. `Ok(None)` when all K permits are held by
    /// others (every slot tried was contended); an error when nodes failed,
    /// as [`LockRequest::try_acquire`](crate::LockRequest::try_acquire).
    pub async fn try_acquire(self) -> Result<Option<Permit>, Error> {
        let started = Instant::now();
        let span = self.span("semaphore_try_acquire");
        let tried = async {
            let (mut targets, schedule) = self.checked()?;
            let mut attempts = 0;
            match self
                .pass(&mut targets, false, &mut attempts, None, None)
                .await
            {
                Ok((slot, grant)) => Ok(self.permit(&mut targets, slot, grant, schedule)),
                Err(Refused { mut failure, .. }) => {
                    failure.attempts = attempts;
                    failure.elapsed = started.elapsed();
                    Err(Error::NotAcquired(Box::new(failure)))
                }
            }
        }
        .instrument(span.clone())
        .await;
        match tried {
            Ok(permit) => {
                record_outcome(&span, started, "acquired", permit.as_ref());
                Ok(permit)
            }
            Err(error) if error.is_contended() => {
                record_outcome(&span, started, "contended", None);
                Ok(None)
            }
            Err(error) => {
                record_outcome(&span, started, "failed", None);
                Err(error)
            }
        }
    }

    /// Acquires a permit (as [`acquire`](Self::acquire)), runs `f` to
    /// completion holding it, then releases, also when `f` fails or panics;
    /// with auto-extension `f` is cancelled when the permit is lost
    /// ([`Error::LockLost`]). The same contract as
    /// [`LockRequest::run`](crate::LockRequest::run); the [`Lease`]'s
    /// resource is the slot's (`{name}:permit:{slot}`), what a store keys
    /// the token by.
    pub async fn run<F, Fut, T>(self, f: F) -> Result<T, Error>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = T>,
    {
        let cancel_on_loss = self.auto_extend.is_some();
        let permit = self.acquire().await?;
        run_holding(permit.into_guard(), cancel_on_loss, f).await
    }

    fn permits(&self) -> u32 {
        u32::try_from(self.slots.len()).unwrap_or(u32::MAX)
    }

    fn span(&self, name: &'static str) -> Span {
        match name {
            "semaphore_try_acquire" => tracing::debug_span!(
                "semaphore_try_acquire",
                semaphore = %self.name,
                permits = self.slots.len(),
                ttl = ?self.ttl,
                slot = Empty,
                elapsed = Empty,
                outcome = Empty,
            ),
            _ => tracing::debug_span!(
                "semaphore_acquire",
                semaphore = %self.name,
                permits = self.slots.len(),
                ttl = ?self.ttl,
                slot = Empty,
                elapsed = Empty,
                outcome = Empty,
            ),
        }
    }

    fn finish(
        &self,
        span: &Span,
        started: Instant,
        result: Result<Permit, Error>,
    ) -> Result<Permit, Error> {
        match &result {
            Ok(permit) => record_outcome(span, started, "acquired", Some(permit)),
            Err(error) => {
                record_outcome(span, started, "failed", None);
                span.in_scope(|| tracing::debug!(%error, "no permit"));
            }
        }
        result
    }
}

fn record_outcome(span: &Span, started: Instant, outcome: &'static str, permit: Option<&Permit>) {
    if let Some(permit) = permit {
        span.record("slot", permit.slot());
    }
    span.record("elapsed", field::debug(started.elapsed()))
        .record("outcome", outcome);
}
