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

use crate::logic::validity::later;

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

/// What this client knows of the server behind one address, kept across
/// its connections: which server it is (`run_id`), the latest instant it
/// can have started, when this client first saw it, and whether its fences
/// were re-seeded. A connection is only a way to reach the server: the
/// guard's verdict belongs to the server, so a reconnect (after a load
/// balancer's reset, `CLIENT KILL`, an idle timeout) can never make a
/// server younger than the window vote, nor skip its re-seed. Before this
/// state outlived the connection, a promoted replica behind a stable
/// address was quarantined on the first reconnect and voted at once on the
/// second, which read its real uptime: two holders with one token
/// (DESIGN.md, "The restart guard"). Pure; `node::server` keeps one per node
/// address.
#[derive(Debug, Clone, Default)]
pub(crate) struct Lineage {
    known: Option<Known>,
    /// The next server seen counts as started then, whatever its uptime
    /// (a Redis Cluster named this address master of new slots before
    /// this client connected to it).
    fresh: bool,
}

#[derive(Debug, Clone)]
struct Known {
    run_id: String,
    /// The latest instant the server can have started, on this process's
    /// clock: never moved earlier by a later connection's report.
    started: Instant,
    /// When this client first reached this server.
    first_seen: Instant,
    /// Its fences were re-seeded from the other nodes.
    reseeded: bool,
}

/// Why a server may not vote now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It votes.
    Votes,
    /// Younger than the window: `uptime` since its latest possible start,
    /// `votes_in` left.
    Young {
        uptime: Duration,
        votes_in: Duration,
    },
    /// Past the window, but it may have lost fences: a fenced vote waits
    /// for its re-seed.
    Unseeded,
}

impl Lineage {
    /// A connection reached the server `run_id`, which reported `uptime`,
    /// at `now`. Another `run_id` than the last one seen is another server
    /// (a restart, a moved VIP or DNS name, a promoted replica): it counts
    /// as started `now`, whatever its uptime. The first server seen is
    /// trusted to be as old as it says, at the latest possible start.
    /// Returns whether this was another server than the one known.
    pub(crate) fn observe(&mut self, run_id: &str, uptime: Duration, now: Instant) -> bool {
        let estimate = started(now, uptime);
        let fresh = std::mem::take(&mut self.fresh);
        match &mut self.known {
            Some(known) if known.run_id == run_id && !fresh => {
                // The same server: a later report never makes it older.
                known.started = known.started.max(estimate);
                false
            }
            Some(_) => {
                self.known = Some(Known::new(run_id, now, now));
                true
            }
            None => {
                let started = if fresh { now } else { estimate };
                self.known = Some(Known::new(run_id, started, now));
                fresh
            }
        }
    }

    /// The server counts as started `now` (a Redis Cluster promoted it
    /// to master of slots it did not serve): out of quorums for a window,
    /// and re-seeded before fenced votes, on this and every later
    /// connection to it.
    pub(crate) fn restarted_now(&mut self, now: Instant) {
        match &mut self.known {
            Some(known) => *known = Known::new(&known.run_id, now, now),
            None => self.fresh = true,
        }
    }

    /// Whether the server `run_id` (the one a connection reached) votes at
    /// `now` under `window`, and with `fenced` whether its fences are
    /// trusted. A server this lineage does not know (a connection older
    /// than the last server seen) never votes.
    pub(crate) fn verdict(
        &self,
        run_id: &str,
        window: Duration,
        fenced: bool,
        now: Instant,
    ) -> Verdict {
        let Some(known) = self.known.as_ref().filter(|k| k.run_id == run_id) else {
            return Verdict::Young {
                uptime: Duration::ZERO,
                votes_in: window,
            };
        };
        if let Some(votes_in) = votes_in(known.started, now, window) {
            return Verdict::Young {
                uptime: now.saturating_duration_since(known.started),
                votes_in,
            };
        }
        // Young when first seen (it may have restarted without its data a
        // moment before): its fences are trusted only once re-seeded.
        let young_at_first_sight =
            known.first_seen.saturating_duration_since(known.started) < window;
        if fenced && young_at_first_sight && !known.reseeded {
            return Verdict::Unseeded;
        }
        Verdict::Votes
    }

    /// The `run_id` of the server known now.
    pub(crate) fn run_id(&self) -> Option<&str> {
        self.known.as_ref().map(|k| k.run_id.as_str())
    }

    /// The latest start of the known server, if it is `run_id`.
    pub(crate) fn started(&self, run_id: &str) -> Option<Instant> {
        self.known
            .as_ref()
            .filter(|k| k.run_id == run_id)
            .map(|k| k.started)
    }

    /// The server `run_id` had its fences re-seeded; ignored when another
    /// server is known by now.
    pub(crate) fn reseeded(&mut self, run_id: &str) {
        if let Some(known) = self.known.as_mut().filter(|k| k.run_id == run_id) {
            known.reseeded = true;
        }
    }
}

impl Known {
    fn new(run_id: &str, started: Instant, first_seen: Instant) -> Self {
        Self {
            run_id: run_id.to_owned(),
            started,
            first_seen,
            reseeded: false,
        }
    }
}

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

    /// Issue 31: a promoted replica behind a stable address was counted as
    /// started now on the first reconnect and trusted on the second, which
    /// read its real uptime. The verdict belongs to the server, whatever
    /// connection reaches it.
    #[test]
    fn a_reconnect_never_shortens_the_window_nor_skips_the_reseed() {
        let w = 10 * S;
        let t0 = Instant::now();
        let mut l = Lineage::default();
        // The old master, up for an hour: votes at once, fences trusted.
        assert!(!l.observe("old", 3600 * S, t0));
        assert_eq!(l.verdict("old", w, true, t0), Verdict::Votes);
        // The address now reaches a replica promoted an hour after it
        // started: another server, started now.
        let t1 = t0 + 2 * S;
        assert!(l.observe("new", 3600 * S, t1));
        assert!(matches!(
            l.verdict("new", w, true, t1),
            Verdict::Young { .. }
        ));
        // A connection drop and a reconnect inside the window: the same
        // server reports its real uptime; it still waits out the window.
        let t2 = t1 + 3 * S;
        assert!(!l.observe("new", 3600 * S, t2));
        match l.verdict("new", w, true, t2) {
            Verdict::Young { votes_in, .. } => assert_eq!(votes_in, 7 * S),
            other => panic!("voted after a reconnect: {other:?}"),
        }
        // Past the window (and after more reconnects) it votes in unfenced
        // requests, and in fenced ones only once re-seeded.
        let t3 = t1 + 11 * S;
        assert!(!l.observe("new", 3700 * S, t3));
        assert_eq!(l.verdict("new", w, false, t3), Verdict::Votes);
        assert_eq!(l.verdict("new", w, true, t3), Verdict::Unseeded);
        l.reseeded("new");
        assert_eq!(l.verdict("new", w, true, t3), Verdict::Votes);
        // A connection still on the old server never votes again.
        assert!(matches!(
            l.verdict("old", w, false, t3),
            Verdict::Young { .. }
        ));
    }

    #[test]
    fn a_young_server_first_seen_needs_its_reseed_on_every_later_connection() {
        let w = 10 * S;
        let t0 = Instant::now();
        let mut l = Lineage::default();
        // Restarted 2 s before this client first saw it.
        l.observe("a", 2 * S, t0);
        assert!(matches!(l.verdict("a", w, true, t0), Verdict::Young { .. }));
        // Reconnected after the window: its uptime is now past the window,
        // but it was young when first seen: the re-seed is still owed.
        let t1 = t0 + 12 * S;
        l.observe("a", 14 * S, t1);
        assert_eq!(l.verdict("a", w, true, t1), Verdict::Unseeded);
        // A server old at first sight is taken as it is.
        let mut old = Lineage::default();
        old.observe("b", 60 * S, t0);
        assert_eq!(old.verdict("b", w, true, t0), Verdict::Votes);
        // A re-seed of a server no longer known changes nothing.
        let mut l2 = Lineage::default();
        l2.observe("c", 2 * S, t0);
        l2.observe("d", 60 * S, t0 + S);
        l2.reseeded("c");
        assert_eq!(l2.verdict("d", w, true, t1), Verdict::Unseeded);
    }

    #[test]
    fn a_cluster_promotion_restarts_the_known_server_or_the_next_one() {
        let w = 10 * S;
        let t0 = Instant::now();
        let mut l = Lineage::default();
        l.observe("r", 3600 * S, t0);
        l.reseeded("r");
        let t1 = t0 + S;
        l.restarted_now(t1);
        // Same run_id (a promoted replica keeps its process), yet young,
        // also after a reconnect that reads its real uptime.
        l.observe("r", 3601 * S, t1 + S);
        assert!(matches!(
            l.verdict("r", w, true, t1 + S),
            Verdict::Young { .. }
        ));
        assert_eq!(l.verdict("r", w, true, t1 + 11 * S), Verdict::Unseeded);
        // Promoted before this client ever connected: the first server
        // seen counts as started then.
        let mut fresh = Lineage::default();
        fresh.restarted_now(t0);
        assert!(fresh.observe("s", 3600 * S, t1));
        assert!(matches!(
            fresh.verdict("s", w, false, t1),
            Verdict::Young { .. }
        ));
        assert_eq!(fresh.started("s"), Some(t1));
        assert_eq!(fresh.started("x"), None);
    }
}
