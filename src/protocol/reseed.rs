//! The restart guard's re-seed: a node whose server was young when a fenced
//! vote reached it (it may have restarted without its data) gets its fences
//! back from a majority of the other nodes before it votes in fenced
//! requests again (DESIGN.md, "The restart guard").

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::error::failure::NodeErrorKind;
use crate::logic::fence::clock_seed;
use crate::logic::quorum::quorum;
use crate::logic::resource::fence_keys;
use crate::node::{Node, Settled, Vote};
use crate::protocol::shared::Shared;
use crate::wire::commands::{mget, parse_fences};
use crate::wire::scripts::RESEED;

/// Fence keys written per re-seed script call.
const RESEED_CHUNK: usize = 256;

/// Starts the re-seed of every node whose server a fenced vote found young
/// and not re-seeded, its restart-guard window over (see `Node::ready`).
pub(crate) fn reseed_if_wanted(shared: &Arc<Shared>) {
    for (index, node) in shared.nodes.iter().enumerate() {
        if !node.take_reseed_wanted() {
            continue;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            node.reseed_done(None);
            continue;
        };
        // A Weak: the re-seed must not keep a dropped client alive; it ends
        // within a few node round trips anyway.
        let weak = Arc::downgrade(shared);
        let span = tracing::info_span!("reseed", node = %node.addr());
        runtime.spawn(
            async move {
                let Some(shared) = weak.upgrade() else { return };
                let node = Arc::clone(&shared.nodes[index]);
                match reseed(&shared, index).await {
                    Ok((run_id, keys)) => {
                        tracing::info!(keys, "fences re-seeded from a majority");
                        node.reseed_done(Some(run_id));
                    }
                    Err(reason) => {
                        tracing::warn!(%reason, "fence re-seed failed; retried on the next vote");
                        node.reseed_done(None);
                    }
                }
            }
            .instrument(span),
        );
    }
}

/// Re-seeds node `index`'s fences from the other nodes: every bucket's
/// fence any of them holds (`MGET` of the [`FENCE_BUCKETS`](crate::limits::FENCE_BUCKETS) keys, one round
/// trip per source), raised on `index` to the largest value among them. Any
/// token handed out was stored on a quorum q of the N nodes, so on at least
/// q − 1 of the N − 1 others; reading N − q + 1 of those others that kept
/// their fences meets at least one of them (q − 1 + N − q + 1 > N − 1), and
/// at most N − q nodes can have lost their fences at once (the model).
/// Afterwards the node's fences are at least every token issued before, as
/// if it had never lost them. N − q + 1 is a majority of the others when N
/// is odd, but only 1 of 1 for N = 2 and 2 of 3 for N = 4: asking for a
/// quorum of the others, as an earlier version did, left an even-sized
/// deployment with a node down (or N = 2) unable ever to re-seed.
///
/// The reads begin only once the target's restart-guard window is over.
/// The window outlasts every attempt that began before the restart; read
/// during it, an attempt the server granted before its restart may still
/// be collecting grants elsewhere, the sources may not hold its token yet,
/// and the copy can end below it: a later quorum through this node repeats
/// or undercuts that token (12 steps in the model check, DESIGN.md §6).
///
/// Where a source lacks a fence that another source holds (fences no
/// longer expire, but one can be lost some other way: an `allkeys-*`
/// eviction, a hand), the largest among the rest may have missed the
/// largest token the missing one held; the copy is raised to at least the
/// clock seed, which a lost fence gets anyway and which is at least every
/// token handed out while clocks agree (13 steps in the model check
/// without it).
///
/// Only nodes that may vote in a fenced request count as sources: a node
/// itself restarted within the window and not yet re-seeded may have lost
/// the largest token, and copying from it wrote stale fences (decreasing
/// tokens, found by the fault suite's 8-minute run). When fewer than
/// N − q + 1 of the nodes that answered are such sources (more than N − q
/// restarted empty at once, outside the model), the values are raised to
/// at least the clock seed a lost fence gets anyway, so tokens keep
/// increasing as long as clocks agree, and the node is not locked out for
/// good. Returns the re-seeded server's `run_id` and the number of keys.
async fn reseed(shared: &Shared, index: usize) -> Result<(String, usize), String> {
    let nodes = &shared.nodes;
    let target = nodes.get(index).ok_or("no such node")?;
    if !shared.config.fencing {
        return Err("fencing is off".into());
    }
    let vote = shared.vote(true);
    let window = vote.map_or(Duration::ZERO, |v| v.window);
    let run_id = target
        .run_id_past_window(window)
        .ok_or("not connected, or its restart-guard window is not over")?;
    let all_keys = fence_keys(&shared.config.key_prefix);
    let bound = shared.config.node_timeout.max(Duration::from_secs(1));
    // Each fence key with the largest value among the sources and how many
    // sources hold it.
    let mut fences: HashMap<String, (u64, usize)> = HashMap::new();
    // Other nodes that answered, and those among them whose fences can be
    // trusted (not restarted and still unseeded themselves).
    let (mut answered, mut sources) = (0, 0);
    for (i, node) in nodes.iter().enumerate() {
        if i == index {
            continue;
        }
        match read_fences(node, &all_keys, bound, vote).await {
            Ok(read) => {
                answered += 1;
                sources += 1;
                for (key, value) in read {
                    let (max, held_by) = fences.entry(key).or_default();
                    *max = (*max).max(value);
                    *held_by += 1;
                }
            }
            Err(NodeErrorKind::Restarted { .. } | NodeErrorKind::Reseeding) => answered += 1,
            Err(_) => {}
        }
    }
    let needed = reseed_sources(nodes.len());
    if answered < needed {
        return Err(format!(
            "only {answered} other nodes answered, {needed} are needed"
        ));
    }
    if sources < needed {
        tracing::warn!(
            sources,
            answered,
            "too few nodes kept their fences: re-seeding with the clock as a floor"
        );
    }
    // Read after every source was: at least every token handed out before.
    let floor = clock_seed();
    // The copy is exact only when enough sources kept their fences. With
    // none to ask (a single node) or too few, every bucket's fence on the
    // node is raised to at least the clock seed, also where no source holds
    // one: the node may hold a stale fence rather than none (a promoted
    // replica that missed the last increments keeps the ones it had), and
    // its next `INCR` would repeat the lost holder's token. Before this, a
    // single node failed over to such a replica handed the lost holder's
    // token out again once its window was over
    // (`failover::a_failover_behind_one_address_keeps_the_guard_across_reconnects`).
    let exact = nodes.len() > 1 && sources >= needed;
    if !exact {
        for key in &all_keys {
            fences.entry(key.to_string()).or_insert((0, 0));
        }
    }
    let keys: Vec<(String, u64)> = fences
        .into_iter()
        .map(|(key, (max, held_by))| {
            let copied = if exact && held_by == sources {
                max
            } else {
                max.max(floor)
            };
            (key, copied)
        })
        .collect();
    for chunk in keys.chunks(RESEED_CHUNK) {
        let names: Vec<&str> = chunk.iter().map(|(k, _)| k.as_str()).collect();
        let values: Vec<String> = chunk.iter().map(|(_, v)| v.to_string()).collect();
        let args: Vec<&[u8]> = values.iter().map(|v| v.as_bytes()).collect();
        let call = target.run_script(&RESEED, &names, &args, &Settled::NEVER, true, None);
        match tokio::time::timeout(bound, call).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(format!("writing fences: {e}")),
            Err(_) => return Err("writing fences timed out".into()),
        }
    }
    // The server must still be the one we re-seeded.
    if target.run_id().as_deref() != Some(run_id.as_str()) {
        return Err("the server changed during the re-seed".into());
    }
    Ok((run_id, keys.len()))
}

/// How many of the other nodes a re-seed must read (that kept their
/// fences) to meet every stored token: N − q + 1, and 0 for a single node
/// (it has nobody to ask, and nobody else holds its tokens either).
fn reseed_sources(nodes: usize) -> usize {
    if nodes <= 1 {
        0
    } else {
        nodes - quorum(nodes) + 1
    }
}

/// The fences among `keys` that `node` holds (one `MGET`), bounded by
/// `bound`.
async fn read_fences(
    node: &Node,
    keys: &[Arc<str>],
    bound: Duration,
    vote: Option<Vote>,
) -> Result<HashMap<String, u64>, NodeErrorKind> {
    let names: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    let reply = tokio::time::timeout(
        bound,
        node.run_command(&mget(&names), &Settled::NEVER, vote),
    )
    .await
    .map_err(|_| NodeErrorKind::Timeout(bound))??;
    Ok(parse_fences(names, reply).into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reseed_reads_enough_others_to_meet_every_quorum() {
        assert_eq!(reseed_sources(1), 0);
        assert_eq!(reseed_sources(2), 1);
        assert_eq!(reseed_sources(3), 2);
        assert_eq!(reseed_sources(4), 2);
        assert_eq!(reseed_sources(5), 3);
        for n in 2..=64 {
            let q = quorum(n);
            let k = reseed_sources(n);
            // Any q − 1 holders among the N − 1 others meet any k of them,
            assert!(k + (q - 1) > n - 1, "n = {n}");
            // k is the least that does,
            assert!((k - 1) + (q - 1) < n, "n = {n}");
            // and the others that kept their fences (N − 1 minus at most
            // N − q that lost them, this node being one) are enough.
            assert!(k <= (n - 1) - (n - q).saturating_sub(1), "n = {n}");
        }
    }
}
