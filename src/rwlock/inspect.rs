//! The read of a read-write lock for operators
//! ([`RwLock::inspect`](crate::RwLock::inspect)): the read-only
//! inspection script on every node, one fan-out bounded by the node
//! timeout. It neither votes nor needs a quorum, so it waits for every
//! node (or its timeout) and reports each one (`view`).

use std::time::Instant;

use super::keys::RwKeys;
use super::scripts::parse_inspect;
use super::view::{summarise, RwInspection, RwObservation, RwSeen};
use crate::logic::resource::fence_key;
use crate::node::Settled;
use crate::protocol::fanout::{all_nodes, FanOut};
use crate::protocol::shared::Shared;
use crate::wire::scripts::RW_INSPECT;

/// Reads lock `keys` on every node: writer, readers, waiting writer, fence.
pub(crate) async fn inspect(shared: &Shared, keys: &RwKeys) -> RwInspection {
    let fence = shared
        .config
        .fencing
        .then(|| fence_key(&shared.config.key_prefix, &keys.name));
    let mut k: Vec<&str> = vec![&keys.writer, &keys.readers, &keys.waiting];
    k.extend(fence.as_deref());
    let most = RwInspection::MAX_READERS.to_string();
    let evalsha = RW_INSPECT.evalsha(&k, &[most.as_bytes()]);
    let started = Instant::now();
    let deadline = started + shared.config.node_timeout;
    let mut fan: FanOut<RwObservation> = FanOut::start(
        &shared.nodes,
        all_nodes(shared.nodes.len()),
        deadline,
        |node, _| {
            let evalsha = evalsha.clone();
            async move {
                let reply = node
                    .run_script_prepared(&RW_INSPECT, &evalsha, &Settled::NEVER, false, None)
                    .await?;
                parse_inspect(reply)
            }
        },
    );
    fan.hear_rest().await;
    let elapsed = started.elapsed();
    let mut seen: Vec<RwSeen> = fan
        .values()
        .into_iter()
        .filter_map(|(index, answer)| {
            Some(RwSeen {
                index,
                addr: shared.nodes.get(index)?.addr().to_owned(),
                answer: Ok(answer),
            })
        })
        .collect();
    seen.extend(fan.failures().into_iter().map(|f| RwSeen {
        index: f.index,
        addr: f.addr,
        answer: Err(f.kind),
    }));
    summarise(&keys.name, &shared.id_text, seen, elapsed)
}
