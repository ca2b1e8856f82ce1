//! The retry policy of a waiting acquire: a value, not a loop. Pure apart
//! from drawing jitter.

use std::time::{Duration, Instant};

/// How long and how often [`acquire`](crate::LockRequest::acquire) retries a
/// lock that could not be taken.
///
/// Every wait is bounded: there is always a deadline (`max_wait`), and
/// optionally an attempt count. After the n-th failed attempt the client
/// sleeps `delay` plus a uniformly random extra in `[0, window]`, where the
/// window starts at `jitter` and doubles after every failed attempt up to
/// `max_jitter`. The randomness keeps clients that failed together from
/// retrying in lock-step (Redlock's split votes: each gets some nodes, none
/// a majority); the growth keeps many contenders from livelocking the nodes
/// with attempts. No sleep ever ends past the deadline: when the next
/// attempt would start after it, the acquire gives up instead.
///
/// # Default
///
/// `max_wait` 10 s, unlimited attempts within it, `delay` 50 ms, `jitter`
/// 100 ms growing to `max_jitter` 1 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    max_wait: Duration,
    max_attempts: Option<u32>,
    delay: Duration,
    jitter: Duration,
    max_jitter: Duration,
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
            max_jitter: Duration::from_secs(1),
        }
    }

    /// Exactly one attempt, no waiting.
    pub const fn once() -> Self {
        Self::new()
            .with_max_attempts(1)
            .with_max_wait(Duration::ZERO)
    }

    /// Give up once this much time has passed since the first attempt began.
    /// An attempt already running finishes (each of its rounds is bounded by
    /// the per-node timeout, and a fenced attempt may need a second round,
    /// the token write-back), so the acquire returns within `max_wait` + two
    /// node timeouts.
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

    /// The initial width of the random part of the pause: uniform in
    /// `[0, jitter]` after the first failed attempt. Defaults to 100 ms.
    #[must_use]
    pub const fn with_jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    /// The widest the random window grows to (it doubles after every failed
    /// attempt, starting at `jitter`). A value at or below `jitter` keeps the
    /// window constant. Defaults to 1 second.
    #[must_use]
    pub const fn with_max_jitter(mut self, max_jitter: Duration) -> Self {
        self.max_jitter = max_jitter;
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
        if !self.allows_another(made) {
            return None;
        }
        let pause = self.pause(made, draw);
        let next_start = spent.saturating_add(pause);
        (next_start < self.max_wait).then_some(pause)
    }

    /// Whether the attempt limit allows another attempt after `made`.
    pub(crate) fn allows_another(&self, made: u32) -> bool {
        self.max_attempts.is_none_or(|max| made < max)
    }

    /// The pause after `made` failed attempts, deadline aside: `delay` plus
    /// a draw from the random window. Waiting by notification uses it as
    /// the fallback when no release is heard.
    pub(crate) fn pause(&self, made: u32, draw: impl FnOnce(Duration) -> Duration) -> Duration {
        self.delay.saturating_add(draw(self.window(made)))
    }

    /// The instant `max_wait` after `start` (far in the future when that
    /// overflows).
    pub(crate) fn deadline(&self, start: Instant) -> Instant {
        start
            .checked_add(self.max_wait)
            .or_else(|| start.checked_add(Duration::from_secs(365 * 24 * 3600)))
            .unwrap_or(start)
    }
}

impl Retry {
    /// The random window after `made` failed attempts: `jitter × 2^(made−1)`,
    /// capped at `max(max_jitter, jitter)`.
    fn window(&self, made: u32) -> Duration {
        let cap = if self.max_jitter > self.jitter {
            self.max_jitter
        } else {
            self.jitter
        };
        let doublings = made.saturating_sub(1).min(31);
        self.jitter
            .checked_mul(1u32 << doublings)
            .map_or(cap, |w| w.min(cap))
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
    fn window_doubles_up_to_the_cap() {
        let r = Retry::new()
            .with_jitter(10 * MS)
            .with_max_jitter(70 * MS)
            .with_delay(Duration::ZERO);
        let windows: Vec<_> = (1..=6)
            .map(|n| r.next_delay(n, Duration::ZERO, |w| w).unwrap())
            .collect();
        assert_eq!(
            windows,
            [10 * MS, 20 * MS, 40 * MS, 70 * MS, 70 * MS, 70 * MS]
        );
        // A cap below the start keeps the window constant.
        let flat = r.with_max_jitter(MS);
        assert_eq!(flat.next_delay(9, Duration::ZERO, |w| w), Some(10 * MS));
        // No overflow after many attempts.
        let big = Retry::new().with_max_wait(Duration::MAX);
        assert_eq!(
            big.next_delay(u32::MAX - 1, Duration::ZERO, |w| w),
            Some(1050 * MS)
        );
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
