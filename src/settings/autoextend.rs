//! Auto-extension as a policy value: [`AutoExtend`] (what the user asks
//! for) and the [`Schedule`] it fixes at the grant (when to extend, with
//! which TTL, when to give up). Pure: no clock reads, no I/O, tested without
//! Redis. The task that follows the schedule is `watchdog`; DESIGN.md
//! ("Lease lifecycle") has the argument for the timings.

use std::time::{Duration, Instant};

use crate::error::Error;
use crate::logic::validity::later;

/// Automatic extension of a held lock (a "watchdog"): while the guard lives,
/// a background task extends the lock on a majority of all N nodes every
/// `interval` (by default a third of the validity, TTL − drift), with the
/// request's TTL. Each extend's validity is computed from its own start.
///
/// Transient failures are retried while an extend can still finish before
/// the validity runs out; when none can, when a majority reports the key
/// gone, or when any node reports another owner's value, the lease is lost
/// and
/// [`Lease::lost`](crate::Lease::lost) resolves with the reason and the
/// validity still left at that moment. A bound on the total hold
/// (`max_hold`) or on the number of extensions stops the extending; the
/// lease then ends when its last validity runs out
/// ([`LossReason::HoldLimit`](crate::LossReason::HoldLimit)), never later than `max_hold` after the grant.
///
/// Releasing or dropping the guard stops the task first: no extend is sent
/// after the release.
///
/// # Default
///
/// `interval` a third of the validity, no hold bound, no extension limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AutoExtend {
    interval: Option<Duration>,
    max_hold: Option<Duration>,
    max_extensions: Option<u32>,
}

impl AutoExtend {
    /// Extend every third of the validity, without bound.
    pub const fn new() -> Self {
        Self {
            interval: None,
            max_hold: None,
            max_extensions: None,
        }
    }

    /// Time between the start of one extension and the next. Must be
    /// positive and leave at least one node timeout before the validity
    /// ends (else acquire fails with [`Error::InvalidAutoExtend`]).
    /// Defaults to a third of the validity (TTL − drift).
    #[must_use]
    pub const fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = Some(interval);
        self
    }

    /// Stop extending so that the lease ends at most this long after the
    /// grant: the last extension is shortened to fit. Defaults to no bound.
    #[must_use]
    pub const fn with_max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Stop after this many successful extensions. Defaults to no limit.
    #[must_use]
    pub const fn with_max_extensions(mut self, extensions: u32) -> Self {
        self.max_extensions = Some(extensions);
        self
    }

    /// The bound on the total hold, if any.
    pub const fn max_hold(&self) -> Option<Duration> {
        self.max_hold
    }

    /// Checks the settings against a lock request (its TTL and drift) and
    /// fixes the schedule.
    pub(crate) fn schedule(
        &self,
        ttl: Duration,
        drift: Duration,
        node_timeout: Duration,
    ) -> Result<Schedule, Error> {
        let span = ttl.saturating_sub(drift);
        let interval = self.interval.unwrap_or(span / 3);
        let invalid = |reason| Err(Error::InvalidAutoExtend { reason });
        if interval.is_zero() {
            return invalid("interval must be greater than zero");
        }
        if interval.saturating_add(node_timeout) >= span {
            return invalid("interval leaves less than one node timeout before the validity ends");
        }
        if self.max_hold.is_some_and(|h| h.is_zero()) {
            return invalid("max hold must be greater than zero");
        }
        Ok(Schedule {
            ttl,
            span,
            interval,
            node_timeout,
            max_hold: self.max_hold,
            max_extensions: self.max_extensions,
        })
    }
}

/// The watchdog's timing decisions, fixed at the grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Schedule {
    ttl: Duration,
    /// Validity of a full-TTL extension: TTL − drift.
    span: Duration,
    interval: Duration,
    node_timeout: Duration,
    max_hold: Option<Duration>,
    max_extensions: Option<u32>,
}

/// What the watchdog does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Extend with this TTL.
    Extend(Duration),
    /// The bound is reached: let the lease run out.
    Stop,
}

impl Schedule {
    /// When to extend a lease valid until `valid_until`: `interval` after
    /// the start of the extension (or acquire) that produced it.
    pub(crate) fn due(&self, valid_until: Instant) -> Instant {
        valid_until
            .checked_sub(self.span - self.interval)
            .unwrap_or(valid_until)
    }

    /// The TTL of the next extension at `now`, given the grant instant and
    /// the extensions made so far. A TTL cut short by `max_hold` still has
    /// to be a valid TTL for the client (checked by the caller).
    pub(crate) fn next(&self, now: Instant, granted: Instant, made: u32) -> Next {
        if self.max_extensions.is_some_and(|max| made >= max) {
            return Next::Stop;
        }
        let Some(max_hold) = self.max_hold else {
            return Next::Extend(self.ttl);
        };
        let left = later(granted, max_hold).saturating_duration_since(now);
        if left >= self.ttl {
            Next::Extend(self.ttl)
        } else if left > self.node_timeout {
            Next::Extend(left)
        } else {
            Next::Stop
        }
    }

    /// After a failed extend at `now`: the pause before the next try, or
    /// `None` when another try could not finish before `valid_until` (the
    /// loss is then certain: no extend can renew the validity in time).
    pub(crate) fn retry(&self, now: Instant, valid_until: Instant) -> Option<Duration> {
        // Fast failures (refused connections, a node skipped as stalled)
        // would otherwise spin; a quarter of the node timeout keeps several
        // tries inside the margin that remains.
        let pause = (self.node_timeout / 4).max(Duration::from_millis(1));
        let finish = now + pause + self.node_timeout;
        (finish < valid_until).then_some(pause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn schedule(max_hold: Option<Duration>, max_extensions: Option<u32>) -> Schedule {
        Schedule {
            ttl: 3000 * MS,
            span: 2900 * MS,
            interval: 1000 * MS,
            node_timeout: 100 * MS,
            max_hold,
            max_extensions,
        }
    }

    #[test]
    fn due_a_third_into_the_validity() {
        let s = schedule(None, None);
        let t0 = Instant::now();
        // Granted at t0: valid until t0 + 2.9 s; extend at t0 + 1 s.
        assert_eq!(s.due(t0 + 2900 * MS), t0 + 1000 * MS);
    }

    #[test]
    fn unbounded_always_extends_with_the_ttl() {
        let s = schedule(None, None);
        let t0 = Instant::now();
        assert_eq!(
            s.next(t0 + 3600 * 1000 * MS, t0, 1_000_000),
            Next::Extend(3000 * MS)
        );
    }

    #[test]
    fn hold_bound_shortens_then_stops() {
        let s = schedule(Some(5000 * MS), None);
        let t0 = Instant::now();
        assert_eq!(s.next(t0 + 1000 * MS, t0, 0), Next::Extend(3000 * MS));
        // 3 s into a 5 s bound: the last extension ends at the bound.
        assert_eq!(s.next(t0 + 3000 * MS, t0, 1), Next::Extend(2000 * MS));
        // Within one node timeout of the bound: stop.
        assert_eq!(s.next(t0 + 4950 * MS, t0, 2), Next::Stop);
        assert_eq!(s.next(t0 + 9000 * MS, t0, 2), Next::Stop);
    }

    #[test]
    fn extension_count_bound() {
        let s = schedule(None, Some(2));
        let t0 = Instant::now();
        assert_eq!(s.next(t0, t0, 1), Next::Extend(3000 * MS));
        assert_eq!(s.next(t0, t0, 2), Next::Stop);
    }

    #[test]
    fn retries_only_while_one_can_finish_in_time() {
        let s = schedule(None, None);
        let t0 = Instant::now();
        assert_eq!(s.retry(t0, t0 + 1000 * MS), Some(25 * MS));
        // 25 ms pause + 100 ms timeout must end before the validity.
        assert_eq!(s.retry(t0, t0 + 126 * MS), Some(25 * MS));
        assert_eq!(s.retry(t0, t0 + 125 * MS), None);
        assert_eq!(s.retry(t0 + 1000 * MS, t0), None);
    }
}
