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

use std::time::Duration;

use crate::node::{Kind, Node};

pub use report::{Audit, Check, Finding, NodeAudit, Severity};

/// One server to visit: a plain node, or one master of a cluster node.
struct Visit {
    index: usize,
    addr: String,
    client: redis::Client,
    timeout: Duration,
    in_cluster: bool,
    /// A Sentinel node's master: what its Sentinels said.
    sentinel: Option<report::SentinelSeen>,
}

/// The servers of `node`: itself, or a cluster's masters (the slot map read
/// first, within the connect timeout). A cluster whose map cannot be read
/// is visited at its first seed, whose failure the audit then reports.
async fn visits(node: &Node) -> Vec<Visit> {
    let timeout = node.connect_timeout();
    match node.kind() {
        Kind::Server(server) => match server.sentinel() {
            None => vec![Visit {
                index: node.index(),
                addr: node.addr().to_owned(),
                client: server.redis_client(),
                timeout,
                in_cluster: false,
                sentinel: None,
            }],
            Some(group) => {
                // The master the Sentinels name now, and each one's answer.
                let (located, answers) =
                    futures::future::join(group.locate(timeout), group.survey(timeout)).await;
                let (addr, client) = match located {
                    Ok(l) => (
                        format!("{} master {}:{}", node.addr(), l.report.host, l.report.port),
                        l.client,
                    ),
                    Err(_) => (node.addr().to_owned(), server.redis_client()),
                };
                vec![Visit {
                    index: node.index(),
                    addr,
                    client,
                    timeout,
                    in_cluster: false,
                    sentinel: Some(report::SentinelSeen {
                        name: group.name().to_owned(),
                        answers,
                    }),
                }]
            }
        },
        Kind::Cluster(cluster) => {
            let _ = tokio::time::timeout(timeout, cluster.refresh(None)).await;
            let mut servers: Vec<Visit> = cluster
                .servers()
                .into_iter()
                .map(|server| Visit {
                    index: node.index(),
                    addr: format!("{} master {}", node.addr(), server.addr()),
                    client: server.redis_client(),
                    timeout,
                    in_cluster: true,
                    sentinel: None,
                })
                .collect();
            if servers.is_empty() {
                if let Some(client) = cluster.seed_client() {
                    servers.push(Visit {
                        index: node.index(),
                        addr: node.addr().to_owned(),
                        client,
                        timeout,
                        in_cluster: true,
                        sentinel: None,
                    });
                }
            }
            servers
        }
    }
}

/// Audits every node concurrently; see [`Client::audit`](crate::Client::audit).
/// A cluster node is audited master by master, each as a plain node.
pub(crate) async fn run(nodes: &[Arc<Node>]) -> Audit {
    // Concurrent in this task rather than spawned: dropping the audit drops
    // every probe and its connection with it.
    let visits: Vec<Visit> = futures::future::join_all(nodes.iter().map(|node| visits(node)))
        .await
        .into_iter()
        .flatten()
        .collect();
    let observed = futures::future::join_all(
        visits
            .iter()
            .map(|v| observe::observe(&v.client, v.timeout, v.in_cluster)),
    )
    .await;
    let mut audits: Vec<NodeAudit> = visits
        .into_iter()
        .zip(observed)
        .map(|(visit, mut seen)| {
            seen.sentinel = visit.sentinel;
            judge::assess(visit.index, &visit.addr, &seen)
        })
        .collect();
    judge::compare_run_ids(&mut audits);
    for audit in &mut audits {
        // Stable: within one check, findings keep the order they were made.
        audit.findings.sort_by_key(|f| f.check);
    }
    Audit { nodes: audits }
}
