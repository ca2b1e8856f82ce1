//! A waiter's place in its resource's queue ([`Place`]): what it sees at
//! the head, how it is woken, what it takes (a naming, a prod), and what it
//! leaves behind when dropped (its successor woken, a ticket that left, a
//! pre-granted vote nobody took).

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Notify;

use super::{Command, Shared, GONE_TICKETS, RECENT_NOTICES};
use crate::waiting::pregrant::Pregrant;

/// A waiter's place in its resource's queue. Dropping it leaves the queue
/// (the next waiter becomes head; the last one unsubscribes).
#[derive(Debug)]
pub(crate) struct Place {
    pub(super) shared: Arc<Shared>,
    pub(super) key: Arc<str>,
    pub(super) id: u64,
    pub(super) notify: Arc<Notify>,
    /// Left with the lock: its ticket is the holder's, not one that left.
    pub(super) granted: bool,
}

/// What a waiter at the head of the queue sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Head {
    /// The release counter: retry when it moves.
    pub(crate) heard: u64,
    /// Releases known done on a majority (see `Queue::settled`):
    /// `wait_any` retries when it moves.
    pub(crate) settled: u64,
    /// When `settled` last moved.
    pub(crate) last_settled: Option<Instant>,
    /// The counter when this waiter became head.
    pub(crate) since: u64,
    /// Clients (this one included) that heard the last release: how many
    /// heads may retry at once.
    pub(crate) competitors: u64,
    /// When the queue last heard a release.
    pub(crate) last_heard: Option<Instant>,
    /// The keys' expiry of the local waiter that got the lock last.
    pub(crate) holder_until: Option<Instant>,
}

impl Place {
    /// `Some` when this waiter is at the head of its queue.
    pub(crate) fn head(&self) -> Option<Head> {
        let queues = self.shared.lock();
        let queue = queues.get(&self.key)?;
        let (id, _, _) = queue.waiters.front()?;
        (*id == self.id).then_some(Head {
            heard: queue.heard,
            settled: queue.settled,
            last_settled: queue.last_settled,
            since: queue.head_since,
            last_heard: queue.last_heard,
            competitors: queue.competitors,
            holder_until: queue.holder_until,
        })
    }

    /// Sleeps until woken (a release heard while head, or becoming head) or
    /// `until`. Wake-ups may be spurious; the caller re-checks.
    pub(crate) async fn wait(&self, until: Instant) {
        // A `notify_one` that raced ahead of this call left a permit, so no
        // wake-up is lost between the caller's check and this await.
        let _ = tokio::time::timeout_at(until.into(), self.notify.notified()).await;
    }

    /// Waits, until `until` at most, for some node to confirm the
    /// subscription to this waiter's resource; returns whether one did. A
    /// fair waiter joins the queue only then, so that no naming of its
    /// ticket is published before its client listens.
    pub(crate) async fn until_subscribed(&self, until: Instant) -> bool {
        loop {
            let subscribed = self
                .shared
                .lock()
                .get(&self.key)
                .is_some_and(|q| q.subscribed);
            if subscribed {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            // The confirmation wakes the head; a waiter behind it checks
            // again a few milliseconds later.
            self.wait(until.min(now + std::time::Duration::from_millis(5)))
                .await;
        }
    }

    /// Whether a release named this waiter's ticket since it last looked
    /// (its turn in the fair queue), with the home's vote when that
    /// release pre-granted it; consumes the naming.
    pub(crate) fn take_named(&self) -> Option<Option<Pregrant>> {
        let mut queues = self.shared.lock();
        let queue = queues.get_mut(&self.key)?;
        let at = queue.named.iter().position(|(id, _)| *id == self.id)?;
        Some(queue.named.swap_remove(at).1)
    }

    /// Until when this client last asked the home node to keep the fair
    /// queue's key (see [`super::Queue::kept_until`]).
    pub(crate) fn kept_until(&self) -> Option<Instant> {
        self.shared.lock().get(&self.key).and_then(|q| q.kept_until)
    }

    /// Records a `PEXPIRE` of the fair queue's key sent by this client: the
    /// key lives until `until`, as far as this client knows (a look's, or
    /// another client's, may have shortened it; `None` forgets).
    pub(crate) fn kept(&self, until: Option<Instant>) {
        if let Some(queue) = self.shared.lock().get_mut(&self.key) {
            queue.kept_until = until;
        }
    }

    /// When the first waiter should look at the fair queue although no
    /// release named it (see [`super::Queue::look_at`]).
    pub(crate) fn look_at(&self) -> Option<Instant> {
        self.shared.lock().get(&self.key).and_then(|q| q.look_at)
    }

    /// The fair queue's home stopped answering: the queue becomes a classic
    /// one (subscribed on every node, every release wakes the head) until
    /// it is reaped, and this waiter goes on as a classic waiter.
    pub(crate) fn widen(&self) {
        let widened = {
            let mut queues = self.shared.lock();
            queues
                .get_mut(&self.key)
                .and_then(|q| q.fair.take())
                .is_some()
        };
        if widened {
            if let Some(queue) = self.shared.lock().get_mut(&self.key) {
                queue.listening = true;
            }
            self.shared.command(|| Command::Subscribe(self.key.clone()));
        }
    }

    /// The first waiter looked: clears [`look_at`](Self::look_at).
    pub(crate) fn looked(&self) {
        if let Some(queue) = self.shared.lock().get_mut(&self.key) {
            queue.look_at = None;
        }
    }

    /// Another waiter of this client holds `ticket`, which this one's look
    /// found at the head of the queue: tells it to attempt (its own timers
    /// may not run, another of its client's waiters being first). Returns
    /// whether such a waiter is here.
    pub(crate) fn prod(&self, ticket: &str) -> bool {
        self.shared
            .lock()
            .get_mut(&self.key)
            .is_some_and(|queue| queue.prod(ticket))
    }

    /// Whether another waiter of this client prodded this one; consumes it.
    pub(crate) fn take_prodded(&self) -> bool {
        let mut queues = self.shared.lock();
        let Some(queue) = queues.get_mut(&self.key) else {
            return false;
        };
        let before = queue.prodded.len();
        queue.prodded.retain(|id| *id != self.id);
        queue.prodded.len() != before
    }

    /// Whether this waiter is the first of its client's waiters on the
    /// resource: the one whose timers stand for them all.
    pub(crate) fn is_first(&self) -> bool {
        self.head().is_some()
    }

    /// Leaves the queue after getting the lock, whose keys expire at
    /// `expires_at`; the next waiter waits for this holder's release.
    pub(crate) fn acquired(mut self, expires_at: Instant) {
        if let Some(queue) = self.shared.lock().get_mut(&self.key) {
            queue.holder_until = Some(expires_at);
        }
        // The ticket is the holder's now, not one that left: a naming of
        // it (a release heard while we hold) sends no look.
        self.granted = true;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let now = Instant::now();
        let orphan;
        {
            let mut queues = self.shared.lock();
            let Some(queue) = queues.get_mut(&self.key) else {
                return;
            };
            let was_head = queue
                .waiters
                .front()
                .is_some_and(|(id, _, _)| *id == self.id);
            let ticket = queue
                .waiters
                .iter()
                .find(|(id, _, _)| *id == self.id)
                .and_then(|(_, _, ticket)| ticket.clone());
            if let Some(ticket) = ticket.as_ref() {
                if !self.granted {
                    if queue.left.len() == RECENT_NOTICES {
                        queue.left.pop_front();
                    }
                    queue.left.push_back(ticket.clone());
                }
                if queue.gone.len() == GONE_TICKETS {
                    queue.gone.pop_front();
                }
                queue.gone.push_back(ticket.clone());
            }
            queue.waiters.retain(|(id, _, _)| *id != self.id);
            // A naming this waiter never took: its pre-granted vote is
            // released.
            let untaken = queue
                .named
                .iter()
                .position(|(id, _)| *id == self.id)
                .map(|at| queue.named.swap_remove(at).1);
            orphan = match (ticket, untaken) {
                (Some(ticket), Some(pregrant)) => queue.orphan(&self.key, ticket, pregrant),
                _ => None,
            };
            queue.prodded.retain(|id| *id != self.id);
            if queue.waiters.is_empty() {
                // Lingers, subscribed; reaped after LINGER.
                queue.idle_since = Some(now);
            } else if was_head {
                queue.head_since = queue.heard;
                if let Some((_, next, _)) = queue.waiters.front() {
                    next.notify_one();
                }
            }
        }
        self.shared.orphaned(orphan);
        self.shared.reap_now_and_then(now);
    }
}
