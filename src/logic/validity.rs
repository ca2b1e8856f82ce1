//! Validity arithmetic: TTL to milliseconds, clock-drift allowance, and the
//! time a granted lock may still be trusted. Pure; no I/O, no clock reads.
//!
//! Durations stay `Duration` everywhere in the crate and become milliseconds
//! only here, at the Redis boundary, with checked arithmetic.

use std::time::{Duration, Instant};

use crate::logic::limits::{DRIFT_CONSTANT, MAX_TTL};

/// Why a TTL was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TtlProblem {
    /// Shorter than one millisecond, which Redis cannot express.
    TooShort,
    /// Longer than [`MAX_TTL`].
    TooLong,
}

/// A TTL that has been validated and truncated to whole milliseconds, the
/// unit in which Redis sets the expiry. Validity is computed from this value,
/// not from the caller's `Duration`, so a sub-millisecond remainder can never
/// make the client believe in time the server does not grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Ttl {
    millis: u64,
}

impl Ttl {
    pub(crate) fn new(ttl: Duration) -> Result<Self, TtlProblem> {
        if ttl > MAX_TTL {
            return Err(TtlProblem::TooLong);
        }
        // Cannot overflow: MAX_TTL is far below u64::MAX milliseconds.
        let millis = u64::try_from(ttl.as_millis()).map_err(|_| TtlProblem::TooLong)?;
        if millis == 0 {
            return Err(TtlProblem::TooShort);
        }
        Ok(Self { millis })
    }

    pub(crate) fn millis(self) -> u64 {
        self.millis
    }

    pub(crate) fn duration(self) -> Duration {
        Duration::from_millis(self.millis)
    }
}

/// The drift factor, checked to lie in `[0, 1)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct DriftFactor(f64);

impl DriftFactor {
    pub(crate) fn new(factor: f64) -> Option<Self> {
        // `contains` is false for NaN, which is what we want.
        (0.0..1.0).contains(&factor).then_some(Self(factor))
    }

    /// drift = TTL × factor + 2 ms, rounded up to whole microseconds so the
    /// allowance is never smaller than the formula.
    pub(crate) fn drift(self, ttl: Ttl) -> Duration {
        let scaled = ttl.duration().mul_f64(self.0);
        let micros = scaled.as_nanos().div_ceil(1_000);
        // scaled < ttl <= MAX_TTL, so the micros fit in u64.
        let micros = u64::try_from(micros).unwrap_or(u64::MAX);
        Duration::from_micros(micros).saturating_add(DRIFT_CONSTANT)
    }
}

/// Validity = TTL − elapsed − drift, or `None` when that is not at least
/// `min_validity` (a lock with no time left is not a lock).
///
/// `elapsed` is measured on a monotonic clock from before the first request
/// was sent, so it over-approximates the time the keys have been alive on
/// every node: the key on a node was set at or after that instant.
pub(crate) fn validity(
    ttl: Ttl,
    elapsed: Duration,
    drift: Duration,
    min_validity: Duration,
) -> Option<Duration> {
    let left = ttl.duration().checked_sub(elapsed)?.checked_sub(drift)?;
    (left > Duration::ZERO && left >= min_validity).then_some(left)
}

/// How long to wait for one node within an attempt: the configured per-node
/// timeout, but never longer than the time after which a grant could no
/// longer produce a valid lock (TTL − drift − min_validity). Waiting past that
/// point only delays the inevitable failure. Never zero, so a node always gets
/// a chance to answer.
pub(crate) fn node_budget(
    node_timeout: Duration,
    ttl: Ttl,
    drift: Duration,
    min_validity: Duration,
) -> Duration {
    let useful = ttl
        .duration()
        .saturating_sub(drift)
        .saturating_sub(min_validity);
    node_timeout.min(useful).max(Duration::from_millis(1))
}

/// `t + d`, or a point about 30 years after `t` when that overflows: for
/// durations a user may set as large as they like (a retry delay, a hold
/// bound, a restart window), where "never" is what `Duration::MAX` means.
/// `Instant + Duration` panics on overflow.
pub(crate) fn later(t: Instant, d: Duration) -> Instant {
    t.checked_add(d).or_else(|| t.checked_add(FAR)).unwrap_or(t)
}

/// What [`later`] gives for a duration past the end of time.
const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn later_saturates() {
        let t = Instant::now();
        assert_eq!(later(t, ms(5)), t + ms(5));
        assert!(later(t, Duration::MAX) >= t + Duration::from_secs(365 * 24 * 3600));
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn ttl_bounds() {
        assert_eq!(Ttl::new(Duration::ZERO), Err(TtlProblem::TooShort));
        assert_eq!(
            Ttl::new(Duration::from_micros(999)),
            Err(TtlProblem::TooShort)
        );
        assert_eq!(Ttl::new(ms(1)).map(Ttl::millis), Ok(1));
        assert_eq!(
            Ttl::new(Duration::from_micros(1_999)).map(Ttl::millis),
            Ok(1)
        );
        assert_eq!(
            Ttl::new(MAX_TTL).map(Ttl::millis),
            Ok(MAX_TTL.as_millis() as u64)
        );
        assert_eq!(Ttl::new(MAX_TTL + ms(1)), Err(TtlProblem::TooLong));
        assert_eq!(Ttl::new(Duration::MAX), Err(TtlProblem::TooLong));
        assert_eq!(
            Ttl::new(Duration::from_secs(u64::MAX / 1000 + 1)),
            Err(TtlProblem::TooLong)
        );
    }

    #[test]
    fn drift_factor_domain() {
        assert!(DriftFactor::new(0.0).is_some());
        assert!(DriftFactor::new(0.01).is_some());
        assert!(DriftFactor::new(0.999).is_some());
        for bad in [
            1.0,
            1.5,
            -0.0001,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ] {
            assert!(DriftFactor::new(bad).is_none(), "{bad} accepted");
        }
    }

    #[test]
    fn drift_matches_the_formula() {
        let f = DriftFactor::new(0.01).unwrap();
        assert_eq!(f.drift(Ttl::new(ms(10_000)).unwrap()), ms(102));
        assert_eq!(
            f.drift(Ttl::new(ms(1)).unwrap()),
            Duration::from_micros(2_010)
        );
        let zero = DriftFactor::new(0.0).unwrap();
        assert_eq!(zero.drift(Ttl::new(ms(5)).unwrap()), ms(2));
        // Huge TTL: no overflow, exact to the microsecond.
        let big = f.drift(Ttl::new(MAX_TTL).unwrap());
        assert_eq!(big, MAX_TTL / 100 + ms(2));
    }

    #[test]
    fn validity_cases() {
        let ttl = Ttl::new(ms(10_000)).unwrap();
        let drift = ms(102);
        assert_eq!(validity(ttl, ms(0), drift, ms(0)), Some(ms(9_898)));
        assert_eq!(validity(ttl, ms(898), drift, ms(0)), Some(ms(9_000)));
        assert_eq!(
            validity(ttl, ms(9_898), drift, ms(0)),
            None,
            "zero is not valid"
        );
        assert_eq!(validity(ttl, ms(9_897), drift, ms(0)), Some(ms(1)));
        assert_eq!(validity(ttl, ms(20_000), drift, ms(0)), None);
        assert_eq!(validity(ttl, ms(9_000), drift, ms(898)), Some(ms(898)));
        assert_eq!(validity(ttl, ms(9_000), drift, ms(899)), None);
        // Tiny TTL: the 2 ms constant alone eats it.
        let tiny = Ttl::new(ms(2)).unwrap();
        let d = DriftFactor::new(0.01).unwrap().drift(tiny);
        assert_eq!(validity(tiny, Duration::ZERO, d, Duration::ZERO), None);
        let three = Ttl::new(ms(3)).unwrap();
        let d3 = DriftFactor::new(0.0).unwrap().drift(three);
        assert_eq!(
            validity(three, Duration::ZERO, d3, Duration::ZERO),
            Some(ms(1))
        );
        // Huge TTL and huge elapsed: no overflow.
        let max = Ttl::new(MAX_TTL).unwrap();
        assert_eq!(validity(max, Duration::MAX, ms(2), ms(0)), None);
        assert!(validity(max, ms(1), ms(2), ms(0)).is_some());
    }

    #[test]
    fn node_budget_is_bounded_by_the_useful_window() {
        let ttl = Ttl::new(ms(10_000)).unwrap();
        assert_eq!(node_budget(ms(50), ttl, ms(102), ms(0)), ms(50));
        let short = Ttl::new(ms(40)).unwrap();
        assert_eq!(node_budget(ms(50), short, ms(2), ms(8)), ms(30));
        assert_eq!(
            node_budget(ms(50), Ttl::new(ms(1)).unwrap(), ms(2), ms(0)),
            ms(1)
        );
    }

    proptest! {
        /// The validity never exceeds TTL − drift, shrinks as elapsed grows,
        /// and the three parts never sum past the TTL.
        #[test]
        fn validity_is_conservative(
            ttl_ms in 1u64..=MAX_TTL.as_millis() as u64,
            elapsed_us in 0u64..=u64::MAX / 2,
            factor in 0.0f64..1.0,
            min_ms in 0u64..10_000,
        ) {
            let ttl = Ttl::new(ms(ttl_ms)).unwrap();
            let drift = DriftFactor::new(factor).unwrap().drift(ttl);
            let elapsed = Duration::from_micros(elapsed_us);
            let min = ms(min_ms);
            if let Some(v) = validity(ttl, elapsed, drift, min) {
                prop_assert!(v > Duration::ZERO);
                prop_assert!(v >= min);
                prop_assert_eq!(v + elapsed + drift, ttl.duration());
                let later = validity(ttl, elapsed + ms(1), drift, Duration::ZERO);
                prop_assert!(later.is_none_or(|l| l < v));
            } else {
                prop_assert!(elapsed + drift + min.max(Duration::from_nanos(1)) > ttl.duration());
            }
            prop_assert!(drift >= DRIFT_CONSTANT);
            prop_assert!(drift >= ttl.duration().mul_f64(factor));
        }
    }
}
