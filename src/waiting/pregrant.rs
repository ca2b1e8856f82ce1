//! The fair queue's pre-granted vote as a client hears it (DESIGN.md,
//! section 2, "The fair queue", step 3): the home node's release that
//! names a ticket may also set the lock key there for that ticket's waiter
//! and publish the fence it moved. This file holds what the notice carries
//! ([`Pregrant`], parsed by [`naming`]), where a queue lives ([`Home`]),
//! and a vote nobody will use ([`Orphan`]), which the client releases.
//! Pure: `waiting::notify` routes namings, `protocol::fair` uses the vote,
//! `protocol::release` releases orphans.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::logic::resource::sibling_key;
use crate::logic::validity::later;

/// Where a resource's fair queue lives: one of the N nodes, the same for
/// every client that lists the nodes in the same order.
#[derive(Debug, Clone)]
pub(crate) struct Home {
    pub(crate) index: usize,
    /// The resource's waiting marker (`resource::sibling_key` of kind
    /// `wait:`), on every node.
    pub(crate) marker: Arc<str>,
    /// The fence key the home's release moves when it pre-grants the
    /// named waiter its vote: with fencing on, on a plain server (a
    /// cluster node's fence key may live in another slot than the lock
    /// key).
    pub(crate) pregrant_fence: Option<Arc<str>>,
    /// The queue's and the outside claim's keys.
    names: Names,
}

/// How a home names its queue and claim keys: made when asked, since an
/// acquire that never waits and a release that finds nobody waiting never
/// use them (issue 32: two allocations per cycle), or given.
#[derive(Debug, Clone)]
enum Names {
    /// The `queue:` and `claim:` keys (`resource::key`) of the resource
    /// whose lock key is `lock` (the claim only where the home pre-grants),
    /// named from it (`resource::sibling_key`).
    Of {
        lock: Arc<str>,
        prefix_len: usize,
        claims: bool,
    },
    /// Given keys (the queue, the claim): boxed, so that the common form
    /// keeps a home (moved with every attempt) no larger.
    Given(Box<(Arc<str>, Option<Arc<str>>)>),
}

impl Home {
    /// The home at node `index` of the resource whose lock key is `lock`,
    /// under a key prefix of `prefix_len` bytes. The outside claim exists
    /// where the home pre-grants (`pregrant_fence` is set): a polling
    /// waiter refused there claims the next turn, and the release reserves
    /// the home's vote for it instead of the queue's next waiter.
    pub(crate) fn of(
        index: usize,
        lock: Arc<str>,
        prefix_len: usize,
        pregrant_fence: Option<Arc<str>>,
    ) -> Self {
        Home {
            index,
            marker: sibling_key(&lock, prefix_len, "wait:"),
            names: Names::Of {
                claims: pregrant_fence.is_some(),
                lock,
                prefix_len,
            },
            pregrant_fence,
        }
    }

    /// A home whose keys are given.
    #[cfg(test)]
    pub(crate) fn given(
        index: usize,
        queue: Arc<str>,
        marker: Arc<str>,
        pregrant_fence: Option<Arc<str>>,
        claim: Option<Arc<str>>,
    ) -> Self {
        Home {
            index,
            marker,
            pregrant_fence,
            names: Names::Given(Box::new((queue, claim))),
        }
    }

    /// The fair queue's key (kind `queue:`).
    pub(crate) fn queue(&self) -> Arc<str> {
        match &self.names {
            Names::Of {
                lock, prefix_len, ..
            } => sibling_key(lock, *prefix_len, "queue:"),
            Names::Given(given) => given.0.clone(),
        }
    }

    /// The outside claim's key (kind `claim:`), where the home
    /// pre-grants.
    pub(crate) fn claim(&self) -> Option<Arc<str>> {
        match &self.names {
            Names::Of {
                lock,
                prefix_len,
                claims,
            } => claims.then(|| sibling_key(lock, *prefix_len, "claim:")),
            Names::Given(given) => given.1.clone(),
        }
    }

    /// Gives the queue and claim keys (a read-write lock's own).
    pub(crate) fn set_names(&mut self, queue: Arc<str>, claim: Option<Arc<str>>) {
        self.names = Names::Given(Box::new((queue, claim)));
    }
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
    /// When the release that handed the lock over (DESIGN.md, section 2,
    /// fair queue, step 3, "Handover") left the released holder's keys on
    /// the other nodes for this waiter's acquire to replace.
    pub(crate) handed: Option<HandedOver>,
}

/// The released holder's keys a handover left for the named waiter: known
/// by the SHA1 of the holder's value, never the value itself (which proves
/// ownership, and the notice travels on pub/sub, which every client that
/// may subscribe can read), and how long they live at most.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HandedOver {
    /// `SHA1(value)` in lowercase hex, as `redis.sha1hex` computes it.
    pub(crate) hash: Arc<str>,
    /// The keys are gone by then: a release of them lives until then.
    pub(crate) until: Instant,
}

impl HandedOver {
    /// The keys of the holder with `value`, which expire by `until`.
    pub(crate) fn of(value: &str, until: Instant) -> Self {
        Self {
            hash: sha1_smol::Sha1::from(value).digest().to_string().into(),
            until,
        }
    }
}

/// A naming's payload after `{notice}:{listeners}:`, that is
/// `{ticket}[:{fence}[:{sha1 of the holder's value}:{its keys' life ms}]]`:
/// the ticket, the vote when a fence follows, and the handover when the
/// hash follows. `notice` is the payload's first field, `since` the
/// connection's connect instant, `now` when the notice arrived (the keys'
/// life counts from then, at the latest).
pub(crate) fn naming<'a>(
    rest: &'a str,
    notice: &str,
    since: Instant,
    now: Instant,
) -> (&'a str, Option<Pregrant>) {
    let mut parts = rest.split(':');
    let ticket = parts.next().unwrap_or(rest);
    let Some(fence) = parts.next() else {
        return (ticket, None);
    };
    let handed = match (parts.next(), parts.next()) {
        (Some(hash), Some(life)) if !hash.is_empty() => {
            let life = Duration::from_millis(life.parse().unwrap_or(0));
            Some(HandedOver {
                hash: hash.into(),
                until: later(now, life),
            })
        }
        _ => None,
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
    /// The released holder's keys when its release handed the lock over:
    /// they are released too.
    pub(crate) handed: Option<HandedOver>,
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
        let now = since + Duration::from_secs(1);
        let ticket = "aaaaaaaaaaaaaaaa.0000000000000001h-30000";
        assert_eq!(naming(ticket, "n1", since, now), (ticket, None));
        let payload = format!("{ticket}:1002");
        let (named, vote) = naming(&payload, "n1", since, now);
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
        // A handover carries the hash of the released holder's value and
        // how long its keys live, never the value.
        let value = "bbbbbbbbbbbbbbbb:0123";
        let hash = HandedOver::of(value, now).hash;
        assert_eq!(hash.len(), 40);
        assert_eq!(
            &*hash,
            &*sha1_smol::Sha1::from("bbbbbbbbbbbbbbbb:0123")
                .digest()
                .to_string()
        );
        let payload = format!("{ticket}:1002:{hash}:2500");
        let (named, vote) = naming(&payload, "n1", since, now);
        assert_eq!(named, ticket);
        let vote = vote.expect("a vote");
        assert_eq!(vote.fence, Some(1002));
        let handed = vote.handed.expect("a handover");
        assert_eq!(handed.hash, hash);
        assert_eq!(handed.until, now + Duration::from_millis(2500));
        // An unreadable fence still says the key was set: the home is
        // asked then.
        let (_, vote) = naming(&format!("{ticket}:x"), "n1", since, now);
        assert_eq!(vote.map(|v| v.fence), Some(None));
    }
}
