//! The retry policy of a waiting acquire: a value, not a loop. Pure apart
//! from drawing jitter.

use std::time::Duration;

/// How long and how often [`acquire`](crate::LockRequest::acquire) retries a
/// lock that could not be taken.
///
/// Every wait is bounded: there is always a deadline (`max_wait`), and
/// optionally an attempt count. Between attempts the client sleeps `delay`
/// plus a uniformly random extra in `[0, jitter]`, so competing clients that
/// failed together do not retry in lock-step (Redlock's split-vote problem).
/// No sleep ever ends past the deadline: when the next attempt would start
/// after it, the acquire gives up instead.
///
/// # Default
///
/// `max_wait` 10 s, unlimited attempts within it, `delay` 50 ms, `jitter`
/// 100 ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    max_wait: Duration,
    max_attempts: Option<u32>,
    delay: Duration,
    jitter: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Self::new()
    }
}

impl Retry {
    /// The default policy; see the type's docs.
    pub const fn new() -> Self {
        Self {
            max_wait: Duration::from_secs(10),
            max_attempts: None,
            delay: Duration::from_millis(50),
            jitter: Duration::from_millis(100),
        }
    }

    /// Exactly one attempt, no waiting.
    pub const fn once() -> Self {
        Self::new()
            .with_max_attempts(1)
            .with_max_wait(Duration::ZERO)
    }

    /// Give up once this much time has passed since the first attempt began.
    /// An attempt already running finishes (it is bounded by the per-node
    /// timeout), so the acquire returns within `max_wait` + node timeout.
    /// Defaults to 10 seconds.
    #[must_use]
    pub const fn with_max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// Give up after this many attempts (values below 1 mean 1: the first
    /// attempt is always made). Defaults to no limit besides `max_wait`.
    #[must_use]
    pub const fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(if attempts == 0 { 1 } else { attempts });
        self
    }

    /// The fixed part of the pause between attempts. Defaults to 50 ms.
    #[must_use]
    pub const fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// The random part of the pause between attempts: uniform in
    /// `[0, jitter]`. Defaults to 100 ms.
    #[must_use]
    pub const fn with_jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    /// The deadline, relative to the first attempt's start.
    pub const fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// The attempt limit, if any.
    pub const fn max_attempts(&self) -> Option<u32> {
        self.max_attempts
    }

    /// Whether another attempt may follow attempt number `made` (1-based),
    /// given the time already spent, and if so after which pause.
    pub(crate) fn next_delay(
        &self,
        made: u32,
        spent: Duration,
        draw: impl FnOnce(Duration) -> Duration,
    ) -> Option<Duration> {
        if self.max_attempts.is_some_and(|max| made >= max) {
            return None;
        }
        let pause = self.delay.saturating_add(draw(self.jitter));
        let next_start = spent.saturating_add(pause);
        (next_start < self.max_wait).then_some(pause)
    }
}

/// Uniform in `[0, max]`, at microsecond resolution.
pub(crate) fn jitter(max: Duration) -> Duration {
    let micros = u64::try_from(max.as_micros()).unwrap_or(u64::MAX);
    if micros == 0 {
        return Duration::ZERO;
    }
    Duration::from_micros(rand::random_range(0..=micros))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn once_never_retries() {
        assert_eq!(
            Retry::once().next_delay(1, Duration::ZERO, |_| Duration::ZERO),
            None
        );
    }

    #[test]
    fn attempts_bound() {
        let r = Retry::new()
            .with_max_attempts(3)
            .with_jitter(Duration::ZERO);
        assert_eq!(r.next_delay(1, Duration::ZERO, jitter), Some(50 * MS));
        assert_eq!(r.next_delay(2, Duration::ZERO, jitter), Some(50 * MS));
        assert_eq!(r.next_delay(3, Duration::ZERO, jitter), None);
        assert_eq!(Retry::new().with_max_attempts(0).max_attempts(), Some(1));
    }

    #[test]
    fn never_sleeps_past_the_deadline() {
        let r = Retry::new()
            .with_max_wait(100 * MS)
            .with_delay(30 * MS)
            .with_jitter(20 * MS);
        assert_eq!(r.next_delay(1, 40 * MS, |j| j), Some(50 * MS));
        assert_eq!(
            r.next_delay(1, 50 * MS, |j| j),
            None,
            "would start exactly at the deadline"
        );
        assert_eq!(r.next_delay(1, 60 * MS, |_| Duration::ZERO), Some(30 * MS));
        assert_eq!(r.next_delay(9, Duration::MAX, |_| Duration::ZERO), None);
    }

    #[test]
    fn jitter_stays_in_range() {
        assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
        for _ in 0..1000 {
            assert!(jitter(7 * MS) <= 7 * MS);
        }
        // Spread: 1000 draws over 100 ms are not all equal.
        let draws: std::collections::HashSet<_> = (0..1000).map(|_| jitter(100 * MS)).collect();
        assert!(draws.len() > 100);
        // Huge jitter does not overflow.
        let _ = jitter(Duration::MAX);
    }
}
