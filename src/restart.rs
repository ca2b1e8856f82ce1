//! The restart guard: Redlock's "delayed restart" rule, enforced by the
//! client. Pure; `node.rs` records when each server started and asks
//! [`votes_in`] before a vote.
//!
//! A node that granted a lock and then restarts without its data would
//! grant the same resource again while the first lease may still be valid:
//! two holders. Redlock's answer is to keep a restarted node out for at
//! least the longest TTL. The client cannot see the restart itself, but it
//! learns each server's `run_id` and uptime at every connect (a restart
//! always breaks the connection, so the new process is seen by the
//! reconnect): it estimates the *latest* time the server can have started
//! ([`started`]) and does not count the node toward a quorum until the
//! window has passed since then.
//!
//! A server seen for the first time with a small uptime is treated the same:
//! it may have restarted a moment ago with clients of other processes
//! holding locks on the others. A freshly deployed node is therefore also
//! kept out for one window; see [`RestartGuard`] for what that costs.

use std::time::{Duration, Instant};

use crate::validity::later;

/// Whether and how long a node that (re)started recently is kept out of
/// quorums.
///
/// With the guard on (the default), a node whose server started less than
/// the window ago does not vote: acquires and extends skip it (a
/// [`NodeErrorKind::Restarted`](crate::NodeErrorKind::Restarted) failure),
/// releases still go there. The window is the longer of
/// [`with_window`](Self::with_window) and the longest TTL this client has
/// requested: set it to the longest TTL *any* client of these nodes uses.
///
/// Availability: after a node restarts, locks need a majority among the
/// other nodes for one window (with 5 nodes, one restarted node costs
/// nothing; with a single node, nothing can be locked for one window). A
/// deployment whose nodes all just started waits one window before the
/// first lock; tests that start their own servers turn the guard off.
///
/// # Default
///
/// On, with no minimum window (the longest TTL this client has used).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartGuard {
    enabled: bool,
    window: Duration,
}

impl Default for RestartGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl RestartGuard {
    /// On: the window is the longest TTL this client has requested.
    pub const fn new() -> Self {
        Self {
            enabled: true,
            window: Duration::ZERO,
        }
    }

    /// Off: a node votes as soon as it answers, whenever it started. Only
    /// safe when every node keeps its data across restarts (AOF with
    /// `appendfsync always`) or is kept down for the longest TTL by other
    /// means.
    pub const fn off() -> Self {
        Self {
            enabled: false,
            window: Duration::ZERO,
        }
    }

    /// The shortest window: a node that started less than this ago does not
    /// vote (the longest TTL this client requested applies when longer).
    /// Set it to the longest TTL any client of these nodes uses.
    #[must_use]
    pub const fn with_window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Whether the guard is on.
    pub const fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// The window now, given the longest TTL this client has requested;
    /// `None` when off.
    pub(crate) fn window(&self, longest_ttl: Duration) -> Option<Duration> {
        self.enabled.then(|| self.window.max(longest_ttl))
    }
}

/// How long a server that started at `started` must still wait before it
/// votes under `window`, as of `now`; `None` when it votes now.
pub(crate) fn votes_in(started: Instant, now: Instant, window: Duration) -> Option<Duration> {
    // A window too long to add is "never" (not "now"): saturate.
    let votes_from = later(started, window);
    let left = votes_from.saturating_duration_since(now);
    (!left.is_zero()).then_some(left)
}

/// When the server started, on this process's clock, at the latest:
/// `connected` minus the uptime it reported, plus one second. Redis reports
/// `uptime_in_seconds` as the difference of two wall-clock times truncated
/// to whole seconds, so it can be up to a second *more* than the real
/// uptime (a server started at 0.96 s reports 1 at 1.02 s) as well as less;
/// the latest start consistent with the report is one second later than
/// `connected − uptime`. The guard must use the latest: an earlier estimate
/// would let a server vote up to a second early.
pub(crate) fn started(connected: Instant, uptime: Duration) -> Instant {
    let earliest = connected.checked_sub(uptime).unwrap_or(connected);
    earliest
        .checked_add(UPTIME_GRAIN)
        .unwrap_or(earliest)
        .min(connected)
}

/// The resolution of `uptime_in_seconds`.
const UPTIME_GRAIN: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn window_is_the_longer_of_setting_and_ttl() {
        assert_eq!(RestartGuard::new().window(10 * S), Some(10 * S));
        assert_eq!(
            RestartGuard::new().with_window(30 * S).window(10 * S),
            Some(30 * S)
        );
        assert_eq!(
            RestartGuard::new().with_window(5 * S).window(10 * S),
            Some(10 * S)
        );
        assert_eq!(RestartGuard::off().with_window(5 * S).window(10 * S), None);
        assert!(RestartGuard::default().is_enabled());
    }

    #[test]
    fn a_recent_start_waits_out_the_window() {
        let t0 = Instant::now();
        // Started at t0, window 10 s: at t0 + 4 s, 6 s are left.
        assert_eq!(votes_in(t0, t0 + 4 * S, 10 * S), Some(6 * S));
        assert_eq!(votes_in(t0, t0 + 10 * S, 10 * S), None);
        assert_eq!(votes_in(t0, t0 + 11 * S, 10 * S), None);
        // A zero window never holds a node back.
        assert_eq!(votes_in(t0, t0, Duration::ZERO), None);
    }

    #[test]
    fn start_is_estimated_conservatively() {
        let t = Instant::now() + 100 * S;
        // Reported up for 3 s (really between 2 and 4 s: two truncated wall
        // clock seconds): started at the latest t − 2 s.
        assert_eq!(started(t, 3 * S), t - 2 * S);
        // Reported 0 s: it may have started just now.
        assert_eq!(started(t, Duration::ZERO), t);
        // An uptime beyond this clock's origin does not panic.
        let early = Instant::now();
        let _ = started(early, Duration::from_secs(u64::MAX / 4));
    }
}
