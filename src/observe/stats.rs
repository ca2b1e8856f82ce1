//! Counters a client keeps about its own acquisitions, for dashboards and
//! for the benchmark's "how often is the token write-back needed" figure.
//! Relaxed atomics: they are statistics, not synchronisation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug, Default)]
pub(crate) struct Counters {
    attempts: AtomicU64,
    acquired: AtomicU64,
    write_backs: AtomicU64,
    write_backs_failed: AtomicU64,
    /// Watchdog tasks alive now: shared with each task, which counts
    /// itself out when it ends or is aborted ([`Alive`]).
    watchdogs: Arc<AtomicU64>,
}

/// Counts one watchdog task as alive until dropped (with the task's
/// future: when it returns or is aborted).
#[derive(Debug)]
pub(crate) struct Alive(Arc<AtomicU64>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A snapshot of a client's counters since it was built (shared by its
/// clones). See [`Client::stats`](crate::Client::stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Acquire attempts (one quorum round each; a waiting acquire makes
    /// several).
    pub attempts: u64,
    /// Attempts that produced a guard.
    pub acquired: u64,
    /// Attempts whose token was on fewer than a quorum of nodes and needed
    /// the second round that writes it back (DESIGN.md, "Fencing tokens").
    pub write_backs: u64,
    /// Write-back rounds that did not reach a quorum (the attempt failed).
    pub write_backs_failed: u64,
    /// Acquires of this client waiting for a release now (a gauge, not a
    /// counter): the tasks in its per-resource queues when waiting by
    /// notification.
    pub waiting: u64,
    /// Auto-extension tasks of this client alive now (a gauge): one per
    /// auto-extended guard until it is released or dropped, or its lease
    /// is lost. A guard's release or drop, however it is cut off, leaves
    /// none behind (`tests/it/cancellation.rs`).
    pub watchdogs: u64,
}

pub(crate) enum Event {
    Attempt,
    Acquired,
    WriteBack,
    WriteBackFailed,
}

impl Counters {
    pub(crate) fn count(&self, event: Event) {
        let counter = match event {
            Event::Attempt => &self.attempts,
            Event::Acquired => &self.acquired,
            Event::WriteBack => &self.write_backs,
            Event::WriteBackFailed => &self.write_backs_failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A watchdog task starts: it holds the returned [`Alive`] until it
    /// ends.
    pub(crate) fn watchdog(&self) -> Alive {
        self.watchdogs.fetch_add(1, Ordering::Relaxed);
        Alive(Arc::clone(&self.watchdogs))
    }

    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            attempts: self.attempts.load(Ordering::Relaxed),
            acquired: self.acquired.load(Ordering::Relaxed),
            write_backs: self.write_backs.load(Ordering::Relaxed),
            write_backs_failed: self.write_backs_failed.load(Ordering::Relaxed),
            waiting: 0,
            watchdogs: self.watchdogs.load(Ordering::Relaxed),
        }
    }
}
