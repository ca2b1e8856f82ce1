//! A read-write lock's request as the engine takes it: the mutex's
//! [`Target`] for the lock's name (its TTL, drift and fence bucket are the
//! name's, checked the same way), with the lock key replaced by the rw
//! entry being acquired (the writer key or one reader's entry), and a
//! "home" whose queue and waiting marker are never written, so that the
//! mutex's release script deletes the entry and nothing else.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::keys::RwKeys;
use crate::error::Error;
use crate::logic::validity::later;
use crate::protocol::fanout::{all_nodes, NodeSet};
use crate::protocol::shared::{Held, Shared, Target};

/// Which side of the lock a request or a guard is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RwMode {
    /// Shared: any number of readers at once, while no writer holds.
    Read,
    /// Exclusive: one writer, and no reader.
    Write,
}

/// The target of `mode` on `keys` for `ttl`; a reader's gets a fresh entry
/// key (`id`). Fails as [`Shared::target`] does: an invalid name or TTL.
pub(crate) fn rw_target(
    shared: &Shared,
    keys: &RwKeys,
    mode: RwMode,
    id: u64,
    ttl: Duration,
) -> Result<Target, Error> {
    let mut target = shared.target(&keys.name, ttl)?;
    target.key = match mode {
        RwMode::Write => keys.writer.clone(),
        RwMode::Read => keys.entry(id),
    };
    target.home.set_names(keys.quiet_queue.clone(), None);
    target.home.marker = keys.quiet_marker.clone();
    target.home.pregrant_fence = None;
    Ok(target)
}

/// The entry `value` on `target.key` as the engine's [`Held`], before its
/// round: sent to every node, expiring at the latest one node timeout
/// and a TTL from now (a node may set it as late as the round's deadline).
pub(crate) fn entry_held(shared: &Shared, target: &Target, value: Arc<str>) -> Held {
    Held {
        key: target.key.clone(),
        value,
        notice: rand::random(),
        granted: false,
        sent: all_nodes(shared.nodes.len()),
        ours: Arc::default(),
        expires_at: later(
            later(Instant::now(), shared.config.node_timeout),
            target.ttl.duration(),
        ),
        home: target.home.clone(),
        ticket: None,
    }
}

/// After the round: the nodes its requests may have reached, and the
/// entry's latest expiry (set as late as the round's `deadline`).
pub(crate) fn after_round(held: &mut Held, target: &Target, sent: NodeSet, deadline: Instant) {
    held.sent = sent;
    held.expires_at = later(deadline.max(Instant::now()), target.ttl.duration());
}
