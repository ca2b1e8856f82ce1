//! The run's one clock, shared by every process of the rig.
//!
//! The checker compares events of different workers directly (a grant of
//! one against the release of another), so every stamp must come from one
//! clock. `Instant` cannot cross a process boundary, so the stamps are
//! read from `CLOCK_MONOTONIC` itself (system-wide on Linux, and not
//! moved by NTP steps or `date -s`) and counted from an origin that the
//! parent takes once and passes to its worker processes.

use std::time::{Duration, Instant};

/// Nanoseconds on `CLOCK_MONOTONIC`, the clock std's `Instant` reads on
/// Linux, which is what makes [`Clock::ns_of`] exact.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec and CLOCK_MONOTONIC is
    // always supported on Linux; the call only writes into `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    // Both fields are non-negative for CLOCK_MONOTONIC.
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// Nanoseconds since the run's origin.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin_ns: u64,
}

impl Clock {
    /// A new run starting now.
    pub fn start() -> Self {
        Self {
            origin_ns: monotonic_ns(),
        }
    }

    /// The clock of a run whose origin another process took.
    pub fn from_origin(origin_ns: u64) -> Self {
        Self { origin_ns }
    }

    pub fn origin_ns(&self) -> u64 {
        self.origin_ns
    }

    pub fn now_ns(&self) -> u64 {
        monotonic_ns().saturating_sub(self.origin_ns)
    }

    /// `t` on this clock. `Instant` is `CLOCK_MONOTONIC` too, so reading
    /// both at (nearly) the same moment and shifting by `t`'s distance from
    /// that moment is exact up to the few hundred nanoseconds between the
    /// two reads; std offers no way to read an `Instant`'s raw value.
    pub fn ns_of(&self, t: Instant) -> u64 {
        let (now, mono) = (Instant::now(), monotonic_ns());
        let abs = if t >= now {
            mono.saturating_add(nanos(t - now))
        } else {
            mono.saturating_sub(nanos(now - t))
        };
        abs.saturating_sub(self.origin_ns)
    }

    /// How long until `ns` on this clock; zero once past.
    pub fn until(&self, ns: u64) -> Duration {
        Duration::from_nanos(ns.saturating_sub(self.now_ns()))
    }
}

pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
