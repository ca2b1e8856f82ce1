//! Waiting by notification: a blocking acquire that finds the lock taken
//! sleeps until the holder's release is announced, instead of polling.
//!
//! The per-resource queues, the notice bookkeeping and the subscription
//! tasks share one state and one set of invariants (who is head, which
//! notices count). Each part is a child module here, which sees that state
//! without it being opened to the crate: the handle the client holds
//! ([`Waits`], `waits.rs`), the shared state and what a notice does to it
//! (`state.rs`), one resource's queue (`queue.rs`), a waiter's [`Place`]
//! (`place.rs`), the per-node subscription task (`subscriber.rs`), and the
//! pure [`free_in`] (`free.rs`).
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
//! - A fair-queue waiter (`protocol::fair`) has a ticket; its queue subscribes on
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

mod free;
mod place;
mod queue;
mod state;
mod subscriber;
#[cfg(test)]
mod tests;
mod waits;

use std::time::Duration;

pub(crate) use free::free_in;
pub(crate) use place::Place;
pub(crate) use waits::Waits;
// For the children, which name them through `super`.
use state::{Command, Shared};

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

/// How long a client's releases of a resource send the full script at
/// once after a node answered its lean release with -1 (`Busy::marked`):
/// as long as an idle queue lingers. Then the lean script is tried again,
/// and the next -1 starts another such stretch.
pub(crate) const MARKED_FOR: Duration = LINGER;

/// The size at which the memory of marked resources drops its lapsed
/// entries (when the next one is added): it holds more only when more
/// resources than this were marked within [`MARKED_FOR`].
const MARKED_PRUNE_AT: usize = 1024;

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
