//! The fair queue's requests to a resource's home node: join the queue,
//! look at it (when a waiter's timer fires or its named attempt failed),
//! leave it. One node, one round trip each, bounded by the node timeout.
//!
//! The queue is a hint that orders who tries; it never decides who holds.
//! A reply that does not come (home down, paused, slow) is `None`, and the
//! waiter falls back to attempting on its own timers: the quorum decides as
//! always. See DESIGN.md, section 2, "Fair queue".

use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, Value};

use crate::logic::resource::notice_channel;
use crate::logic::resource::pregrant_value;
use crate::node::Settled;
use crate::protocol::shared::{Shared, Target};
use crate::wire::commands::lrem;
use crate::wire::scripts::{JOIN, LEAVE, MARK, QUEUE};

/// What the home node said about the queue and the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Look {
    /// Whether the waiter's ticket is at the head of the queue.
    pub(crate) head: bool,
    /// The head's ticket (a look only).
    pub(crate) head_ticket: Option<String>,
    /// The lock key's remaining TTL on the home node: `Some(ZERO)` when
    /// absent (free there), `None` for a key without expiry.
    pub(crate) held_for: Option<Duration>,
    /// The waiter's place in the queue, 1 at the head.
    pub(crate) position: u64,
}

/// Appends `ticket` to the queue: the join of a waiter that arrives at a
/// busy resource, instead of an attempt bound to fail. One script on one
/// node (`wire/lua/join.lua`): the `RPUSH`, and the queue key's `PEXPIRE`
/// for `life` when `keep` or when the `RPUSH` created the key (a queue
/// that had emptied, or a home restarted empty), in one step, so that no
/// crash between the two can leave a queue key without expiry. The whole
/// cost of waiting, besides the named attempt.
pub(crate) async fn join(
    shared: &Arc<Shared>,
    target: &Target,
    ticket: &str,
    life: Duration,
    keep: bool,
) -> Option<Look> {
    let node = shared.nodes.get(target.home.index)?;
    let life = life_ms(life).to_string();
    let args: [&[u8]; 3] = [
        ticket.as_bytes(),
        life.as_bytes(),
        if keep { b"1" } else { b"" },
    ];
    let queue = target.home.queue();
    let keys: [&str; 3] = [&queue, &target.key, &target.home.marker];
    let reply = bounded(
        shared,
        node.run_script(&JOIN, &keys, &args, &Settled::NEVER, true, None),
    )
    .await?;
    let Value::Array(items) = reply else {
        return None;
    };
    let [Value::Int(len), pttl] = items.as_slice() else {
        return None;
    };
    // Alone in the queue with the lock free on the home: a release ran
    // there before this join, and names nobody; the waiter attempts.
    // Behind others, or the lock held, it waits to be named.
    Some(Look {
        head: *len == 1,
        head_ticket: None,
        held_for: held_for(pttl)?,
        position: u64::try_from(*len).unwrap_or(1),
    })
}

/// Looks at the queue: skips `stale` if it is still the head while the
/// lock is free (its owner let a free turn pass), puts `ticket` back at
/// the back if it is missing, keeps the queue key alive for `life` when
/// `keep` (or when the ticket's `RPUSH` created it), and returns the head,
/// the lock's `PTTL` and the ticket's position.
pub(crate) async fn look(
    shared: &Shared,
    target: &Target,
    ticket: &str,
    (life, keep): (Duration, bool),
    stale: Option<&str>,
) -> Option<Look> {
    let node = shared.nodes.get(target.home.index)?;
    let life = life_ms(life).to_string();
    let channel = notice_channel(&target.key, node.db());
    let args: [&[u8]; 5] = [
        ticket.as_bytes(),
        life.as_bytes(),
        stale.unwrap_or("").as_bytes(),
        channel.as_bytes(),
        if keep { b"1" } else { b"" },
    ];
    let queue = target.home.queue();
    let keys: [&str; 3] = [&target.key, &queue, &target.home.marker];
    let reply = bounded(
        shared,
        node.run_script(&QUEUE, &keys, &args, &Settled::NEVER, true, None),
    )
    .await?;
    let Value::Array(items) = reply else {
        return None;
    };
    match items.as_slice() {
        [head, pttl, Value::Int(position)] => {
            let head_ticket = match head {
                Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
                _ => None,
            };
            Some(Look {
                head: head_ticket.as_deref() == Some(ticket),
                head_ticket,
                held_for: held_for(pttl)?,
                position: u64::try_from(*position).unwrap_or(1),
            })
        }
        _ => None,
    }
}

/// Marks `targets` as waited for on every node for `life` (the waiter's
/// remaining wait and its TTL): a waiter outside the fair queue, which
/// hears the releases of every node. A release publishes its notice only
/// where the marker is (DESIGN.md, section 2, "Notices only where waited
/// for"), so the waiter awaits its marks before it subscribes: the
/// subscription's confirmation, which counts as a release heard, then
/// comes after them, and a release between the refused attempt and the
/// marks is caught by the retry it triggers. All nodes and targets at
/// once, each bounded by the node timeout; a mark that does not land
/// (a node down or slow) costs a notice, which the waiter's timers cover.
pub(crate) async fn mark_waiting(shared: &Arc<Shared>, targets: &[&Target], life: Duration) {
    mark_all(shared, targets, vec![life_ms(life).to_string()], false).await;
}

/// [`mark_waiting`] by the semaphore's waiter whose turn it is: the marker
/// is its `claim` (`c:{ms}:{claimant}`, replacing another's), so that a
/// release of any of `targets` keeps the freed key for it that long
/// (`release.lua`; DESIGN.md, section 6a, "Waiting").
pub(crate) async fn claim_waiting(
    shared: &Arc<Shared>,
    targets: &[&Target],
    life: Duration,
    claim: &str,
) {
    mark_all(
        shared,
        targets,
        vec![life_ms(life).to_string(), claim.to_owned()],
        false,
    )
    .await;
}

/// Takes `claim` back (the waiter has its permit, or gave up), in the
/// background: where the marker is still this claim it becomes a plain
/// marker for the rest of its life, so releases stop keeping keys for a
/// waiter that no longer comes, and a key a release kept for the claimant
/// (`kept`, `r:{claimant}`) that it did not take is deleted (two releases
/// can keep two slots for one claimant). Best effort: a claim left behind
/// makes each release keep its key for the claim's few node timeouts,
/// until the next waiter's claim replaces it or it expires.
pub(crate) fn unclaim(shared: &Arc<Shared>, targets: Vec<Target>, claim: String, kept: String) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let shared = Arc::clone(shared);
    handle.spawn(async move {
        let targets: Vec<&Target> = targets.iter().collect();
        unclaim_now(&shared, &targets, &claim, &kept).await;
    });
}

/// [`unclaim`], awaited: all nodes and targets at once, each bounded by
/// the node timeout.
pub(crate) async fn unclaim_now(
    shared: &Arc<Shared>,
    targets: &[&Target],
    claim: &str,
    kept: &str,
) {
    let args = vec![
        String::from("1"),
        claim.to_owned(),
        String::from("drop"),
        kept.to_owned(),
    ];
    mark_all(shared, targets, args, true).await;
}

/// [`MARK`] with `args` on every node for every target's marker (and,
/// with `lock`, its lock key), all at once, each bounded by the node
/// timeout.
async fn mark_all(shared: &Arc<Shared>, targets: &[&Target], args: Vec<String>, lock: bool) {
    let timeout = shared.config.node_timeout;
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    let marks = targets.iter().flat_map(|target| {
        let keys: Vec<&str> = if lock {
            vec![&target.home.marker, &target.key]
        } else {
            vec![&target.home.marker]
        };
        let args = &args;
        shared.nodes.iter().map(move |node| {
            let keys = keys.clone();
            async move {
                let run = node.run_script(&MARK, &keys, args, &Settled::NEVER, true, None);
                let _ = tokio::time::timeout(timeout, run).await;
            }
        })
    });
    futures::future::join_all(marks).await;
}

/// Takes `ticket` out of the queue, in the background: a waiter that gave
/// up. Best effort: a ticket left behind is skipped when its turn comes.
/// On a home that pre-grants, the leave script also deletes a key the
/// home's release pre-granted to this ticket ([`LEAVE`]): a client that
/// is cancelled or shut down with waiters queued leaves no key behind.
pub(crate) fn leave(shared: &Arc<Shared>, target: &Target, ticket: &str) {
    if target.home.pregrant_fence.is_none() {
        in_background(shared, target, lrem(&target.home.queue(), ticket));
        return;
    }
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let Some(node) = shared.nodes.get(target.home.index).cloned() else {
        return;
    };
    // The pre-granted value without its notice id: `{tag}:{rest}:`.
    let prefix = pregrant_value(ticket, "");
    let channel = notice_channel(&target.key, node.db());
    let evalsha = LEAVE.evalsha(
        &[&target.key, &target.home.queue()],
        &[ticket.as_bytes(), prefix.as_bytes(), channel.as_bytes()],
    );
    let timeout = shared.config.node_timeout;
    handle.spawn(async move {
        let run = node.run_script_prepared(&LEAVE, &evalsha, &Settled::NEVER, true, None);
        let _ = tokio::time::timeout(timeout, run).await;
    });
}

/// Sends `cmd` to the home node without waiting for it, bounded by the
/// node timeout. Without a tokio runtime it does nothing.
fn in_background(shared: &Arc<Shared>, target: &Target, cmd: Cmd) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let Some(node) = shared.nodes.get(target.home.index).cloned() else {
        return;
    };
    let timeout = shared.config.node_timeout;
    handle.spawn(async move {
        let _ = tokio::time::timeout(timeout, node.run_command(&cmd, &Settled::NEVER, None)).await;
    });
}

async fn bounded<F>(shared: &Shared, request: F) -> Option<Value>
where
    F: std::future::Future<Output = Result<Value, crate::error::failure::NodeErrorKind>>,
{
    match tokio::time::timeout(shared.config.node_timeout, request).await {
        Ok(Ok(value)) => Some(value),
        _ => None,
    }
}

/// At least a second: the key outlives a wait that is about to end anyway.
fn life_ms(life: Duration) -> u64 {
    u64::try_from(life.as_millis())
        .unwrap_or(u64::MAX)
        .max(1_000)
}

/// A `PTTL` reply: -2 (absent) is free now, -1 never frees.
fn held_for(pttl: &Value) -> Option<Option<Duration>> {
    match pttl {
        Value::Int(-2) => Some(Some(Duration::ZERO)),
        Value::Int(-1) => Some(None),
        Value::Int(ms) if *ms >= 0 => Some(Some(Duration::from_millis(ms.unsigned_abs()))),
        _ => None,
    }
}
