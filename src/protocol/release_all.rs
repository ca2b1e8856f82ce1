//! The release of a multi-resource set: one `RELEASE_ALL` script per node
//! carrying every key of the set (compare-and-delete of each, and each
//! resource's notice where it is waited for), decided at the quorum as the
//! mutex's release is (per resource); the rest finishes in the background. A resource
//! whose home node has fair waiters listening is left alone by that
//! script and gets the mutex's full release there, which names the
//! queue's next waiter (DESIGN.md, section 6c, "Release").

use std::sync::Arc;
use std::time::Instant;

use crate::error::failure::{NodeErrorKind, NodeFailure};
use crate::logic::quorum::quorum;
use crate::logic::resource::notice_channel;
use crate::node::Settled;
use crate::protocol::fanout::{node_set, FanOut, NodeSet};
use crate::protocol::release::{release_deadline, resend_until, start_release, Released, Step};
use crate::protocol::shared::{Held, Shared};
use crate::wire::commands::parse_codes;
use crate::wire::scripts::RELEASE_ALL;

/// A resource deleted on a node.
const DELETED: i64 = 1;
/// A resource left for the full release on its home node.
const FULL: i64 = -1;

/// Releases every resource of a set (`helds`, one per resource, all with
/// the set's value) with one script per node. Returns once every
/// resource's outcome is certain (deleted on a majority, or no longer
/// can be) or after one node timeout, with each resource's [`Released`] in the set's order;
/// the rest finishes in the background. Cut off, it is sent again in the
/// background (compare-and-delete is idempotent).
pub(crate) async fn release_all(shared: &Arc<Shared>, helds: Vec<Held>) -> Vec<Released> {
    let mut cleanup = ReleaseAllOnDrop {
        shared: Arc::clone(shared),
        helds: Some(helds.clone()),
    };
    let mut fan = send(shared, &helds);
    let wait = Instant::now() + shared.config.node_timeout;
    // Decided per resource: each one deleted on a majority, or no longer
    // able to be (one resource gone must not cut the others' wait short).
    let resources = helds.len();
    fan.hear_until_done(wait, every_key_deleted, |fan| decided(fan, resources))
        .await;
    let released = outcome(shared, &fan, helds.len());
    fan.finish_in_background();
    cleanup.helds = None;
    released
}

/// Fire-and-forget [`release_all`], for a dropped guard. Without a tokio
/// runtime it does nothing and the TTL frees the keys.
pub(crate) fn release_all_in_background(shared: &Arc<Shared>, helds: Vec<Held>) {
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        // Queued here, not in the task: a release dropped just before the
        // next acquire of the same resources runs before it.
        let fan = send(shared, &helds);
        handle.spawn(fan.drain());
    }
}

/// A node's answer counts when it deleted every key of the set.
fn every_key_deleted(r: &Result<Vec<i64>, NodeErrorKind>) -> bool {
    matches!(r, Ok(codes) if !codes.is_empty() && codes.iter().all(|&c| c == DELETED))
}

/// Whether every resource's outcome is certain: deleted on a majority of
/// all N nodes, or refused or failed on more than N minus a majority.
fn decided(fan: &FanOut<Vec<i64>>, resources: usize) -> bool {
    let n = fan.tally().nodes();
    let majority = quorum(n);
    let answered = fan.values();
    let failed = fan.failures().len();
    (0..resources).all(|i| {
        let deleted = answered
            .iter()
            .filter(|(_, codes)| codes.get(i) == Some(&DELETED))
            .count();
        let not = failed + answered.len() - deleted;
        deleted >= majority || not > n - majority
    })
}

/// Where the release goes: every node any acquire reached, and each
/// resource's home (its fair queue is tended there even when the acquire
/// never reached it, as the mutex's release does).
fn targets(helds: &[Held]) -> NodeSet {
    helds.iter().fold(0, |set, held| {
        set | held.sent
            | if held.granted {
                node_set([held.home.index])
            } else {
                0
            }
    })
}

/// Starts the release on every target and queues it on every connection
/// before returning, so that this client's own next waiter, told at once,
/// runs its attempt after our deletes on each node (as the mutex's
/// `send_release`).
fn send(shared: &Arc<Shared>, helds: &[Held]) -> FanOut<Vec<i64>> {
    let notices: Arc<[Arc<str>]> = helds.iter().map(Held::notice_id).collect();
    let releasing: Vec<_> = helds
        .iter()
        .zip(notices.iter())
        .filter(|(held, _)| held.granted)
        .map(|(held, notice)| shared.waits.releasing(&held.key, notice.clone()))
        .collect();
    let deadline = helds
        .iter()
        .map(|held| release_deadline(shared, held))
        .max()
        .unwrap_or_else(|| Instant::now() + shared.config.node_timeout);
    let helds: Arc<[Held]> = helds.into();
    let mut fan = FanOut::start(
        &shared.nodes,
        targets(&helds),
        deadline,
        |node, _settled| {
            let (shared, helds, notices) =
                (Arc::clone(shared), Arc::clone(&helds), Arc::clone(&notices));
            async move {
                let Some(first) = helds.first() else {
                    return Ok(Vec::new());
                };
                let mut keys: Vec<&str> = Vec::with_capacity(2 * helds.len());
                for held in helds.iter() {
                    keys.push(&held.key);
                    keys.push(&held.home.marker);
                }
                let channels: Vec<String> = helds
                    .iter()
                    .map(|held| notice_channel(&held.key, node.db()))
                    .collect();
                let mut args: Vec<&[u8]> = Vec::with_capacity(1 + 3 * helds.len());
                args.push(first.value.as_bytes());
                for ((held, notice), channel) in helds.iter().zip(notices.iter()).zip(&channels) {
                    args.push(notice.as_bytes());
                    args.push(channel.as_bytes());
                    let home = held.granted && held.home.index == node.index();
                    args.push(if home { b"1" } else { b"" });
                }
                let evalsha = RELEASE_ALL.evalsha(&keys, &args);
                let run = || {
                    node.run_script_prepared(&RELEASE_ALL, &evalsha, &Settled::NEVER, true, None)
                };
                let mut codes = parse_codes(resend_until(deadline, run).await?, helds.len())?;
                // Waited for by fair waiters on this, its home: the
                // mutex's full release names the queue's next waiter.
                for (i, code) in codes.iter_mut().enumerate() {
                    if *code != FULL {
                        continue;
                    }
                    let step = Step {
                        targets: node_set([node.index()]),
                        credited: 0,
                        handover: None,
                        deadline,
                        by_hash: false,
                    };
                    let mut full = start_release(&shared, &helds[i], notices[i].clone(), &step);
                    // Heard out, not decided: over all N nodes, one
                    // asked is a decided "no" before it answers.
                    full.hear_rest().await;
                    *code = if full.tally().yes() == 1 { DELETED } else { 0 };
                }
                Ok(codes)
            }
        },
    );
    fan.send_now(every_key_deleted);
    for releasing in releasing {
        releasing.queued();
    }
    fan
}

/// Each resource's [`Released`], from the nodes' answers so far.
fn outcome(shared: &Shared, fan: &FanOut<Vec<i64>>, resources: usize) -> Vec<Released> {
    let answered = fan.values();
    let failed = fan.failures();
    (0..resources)
        .map(|i| {
            let mut failures = failed.clone();
            let mut confirmed = 0;
            for (index, codes) in &answered {
                if codes.get(i) == Some(&DELETED) {
                    confirmed += 1;
                } else if let Some(node) = shared.nodes.get(*index) {
                    failures.push(NodeFailure {
                        index: *index,
                        addr: node.addr().to_owned(),
                        kind: NodeErrorKind::NotHeld,
                    });
                }
            }
            failures.sort_by_key(|f| f.index);
            Released {
                confirmed,
                nodes: shared.nodes.len(),
                failures,
                pending: fan.pending(),
                handed_over: 0,
            }
        })
        .collect()
}

/// Sends the release again in the background when dropped while armed:
/// a release cut off before its decision.
struct ReleaseAllOnDrop {
    shared: Arc<Shared>,
    helds: Option<Vec<Held>>,
}

impl Drop for ReleaseAllOnDrop {
    fn drop(&mut self) {
        if let Some(helds) = self.helds.take() {
            release_all_in_background(&self.shared, helds);
        }
    }
}
