//! The watchdog: a background task, owned by the guard, that follows an
//! auto-extension [`Schedule`]: it extends a held lock on a majority of
//! nodes well before its validity runs out, and reports the loss when it
//! cannot. It holds the client's shared state by `Weak`, as redis-rs's
//! background tasks do: a task never keeps a dropped client alive (the
//! guard holds it strongly while it lives).

use std::sync::{Arc, Weak};
use std::time::Instant;

use tokio::task::JoinHandle;
use tracing::field::{self, Empty};
use tracing::Instrument;

use crate::error::failure::{FailureReason, NodeErrorKind, NodeFailure, QuorumFailure};
use crate::error::lost::LossReason;
use crate::lease::Lease;
use crate::logic::quorum::quorum;
use crate::observe::metrics::{self, ExtendBy, ExtendOutcome};
use crate::protocol::extend::{extend, extend_all, Extended};
use crate::protocol::shared::{Held, Shared, Target};
use crate::settings::autoextend::{Next, Schedule};

/// The running task, owned by the guard. Dropping it aborts the task.
#[derive(Debug)]
pub(crate) struct Watchdog {
    handle: Option<JoinHandle<()>>,
}

impl Watchdog {
    pub(crate) fn spawn(shared: &Arc<Shared>, lease: Lease, schedule: Schedule) -> Self {
        Self::spawn_set(shared, vec![lease], schedule)
    }

    /// One watchdog for a multi-resource set (`leases`, one per resource,
    /// all of one acquire): each extension is the set's `EXTEND_ALL`, every
    /// key on a node or none, and a loss is every lease's.
    pub(crate) fn spawn_set(shared: &Arc<Shared>, leases: Vec<Lease>, schedule: Schedule) -> Self {
        let first = leases.first().map_or("", Lease::resource);
        let span = tracing::debug_span!("watchdog", resource = %first, resources = leases.len());
        let alive = shared.counters.watchdog();
        let task = run(Arc::downgrade(shared), leases, schedule);
        let handle = tokio::spawn(
            async move {
                // Dropped with the future: when `run` returns or the task
                // is aborted.
                let _alive = alive;
                task.await;
            }
            .instrument(span),
        );
        Self {
            handle: Some(handle),
        }
    }

    /// Aborts the task and waits until it is gone, so nothing it sends can
    /// follow what the caller sends next. Cancel-safe: cut off while it
    /// waits, the handle stays here, aborted, for [`abort`](Self::abort)
    /// to hand to whoever releases in the background (a guard's drop).
    pub(crate) async fn stop(&mut self) {
        if let Some(handle) = self.handle.as_mut() {
            handle.abort();
            let _ = handle.await;
            // Polled to completion: a `JoinHandle` is not polled again.
            self.handle = None;
        }
    }

    /// Aborts the task and hands back its handle, to await where the caller
    /// cannot (a drop that releases in the background).
    pub(crate) fn abort(mut self) -> Option<JoinHandle<()>> {
        let handle = self.handle.take()?;
        handle.abort();
        Some(handle)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(handle) = &self.handle {
            handle.abort();
        }
    }
}

/// The leases one watchdog keeps: one resource, or a multi-resource set
/// extended together.
struct Leases {
    leases: Vec<Lease>,
    /// Every lease's lock key when more than one (`EXTEND_ALL`), else
    /// none (the mutex's `EXTEND`).
    keys: Vec<Arc<str>>,
}

impl Leases {
    fn new(leases: Vec<Lease>) -> Option<Self> {
        leases.first()?;
        let keys = if leases.len() > 1 {
            leases.iter().map(|l| l.held().key).collect()
        } else {
            Vec::new()
        };
        Some(Self { leases, keys })
    }

    fn first(&self) -> &Lease {
        &self.leases[0]
    }

    /// The earliest validity: the set is held while every lease is.
    fn valid_until(&self) -> Instant {
        self.leases
            .iter()
            .map(Lease::valid_until)
            .min()
            .unwrap_or_else(Instant::now)
    }

    /// Whether any lease ran out (each records its own loss).
    fn expire(&self) -> bool {
        self.leases
            .iter()
            .fold(false, |lost, lease| lease.expire() | lost)
    }

    fn extending(&self, node_timeout: std::time::Duration, ttl: std::time::Duration) {
        for lease in &self.leases {
            lease.extending(node_timeout, ttl);
        }
    }

    /// Applies an extension to every lease; `false` when any refused it.
    fn extended(&self, valid_until: Instant, expires_at: Instant) -> bool {
        self.leases.iter().fold(true, |all, lease| {
            lease.extended(valid_until, expires_at) & all
        })
    }

    fn lose(&self, reason: LossReason, failure: Option<Box<QuorumFailure>>) {
        for lease in &self.leases {
            lease.lose(reason, failure.clone());
        }
    }

    fn set_ending(&self, ending: LossReason) {
        for lease in &self.leases {
            lease.set_ending(ending);
        }
    }

    async fn extend(
        &self,
        shared: &Shared,
        target: &Target,
        held: &Held,
    ) -> Result<Extended, QuorumFailure> {
        if self.keys.is_empty() {
            extend(shared, target, held, true).await
        } else {
            extend_all(shared, target, held, &self.keys, true).await
        }
    }
}

async fn run(shared: Weak<Shared>, leases: Vec<Lease>, schedule: Schedule) {
    let Some(lease) = Leases::new(leases) else {
        return;
    };
    let granted = Instant::now();
    let mut made = 0u32;
    loop {
        tokio::time::sleep_until(schedule.due(lease.valid_until()).into()).await;
        // The guard holds the state while it lives and stops this task
        // before it lets go: gone means nothing is left to extend.
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let target = match schedule.next(Instant::now(), granted, made) {
            // A TTL shortened to the hold bound may leave no validity once
            // drift is deducted: then the bound is reached.
            Next::Extend(ttl) => shared.target(lease.first().resource(), ttl).ok(),
            Next::Stop => None,
        };
        let Some(target) = target else {
            tracing::debug!(extensions = made, "hold limit reached, extending stops");
            lease.set_ending(LossReason::HoldLimit);
            return;
        };
        loop {
            // A lease whose validity ran out (this task was starved: a
            // blocked runtime thread) is lost for good: no extend is sent.
            if lease.expire() {
                return;
            }
            lease.extending(shared.config.node_timeout, target.ttl.duration());
            let held = lease.first().held();
            // Another owner's value is evidence of a takeover only where the
            // node held ours; elsewhere it may be a contender's leftover.
            let taken_over = |f: &NodeFailure| {
                matches!(f.kind, NodeErrorKind::HeldByOther { .. }) && held.was_ours(f.index)
            };
            let started = Instant::now();
            let span = tracing::debug_span!(
                "extend",
                resource = %lease.first().resource(),
                ttl = ?target.ttl.duration(),
                by = "watchdog",
                granted = Empty,
                quorum = Empty,
                elapsed = Empty,
                outcome = Empty,
                reason = Empty,
            );
            let result = lease
                .extend(&shared, &target, &held)
                .instrument(span.clone())
                .await;
            span.record("elapsed", field::debug(started.elapsed()));
            match result {
                Ok(extended) => {
                    span.record("granted", extended.granted)
                        .record("quorum", quorum(shared.nodes.len()));
                    let failures = extended.failures;
                    if !lease.extended(extended.valid_until, extended.expires_at) {
                        span.record("outcome", "lost");
                        metrics::extend(ExtendBy::Watchdog, ExtendOutcome::Lost);
                        return;
                    }
                    span.record("outcome", "extended");
                    metrics::extend(ExtendBy::Watchdog, ExtendOutcome::Extended);
                    made += 1;
                    // A majority extended, but a node that held our value
                    // holds another owner's: someone was granted the key
                    // there, so our lease is not what we think (an early
                    // expiry, a restart); stop before acting on it.
                    if failures.iter().any(taken_over) {
                        lease.lose(LossReason::TakenOver, None);
                        return;
                    }
                    tracing::debug!(extensions = made, validity = ?lease.first().validity(), "extended");
                    break;
                }
                Err(failure) => {
                    span.record("granted", failure.granted)
                        .record("quorum", failure.quorum)
                        .record("reason", field::display(failure.reason))
                        .record("outcome", "failed");
                    metrics::extend(ExtendBy::Watchdog, ExtendOutcome::Failed);
                    let failure = Box::new(failure);
                    if failure.failures.iter().any(taken_over) {
                        lease.lose(LossReason::TakenOver, Some(failure));
                        return;
                    }
                    if failure.reason == FailureReason::NotHeld {
                        lease.lose(LossReason::NotHeld, Some(failure));
                        return;
                    }
                    let Some(pause) = schedule.retry(Instant::now(), lease.valid_until()) else {
                        lease.lose(LossReason::Unreachable, Some(failure));
                        return;
                    };
                    tracing::debug!(error = %failure, ?pause, "extend failed, retrying");
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }
}
