//! The client's waiting state as the rest of the crate holds it: [`Waits`]
//! (the queues per resource and the subscription tasks it owns), and the
//! two handles a release holds, [`Releasing`] and [`Busy`].

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use super::queue::Queue;
use super::state::{lock, Command, Queues, Shared};
use super::{subscriber, Place, MARKED_FOR, MARKED_PRUNE_AT};
use crate::node::Node;
use crate::waiting::pregrant::{HandedOver, Home, Orphan, OrphanHook, Pregrant};

/// The client's waiting state: queues per resource and the per-node
/// subscription tasks, which are aborted when this is dropped (with the
/// client's last clone).
#[derive(Debug, Default)]
pub(crate) struct Waits {
    pub(super) shared: Arc<Shared>,
    pub(super) tasks: OnceLock<Vec<JoinHandle<()>>>,
}

/// A release of this client being queued on every connection; see
/// [`Waits::releasing`].
#[derive(Debug)]
pub(crate) struct Releasing {
    pub(super) shared: Arc<Shared>,
    pub(super) key: Arc<str>,
    pub(super) notice: Arc<str>,
}

impl Releasing {
    /// The deletes are queued on every connection: this client's own head
    /// may retry at once (on each node its attempt runs after our delete),
    /// without waiting for the notice's trip through Redis. Copies of the
    /// notice that come back later are counted as already heard.
    pub(crate) fn queued(self) {
        self.forget();
        self.shared.released_here(&self.key, &self.notice);
    }

    fn forget(&self) {
        let mut own = lock(&self.shared.own);
        if let Some(i) = own.iter().position(|n| **n == *self.notice) {
            own.swap_remove(i);
        }
    }
}

impl Drop for Releasing {
    fn drop(&mut self) {
        // After `queued` this finds nothing; otherwise (a panic in between)
        // later copies of the notice wake the head as usual.
        self.forget();
    }
}

/// A first attempt in flight without a place; see [`Waits::first_attempt`].
#[derive(Debug)]
pub(crate) struct FirstAttempt<'a> {
    waits: &'a Waits,
    key: &'a Arc<str>,
    granted: Option<Instant>,
}

impl FirstAttempt<'_> {
    /// The attempt got the lock, whose keys expire at `expires_at`: as
    /// [`Place::acquired`], for this client's next waiters.
    pub(crate) fn granted(mut self, expires_at: Instant) {
        self.granted = Some(expires_at);
    }
}

impl Drop for FirstAttempt<'_> {
    fn drop(&mut self) {
        let mut queues = self.waits.shared.lock();
        if let Some(queue) = queues.get_mut(&**self.key) {
            queue.attempting = queue.attempting.saturating_sub(1);
            if let Some(expires_at) = self.granted {
                queue.holder_until = Some(expires_at);
            }
        }
    }
}

/// See [`Waits::busy`].
#[derive(Debug)]
pub(crate) struct Busy {
    pub(super) shared: Arc<Shared>,
    pub(super) key: Arc<str>,
}

impl Busy {
    pub(crate) fn set(&self, busy: bool) {
        if let Some(queue) = self.shared.lock().get_mut(&self.key) {
            queue.busy = busy;
        }
    }

    /// A node answered this client's lean release with -1: another
    /// client waits for the resource there. For [`MARKED_FOR`] the
    /// client's releases of it are not [`quiet`](Waits::quiet) and send
    /// the full script at once, instead of paying the lean one's round trip
    /// on every release (a waiter outside the fair queue marks every node,
    /// and no release names it: nothing else tells the client).
    pub(crate) fn marked(&self) {
        let now = Instant::now();
        let mut marked = lock(&self.shared.marked);
        if marked.len() >= MARKED_PRUNE_AT {
            marked.retain(|_, until| *until > now);
        }
        marked.insert(self.key.clone(), now + MARKED_FOR);
        self.shared.marked_any.store(true, Ordering::Relaxed);
    }

    /// This client's release named `ticket`, one of this client's, in its
    /// reply (not by a notice: `fence` is the pre-granted fence, or ""),
    /// with `notice` its own notice id; `since`: when the server that
    /// answered started, as far as the client knows; `handed`: the
    /// releasing holder's value when the release handed the lock over.
    pub(crate) fn named_here(
        &self,
        ticket: &str,
        notice: &str,
        fence: &str,
        since: Instant,
        handed: Option<HandedOver>,
    ) {
        let pregrant = (!fence.is_empty()).then(|| Pregrant {
            notice: notice.into(),
            fence: fence.parse().ok(),
            since,
            handed,
        });
        let orphan = {
            let mut queues = self.shared.lock();
            let Some(queue) = queues.get_mut(&self.key) else {
                return;
            };
            queue.turn(&self.key, ticket, pregrant)
        };
        self.shared.orphaned(orphan);
    }
}

impl Drop for Waits {
    fn drop(&mut self) {
        for task in self.tasks.get().into_iter().flatten() {
            task.abort();
        }
    }
}

impl Waits {
    /// Waiting state of the client with tag `client`.
    pub(crate) fn new(client: &str, local_handoffs: u32) -> Self {
        let mut tag = String::with_capacity(client.len() + 1);
        tag.push_str(client);
        tag.push('/');
        Self {
            shared: Arc::new(Shared {
                tag,
                local_handoffs,
                ..Shared::default()
            }),
            tasks: OnceLock::new(),
        }
    }

    /// This client is about to queue the release of lock key `key` with
    /// `notice` on every connection. Until [`Releasing::queued`], copies of
    /// the notice that come back from Redis are ignored: the first node to
    /// run the delete may publish before the last delete is queued (the
    /// releasing thread preempted in between), and a head woken then would
    /// queue its attempt ahead of our delete on the remaining nodes, find
    /// our key there, and sleep until its fallback.
    pub(crate) fn releasing(&self, key: &Arc<str>, notice: Arc<str>) -> Releasing {
        lock(&self.shared.own).push(notice.clone());
        Releasing {
            shared: self.shared.clone(),
            key: key.clone(),
            notice,
        }
    }

    /// What the home node's release of `key` said about the fair queue:
    /// `true` when it named a waiter (the queue was not empty). A new
    /// waiter of this client on a busy resource joins the queue instead of
    /// attempting first.
    pub(crate) fn busy(&self, key: &Arc<str>) -> Busy {
        Busy {
            shared: self.shared.clone(),
            key: key.clone(),
        }
    }

    /// A fair acquire of `key` may send its first attempt before it takes
    /// a place and a ticket in this client's queue when none of this
    /// client's tasks waits for the resource or is making such an attempt,
    /// and its home named nobody at this client's last release (issue 32:
    /// the place and the ticket of an acquire that never waits were made
    /// and dropped on every cycle). Until the returned guard is dropped,
    /// a new fair waiter of `key` joins the queue instead, as it would
    /// behind a waiter (`None`: this one must too).
    pub(crate) fn first_attempt<'a>(
        &'a self,
        key: &'a Arc<str>,
        home: &Home,
    ) -> Option<FirstAttempt<'a>> {
        let mut queues = self.shared.lock();
        // Looked up before an entry is made: the key's hash and clone only
        // for a new one.
        let queue = match queues.get_mut(&**key) {
            Some(queue) => queue,
            None => queues.entry(key.clone()).or_insert_with(|| Queue {
                fair: Some(home.index),
                home: Some(home.clone()),
                // Reaped as any idle queue unless a waiter comes.
                idle_since: Some(Instant::now()),
                ..Queue::default()
            }),
        };
        if queue.busy || !queue.waiters.is_empty() || queue.attempting > 0 {
            return None;
        }
        queue.attempting += 1;
        Some(FirstAttempt {
            waits: self,
            key,
            granted: None,
        })
    }

    /// Whether a release of `key` should ask the home to hand the lock
    /// over to the next fair waiter (DESIGN.md, section 2, fair queue,
    /// step 3, "Handover"): the key has a fair queue here and it is contended, by
    /// waiters of this client or by the tickets this client's last release
    /// or naming found. The release then waits for the home's answer
    /// before it releases the other nodes, so it is asked only where a
    /// waiter is likely.
    pub(crate) fn hands_over(&self, key: &str) -> bool {
        self.shared
            .lock()
            .get(key)
            .is_some_and(|q| q.fair.is_some() && (q.busy || !q.waiters.is_empty()))
    }

    /// Whether this client has nothing to tend on `key`'s home at a
    /// release: none of its tasks waits for it, its last release there
    /// named nobody, and no node answered a lean release of it with -1
    /// in the last [`MARKED_FOR`]. The release then sends the lean script
    /// first, to every node (`protocol::release`; a node where others wait
    /// says so, and gets the full release).
    pub(crate) fn quiet(&self, key: &str) -> bool {
        let tending = self
            .shared
            .lock()
            .get(key)
            .is_some_and(|q| q.busy || !q.waiters.is_empty());
        if tending {
            return false;
        }
        // The map only when something is in it.
        !(self.shared.marked_any.load(Ordering::Relaxed) && self.marked_now(key))
    }

    /// Whether `key` was marked in the last [`MARKED_FOR`]; a lapsed entry
    /// is dropped.
    fn marked_now(&self, key: &str) -> bool {
        let mut marked = lock(&self.shared.marked);
        match marked.get(key) {
            Some(until) if Instant::now() < *until => true,
            Some(_) => {
                marked.remove(key);
                if marked.is_empty() {
                    self.shared.marked_any.store(false, Ordering::Relaxed);
                }
                false
            }
            None => false,
        }
    }

    /// The prefix of this client's cleanup notices.
    pub(crate) fn tag(&self) -> &str {
        &self.shared.tag
    }

    /// Joins the queue of lock key `key` if other tasks of this client wait
    /// in it: a new acquire then waits its turn behind them instead of
    /// barging in with an attempt of its own (a task that just released
    /// and comes straight back would otherwise beat them all).
    pub(crate) fn join_if_waiting(&self, nodes: &[Arc<Node>], key: &Arc<str>) -> Option<Place> {
        let pushed = {
            let mut queues = self.shared.lock();
            if queues.get(key).is_none_or(|q| q.waiters.is_empty()) {
                return None;
            }
            self.push(&mut queues, key, None, None)
        };
        Some(self.subscribed(nodes, pushed))
    }

    /// Joins the queue of lock key `key`, subscribing when the queue is new.
    /// Starts the subscription tasks on first use.
    pub(crate) fn join(&self, nodes: &[Arc<Node>], key: &Arc<str>) -> Place {
        let pushed = self.push(&mut self.shared.lock(), key, None, None);
        self.subscribed(nodes, pushed)
    }

    /// Joins the queue of lock key `key` as a fair-queue waiter with
    /// `ticket`, subscribing on the fair queue's home node `home` only when
    /// the queue is new (only the home's notices name tickets). Also
    /// says whether the resource is busy: waiters of this client are
    /// queued already or making their first attempt
    /// ([`first_attempt`](Self::first_attempt)), or the home's last notice
    /// named a ticket.
    pub(crate) fn join_fair(&self, key: &Arc<str>, home: &Home, ticket: Arc<str>) -> (Place, bool) {
        // One lookup.
        let mut queues = self.shared.lock();
        let queue = queues.entry(key.clone()).or_insert_with(|| Queue {
            fair: Some(home.index),
            ..Queue::default()
        });
        let busy = queue.busy || !queue.waiters.is_empty() || queue.attempting > 0;
        queue.home = Some(home.clone());
        (self.push_into(queue, key, Some(ticket)), busy)
    }

    /// Subscribes `place`'s resource, unless asked already: a fair waiter
    /// that must wait, before it joins the queue (issue 32: an acquire of a
    /// free resource subscribed first, one `SUBSCRIBE` per uncontended
    /// cycle, and its `UNSUBSCRIBE` a moment later).
    pub(crate) fn listen(&self, nodes: &[Arc<Node>], place: &Place) {
        let fair = {
            let mut queues = self.shared.lock();
            match queues.get_mut(&place.key) {
                Some(queue) if !queue.listening => {
                    queue.listening = true;
                    queue.fair
                }
                _ => return,
            }
        };
        self.start(nodes);
        match fair {
            Some(home) => self
                .shared
                .command_to(home, Command::SubscribeFair(place.key.clone())),
            None => self
                .shared
                .command(|| Command::Subscribe(place.key.clone())),
        }
    }

    /// Sets what the client does with an [`Orphan`] (once).
    pub(crate) fn on_orphan(&self, hook: impl Fn(Orphan) + Send + Sync + 'static) {
        let _ = self.shared.orphans.set(OrphanHook(Box::new(hook)));
    }

    /// Waiters in every queue.
    pub(crate) fn waiting(&self) -> u64 {
        let queues = self.shared.lock();
        queues.values().map(|q| q.waiters.len() as u64).sum()
    }

    /// Adds a waiter at the tail of `key`'s queue; `true` when the queue is
    /// new.
    fn push(
        &self,
        queues: &mut Queues,
        key: &Arc<str>,
        fair: Option<usize>,
        ticket: Option<Arc<str>>,
    ) -> (Place, bool) {
        let created = !queues.contains_key(key);
        let queue = queues.entry(key.clone()).or_insert_with(|| Queue {
            fair,
            ..Queue::default()
        });
        (self.push_into(queue, key, ticket), created)
    }

    /// Adds a waiter at the tail of `queue`, the queue of `key`.
    fn push_into(&self, queue: &mut Queue, key: &Arc<str>, ticket: Option<Arc<str>>) -> Place {
        let notify = Arc::new(Notify::new());
        let id = queue.next_id;
        queue.next_id += 1;
        if queue.waiters.is_empty() {
            queue.head_since = queue.heard;
        }
        queue.idle_since = None;
        queue.waiters.push_back((id, notify.clone(), ticket));
        Place {
            shared: self.shared.clone(),
            key: key.clone(),
            id,
            notify,
            granted: false,
        }
    }

    /// Subscribes a new queue's channel, starting the subscription tasks
    /// on first use.
    fn subscribed(&self, nodes: &[Arc<Node>], (place, _created): (Place, bool)) -> Place {
        self.listen(nodes, &place);
        place
    }

    fn start(&self, nodes: &[Arc<Node>]) {
        self.tasks.get_or_init(|| {
            let tag: Arc<str> = self.shared.tag.trim_end_matches('/').into();
            let (senders, tasks) = nodes
                .iter()
                .map(|node| {
                    let (tx, rx) = mpsc::unbounded_channel();
                    let task = tokio::spawn(subscriber::subscriber(
                        node.clone(),
                        Arc::downgrade(&self.shared),
                        rx,
                        tag.clone(),
                    ));
                    (tx, task)
                })
                .unzip();
            let _ = self.shared.senders.set(senders);
            tasks
        });
    }

    /// Subscription connections currently wanted per node (for tests and
    /// stats): resources with waiters.
    #[cfg(test)]
    pub(super) fn queues(&self) -> usize {
        self.shared.lock().len()
    }
}
