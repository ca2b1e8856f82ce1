//! Waiting in the fair queue: a blocking acquire on a busy lock takes a
//! ticket in the resource's queue on its home node and attempts only when
//! a release names its ticket (or when a look finds it at the head of the
//! queue with the lock free: its client's first waiter's, at its timer, or
//! another client's, which tells it with a `p:` notice).
//!
//! Across processes, grants then follow the queue's order, and one release
//! costs one attempt however many clients and tasks wait: the others send
//! nothing until their turn. The queue only orders who tries. The attempt
//! is the usual quorum round, so mutual exclusion and token order never
//! depend on it; a queue that is lost (home restarted empty), unreachable
//! or wrong (a ticket whose owner died) costs order and time, bounded by
//! the first waiter's timer, never safety. DESIGN.md, section 2, "Fair
//! queue", has the argument and the failure cases.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::failure::{FailureReason, NodeErrorKind, QuorumFailure};
use crate::logic::resource::{self, pregrant_value, ticket_parts};
use crate::logic::validity::{later, validity};
use crate::protocol::attempt::{attempt_pregranted, Pregranted};
use crate::protocol::queue::{self, Look};
use crate::protocol::release::release_handed;
use crate::protocol::shared::{Grant, Shared, Target};
use crate::settings::retry::{jitter, Retry};
use crate::waiting::notify::{free_in, Place};
use crate::waiting::pregrant::{HandedOver, Pregrant};

/// Spread of the retries of waiters that wake on a holder's TTL running
/// out: they all computed about the same instant.
pub(crate) const EXPIRY_SPREAD: Duration = Duration::from_millis(5);

/// The first pause before a queued waiter's quick retry (see
/// [`QuickRetries`]); each next one doubles.
const QUICK_FIRST: Duration = Duration::from_millis(1);

/// A named waiter's quick retries in one turn: when its attempt was
/// refused by a majority but not by the home node ([`home_granted`]), the
/// release that named it has deleted the old holder's key on the home node
/// and not yet on the others (its requests still queued in the releasing
/// client, or behind on a loaded machine). No release will name the waiter
/// again, so it tries again after 1, 2, 4, … ms, for one node timeout in
/// all: a release's request that has not reached a node by then counts as
/// failed there. Then it waits as any refused waiter does, for a release,
/// a timer or a look. Measured in `benches/hot.rs` at 8 × 4: 7 such
/// refusals in 4,220 grants, each of which waited 50-100 ms for a timer
/// before (436 ms of the 3 s window). The same refusals come from a holder
/// that never had the home's vote (granted by the others): then a release
/// does name the waiter, later, and a naming heard during a pause ends it
/// and starts a new turn ([`Waiter::quick_pause`]).
struct QuickRetries {
    next: Duration,
    spent: Duration,
    budget: Duration,
}

impl QuickRetries {
    fn new(budget: Duration) -> Self {
        Self {
            next: QUICK_FIRST,
            spent: Duration::ZERO,
            budget,
        }
    }

    /// The pause before the next quick retry, if the budget allows one.
    fn pause(&mut self) -> Option<Duration> {
        let pause = self.next;
        let spent = self.spent.saturating_add(pause);
        (spent <= self.budget).then(|| {
            self.spent = spent;
            self.next = pause.saturating_mul(2);
            pause
        })
    }
}

/// Positions of the queue per step of [`look_spacing`].
const LOOK_SPACING_STEP: u64 = 4;

/// The most [`look_spacing`] stretches a look's pause.
const LOOK_SPACING_MAX: u32 = 8;

/// How many retry pauses a client's first waiter lets pass before its next
/// look, at `position` in the queue (1 = head): 1 within the first 4
/// places, 2 within the next 4, and so on, at most 8. A hot lock's queue
/// holds each client's waiters in runs (a client's tasks are granted one
/// after another, and come back one after another), so a client's first
/// waiter can stand hundreds of places back for a whole turn of the queue;
/// at every pause it looked (`benches/hot.rs`, 32 × 31: 533 looks in a 3 s
/// window, about 0.7 commands per acquisition). The waiters nearest the
/// head still look at every pause: they find a dead head soonest.
fn look_spacing(position: u64) -> u32 {
    u32::try_from(position.div_ceil(LOOK_SPACING_STEP))
        .unwrap_or(LOOK_SPACING_MAX)
        .clamp(1, LOOK_SPACING_MAX)
}

/// Whether an attempt was refused by a holder's key somewhere, without the
/// home node among the failures: the home said yes (or had not answered by
/// the decision). For the waiter its queue named, this means the release
/// that named it deleted the old holder's key on the home node but has not
/// yet reached the nodes that refused. Other failures beside those
/// refusals (a node down) do not change that: with a minority down the
/// attempt's reason is `Unavailable`, and before 2026-12-02 such a named
/// waiter, refused by one late release, waited for its timer
/// (`tests/it/pregrant.rs`, the young subscription with a node killed:
/// 10 s in 1 run of 6 on a loaded machine).
fn home_granted(failure: &QuorumFailure, home: usize) -> bool {
    failure.failures.iter().all(|f| f.index != home)
        && failure
            .failures
            .iter()
            .any(|f| matches!(f.kind, NodeErrorKind::HeldByOther { .. }))
}

/// True when the permanent failures (auth, replica, duplicate server) alone
/// rule out a majority: waiting cannot help.
pub(crate) fn hopeless(failure: &QuorumFailure) -> bool {
    let permanent = failure
        .failures
        .iter()
        .filter(|f| f.kind.is_permanent())
        .count();
    permanent > failure.nodes - failure.quorum
}

/// When a contended attempt's holder's keys will have freed a majority
/// (from the `PTTL`s its failure carries), spread by [`EXPIRY_SPREAD`];
/// `None` for another failure, or when the holder's expiry is unknown.
pub(crate) fn holder_expiry(failure: &QuorumFailure, now: Instant) -> Option<Instant> {
    match failure.reason {
        FailureReason::Contended => free_in(
            failure.nodes,
            failure.quorum,
            failure.granted,
            &failure.failures,
        )
        .map(|d| later(now, d.saturating_add(jitter(EXPIRY_SPREAD)))),
        _ => None,
    }
}

pub(crate) fn log_failure(attempts: u32, failure: &QuorumFailure) {
    tracing::debug!(
        attempts,
        granted = failure.granted,
        quorum = failure.quorum,
        reason = %failure.reason,
        "attempt failed"
    );
}

/// What the waiter does next.
enum Next {
    /// Send an attempt now.
    Attempt,
    /// Wait for a release naming this ticket; as the client's first
    /// waiter, look at the queue at this instant.
    Wait(Instant),
    /// The home node did not answer: go on as a classic waiter.
    HomeLost,
}

/// A fair-queue waiter: its ticket, and where it stands.
struct Waiter<'a> {
    shared: &'a Arc<Shared>,
    target: &'a Target,
    retry: &'a Retry,
    deadline: Instant,
    ticket: Arc<str>,
    /// The ticket may be in the home node's queue: joined, and not taken
    /// out since. A release that names it leaves it at the head; the
    /// holder's own release takes it out.
    queued: bool,
    /// The head seen with the lock free at the last look: skipped at the
    /// next look if still there (its owner let a free turn pass).
    stale: Option<String>,
    /// The last look found this ticket at the head with the lock held on
    /// the home node: the timer then sends an attempt, not another look
    /// (the home's key may be one the quorum has released or never had:
    /// one node's view never keeps the head from trying).
    attempt_on_timer: bool,
    /// The attempt about to be sent answers a release that named this
    /// ticket (not a prod, a look or a timer): refused by a majority while
    /// the home node grants, it retries quickly (see [`QuickRetries`]).
    named: bool,
    /// The home's vote, when the release that named this ticket
    /// pre-granted it: the next attempt uses it ([`Waiter::pregranted`]).
    pregrant: Option<Pregrant>,
    /// The notices whose pre-grants this waiter used: a value is never
    /// used twice (a late cleanup of the first attempt could delete the
    /// second's key).
    used: Vec<Arc<str>>,
    /// When this waiter's first join was sent: no release can have set
    /// the home's key for its ticket before.
    joined_at: Option<Instant>,
    attempts: u32,
}

/// How a fair wait ended.
pub(crate) enum Fair {
    /// Granted, or failed with the last attempt's failure.
    Done(Result<(Grant, u32), QuorumFailure>),
    /// The home node did not answer (down, paused, slow): the queue was
    /// widened to the classic competition, and the caller goes on waiting
    /// that way after `attempts` attempts, until `deadline`.
    Classic { attempts: u32, deadline: Instant },
}

/// Acquires through the fair queue; see the module docs.
pub(crate) async fn wait_fair(shared: &Arc<Shared>, target: &Target, retry: &Retry) -> Fair {
    match fair_wait(shared, target, retry).await {
        Ok(done) => Fair::Done(done),
        Err(HomeLost { attempts, deadline }) => Fair::Classic { attempts, deadline },
    }
}

/// The home node did not answer a join or a look.
struct HomeLost {
    attempts: u32,
    deadline: Instant,
}

async fn fair_wait(
    shared: &Arc<Shared>,
    target: &Target,
    retry: &Retry,
) -> Result<Result<(Grant, u32), QuorumFailure>, HomeLost> {
    let started = Instant::now();
    // Nobody of this client waits for the resource, and its home named
    // nobody at this client's last release: the first attempt goes out
    // before the waiter takes a place and a ticket, which only a waiter
    // needs (issue 32: both were made and dropped on every uncontended
    // cycle). Refused, the waiter takes them and goes on as after any
    // failed attempt: into the queue, whose join looks at the lock again
    // (a release between the attempt and the join is seen there). Another
    // task of this client starting meanwhile joins the queue at once, as
    // it did behind this one's place (`Waits::first_attempt`), and so may
    // be ahead of this one in it.
    //
    // That attempt is `try_acquire`'s, without the holder's `PTTL`: in the
    // transaction it would be a fourth queued command on every node of
    // every uncontended cycle (measured: 1.4 µs of Redis CPU per one-node
    // cycle, about 15 %; BENCHMARKS.md, runs F1–F3). Refused, the join's
    // look reads the holder's TTL on the home, and the retries read it
    // everywhere.
    let mut early = None;
    if let Some(first) = shared.waits.first_attempt(&target.key, &target.home) {
        match attempt_pregranted(shared, target, false, None, None, None).await {
            Ok(grant) => {
                first.granted(grant.held.expires_at);
                return Ok(Ok((grant, 1)));
            }
            Err(failure) => early = Some(failure),
        }
    }
    // Refused, or this client's other tasks wait: the rest of the wait,
    // boxed (issue 32: its state stays out of the future of every
    // uncontended `acquire`, which is moved several times per cycle).
    Box::pin(queued_wait(shared, target, retry, started, early)).await
}

/// [`fair_wait`] from the place in the queue on; `early`: the first
/// attempt's refusal, if it made one.
async fn queued_wait(
    shared: &Arc<Shared>,
    target: &Target,
    retry: &Retry,
    started: Instant,
    mut early: Option<QuorumFailure>,
) -> Result<Result<(Grant, u32), QuorumFailure>, HomeLost> {
    // The client's tag first: the home's release publishes the ticket on
    // the channel of the client it names (`resource::fair_channels`).
    // With pre-grants, the TTL the home's release sets when it pre-grants
    // this ticket its vote, after `h`: this client takes handovers (step 3,
    // the handover); a release whose script predates them sees the TTL all
    // the same.
    let handover_ttl = target
        .home
        .pregrant_fence
        .as_ref()
        .map(|_| target.ttl.millis());
    let ticket = resource::ticket(&shared.id_text, handover_ttl);
    // The waiter's place in this client's queue (local: the client's other
    // tasks see it and join behind it). The subscription to the resource's
    // notices comes only once the waiter must wait, and is confirmed
    // before it joins (`Waiter::join`; issue 32: an acquire of a free
    // resource subscribed first, one `SUBSCRIBE` per uncontended cycle).
    let (place, busy) = shared
        .waits
        .join_fair(&target.key, &target.home, ticket.clone());
    let mut waiter = Waiter {
        shared,
        target,
        retry,
        deadline: retry.deadline(started),
        ticket,
        queued: false,
        stale: None,
        attempt_on_timer: false,
        named: false,
        pregrant: None,
        used: Vec::new(),
        joined_at: None,
        attempts: 0,
    };
    // Dropped mid-wait (cancelled), the waiter takes its ticket out of the
    // queue, so that no release names a ticket nobody holds. Armed before
    // the first join is sent: cut off while that join is in flight, its
    // `RPUSH` may land all the same (issue 31: the ticket stayed queued
    // until a release named it as an orphan or a look skipped it).
    let mut leave = Leave {
        shared,
        target,
        ticket: None,
    };
    // A busy resource (this client's tasks wait for it, or the last
    // release named a waiter): join the queue instead of sending an
    // attempt that would fail on every node.
    let mut next = if busy && early.is_none() {
        match Box::pin(waiter.join(&place, &mut leave)).await {
            Some(look) => {
                waiter.queued = true;
                let next = waiter.after_look(&look, &place);
                // At the head with the lock free: a release ran before the
                // join and names nobody; its deletes elsewhere may still
                // be on their way, so the quick retries apply (below).
                waiter.named = matches!(next, Next::Attempt);
                next
            }
            None => Next::HomeLost,
        }
    } else {
        Next::Attempt
    };
    let mut last: Option<QuorumFailure> = None;
    // Keys a handover left to this waiter, released if it does not take
    // them (its attempt failed, or it was dropped).
    let mut handed = Handed {
        shared,
        target,
        value: None,
    };
    let quick_budget = shared.config.node_timeout;
    let mut quick = QuickRetries::new(quick_budget);
    loop {
        if let Next::Wait(at) = next {
            quick = QuickRetries::new(quick_budget);
            next = Box::pin(waiter.wait(&place, at)).await;
            if matches!(next, Next::Wait(_)) && last.is_some() {
                // The deadline passed while waiting.
                leave.ticket = None;
                return Ok(Err(waiter.give_up(last, started)));
            }
        }
        if let Next::HomeLost = next {
            place.widen();
            // Waiting the classic way from here: the other nodes' releases
            // must publish too.
            let life = waiter
                .deadline
                .saturating_duration_since(Instant::now())
                .saturating_add(target.ttl.duration());
            Box::pin(queue::mark_waiting(shared, &[target], life)).await;
            return Err(HomeLost {
                attempts: waiter.attempts,
                deadline: waiter.deadline,
            });
        }
        waiter.attempts += 1;
        let result = match early.take() {
            // The attempt made before the place (above), refused.
            Some(failure) => Err(failure),
            None => {
                // A first attempt here comes behind this client's other
                // waiters (the resource is busy): it asks for the holder's
                // TTL when another may follow, at the cost of a queued
                // `PTTL` in the transaction (the script reads it only when
                // it refuses).
                let probe = waiter.attempts > 1
                    || waiter.queued
                    || (target.fence.is_some() && retry.allows_another(waiter.attempts));
                if let Some(value) = waiter.pregrant.as_mut().and_then(|p| p.handed.take()) {
                    handed.take_over(value);
                }
                let pregranted = waiter.pregranted();
                let hash = handed.value.as_ref().map(|h| h.hash.clone());
                let result =
                    attempt_pregranted(shared, target, probe, pregranted, hash.as_deref(), None)
                        .await;
                // Granted, the keys it replaced are ours; refused, those it
                // did not reach are released now.
                handed.done(result.is_ok());
                result
            }
        };
        match result {
            Ok(mut grant) => {
                leave.ticket = None;
                if waiter.queued {
                    // Its ticket is still in the queue (at the head when a
                    // release named it): the release takes it out, and
                    // until then a waiter that joins finds it there and
                    // waits to be named instead of attempting.
                    grant.held.ticket = Some(waiter.ticket.clone());
                }
                place.acquired(grant.held.expires_at);
                return Ok(Ok((grant, waiter.attempts)));
            }
            Err(failure) => {
                log_failure(waiter.attempts, &failure);
                let now = Instant::now();
                if hopeless(&failure)
                    || !retry.allows_another(waiter.attempts)
                    || now >= waiter.deadline
                {
                    leave.ticket = None;
                    return Ok(Err(waiter.give_up(Some(failure), started)));
                }
                // Named, refused elsewhere while the home node granted: the
                // release that named it has not reached the other nodes
                // yet. Try again shortly, not at a timer. (Only a named
                // attempt: a head that a look or a timer sent, refused by
                // a holder the home lost in a restart, would retry in vain
                // at every timer for the rest of that holder's TTL.)
                if waiter.named && home_granted(&failure, target.home.index) {
                    if let Some(pause) = quick.pause() {
                        if now + pause < waiter.deadline {
                            if Box::pin(waiter.quick_pause(&place, now + pause)).await {
                                // A new turn: its own quick retries.
                                quick = QuickRetries::new(quick_budget);
                            }
                            last = Some(failure);
                            next = Next::Attempt;
                            continue;
                        }
                    }
                }
                // Into the queue. A named waiter whose attempt failed (the
                // lock was taken in between) is still at its head: it
                // keeps its turn.
                let mut from_look = None;
                if !waiter.queued {
                    let Some(look) = Box::pin(waiter.join(&place, &mut leave)).await else {
                        last = Some(failure);
                        next = Next::HomeLost;
                        continue;
                    };
                    waiter.queued = true;
                    from_look = Some(waiter.after_look(&look, &place));
                }
                if matches!(from_look, Some(Next::Attempt)) {
                    // The join found this ticket at the head and the lock
                    // free on the home: the holder's release ran there
                    // between the failed attempt and the join, so no
                    // release will name this ticket. It attempts now, as
                    // a named waiter would, with the quick retries if the
                    // release has not reached the other nodes yet. Before,
                    // it waited for its fallback pause (10 s in
                    // `fair::a_waiter_joining_during_the_release_is_still_woken`).
                    waiter.named = true;
                    last = Some(failure);
                    next = Next::Attempt;
                    continue;
                }
                // Never straight back: the attempt just failed, so wait for
                // a release, the holder's expiry or the fallback pause.
                let expiry = holder_expiry(&failure, now);
                let fallback = waiter.fallback(now);
                let from_look = match from_look {
                    Some(Next::Wait(at)) => at,
                    _ => fallback,
                };
                next = Next::Wait(
                    expiry
                        .map_or(fallback, |e| e.min(fallback))
                        .min(from_look.max(now))
                        .min(waiter.deadline),
                );
                last = Some(failure);
            }
        }
    }
}

/// The keys a release handed over to this waiter (DESIGN.md, section 2,
/// fair queue, step 3, "Handover"): the released holder's value, which its attempt
/// replaces on the nodes other than the home. Released on every such node
/// when the waiter does not take them: its attempt failed (there they
/// could only block the next waiter) or the waiter was dropped.
struct Handed<'a> {
    shared: &'a Arc<Shared>,
    target: &'a Target,
    value: Option<HandedOver>,
}

impl Handed<'_> {
    /// A naming handed this waiter `value`; the keys of an earlier
    /// handover it has not taken are released.
    fn take_over(&mut self, value: HandedOver) {
        if let Some(old) = self.value.replace(value) {
            self.release(old);
        }
    }

    /// The attempt that carried the value was decided: `granted`, the keys
    /// it replaced are the waiter's; else the rest are released.
    fn done(&mut self, granted: bool) {
        if let Some(old) = self.value.take().filter(|_| !granted) {
            self.release(old);
        }
    }

    fn release(&self, value: HandedOver) {
        release_handed(self.shared, &self.target.key, &self.target.home, value);
    }
}

impl Drop for Handed<'_> {
    fn drop(&mut self) {
        if let Some(value) = self.value.take() {
            self.release(value);
        }
    }
}

/// See `wait_fair`: takes the ticket out of the queue when dropped armed.
struct Leave<'a> {
    shared: &'a Arc<Shared>,
    target: &'a Target,
    ticket: Option<Arc<str>>,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            queue::leave(self.shared, self.target, &ticket);
        }
    }
}

impl Waiter<'_> {
    /// Joins the queue. The `PEXPIRE` of the queue key goes along only when
    /// this client's last one leaves the key less than this waiter needs,
    /// and then asks for half a TTL more, so that the joins of the
    /// client's next waiters leave it out (a hot lock's joins are one
    /// command, not two).
    async fn join(&mut self, place: &Place, leave: &mut Leave<'_>) -> Option<queue::Look> {
        // Listening before the ticket can be named. A subscription that is
        // not confirmed within a node timeout (its node slow or down) only
        // costs a naming, which the timers cover.
        let node_timeout = self.shared.config.node_timeout;
        self.shared.waits.listen(&self.shared.nodes, place);
        place
            .until_subscribed(later(Instant::now(), node_timeout).min(self.deadline))
            .await;
        leave.ticket = Some(self.ticket.clone());
        let now = Instant::now();
        self.joined_at.get_or_insert(now);
        let (life, keep) = self.keep(place, now);
        let look = queue::join(self.shared, self.target, &self.ticket, life, keep).await;
        if keep && look.is_some() {
            place.kept(now.checked_add(life));
        }
        look
    }

    /// Whether a join or look sent `now` should keep the queue key alive
    /// (`PEXPIRE`), and for how long: only when this client's last
    /// `PEXPIRE` leaves the key less than this waiter needs, and then for
    /// half a TTL more, so that the client's next joins and looks leave it
    /// out.
    fn keep(&self, place: &Place, now: Instant) -> (Duration, bool) {
        let need = self.life();
        // `checked_add`: a retry policy's wait may reach the end of time.
        let keep = place
            .kept_until()
            .is_none_or(|until| now.checked_add(need).is_none_or(|n| until < n));
        (need.saturating_add(self.target.ttl.duration() / 2), keep)
    }

    /// How long the queue key should outlive this waiter's look: until its
    /// deadline, plus a TTL.
    fn life(&self) -> Duration {
        self.deadline
            .saturating_duration_since(Instant::now())
            .saturating_add(self.target.ttl.duration())
    }

    /// The home's pre-granted vote for the attempt about to be sent, if the
    /// release that named this ticket set one (DESIGN.md, section 2, step
    /// 3). Counted without asking the home (`since`) when the notice came
    /// over a subscription connection whose server is past the restart
    /// guard's window (a server younger than that may have lost a key it
    /// granted before) and the wait since the join leaves the lock its
    /// minimum validity after one node timeout; otherwise the home is
    /// asked too, and says yes again for the same value. A pre-grant whose
    /// notice this waiter used before is not used again: the attempt then
    /// takes a fresh value, which the home refuses.
    fn pregranted(&mut self) -> Option<Pregranted> {
        let pregrant = self.pregrant.take()?;
        if self.used.contains(&pregrant.notice) {
            return None;
        }
        self.used.push(pregrant.notice.clone());
        let now = Instant::now();
        let config = &self.shared.config;
        // Counted unasked only when the server that set the key was past
        // the restart guard's window when the notice's connection opened,
        // and when this client's own connection to the home would count
        // that server's vote now (past its window and, if it was seen
        // young, re-seeded): a home restarted empty or a promoted replica
        // is asked, and its fence settled, like any other node (issue 31).
        let home = self.shared.nodes.get(self.target.home.index);
        let guard_passed = self.shared.vote(true).is_none_or(|vote| {
            later(pregrant.since, vote.window) <= now && home.is_some_and(|n| n.votes_now(vote))
        });
        // The key was set with the ticket's whole TTL by a release after
        // the join, but the join is the latest moment known to precede it:
        // counted from there after a long wait, the credit would leave
        // little validity (about 1 ms, issue 31). Below half the TTL the
        // home is asked instead, in the same round (no round trip more):
        // it re-confirms the key with a fresh TTL and the validity counts
        // from the round, as for any node.
        let since = self.joined_at.filter(|&joined| {
            guard_passed
                && pregrant.fence.is_some()
                && validity(
                    self.target.ttl,
                    now.saturating_duration_since(joined)
                        .saturating_add(config.node_timeout),
                    self.target.drift,
                    config.min_validity,
                )
                .is_some_and(|left| left >= self.target.ttl.duration() / 2)
        });
        Some(Pregranted {
            value: pregrant_value(&self.ticket, &pregrant.notice),
            fence: pregrant.fence.unwrap_or(0),
            since,
        })
    }

    /// The retry policy's jittered pause from `now`: the first waiter's
    /// timer when nothing more precise is known.
    fn fallback(&self, now: Instant) -> Instant {
        later(now, self.retry.pause(self.attempts.max(1), jitter))
    }

    /// [`fallback`](Self::fallback) stretched by the waiter's distance from
    /// the head ([`look_spacing`]): the first waiter's next look, after a
    /// join or look found the lock held.
    fn spaced_fallback(&self, now: Instant, position: u64) -> Instant {
        let pause = self.retry.pause(self.attempts.max(1), jitter);
        later(now, pause.saturating_mul(look_spacing(position)))
    }

    /// What a join's or look's answer means: attempt when this ticket is
    /// the head and the lock is free on the home node, else wait (with a
    /// timer at the holder's expiry or the fallback, or a turn window when
    /// another head lets the free lock wait).
    fn after_look(&mut self, look: &Look, place: &Place) -> Next {
        let now = Instant::now();
        let free = look.held_for == Some(Duration::ZERO);
        self.attempt_on_timer = look.head;
        if look.head && free {
            self.stale = None;
            return Next::Attempt;
        }
        // The head is another waiter of this client (it joined the queue
        // before this one, which is first here): it is alive, so tell it
        // to go rather than let a turn window skip it.
        let ours = look
            .head_ticket
            .as_deref()
            .is_some_and(|t| ticket_parts(t).0 == &*self.shared.id_text && place.prod(t));
        let at = if free && !ours {
            // Another client's turn and the lock is free: give its owner a
            // turn window (a healthy one attempts within a round trip of
            // its notice), then skip it.
            self.stale = look.head_ticket.clone();
            later(now, self.shared.config.node_timeout)
        } else {
            self.stale = None;
            let expiry = look
                .held_for
                .map(|d| later(now, d.saturating_add(jitter(EXPIRY_SPREAD))));
            let fallback = self.spaced_fallback(now, look.position);
            expiry.map_or(fallback, |e| e.min(fallback))
        };
        Next::Wait(at.min(self.deadline))
    }

    /// A quick retry's pause, cut short by a release that names this
    /// ticket (returns `true`, with its pre-grant taken for the next
    /// attempt). The home's free key does not always mean a release landed
    /// there first: a holder granted by a majority without the home (its
    /// request there lost the race with this waiter's own attempt) holds
    /// the lock for its whole critical section, and its release names this
    /// ticket in the middle of a pause. A plain sleep heard that naming
    /// only at the pause's end, up to half the budget later (a node
    /// timeout: 32 ms of the default 100 ms); `benches/once.rs` measured
    /// the non-computing instance ~20 ms behind in such rounds.
    async fn quick_pause(&mut self, place: &Place, until: Instant) -> bool {
        loop {
            if self.take_naming(place) {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            place.wait(until).await;
        }
    }

    /// Takes a naming this ticket's place heard, with its pre-grant, for
    /// the next attempt; `false` when none came.
    fn take_naming(&mut self, place: &Place) -> bool {
        let Some(pregrant) = place.take_named() else {
            return false;
        };
        self.stale = None;
        self.attempt_on_timer = false;
        self.named = true;
        self.pregrant = pregrant;
        true
    }

    /// Waits until a release names this ticket (attempt), or, as the
    /// client's first waiter, until `at` (look at the queue), or until the
    /// deadline (returns `Wait`).
    async fn wait(&mut self, place: &Place, mut at: Instant) -> Next {
        let mut first = place.is_first();
        self.named = false;
        loop {
            if self.take_naming(place) {
                // Still queued: the ticket stays at the head until this
                // waiter's release, or a look skips it.
                return Next::Attempt;
            }
            if place.take_prodded() {
                // At the head, found by another waiter's look; still queued.
                self.stale = None;
                self.attempt_on_timer = false;
                return Next::Attempt;
            }
            let now = Instant::now();
            if now >= self.deadline {
                return Next::Wait(self.deadline);
            }
            let is_first = place.is_first();
            if is_first && !first {
                // Just became the client's first waiter: its timer starts
                // now (the one computed when it joined may be long past).
                at = self.fallback(now).min(self.deadline);
            }
            first = is_first;
            let at_or_look = place.look_at().map_or(at, |l| l.min(at));
            if first && now >= at && self.attempt_on_timer {
                self.attempt_on_timer = false;
                return Next::Attempt;
            }
            if first && now >= at_or_look {
                place.looked();
                let (life, keep) = self.keep(place, now);
                let look = queue::look(
                    self.shared,
                    self.target,
                    &self.ticket,
                    (life, keep),
                    self.stale.as_deref(),
                )
                .await;
                match look {
                    Some(look) => {
                        if keep {
                            // The look's `PEXPIRE` set the key's life anew.
                            place.kept(now.checked_add(life));
                        }
                        self.queued = true;
                        match self.after_look(&look, place) {
                            Next::Wait(next) => at = next,
                            other => return other,
                        }
                    }
                    None => return Next::HomeLost,
                }
                continue;
            }
            let until = if first { at_or_look } else { self.deadline };
            place.wait(until.min(self.deadline)).await;
        }
    }

    /// The failure to report once waiting ends: the last attempt's (made
    /// now if none was).
    fn give_up(&self, last: Option<QuorumFailure>, started: Instant) -> QuorumFailure {
        if self.queued {
            queue::leave(self.shared, self.target, &self.ticket);
        }
        let mut failure = last.unwrap_or_else(|| QuorumFailure {
            phase: crate::error::failure::Phase::Acquire,
            resource: self.target.resource.to_string(),
            reason: FailureReason::Contended,
            granted: 0,
            quorum: crate::logic::quorum::quorum(self.shared.nodes.len()),
            nodes: self.shared.nodes.len(),
            attempts: 0,
            elapsed: Duration::ZERO,
            failures: Vec::new(),
        });
        failure.attempts = self.attempts;
        failure.elapsed = started.elapsed();
        failure
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::failure::{NodeErrorKind, NodeFailure, Phase};

    fn refused(indexes: &[usize], reason: FailureReason) -> QuorumFailure {
        QuorumFailure {
            phase: Phase::Acquire,
            resource: "r".into(),
            reason,
            granted: 1,
            quorum: 3,
            nodes: 5,
            attempts: 1,
            elapsed: Duration::ZERO,
            failures: indexes
                .iter()
                .map(|&index| NodeFailure {
                    index,
                    addr: format!("n{index}"),
                    kind: NodeErrorKind::HeldByOther { expires_in: None },
                })
                .collect(),
        }
    }

    #[test]
    fn only_a_refusal_by_a_holder_without_the_home_is_a_late_release() {
        assert!(home_granted(
            &refused(&[1, 2, 3], FailureReason::Contended),
            0
        ));
        assert!(!home_granted(
            &refused(&[0, 2, 3], FailureReason::Contended),
            0
        ));
        // A node down beside the late release: still the release's race.
        let mut down = refused(&[1], FailureReason::Unavailable);
        down.failures.push(NodeFailure {
            index: 2,
            addr: "n2".into(),
            kind: NodeErrorKind::Timeout(Duration::from_secs(1)),
        });
        assert!(home_granted(&down, 0));
        // Nodes down and nobody holding a key: no release to wait for.
        down.failures.remove(0);
        assert!(!home_granted(&down, 0));
    }

    #[test]
    fn looks_space_out_with_the_distance_from_the_head() {
        let spacing: Vec<u32> = [0, 1, 4, 5, 8, 9, 28, 29, 32, 33, 992, u64::MAX]
            .into_iter()
            .map(look_spacing)
            .collect();
        assert_eq!(spacing, [1, 1, 1, 2, 2, 3, 7, 8, 8, 8, 8, 8]);
    }

    /// 1, 2, 4, … ms while the sum stays within the budget, then none.
    #[test]
    fn quick_retries_double_within_one_node_timeout() {
        let mut quick = QuickRetries::new(Duration::from_millis(100));
        let pauses: Vec<u64> = std::iter::from_fn(|| quick.pause())
            .map(|p| p.as_millis() as u64)
            .collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 32]);
        assert!(QuickRetries::new(Duration::ZERO).pause().is_none());
    }
}
