//! The fair queue's pre-granted vote as a client hears it (DESIGN.md,
//! section 2, "The fair queue", step 3): the home node's release that
//! names a ticket may also set the lock key there for that ticket's waiter
//! and publish the fence it moved. This file holds what the notice carries
//! ([`Pregrant`], parsed by [`naming`]), where a queue lives ([`Home`]),
//! and a vote nobody will use ([`Orphan`]), which the client releases.
//! Pure: `notify.rs` routes namings, `fair.rs` uses the vote,
//! `protocol::release` releases orphans.

use std::sync::Arc;
use std::time::Instant;

/// Where a resource's fair queue lives: one of the N nodes, the same for
/// every client that lists the nodes in the same order.
#[derive(Debug, Clone)]
pub(crate) struct Home {
    pub(crate) index: usize,
    pub(crate) queue: Arc<str>,
    /// The fence key the home's release moves when it pre-grants the
    /// named waiter its vote: with fencing on, on a plain server (a
    /// cluster node's fence key may live in another slot than the lock
    /// key).
    pub(crate) pregrant_fence: Option<Arc<str>>,
}

/// The home node's vote for a named ticket: the release that named it set
/// the lock key there for it (`wire/lua/release.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pregrant {
    /// The naming release's notice id: the key holds
    /// `resource::pregrant_value(ticket, notice)`.
    pub(crate) notice: Arc<str>,
    /// The home's fence, moved by the same script (`None`: unreadable,
    /// the home is then asked).
    pub(crate) fence: Option<u64>,
    /// When the subscription connection that carried the notice connected:
    /// the server that set the key was already running then.
    pub(crate) since: Instant,
}

/// A naming's payload after `{notice}:{listeners}:`, that is
/// `{ticket}[:{fence}]`: the ticket, and the vote when a fence follows.
/// `notice` is the payload's first field, `since` the connection's connect
/// instant.
pub(crate) fn naming<'a>(
    rest: &'a str,
    notice: &str,
    since: Instant,
) -> (&'a str, Option<Pregrant>) {
    match rest.split_once(':') {
        Some((ticket, fence)) => (
            ticket,
            Some(Pregrant {
                notice: notice.into(),
                fence: fence.parse().ok(),
                since,
            }),
        ),
        None => (rest, None),
    }
}

/// A home's vote pre-granted to a ticket of this client whose waiter left,
/// or that never took it (granted meanwhile by an attempt of its own): the
/// key on the home holds the pre-granted value for a whole TTL unless it is
/// released, and that release names the next waiter.
#[derive(Debug, Clone)]
pub(crate) struct Orphan {
    pub(crate) key: Arc<str>,
    pub(crate) home: Home,
    pub(crate) ticket: Arc<str>,
    pub(crate) notice: Arc<str>,
}

/// What the client does with an [`Orphan`] (`protocol::release`): set
/// once, when the client is built.
pub(crate) struct OrphanHook(pub(crate) Box<dyn Fn(Orphan) + Send + Sync>);

impl std::fmt::Debug for OrphanHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OrphanHook")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_naming_carries_the_vote_when_a_fence_follows_the_ticket() {
        let since = Instant::now();
        let ticket = "aaaaaaaa0000000000000001-30000";
        assert_eq!(naming(ticket, "n1", since), (ticket, None));
        let (named, vote) = naming("aaaaaaaa0000000000000001-30000:1002", "n1", since);
        assert_eq!(named, ticket);
        assert_eq!(
            vote,
            Some(Pregrant {
                notice: "n1".into(),
                fence: Some(1002),
                since
            })
        );
        // An unreadable fence still says the key was set: the home is
        // asked then.
        let (_, vote) = naming("aaaaaaaa0000000000000001-30000:x", "n1", since);
        assert_eq!(vote.map(|v| v.fence), Some(None));
    }
}
