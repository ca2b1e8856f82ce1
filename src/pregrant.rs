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
    /// The released holder's value, when its release handed the lock over
    /// (DESIGN.md, section 2, fair queue, step 3, "Handover"): its keys on the other
    /// nodes are left for this waiter's acquire to replace.
    pub(crate) handed: Option<Arc<str>>,
}

/// A naming's payload after `{notice}:{listeners}:`, that is
/// `{ticket}[:{fence}[:{holder's value}]]`: the ticket, the vote when a
/// fence follows, and the handover when the released holder's value
/// follows (a value has colons of its own: it is the rest). `notice` is
/// the payload's first field, `since` the connection's connect instant.
pub(crate) fn naming<'a>(
    rest: &'a str,
    notice: &str,
    since: Instant,
) -> (&'a str, Option<Pregrant>) {
    match rest.split_once(':') {
        Some((ticket, vote)) => {
            let (fence, handed) = match vote.split_once(':') {
                Some((fence, value)) if !value.is_empty() => (fence, Some(value.into())),
                _ => (vote, None),
            };
            (
                ticket,
                Some(Pregrant {
                    notice: notice.into(),
                    fence: fence.parse().ok(),
                    since,
                    handed,
                }),
            )
        }
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
    /// The released holder's value when its release handed the lock over:
    /// its keys on the other nodes are released too.
    pub(crate) handed: Option<Arc<str>>,
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
                since,
                handed: None,
            })
        );
        // A handover carries the released holder's value, colons and all.
        let (named, vote) = naming(
            "aaaaaaaa0000000000000001h-30000:1002:bbbbbbbb:0123:n0",
            "n1",
            since,
        );
        assert_eq!(named, "aaaaaaaa0000000000000001h-30000");
        let vote = vote.expect("a vote");
        assert_eq!(vote.fence, Some(1002));
        assert_eq!(vote.handed.as_deref(), Some("bbbbbbbb:0123:n0"));
        // An unreadable fence still says the key was set: the home is
        // asked then.
        let (_, vote) = naming("aaaaaaaa0000000000000001-30000:x", "n1", since);
        assert_eq!(vote.map(|v| v.fence), Some(None));
    }
}
