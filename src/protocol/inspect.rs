//! Inspection and administration of a resource's lock, outside any lock
//! request: a read of every node (who holds the key, its TTL, the fence)
//! and the forced release (`DEL` whatever the value). One fan-out each,
//! bounded by the node timeout; neither votes nor needs a quorum, so both
//! wait for every node (or its timeout) and report each one.

use std::sync::Arc;
use std::time::Instant;

use crate::error::failure::{NodeErrorKind, NodeFailure};
use crate::error::Error;
use crate::logic::resource::{fence_key, lock_key, validate};
use crate::node::{Node, Settled};
use crate::observe::inspect::{summarise, Inspection, Observation, Seen};
use crate::protocol::fanout::{all_nodes, FanOut};
use crate::protocol::shared::Shared;
use crate::wire::commands::{del, inspect as inspect_pipeline, parse_deleted, parse_inspect};

/// Reads `resource`'s lock key (value, `PTTL`) and its fence on every node.
pub(crate) async fn inspect(shared: &Shared, resource: &str) -> Result<Inspection, Error> {
    validate(resource).map_err(Error::InvalidResource)?;
    let prefix = &shared.config.key_prefix;
    let key = lock_key(prefix, resource, shared.config.layout);
    let fence = shared.config.fencing.then(|| fence_key(prefix, resource));
    let pipe = inspect_pipeline(&key, fence.as_deref());
    let started = Instant::now();
    let deadline = started + shared.config.node_timeout;
    let mut fan: FanOut<Observation> = FanOut::start(
        &shared.nodes,
        all_nodes(shared.nodes.len()),
        deadline,
        |node, _| {
            let pipe = pipe.clone();
            async move {
                let reply = node.run_pipeline(&pipe, &Settled::NEVER, None).await?;
                parse_inspect(reply)
            }
        },
    );
    fan.hear_rest().await;
    let elapsed = started.elapsed();
    let seen = answers(&shared.nodes, fan.values(), fan.failures());
    Ok(summarise(
        resource,
        &key,
        fence.as_deref(),
        &shared.id_text,
        seen,
        elapsed,
    ))
}

/// Every node's answer or failure, in node order.
fn answers(
    nodes: &[Arc<Node>],
    values: Vec<(usize, Observation)>,
    failures: Vec<NodeFailure>,
) -> Vec<Seen> {
    let mut seen: Vec<Seen> = values
        .into_iter()
        .filter_map(|(index, o)| {
            Some(Seen {
                index,
                addr: nodes.get(index)?.addr().to_owned(),
                answer: Ok(o),
            })
        })
        .collect();
    seen.extend(failures.into_iter().map(|f| Seen {
        index: f.index,
        addr: f.addr,
        answer: Err(f.kind),
    }));
    seen.sort_by_key(|s| s.index);
    seen
}

/// What one node did with a forced release.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ForceOutcome {
    /// The key was there, and is deleted.
    Deleted,
    /// There was no key.
    Absent,
    /// The node did not answer in time or failed; the key may still be
    /// there.
    Failed(NodeErrorKind),
}

/// One node's outcome of [`Client::force_release`](crate::Client::force_release).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NodeForceRelease {
    /// Index in the configured node list.
    pub index: usize,
    /// The node's address (without credentials).
    pub addr: String,
    /// What the node did.
    pub outcome: ForceOutcome,
}

/// What [`Client::force_release`](crate::Client::force_release) did on
/// every node, in node order.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ForceReleased {
    /// The lock key that was deleted.
    pub key: String,
    /// Every node's outcome.
    pub nodes: Vec<NodeForceRelease>,
}

impl ForceReleased {
    /// Nodes that deleted a key.
    pub fn deleted(&self) -> usize {
        self.count(|o| matches!(o, ForceOutcome::Deleted))
    }

    /// Nodes that failed: the key may remain there.
    pub fn failed(&self) -> usize {
        self.count(|o| matches!(o, ForceOutcome::Failed(_)))
    }

    /// Whether every node answered: no key of the resource is left.
    pub fn is_complete(&self) -> bool {
        self.failed() == 0
    }

    fn count(&self, f: impl Fn(&ForceOutcome) -> bool) -> usize {
        self.nodes.iter().filter(|n| f(&n.outcome)).count()
    }
}

/// `DEL` of `resource`'s lock key on every node, waiting for each (or its
/// timeout).
pub(crate) async fn force_release(shared: &Shared, resource: &str) -> Result<ForceReleased, Error> {
    validate(resource).map_err(Error::InvalidResource)?;
    let key = lock_key(&shared.config.key_prefix, resource, shared.config.layout);
    let cmd = del(&key);
    let deadline = Instant::now() + shared.config.node_timeout;
    let mut fan: FanOut<bool> = FanOut::start(
        &shared.nodes,
        all_nodes(shared.nodes.len()),
        deadline,
        |node, _| {
            let cmd = cmd.clone();
            async move {
                let reply = node.run_command(&cmd, &Settled::NEVER, None).await?;
                parse_deleted(reply)
            }
        },
    );
    fan.hear_rest().await;
    let mut nodes: Vec<NodeForceRelease> = fan
        .values()
        .into_iter()
        .filter_map(|(index, deleted)| {
            Some(NodeForceRelease {
                index,
                addr: shared.nodes.get(index)?.addr().to_owned(),
                outcome: if deleted {
                    ForceOutcome::Deleted
                } else {
                    ForceOutcome::Absent
                },
            })
        })
        .collect();
    nodes.extend(fan.failures().into_iter().map(|f| NodeForceRelease {
        index: f.index,
        addr: f.addr,
        outcome: ForceOutcome::Failed(f.kind),
    }));
    nodes.sort_by_key(|n| n.index);
    Ok(ForceReleased {
        key: key.to_string(),
        nodes,
    })
}
