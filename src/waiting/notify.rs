//! Waiting by notification: a blocking acquire that finds the lock taken
//! sleeps until the holder's release is announced, instead of polling.
//!
//! The per-resource queues, the notice bookkeeping and the subscription
//! tasks share one state and one set of invariants (who is head, which
//! notices count). The parts with a concept of their own are child
//! modules, which see that state without it being opened to the crate:
//! a waiter's [`Place`] (`notify/place.rs`) and the per-node subscription
//! task (`notify/subscriber.rs`).
//!
//! - The release script `PUBLISH`es on the lock key's notice channel
//!   (`{key}@{db}`: pub/sub is server-wide, so the channel names the
//!   database) on every node where it deleted the key, with a per-acquisition
//!   notice id as payload; the up to N copies of one release are counted
//!   once.
//! - Each client keeps **one** subscription connection per node, shared by
//!   all its waiters, driven by one task per node
//!   (`subscriber::subscriber`) that the client owns. Channels are
//!   subscribed while a resource has waiters.
//! - Waiters on one resource form a FIFO queue per client. Only the head
//!   retries when a release is heard, so one release costs one attempt per
//!   waiting *client*, not per waiting task: no herd. When the head gets the
//!   lock the next waiter becomes head and waits for *that* holder's
//!   release.
//! - A release can be missed (subscribed too late, a node paused or down):
//!   the head also retries when the holder's remaining TTL has run out on a
//!   majority (from `PTTL`, sent with every retry attempt), and after the
//!   retry policy's jittered delay as a fallback. Nothing waits past the
//!   acquire's deadline.
//!
//! - A fair-queue waiter (`fair.rs`) has a ticket; its queue subscribes on
//!   the resource's home node only, to the marker channel and this
//!   client's own (`resource::fair_channels`). A notice on the own channel
//!   names a ticket: that waiter is woken (`Place::take_named`) and nobody
//!   else; a `p:` notice there, from another client's look that found the
//!   lock free with our ticket at the head, prods that waiter
//!   (`Place::take_prodded`: it attempts still queued). The releasing
//!   client learns from its release's reply whether the queue was busy
//!   (`Waits::busy`), so its next waiter joins instead of attempting. A fair queue whose home stopped answering is widened
//!   to the classic one (`Place::widen`).
//!
//! The pure part, when the holder's keys free a majority, is [`free_in`].

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use crate::error::failure::{NodeErrorKind, NodeFailure};
use crate::node::Node;
use crate::waiting::pregrant::{naming, HandedOver, Home, Orphan, OrphanHook, Pregrant};

mod place;
mod subscriber;

pub(crate) use place::Place;

/// Notice ids remembered per resource to count a release once although it
/// is published on up to N nodes. Copies of one release arrive within a
/// round trip of each other; a few dozen releases apart is far enough.
const RECENT_NOTICES: usize = 32;

/// Tickets remembered per resource whose waiters are gone (see
/// `Queue::gone`): a naming comes within a few releases of a waiter's
/// leaving; an older one is not released and its key expires with its TTL.
pub(super) const GONE_TICKETS: usize = 128;

/// How long a resource stays subscribed after its last waiter left: a
/// client that waits on a resource again soon reuses the subscription
/// (no `SUBSCRIBE`, no confirmation round) and its notice history.
pub(crate) const LINGER: Duration = Duration::from_secs(5);

/// How often a leaving waiter looks for queues idle for [`LINGER`].
const REAP_EVERY: Duration = Duration::from_secs(1);

/// How many times in a row a client hands a lock it releases straight to
/// its own next waiter while other clients wait for it too, unless
/// `Builder::max_local_handoffs` says otherwise. Then, once, its head hears
/// the release through Redis with theirs and competes on equal terms:
/// without this, a client whose tasks keep the queue full (workers in a
/// loop) would keep the lock from every other client.
pub(crate) const DEFAULT_LOCAL_HANDOFFS: u32 = 16;

/// Pauses between reconnects of a subscription connection.
const RESUBSCRIBE_MIN: Duration = Duration::from_millis(25);

/// When the lock held by another owner frees a majority, from the attempt's
/// per-node answers: nodes that granted us (released since) and nodes that
/// reported the holder's remaining TTL are known; the others (failed, or not
/// heard before the decision) count as never. `None` when fewer than a
/// quorum are known to free.
pub(crate) fn free_in(
    nodes: usize,
    quorum: usize,
    granted: usize,
    failures: &[NodeFailure],
) -> Option<Duration> {
    let mut known: Vec<Duration> = std::iter::repeat_n(Duration::ZERO, granted)
        .chain(failures.iter().filter_map(|f| match f.kind {
            NodeErrorKind::HeldByOther { expires_in } => expires_in,
            _ => None,
        }))
        .take(nodes)
        .collect();
    if known.len() < quorum {
        return None;
    }
    known.sort_unstable();
    known.get(quorum - 1).copied()
}

/// The client's waiting state: queues per resource and the per-node
/// subscription tasks, which are aborted when this is dropped (with the
/// client's last clone).
#[derive(Debug, Default)]
pub(crate) struct Waits {
    shared: Arc<Shared>,
    tasks: OnceLock<Vec<JoinHandle<()>>>,
}

#[derive(Debug, Default)]
struct Shared {
    /// Prefix of this client's cleanup notices (`{tag}{id}`), which its own
    /// waiters ignore: a failed attempt of this client freeing its partial
    /// grants says nothing about the holder this client waits for, and
    /// waking on it would make a head retry after each of its own failures.
    tag: String,
    /// A std Mutex: held for map and queue updates only, never across an
    /// await.
    queues: Mutex<HashMap<Arc<str>, Queue>>,
    /// Commands to the per-node subscription tasks.
    senders: OnceLock<Vec<mpsc::UnboundedSender<Command>>>,
    /// Notices of this client's releases still being queued: their copies
    /// from Redis are ignored (see [`Waits::releasing`]). A handful at most.
    own: Mutex<Vec<Box<str>>>,
    /// See [`DEFAULT_LOCAL_HANDOFFS`].
    local_handoffs: u32,
    /// Releases the home's vote pre-granted to a ticket of this client
    /// that no waiter will use (see [`Orphan`]).
    orphans: OnceLock<OrphanHook>,
    /// When a leaving waiter next scans the queues for idle ones (see
    /// [`Shared::reap_now_and_then`]).
    next_reap: Mutex<Option<Instant>>,
}

/// A release of this client being queued on every connection; see
/// [`Waits::releasing`].
#[derive(Debug)]
pub(crate) struct Releasing {
    shared: Arc<Shared>,
    key: Arc<str>,
    notice: String,
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

/// See [`Waits::busy`].
#[derive(Debug)]
pub(crate) struct Busy {
    shared: Arc<Shared>,
    key: Arc<str>,
}

impl Busy {
    pub(crate) fn set(&self, busy: bool) {
        if let Some(queue) = self.shared.lock().get_mut(&self.key) {
            queue.busy = busy;
        }
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

#[derive(Debug, Default)]
struct Queue {
    /// Waiters in arrival order; the first is the head. Each with its fair
    /// queue ticket, if it has one.
    waiters: VecDeque<(u64, Arc<Notify>, Option<Arc<str>>)>,
    /// A fair queue's home node, whose notices name the next ticket:
    /// subscribed there only (`None`: on every node, the classic
    /// competition; a fair queue whose home stopped answering is widened
    /// to that, see [`Place::widen`]).
    fair: Option<usize>,
    /// When this client's first fair waiter should look at the queue
    /// although no release named a ticket of ours: a release named a
    /// ticket of ours whose waiter left.
    look_at: Option<Instant>,
    /// Tickets of this client's waiters that left (cancelled, gave up):
    /// a release that names one passes the turn to our first waiter.
    left: VecDeque<Arc<str>>,
    /// Tickets this client issued whose waiter is gone (left, or got the
    /// lock), the last [`GONE_TICKETS`]: a pre-grant to one of them is an
    /// [`Orphan`] to release, a pre-grant to a ticket it never issued is
    /// not its to touch.
    gone: VecDeque<Arc<str>>,
    /// Local waiters whose ticket a release named, not yet taken, with
    /// the home's vote when the release pre-granted it.
    named: Vec<(u64, Option<Pregrant>)>,
    /// The fair queue's home, for releasing an [`Orphan`].
    home: Option<Home>,
    /// Local waiters whose ticket another waiter of this client found at
    /// the head of the queue with no release to name it: they attempt (see
    /// [`Place::prod`]).
    prodded: Vec<u64>,
    /// Whether this client's last release (or notice) found tickets in the
    /// fair queue: other clients wait in it, so a new waiter joins it
    /// instead of sending an attempt bound to fail.
    busy: bool,
    /// Releases heard (and subscription confirmations, which stand for any
    /// release missed before them). The head retries when it moves.
    heard: u64,
    recent: VecDeque<Arc<str>>,
    /// Clients subscribed to the resource on the node of the last release
    /// heard (us included): how many heads may be retrying at once.
    competitors: u64,
    /// `heard` when the current head became head: releases heard after it
    /// are for the head, even if it only looks later.
    head_since: u64,
    /// Whether some node confirmed the subscription.
    subscribed: bool,
    /// Whether the subscription was asked for: a fair queue listens only
    /// once a waiter must wait ([`Waits::listen`]), so an acquire of a free
    /// resource subscribes to nothing.
    listening: bool,
    /// Expiry of the keys of the last local waiter that got the lock: the
    /// next head's TTL wake-up.
    holder_until: Option<Instant>,
    /// When the last release was heard: a waiter that joins a lingering
    /// queue retries at once if one was heard after its attempt began.
    last_heard: Option<Instant>,
    /// Since when the queue has had no waiters (it lingers, subscribed,
    /// for [`LINGER`]).
    idle_since: Option<Instant>,
    /// Until when this client's last join or look asked the home node to
    /// keep the fair queue's key (`PEXPIRE`): a join whose waiter needs no
    /// more leaves the `PEXPIRE` out.
    kept_until: Option<Instant>,
    /// Releases of this client handed straight to its own head since a
    /// release was last heard through Redis (see
    /// [`DEFAULT_LOCAL_HANDOFFS`]).
    local_turns: u32,
    next_id: u64,
}

#[derive(Debug)]
enum Command {
    /// The key's notice channel (the classic competition).
    Subscribe(Arc<str>),
    /// The key's fair-queue channels: the marker and this client's own.
    SubscribeFair(Arc<str>),
    /// Every channel of the key.
    Unsubscribe(Arc<str>),
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
    pub(crate) fn releasing(&self, key: &Arc<str>, notice: String) -> Releasing {
        lock(&self.shared.own).push(notice.clone().into());
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
    /// queued already, or the home's last notice named a ticket.
    pub(crate) fn join_fair(&self, key: &Arc<str>, home: &Home, ticket: Arc<str>) -> (Place, bool) {
        // One lookup: this runs on every fair acquire, waiting or not.
        let mut queues = self.shared.lock();
        let queue = queues.entry(key.clone()).or_insert_with(|| Queue {
            fair: Some(home.index),
            ..Queue::default()
        });
        let busy = queue.busy || !queue.waiters.is_empty();
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
        queues: &mut HashMap<Arc<str>, Queue>,
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
    fn queues(&self) -> usize {
        self.shared.lock().len()
    }
}

/// Nothing panics while holding these locks; recover from poison anyway.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Queue>> {
        lock(&self.queues)
    }

    fn command(&self, make: impl Fn() -> Command) {
        for tx in self.senders.get().into_iter().flatten() {
            // A closed channel means the client is being dropped.
            let _ = tx.send(make());
        }
    }

    fn command_to(&self, node: usize, command: Command) {
        if let Some(tx) = self.senders.get().and_then(|s| s.get(node)) {
            let _ = tx.send(command);
        }
    }

    /// A release of `key` heard from node `node`: on a fair queue's home
    /// node, the notice's third field names the ticket whose turn it is.
    /// `since`: when the subscription connection that carried the notice
    /// connected (its server is at least that old).
    fn heard_from(&self, key: &str, payload: &str, node: usize, since: Instant) {
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
    fn heard(&self, key: &str, payload: &str) {
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
            return;
        }
        queue.competitors = clients;
        queue.local_turns = 0;
        queue.remember(notice.into());
        queue.last_heard = Some(Instant::now());
        queue.wake_head();
    }

    /// This client's release of `key` with `notice` is queued on every
    /// connection: wake its own head at once, unless other clients wait
    /// too and it has had its local handoffs in a row. Then the notice's copies
    /// from Redis wake it, with the count of clients to spread over, as
    /// they wake every other client's head.
    fn released_here(&self, key: &str, notice: &str) {
        let mut queues = self.lock();
        let Some(queue) = queues.get_mut(key) else {
            return;
        };
        if queue.waiters.is_empty() {
            // Nobody to hand it to; copies from Redis count as heard.
            queue.remember(notice.into());
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
        queue.remember(notice.into());
        queue.last_heard = Some(Instant::now());
        queue.wake_head();
    }

    /// Hands `orphan` to the client's hook (never under the queues' lock).
    fn orphaned(&self, orphan: Option<Orphan>) {
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
    fn reap_now_and_then(&self, now: Instant) {
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
    fn reap(&self, now: Instant) {
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
    fn confirmed(&self, key: &str, reconnected: bool) {
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
            }
        }
    }
}

impl Queue {
    /// The home node's release named `next`: wake that waiter if it is
    /// ours. A vote pre-granted to a ticket no waiter of ours holds comes
    /// back as an [`Orphan`], to release.
    fn turn(&mut self, key: &str, next: &str, pregrant: Option<Pregrant>) -> Option<Orphan> {
        self.busy = true;
        if let Some((id, notify, _)) = self
            .waiters
            .iter()
            .find(|(_, _, t)| t.as_deref() == Some(next))
        {
            match self.named.iter_mut().find(|(named, _)| named == id) {
                // Named again before it took the first naming: a plain
                // naming (the key on the home is held, by the pre-grant
                // itself as likely as not) keeps the vote the first one
                // carried; a new pre-grant means the old key was deleted.
                Some((_, kept)) => {
                    if let Some(mut pregrant) = pregrant {
                        // Keys an earlier handover left stay this
                        // waiter's to replace.
                        if pregrant.handed.is_none() {
                            pregrant.handed = kept.as_mut().and_then(|k| k.handed.take());
                        }
                        *kept = Some(pregrant);
                    }
                }
                None => self.named.push((*id, pregrant)),
            }
            notify.notify_one();
            return None;
        }
        if self.left.iter().any(|t| **t == *next) {
            // Named a waiter of ours that left: our first waiter looks now
            // (the queue's new head may be free to go).
            self.look_at = Some(Instant::now());
            self.wake_head();
        }
        // Only a ticket this client issued is its orphan to release. A
        // ticket on this client's channel that it never issued is another
        // live client's whose tag is the same (or planted by hand):
        // releasing it deleted that client's pre-granted key and gave the
        // home's vote to the next ticket, two holders (issue 31, with
        // 32-bit tags). It is left alone: its own client uses it, or it
        // expires with its TTL.
        if !self.gone.iter().any(|t| **t == *next) {
            return None;
        }
        self.orphan(key, next.into(), pregrant)
    }

    /// The [`Orphan`] of `pregrant`, if any and the home is known.
    fn orphan(&self, key: &str, ticket: Arc<str>, pregrant: Option<Pregrant>) -> Option<Orphan> {
        let pregrant = pregrant?;
        Some(Orphan {
            key: key.into(),
            home: self.home.clone()?,
            ticket,
            notice: pregrant.notice,
            handed: pregrant.handed,
        })
    }

    /// Tells the waiter holding `ticket`, if it is here, to attempt while
    /// queued: its ticket is at the head and the lock was free.
    fn prod(&mut self, ticket: &str) -> bool {
        let Some((id, notify, _)) = self
            .waiters
            .iter()
            .find(|(_, _, t)| t.as_deref() == Some(ticket))
        else {
            return false;
        };
        let id = *id;
        notify.notify_one();
        self.prodded.push(id);
        true
    }

    /// Counts `notice` as heard: its copies from other nodes are ignored.
    fn remember(&mut self, notice: Arc<str>) {
        if self.recent.len() == RECENT_NOTICES {
            self.recent.pop_front();
        }
        self.recent.push_back(notice);
    }

    fn wake_head(&mut self) {
        self.heard += 1;
        if let Some((_, notify, _)) = self.waiters.front() {
            notify.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn held(ms: Option<u64>) -> NodeFailure {
        NodeFailure {
            index: 0,
            addr: "x:1".into(),
            kind: NodeErrorKind::HeldByOther {
                expires_in: ms.map(Duration::from_millis),
            },
        }
    }

    fn timeout() -> NodeFailure {
        NodeFailure {
            index: 0,
            addr: "x:1".into(),
            kind: NodeErrorKind::Timeout(100 * MS),
        }
    }

    #[test]
    fn free_when_a_quorum_of_keys_expired() {
        // 5 nodes, quorum 3: the third-shortest TTL frees a majority.
        let f = [held(Some(300)), held(Some(100)), held(Some(200))];
        assert_eq!(free_in(5, 3, 0, &f), Some(300 * MS));
        // Nodes that granted us are free now.
        assert_eq!(free_in(5, 3, 2, &f), Some(100 * MS));
        // Unknown nodes never count: two known of a quorum of three.
        assert_eq!(
            free_in(5, 3, 0, &[held(Some(5)), timeout(), held(Some(9))]),
            None
        );
        // A key without expiry (PTTL -1) never frees.
        assert_eq!(free_in(3, 2, 0, &[held(None), held(Some(7))]), None);
        assert_eq!(free_in(1, 1, 0, &[held(Some(42))]), Some(42 * MS));
        // More answers than nodes (a caller bug) do not panic.
        assert_eq!(free_in(1, 1, 3, &[]), Some(Duration::ZERO));
    }

    #[test]
    fn queue_is_fifo_and_wakes_only_the_head() {
        let waits = Waits::default();
        let key: Arc<str> = "k".into();
        let a = waits.join(&[], &key);
        let b = waits.join(&[], &key);
        let c = waits.join(&[], &key);
        assert!(a.head().is_some());
        assert!(b.head().is_none() && c.head().is_none());
        let before = a.head().unwrap().heard;
        waits.shared.heard("k", "n1:1");
        // Copies of one release from other nodes count once.
        waits.shared.heard("k", "n1:1");
        assert_eq!(a.head().unwrap().heard, before + 1);
        waits.shared.heard("k", "n2:1");
        assert_eq!(a.head().unwrap().heard, before + 2);
        // The head got the lock: b is head and learns the holder's expiry.
        let expiry = Instant::now() + 500 * MS;
        a.acquired(expiry);
        assert_eq!(b.head().unwrap().holder_until, Some(expiry));
        // A release heard before b looks still counts for b.
        let since = b.head().unwrap().since;
        waits.shared.heard("k", "n4:1");
        assert_eq!(b.head().unwrap().since, since);
        assert_eq!(b.head().unwrap().heard, since + 1);
        // A waiter behind the head leaves: order unchanged.
        drop(c);
        assert!(b.head().is_some());
        drop(b);
        // The last waiter leaves: the queue lingers, then is reaped.
        assert_eq!(waits.queues(), 1);
        waits.shared.reap(Instant::now());
        assert_eq!(waits.queues(), 1, "lingers");
        waits.shared.reap(Instant::now() + LINGER);
        assert_eq!(waits.queues(), 0, "reaped after LINGER");
        // Unknown channels are ignored.
        waits.shared.heard("other", "n3:1");
        waits.shared.confirmed("other", false);
    }

    /// A leaving waiter scans for idle queues at most once per
    /// `REAP_EVERY`, and idle queues still go within `LINGER + REAP_EVERY`.
    #[test]
    fn leaving_waiters_reap_now_and_then() {
        let waits = Waits::default();
        let idle = |n: usize| {
            for i in 0..n {
                let key: Arc<str> = format!("k{i}").into();
                drop(waits.join(&[], &key));
            }
        };
        idle(100);
        assert_eq!(waits.queues(), 100, "idle queues linger");
        let later = Instant::now() + 2 * LINGER;
        waits.shared.reap_now_and_then(later);
        assert_eq!(waits.queues(), 0, "reaped by a scan after LINGER");
        // These waiters leave before the next scan is due: none scans, not
        // even the last one, when the others' LINGER has passed.
        idle(100);
        let long_ago = Instant::now().checked_sub(2 * LINGER).unwrap();
        for queue in waits.shared.lock().values_mut() {
            queue.idle_since = Some(long_ago);
        }
        drop(waits.join(&[], &Arc::from("one more")));
        assert_eq!(waits.queues(), 101, "a leaving waiter scanned");
        waits.shared.reap_now_and_then(later + REAP_EVERY / 2);
        assert_eq!(waits.queues(), 101, "no scan within REAP_EVERY");
        waits.shared.reap_now_and_then(later + REAP_EVERY);
        assert_eq!(waits.queues(), 0, "reaped by the next scan");
    }

    #[test]
    fn own_release_wakes_only_once_queued_everywhere() {
        let waits = Waits::default();
        let key: Arc<str> = "k".into();
        let a = waits.join(&[], &key);
        let h0 = a.head().unwrap().heard;
        let releasing = waits.releasing(&key, "00000000000000bb".into());
        // The first node ran our delete and published before the last
        // delete was queued: the head must not retry yet.
        waits.shared.heard("k", "00000000000000bb:1");
        assert_eq!(a.head().unwrap().heard, h0);
        // Another release meanwhile still wakes it.
        waits.shared.heard("k", "00000000000000cc:1");
        assert_eq!(a.head().unwrap().heard, h0 + 1);
        // Queued on every connection: one wake, and later copies count as
        // heard already.
        releasing.queued();
        assert_eq!(a.head().unwrap().heard, h0 + 2);
        waits.shared.heard("k", "00000000000000bb:1");
        assert_eq!(a.head().unwrap().heard, h0 + 2);
        assert!(lock(&waits.shared.own).is_empty());
        // A release abandoned before `queued` (a panic) forgets its notice:
        // its copies then wake the head as any release does.
        drop(waits.releasing(&key, "00000000000000dd".into()));
        assert!(lock(&waits.shared.own).is_empty());
        waits.shared.heard("k", "00000000000000dd:1");
        assert_eq!(a.head().unwrap().heard, h0 + 3);
    }

    #[test]
    fn other_clients_get_a_turn_after_local_handoffs() {
        const LOCAL_TURNS: u32 = 4;
        let waits = Waits::new(&crate::logic::resource::client_tag(), LOCAL_TURNS);
        let key: Arc<str> = "k".into();
        let a = waits.join(&[], &key);
        // Another client's release, heard with 3 clients subscribed.
        waits.shared.heard("k", "0000000000000001:3");
        assert_eq!(a.head().unwrap().competitors, 3);
        let mut woken = Vec::new();
        for i in 0..(2 * LOCAL_TURNS + 2) {
            let before = a.head().unwrap().heard;
            let notice = format!("{:016x}", 0x100 + i);
            waits.releasing(&key, notice.clone()).queued();
            woken.push(a.head().unwrap().heard > before);
            // Its copies come back from Redis with the clients' count.
            waits.shared.heard("k", &format!("{notice}:3"));
        }
        // LOCAL_TURNS handed over at once, then one heard through Redis
        // like every other client's head hears it, and so on.
        let turn = LOCAL_TURNS as usize;
        let mut expected = vec![true; turn];
        expected.push(false);
        expected.extend(vec![true; turn]);
        expected.push(false);
        assert_eq!(woken, expected);
        // The yielded release still woke the head, through its copy, with
        // the clients to spread over.
        assert_eq!(a.head().unwrap().competitors, 3);
        // With this client alone, every release is handed over at once.
        let alone = Waits::new(&crate::logic::resource::client_tag(), LOCAL_TURNS);
        let b = alone.join(&[], &key);
        for i in 0..(2 * LOCAL_TURNS) {
            let before = b.head().unwrap().heard;
            let notice = format!("{:016x}", 0x200 + i);
            alone.releasing(&key, notice.clone()).queued();
            assert!(b.head().unwrap().heard > before);
            alone.shared.heard("k", &format!("{notice}:1"));
        }
    }

    #[test]
    fn a_new_waiter_queues_behind_waiting_tasks_only() {
        let waits = Waits::default();
        let key: Arc<str> = "k".into();
        assert!(waits.join_if_waiting(&[], &key).is_none(), "no queue");
        let a = waits.join(&[], &key);
        let b = waits.join_if_waiting(&[], &key).expect("a waits");
        assert!(a.head().is_some() && b.head().is_none());
        drop((a, b));
        // A lingering queue without waiters: attempt first.
        assert_eq!(waits.queues(), 1);
        assert!(waits.join_if_waiting(&[], &key).is_none());
    }

    #[test]
    fn own_cleanup_notices_are_ignored() {
        let waits = Waits::new(
            &crate::logic::resource::client_tag(),
            DEFAULT_LOCAL_HANDOFFS,
        );
        assert_eq!(waits.tag().len(), 17);
        let key: Arc<str> = "k".into();
        let a = waits.join(&[], &key);
        let h0 = a.head().unwrap().heard;
        // This client's failed attempt freeing its partial grants.
        waits
            .shared
            .heard("k", &format!("{}00000000000000aa:2", waits.tag()));
        assert_eq!(a.head().unwrap().heard, h0);
        // Another client's cleanup (a split vote: the lock may be free).
        waits.shared.heard("k", "0123abcd/00000000000000aa:2");
        assert_eq!(a.head().unwrap().heard, h0 + 1);
        assert_eq!(a.head().unwrap().competitors, 2);
        // Copies from other nodes count once, with the most competitors.
        waits.shared.heard("k", "0123abcd/00000000000000aa:3");
        assert_eq!(a.head().unwrap().heard, h0 + 1);
        assert_eq!(a.head().unwrap().competitors, 3);
        // A payload without a count (another version) counts one.
        waits.shared.heard("k", "ffff");
        assert_eq!(a.head().unwrap().competitors, 1);
    }

    #[test]
    fn first_confirmation_counts_as_a_release() {
        let waits = Waits::default();
        let key: Arc<str> = "k".into();
        let a = waits.join(&[], &key);
        let h0 = a.head().unwrap().heard;
        waits.shared.confirmed("k", false);
        waits.shared.confirmed("k", false);
        assert_eq!(a.head().unwrap().heard, h0 + 1, "only the first");
        waits.shared.confirmed("k", true);
        assert_eq!(a.head().unwrap().heard, h0 + 2, "and after a reconnect");
    }

    #[test]
    fn a_pregranted_naming_reaches_its_waiter_or_comes_back_as_an_orphan() {
        let waits = Waits::new(
            &crate::logic::resource::client_tag(),
            DEFAULT_LOCAL_HANDOFFS,
        );
        let orphans = Arc::new(Mutex::new(Vec::new()));
        let seen = orphans.clone();
        waits.on_orphan(move |o: Orphan| {
            seen.lock().unwrap().push((o.ticket, o.notice));
        });
        let key: Arc<str> = "k".into();
        let home = Home {
            index: 0,
            queue: "q".into(),
            marker: "w".into(),
            pregrant_fence: Some("f".into()),
            claim: Some("c".into()),
        };
        let mine = "aaaaaaaa0000000000000001-30000";
        let (a, _) = waits.join_fair(&key, &home, mine.into());
        let since = Instant::now();
        // Named with the home's fence: the waiter takes the vote.
        let shared = &waits.shared;
        shared.heard_from("k", &format!("n1:2:{mine}:1002"), 0, since);
        let vote = Pregrant {
            notice: "n1".into(),
            fence: Some(1002),
            since,
            handed: None,
        };
        assert_eq!(a.take_named(), Some(Some(vote)));
        assert_eq!(a.take_named(), None);
        // A plain naming carries no vote.
        shared.heard_from("k", &format!("n2:2:{mine}"), 0, since);
        assert_eq!(a.take_named(), Some(None));
        // Named again plainly before taking a pre-granted naming (another
        // release found the key held, by that pre-grant): the vote stays.
        shared.heard_from("k", &format!("n5:2:{mine}:1005"), 0, since);
        shared.heard_from("k", &format!("n6:2:{mine}"), 0, since);
        let kept = a.take_named().flatten().map(|v| v.notice);
        assert_eq!(kept.as_deref(), Some("n5"));
        // A vote its waiter never took before leaving comes back to
        // release; so does a later one for the ticket of a waiter that
        // left.
        shared.heard_from("k", &format!("n4:2:{mine}:1004"), 0, since);
        drop(a);
        shared.heard_from("k", &format!("n7:2:{mine}:1007"), 0, since);
        // A vote for a ticket this client never issued (another live
        // client with the same tag, or one planted by hand) is not this
        // client's to release (issue 31): nothing comes back.
        shared.heard_from("k", "n3:2:aaaaaaaa0000000000000009-30000:1003", 0, since);
        let orphans = orphans.lock().unwrap();
        let got: Vec<(&str, &str)> = orphans.iter().map(|(t, n)| (&**t, &**n)).collect();
        assert_eq!(got, vec![(mine, "n4"), (mine, "n7")]);
    }

    #[test]
    fn a_granted_waiters_ticket_is_the_holders_not_one_that_left() {
        let waits = Waits::new(
            &crate::logic::resource::client_tag(),
            DEFAULT_LOCAL_HANDOFFS,
        );
        let orphans = Arc::new(Mutex::new(Vec::new()));
        let seen = orphans.clone();
        waits.on_orphan(move |o: Orphan| seen.lock().unwrap().push(o.notice));
        let key: Arc<str> = "k".into();
        let home = Home {
            index: 0,
            queue: "q".into(),
            marker: "w".into(),
            pregrant_fence: Some("f".into()),
            claim: Some("c".into()),
        };
        let (granted, left) = ("aaaaaaaa0000000000000001", "aaaaaaaa0000000000000002");
        let (a, _) = waits.join_fair(&key, &home, granted.into());
        let (b, _) = waits.join_fair(&key, &home, left.into());
        let (c, _) = waits.join_fair(&key, &home, "aaaaaaaa0000000000000003".into());
        let since = Instant::now();
        // A pre-granted naming the waiter never took (it got the lock by
        // an attempt of its own meanwhile) is still released.
        waits
            .shared
            .heard_from("k", &format!("n0:2:{granted}:1001"), 0, since);
        a.acquired(Instant::now() + Duration::from_secs(30));
        assert_eq!(*orphans.lock().unwrap(), vec![Arc::<str>::from("n0")]);
        drop(b);
        // The holder's ticket stays at the queue's head until its release:
        // a release heard meanwhile names it, and nobody should look.
        waits
            .shared
            .heard_from("k", &format!("n1:2:{granted}"), 0, since);
        assert_eq!(
            c.look_at(),
            None,
            "a naming of the holder's ticket scheduled a look"
        );
        // A waiter that left: the first waiter looks (the head may be free).
        waits
            .shared
            .heard_from("k", &format!("n2:2:{left}"), 0, since);
        assert!(
            c.look_at().is_some(),
            "a naming of a ticket that left scheduled no look"
        );
    }

    #[tokio::test]
    async fn head_wakes_on_release_and_successor_on_promotion() {
        let waits = Waits::default();
        let key: Arc<str> = "k".into();
        let a = waits.join(&[], &key);
        let b = waits.join(&[], &key);
        let far = Instant::now() + Duration::from_secs(30);
        // A release heard before the head waits leaves a permit.
        waits.shared.heard("k", "n:1");
        tokio::time::timeout(Duration::from_secs(5), a.wait(far))
            .await
            .expect("head woken");
        // The head leaves: its successor is woken.
        drop(a);
        tokio::time::timeout(Duration::from_secs(5), b.wait(far))
            .await
            .expect("successor woken");
        assert!(b.head().is_some());
    }
}
