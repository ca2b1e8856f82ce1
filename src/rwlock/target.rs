//! A read-write lock's request as the engine takes it: the mutex's
//! [`Target`] for the lock's name (its TTL, drift and fence bucket are the
//! name's, checked the same way), with the lock key replaced by the rw
//! entry being acquired (the writer key or one reader's entry), and a
//! "home" whose queue and waiting marker are never written, so that the
//! mutex's release script deletes the entry and nothing else.

use std::time::Duration;

use super::keys::RwKeys;
use crate::error::Error;
use crate::protocol::shared::{Shared, Target};

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
    target.home.queue = keys.quiet_queue.clone();
    target.home.marker = keys.quiet_marker.clone();
    target.home.pregrant_fence = None;
    target.home.claim = None;
    Ok(target)
}
