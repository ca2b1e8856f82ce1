//! A deployment audit: checks each configured node against what Redlock
//! assumes of it (an independent master that never evicts lock keys,
//! remembers them across a restart, and keeps time) and says, per node, what
//! breaks where it does not.
//!
//! The audit is read-only and separate from locking: each node gets a fresh
//! connection (never the lock connection, whose handshake would refuse a
//! replica before we could describe it), and the whole visit to one node is
//! bounded by the client's connect timeout, so a dead or paused node costs at
//! most that, all nodes concurrently. I/O only gathers raw answers
//! (`Observed`); turning them into findings is pure and tested without
//! Redis.
//!
//! From the bottom: `report` (the public report types and the raw
//! answers, plain data), `observe` (the I/O that gathers the answers),
//! `judge` (the pure rules that turn them into findings), and here the
//! `run` that ties them together.

mod judge;
mod observe;
mod report;

use std::sync::Arc;

use crate::node::Node;

pub use report::{Audit, Check, Finding, NodeAudit, Severity};

/// Audits every node concurrently; see [`Client::audit`](crate::Client::audit).
pub(crate) async fn run(nodes: &[Arc<Node>]) -> Audit {
    // Concurrent in this task rather than spawned: dropping the audit drops
    // every probe and its connection with it.
    let observed = futures::future::join_all(nodes.iter().map(|node| observe::observe(node))).await;
    let mut audits: Vec<NodeAudit> = nodes
        .iter()
        .zip(&observed)
        .map(|(node, seen)| judge::assess(node.index(), node.addr(), seen))
        .collect();
    judge::compare_run_ids(&mut audits);
    for audit in &mut audits {
        // Stable: within one check, findings keep the order they were made.
        audit.findings.sort_by_key(|f| f.check);
    }
    Audit { nodes: audits }
}
