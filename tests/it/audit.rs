//! `Client::audit` against real servers, each misconfigured the way
//! deployments quietly break Redlock: eviction, weak persistence, a
//! replica, two URLs to one server, refused credentials, a dead or frozen
//! node.

use std::time::Instant;

use redfence::{Audit, Check, Client, NodeAudit, Severity};

use crate::helpers::{assert_message_style, eventually, secs};
use crate::support::{Cluster, RedisServer, ServerOptions};

/// AOF with `appendfsync always`: the configuration the audit passes
/// without a persistence warning.
fn durable() -> ServerOptions {
    ServerOptions {
        appendonly: true,
        appendfsync_always: true,
        ..ServerOptions::default()
    }
}

/// A generous connect timeout, so a loaded machine never turns a healthy
/// node into an unreachable one. Tests of the bound set their own.
fn client(urls: impl IntoIterator<Item = String>) -> Client {
    crate::helpers::builder(urls)
        .connect_timeout(secs(5))
        .build()
        .unwrap()
}

/// Audits the nodes at `urls`, bounded so a bug cannot hang the suite.
async fn audit(urls: impl IntoIterator<Item = String>) -> Audit {
    tokio::time::timeout(secs(30), client(urls).audit())
        .await
        .expect("the audit hung")
}

/// Errors and warnings of `check` on each node, as `(index, severity)`.
fn problems(audit: &Audit, check: Check) -> Vec<(usize, Severity)> {
    audit
        .errors()
        .chain(audit.warnings())
        .filter(|(_, f)| f.check == check)
        .map(|(n, f)| (n.index, f.severity))
        .collect()
}

/// The single finding of `check` on `node`.
fn finding(node: &NodeAudit, check: Check) -> &redfence::Finding {
    let found: Vec<_> = node.findings.iter().filter(|f| f.check == check).collect();
    assert_eq!(
        found.len(),
        1,
        "{check:?} on node {}: {node:#?}",
        node.index
    );
    found[0]
}

fn assert_styled(audit: &Audit) {
    for node in &audit.nodes {
        for f in &node.findings {
            assert_message_style(&f.message);
        }
    }
}

#[tokio::test]
async fn healthy_set_with_aof_always_passes() {
    let cluster = Cluster::start_with(3, |_| durable());
    let client = client(cluster.urls());
    let audit = client.audit().await;
    assert!(audit.is_ok(), "{audit:#}");
    assert_eq!(audit.errors().count(), 0, "{audit:#}");
    for check in [
        Check::Persistence,
        Check::Eviction,
        Check::Role,
        Check::RunId,
    ] {
        assert_eq!(problems(&audit, check), [], "{audit:#}");
    }
    assert_eq!(audit.nodes.len(), 3);
    for (i, node) in audit.nodes.iter().enumerate() {
        assert_eq!(node.index, i);
        assert_eq!(node.addr, format!("127.0.0.1:{}", cluster.nodes[i].port()));
        assert!(node.reachable, "{audit:#}");
        assert_eq!(node.role.as_deref(), Some("master"));
        assert_eq!(node.maxmemory_policy.as_deref(), Some("noeviction"));
        assert_eq!(node.aof, Some(true));
        assert_eq!(node.appendfsync.as_deref(), Some("always"));
        // The harness turns RDB snapshots off.
        assert_eq!(node.rdb_save.as_deref(), Some(""));
        assert!(node.version.is_some() && node.uptime.is_some(), "{node:#?}");
        assert_eq!(finding(node, Check::Persistence).severity, Severity::Info);
    }
    let mut ids: Vec<_> = audit
        .nodes
        .iter()
        .map(|n| n.run_id.clone().unwrap())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3);
    assert_styled(&audit);

    let report = audit.to_string();
    assert!(report.starts_with("audit of 3 nodes: 0 errors"), "{report}");
    for node in &cluster.nodes {
        assert!(
            report.contains(&format!("127.0.0.1:{}", node.port())),
            "{report}"
        );
    }

    // The audit used its own connections: the client locks as before.
    let guard = client.acquire("after-audit", secs(5)).await.unwrap();
    guard.release().await;
}

/// `maxmemory-policy` set at runtime on one node: an error there only.
async fn eviction_policy_is_an_error(policy: &str) {
    let cluster = Cluster::start_with(3, |_| durable());
    cluster.nodes[1].cli(&["CONFIG", "SET", "maxmemory-policy", policy]);
    let audit = audit(cluster.urls()).await;
    assert!(!audit.is_ok(), "{audit:#}");
    assert_eq!(
        problems(&audit, Check::Eviction),
        [(1, Severity::Error)],
        "{audit:#}"
    );
    assert_eq!(audit.errors().count(), 1, "{audit:#}");
    let node = &audit.nodes[1];
    assert_eq!(node.maxmemory_policy.as_deref(), Some(policy));
    let message = &finding(node, Check::Eviction).message;
    assert!(message.contains(policy), "{message}");
    assert!(message.contains("second holder"), "{message}");
    assert!(audit.to_string().contains("error eviction"), "{audit}");
    assert_styled(&audit);
}

#[tokio::test]
async fn volatile_lru_is_an_error_on_that_node_only() {
    eviction_policy_is_an_error("volatile-lru").await;
}

#[tokio::test]
async fn allkeys_lru_is_an_error() {
    eviction_policy_is_an_error("allkeys-lru").await;
}

#[tokio::test]
async fn aof_off_is_a_warning() {
    let cluster = Cluster::start_with(3, |_| durable());
    cluster.nodes[2].cli(&["CONFIG", "SET", "appendonly", "no"]);
    let audit = audit(cluster.urls()).await;
    assert!(audit.is_ok(), "a warning is not an error: {audit:#}");
    assert_eq!(
        problems(&audit, Check::Persistence),
        [(2, Severity::Warning)],
        "{audit:#}"
    );
    let node = &audit.nodes[2];
    assert_eq!(node.aof, Some(false));
    let message = &finding(node, Check::Persistence).message;
    assert!(message.contains("forgets every lock"), "{message}");
    assert!(message.contains("longest lock TTL"), "{message}");
}

#[tokio::test]
async fn appendfsync_everysec_is_a_warning() {
    let cluster = Cluster::start_with(3, |_| durable());
    cluster.nodes[0].cli(&["CONFIG", "SET", "appendfsync", "everysec"]);
    let audit = audit(cluster.urls()).await;
    assert!(audit.is_ok(), "{audit:#}");
    assert_eq!(
        problems(&audit, Check::Persistence),
        [(0, Severity::Warning)],
        "{audit:#}"
    );
    let node = &audit.nodes[0];
    assert_eq!(
        (node.aof, node.appendfsync.as_deref()),
        (Some(true), Some("everysec"))
    );
    let message = &finding(node, Check::Persistence).message;
    assert!(message.contains("everysec"), "{message}");
    assert!(message.contains("longest lock TTL"), "{message}");
}

#[tokio::test]
async fn a_replica_is_an_error_and_its_master_is_warned() {
    let master = RedisServer::start_with(durable());
    let replica = RedisServer::start_with(ServerOptions {
        replica_of: Some(master.port()),
        ..durable()
    });
    let other = RedisServer::start_with(durable());
    // The master lists a replica once it has connected.
    assert!(
        eventually(secs(20), || master
            .cli(&["INFO", "replication"])
            .contains("connected_slaves:1"))
        .await,
        "the replica did not connect"
    );
    let audit = audit([master.url(), replica.url(), other.url()]).await;
    assert_eq!(
        problems(&audit, Check::Role),
        [(1, Severity::Error), (0, Severity::Warning)],
        "{audit:#}"
    );
    // Its master is warned: a failover to the replica forgets locks.
    let message = &finding(&audit.nodes[0], Check::Role).message;
    assert!(
        message.contains(&format!(
            "1 connected replica (127.0.0.1:{})",
            replica.port()
        )),
        "{message}"
    );
    assert!(message.contains("failover"), "{message}");
    let node = &audit.nodes[1];
    assert!(node.reachable);
    assert_eq!(node.role.as_deref(), Some("slave"));
    let message = &finding(node, Check::Role).message;
    assert!(
        message.contains(&format!("replica of 127.0.0.1:{}", master.port())),
        "{message}"
    );
    // A replica is its own process: its run_id differs from its master's.
    assert_eq!(problems(&audit, Check::RunId), [], "{audit:#}");
}

#[tokio::test]
async fn two_urls_to_one_server_share_a_run_id() {
    let shared = RedisServer::start_with(durable());
    let other = RedisServer::start_with(durable());
    let urls = [
        shared.url(),
        format!("redis://localhost:{}", shared.port()),
        other.url(),
    ];
    // Identical addresses are refused by `build`; these differ in spelling.
    let audit = audit(urls).await;
    assert_eq!(
        problems(&audit, Check::RunId),
        [(0, Severity::Error), (1, Severity::Error)],
        "{audit:#}"
    );
    assert_eq!(audit.nodes[0].run_id, audit.nodes[1].run_id);
    assert_ne!(audit.nodes[0].run_id, audit.nodes[2].run_id);
    for (i, twin) in [(0, 1), (1, 0)] {
        let message = &finding(&audit.nodes[i], Check::RunId).message;
        assert!(message.contains("same run_id"), "{message}");
        assert!(message.contains(&format!("node {twin}")), "{message}");
    }
}

/// A killed or paused node: unreachable, found within the connect timeout
/// plus a margin for a loaded machine, and the other nodes still audited.
async fn unreachable_within_bound(cluster: &Cluster, down: usize) -> Audit {
    let connect_timeout = secs(1);
    let client = crate::helpers::builder(cluster.urls())
        .connect_timeout(connect_timeout)
        .build()
        .unwrap();
    let started = Instant::now();
    let audit = tokio::time::timeout(secs(30), client.audit())
        .await
        .expect("the audit hung");
    let elapsed = started.elapsed();
    assert!(
        elapsed < connect_timeout + secs(2),
        "audit took {elapsed:?}\n{audit:#}"
    );
    assert!(!audit.is_ok());
    let node = &audit.nodes[down];
    assert!(!node.reachable, "{audit:#}");
    let unreachable = finding(node, Check::Reachable);
    assert_eq!(unreachable.severity, Severity::Error);
    assert!(
        unreachable.message.starts_with("unreachable: "),
        "{unreachable}"
    );
    // Nothing else is claimed about a node that said nothing.
    assert_eq!(node.findings.len(), 1, "{node:#?}");
    assert_eq!((node.role.as_ref(), node.clock_offset), (None, None));
    assert!(
        audit
            .to_string()
            .contains(&format!("{}): unreachable", node.addr)),
        "{audit}"
    );
    for other in audit.nodes.iter().filter(|n| n.index != down) {
        assert!(other.reachable, "{audit:#}");
    }
    audit
}

#[tokio::test]
async fn a_killed_node_is_unreachable_within_the_connect_timeout() {
    let mut cluster = Cluster::start_with(3, |_| durable());
    cluster.node(1).kill();
    unreachable_within_bound(&cluster, 1).await;
}

#[tokio::test]
async fn a_paused_node_is_unreachable_within_the_connect_timeout() {
    let mut cluster = Cluster::start_with(3, |_| durable());
    cluster.node(2).pause();
    let audit = unreachable_within_bound(&cluster, 2).await;
    cluster.node(2).resume();
    let message = &finding(&audit.nodes[2], Check::Reachable).message;
    assert!(message.contains("1s"), "names the timeout: {message}");
}

#[tokio::test]
async fn clock_offset_on_loopback_is_small() {
    let server = RedisServer::start_with(durable());
    let audit = audit([server.url()]).await;
    let node = &audit.nodes[0];
    let offset = node.clock_offset.expect("offset measured");
    // Same host, same clock: only the measurement's error (half a round
    // trip, scheduling) separates them.
    assert!(
        offset.unsigned_abs() < 1_000_000,
        "offset {offset} µs\n{audit:#}"
    );
    let rtt = node.clock_rtt.expect("round trip reported");
    assert!(rtt < secs(5), "{rtt:?}");
    assert!(node.clock_spread.is_some(), "{node:#?}");
    let clock = finding(node, Check::Clock);
    assert!(clock.message.contains("rtt"), "{clock}");
    assert!(format!("{audit}").contains(" ms (rtt "), "{audit}");
}

#[tokio::test]
async fn renamed_config_falls_back_to_info() {
    // CONFIG unavailable, as on many managed services: the policy and AOF
    // state come from INFO, appendfsync stays unknown.
    let server = RedisServer::start_with(ServerOptions {
        maxmemory_policy: Some("allkeys-lru".into()),
        extra_args: vec!["--rename-command".into(), "CONFIG".into(), String::new()],
        ..durable()
    });
    let audit = audit([server.url()]).await;
    let node = &audit.nodes[0];
    assert_eq!(
        node.maxmemory_policy.as_deref(),
        Some("allkeys-lru"),
        "{audit:#}"
    );
    assert_eq!(finding(node, Check::Eviction).severity, Severity::Error);
    assert_eq!(
        (node.aof, node.appendfsync.as_ref(), node.rdb_save.as_ref()),
        (Some(true), None, None)
    );
    let persistence = finding(node, Check::Persistence);
    assert_eq!(persistence.severity, Severity::Warning);
    assert!(
        persistence.message.contains("appendfsync is unknown"),
        "{persistence}"
    );
}

#[tokio::test]
async fn refused_credentials_are_reported() {
    let protected = || ServerOptions {
        requirepass: Some("s3cret".into()),
        ..durable()
    };
    let (a, b, c) = (
        RedisServer::start_with(protected()),
        RedisServer::start_with(protected()),
        RedisServer::start_with(protected()),
    );
    let audit = audit([
        format!("redis://:wrong@127.0.0.1:{}", a.port()),
        b.url(),
        format!("redis://:s3cret@127.0.0.1:{}", c.port()),
    ])
    .await;
    assert_eq!(
        problems(&audit, Check::Reachable),
        [(0, Severity::Error), (1, Severity::Error)],
        "{audit:#}"
    );
    // Both answered: refused, not unreachable, and nothing else judged.
    for node in &audit.nodes[..2] {
        assert!(node.reachable, "{audit:#}");
        assert_eq!(node.findings.len(), 1, "{audit:#}");
    }
    let wrong = &finding(&audit.nodes[0], Check::Reachable).message;
    assert!(wrong.starts_with("refuses the credentials"), "{wrong}");
    // No password in the URL: the connect sends none, ROLE and INFO fail.
    let missing = &finding(&audit.nodes[1], Check::Reachable).message;
    assert!(missing.starts_with("refuses the credentials"), "{missing}");
    assert!(missing.contains("NOAUTH"), "{missing}");
    // The password is never shown.
    assert!(
        !format!("{audit:#} {audit:?}").contains("wrong@"),
        "{audit:?}"
    );
    assert!(audit.nodes[2].is_ok(), "{audit:#}");
    assert_styled(&audit);
}
