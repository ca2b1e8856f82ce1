//! The pure part of waiting: when the holder's keys free a majority.

use std::time::Duration;

use crate::error::failure::{NodeErrorKind, NodeFailure};

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
