//! The state the waits, their places and the subscription tasks share
//! (behind one `Arc`): the queues per resource, the commands to the
//! per-node tasks, and what a heard notice does to them.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::queue::Queue;
use super::{LINGER, REAP_EVERY};
use crate::waiting::pregrant::{naming, Orphan, OrphanHook};

/// The queues by lock key. Looked up three times in every `acquire`,
/// waiting or not: foldhash rather than SipHash (randomly seeded per
/// process all the same), which took 4 % of an uncontended cycle's client
/// instructions (BENCHMARKS.md, "Out of process").
pub(super) type Queues = std::collections::HashMap<Arc<str>, Queue, foldhash::fast::RandomState>;

/// Until when this client's releases of each lock key send the full script
/// at once (see [`Busy::marked`](super::waits::Busy::marked)).
pub(super) type Marked = std::collections::HashMap<Arc<str>, Instant, foldhash::fast::RandomState>;

#[derive(Debug, Default)]
pub(super) struct Shared {
    /// Prefix of this client's cleanup notices (`{tag}{id}`), which its own
    /// waiters ignore: a failed attempt of this client freeing its partial
    /// grants says nothing about the holder this client waits for, and
    /// waking on it would make a head retry after each of its own failures.
    pub(super) tag: String,
    /// A std Mutex: held for map and queue updates only, never across an
    /// await.
    pub(super) queues: Mutex<Queues>,
    /// Commands to the per-node subscription tasks.
    pub(super) senders: OnceLock<Vec<mpsc::UnboundedSender<Command>>>,
    /// Notices of this client's releases still being queued: their copies
    /// from Redis are ignored (see [`Waits::releasing`](super::Waits::releasing)). A handful at most.
    pub(super) own: Mutex<Vec<Arc<str>>>,
    /// See [`DEFAULT_LOCAL_HANDOFFS`](super::DEFAULT_LOCAL_HANDOFFS).
    pub(super) local_handoffs: u32,
    /// Releases the home's vote pre-granted to a ticket of this client
    /// that no waiter will use (see [`Orphan`]).
    pub(super) orphans: OnceLock<OrphanHook>,
    /// When a leaving waiter next scans the queues for idle ones (see
    /// [`Shared::reap_now_and_then`]).
    pub(super) next_reap: Mutex<Option<Instant>>,
    /// Resources a node answered this client's lean release of with -1
    /// (another client marked them as waited for), kept apart from the
    /// queues: a client that never waits for a resource has no queue for
    /// it, and a queue made here would miss what a waiter's makes.
    pub(super) marked: Mutex<Marked>,
    /// Whether `marked` holds any entry: an uncontended release reads this
    /// one flag, not the map.
    pub(super) marked_any: AtomicBool,
}

#[derive(Debug)]
pub(super) enum Command {
    /// The key's notice channel (the classic competition).
    Subscribe(Arc<str>),
    /// The key's fair-queue channels: the marker and this client's own.
    SubscribeFair(Arc<str>),
    /// Every channel of the key.
    Unsubscribe(Arc<str>),
}

/// Nothing panics while holding these locks; recover from poison anyway.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Queues> {
        lock(&self.queues)
    }

    pub(super) fn command(&self, make: impl Fn() -> Command) {
        for tx in self.senders.get().into_iter().flatten() {
            // A closed channel means the client is being dropped.
            let _ = tx.send(make());
        }
    }

    pub(super) fn command_to(&self, node: usize, command: Command) {
        if let Some(tx) = self.senders.get().and_then(|s| s.get(node)) {
            let _ = tx.send(command);
        }
    }

    /// A release of `key` heard from node `node`: on a fair queue's home
    /// node, the notice's third field names the ticket whose turn it is.
    /// `since`: when the subscription connection that carried the notice
    /// connected (its server is at least that old).
    pub(super) fn heard_from(&self, key: &str, payload: &str, node: usize, since: Instant) {
        let mut parts = payload.splitn(3, ':');
        let (body_len, next) = match (parts.next(), parts.next(), parts.next()) {
            (Some(n), Some(c), next) => (n.len() + 1 + c.len(), next),
            _ => (payload.len(), None),
        };
        {
            let mut queues = self.lock();
            if let Some(queue) = queues.get_mut(key) {
                if let (Some("p"), Some(ticket)) = (payload.split(':').next(), next) {
                    // A look found the lock free with our ticket at the
                    // head (a notice id is hex, never `p`): that waiter
                    // attempts, still queued.
                    queue.prod(ticket);
                    return;
                }
                if let (Some("r"), Some(ms)) =
                    (payload.split(':').next(), payload.split(':').nth(1))
                {
                    // A release reserved the home for a client outside the
                    // queue, our ticket at the head (DESIGN.md, section 2,
                    // "Outside turns"): our first waiter looks when the
                    // reservation would lapse, unused.
                    let ms = ms.parse().unwrap_or(0);
                    let at = Instant::now() + Duration::from_millis(ms);
                    queue.look_at = Some(queue.look_at.map_or(at, |l| l.min(at)));
                    queue.wake_head();
                    return;
                }
                if let Some(next) = next {
                    // On this client's own channel: only the named waiter
                    // acts. A fourth field is the home's fence: the
                    // release pre-granted the home's vote to the ticket.
                    let notice = payload.split(':').next().unwrap_or("");
                    let (ticket, pregrant) = naming(next, notice, since, Instant::now());
                    let orphan = queue.turn(key, ticket, pregrant);
                    drop(queues);
                    self.orphaned(orphan);
                    return;
                }
                if queue.fair == Some(node) {
                    // The home's plain notice (classic clients listen too):
                    // no ticket of ours named, nobody of ours wakes.
                    return;
                }
            }
        }
        self.heard(key, &payload[..body_len]);
    }

    /// A release of `key` was heard. The payload is `{notice}:{clients}`:
    /// the notice identifies the release across nodes, `clients` is how
    /// many clients were subscribed on the publishing node.
    pub(super) fn heard(&self, key: &str, payload: &str) {
        if !self.tag.is_empty() && payload.starts_with(&self.tag) {
            return;
        }
        let (notice, clients) = match payload.rsplit_once(':') {
            Some((notice, clients)) => (notice, clients.parse().unwrap_or(1)),
            None => (payload, 1),
        };
        if lock(&self.own).iter().any(|n| **n == *notice) {
            return;
        }
        let mut queues = self.lock();
        let Some(queue) = queues.get_mut(key) else {
            return;
        };
        if queue.recent.iter().any(|n| **n == *notice) {
            queue.competitors = queue.competitors.max(clients);
            let nodes = self.senders.get().map_or(1, Vec::len);
            queue.copy(notice, nodes);
            return;
        }
        queue.competitors = clients;
        queue.local_turns = 0;
        queue.remember(notice.into());
        queue.last_heard = Some(Instant::now());
        queue.wake_head();
        if self.senders.get().map_or(1, Vec::len) == 1 {
            // One node: its copy is the majority.
            queue.settle();
        }
    }

    /// This client's release of `key` with `notice` is queued on every
    /// connection: wake its own head at once, unless other clients wait
    /// too and it has had its local handoffs in a row. Then the notice's copies
    /// from Redis wake it, with the count of clients to spread over, as
    /// they wake every other client's head.
    pub(super) fn released_here(&self, key: &str, notice: &Arc<str>) {
        let mut queues = self.lock();
        let Some(queue) = queues.get_mut(key) else {
            return;
        };
        if queue.waiters.is_empty() {
            // Nobody to hand it to; copies from Redis count as heard,
            // and a waiter of this client about to join (its attempt
            // began before now) retries at once (`fresh`, `wait_any`).
            queue.remember(notice.clone());
            queue.last_heard = Some(Instant::now());
            queue.last_settled = queue.last_heard;
            return;
        }
        if queue.fair.is_some() {
            // The home's notice names whose turn it is.
            return;
        }
        if queue.competitors > 1 && queue.local_turns >= self.local_handoffs {
            queue.local_turns = 0;
            return;
        }
        queue.local_turns += 1;
        queue.competitors = 1;
        queue.remember(notice.clone());
        queue.last_heard = Some(Instant::now());
        queue.wake_head();
        queue.settle();
    }

    /// Hands `orphan` to the client's hook (never under the queues' lock).
    pub(super) fn orphaned(&self, orphan: Option<Orphan>) {
        if let (Some(orphan), Some(hook)) = (orphan, self.orphans.get()) {
            (hook.0)(orphan);
        }
    }

    /// [`Shared::reap`], at most once per [`REAP_EVERY`]: a scan visits
    /// every queue, and a client that locked many resources in the last
    /// [`LINGER`] has that many (issue 32: every leaving waiter scanned
    /// them all, 17 clock reads per cycle at 32 resources, and a cost per
    /// release that grew with the resources in use). An idle queue is
    /// dropped between [`LINGER`] and [`LINGER`] + [`REAP_EVERY`] after
    /// its last waiter left.
    pub(super) fn reap_now_and_then(&self, now: Instant) {
        {
            let mut next = lock(&self.next_reap);
            if next.is_some_and(|t| now < t) {
                return;
            }
            *next = Some(now + REAP_EVERY);
        }
        self.reap(now);
    }

    /// Drops the queues idle for [`LINGER`] and unsubscribes those that
    /// were subscribed.
    pub(super) fn reap(&self, now: Instant) {
        let expired: Vec<Arc<str>> = {
            let mut queues = self.lock();
            let expired: Vec<(Arc<str>, bool)> = queues
                .iter()
                .filter(|(_, q)| {
                    q.idle_since
                        .is_some_and(|t| now.duration_since(t) >= LINGER)
                })
                .map(|(k, q)| (k.clone(), q.listening))
                .collect();
            for (key, _) in &expired {
                queues.remove(key);
            }
            expired
                .into_iter()
                .filter_map(|(key, listening)| listening.then_some(key))
                .collect()
        };
        for key in expired {
            self.command(|| Command::Unsubscribe(key.clone()));
        }
    }

    /// A node confirmed the subscription of `key`. The first confirmation
    /// (and any after a reconnect) counts as a release heard: one may have
    /// happened between the waiter's failed attempt and the subscription.
    pub(super) fn confirmed(&self, key: &str, reconnected: bool) {
        let mut queues = self.lock();
        if let Some(queue) = queues.get_mut(key) {
            if !queue.subscribed || reconnected {
                queue.subscribed = true;
                if queue.fair.is_some() && reconnected {
                    // A fair queue's naming is published on our channel
                    // only: one sent while the connection was down was
                    // missed. The first waiter looks at the queue now.
                    // (A first subscription is confirmed before the
                    // waiter joins: `Place::until_subscribed`.)
                    queue.look_at = Some(Instant::now());
                }
                queue.wake_head();
                queue.settle();
            }
        }
    }
}
