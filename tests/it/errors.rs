//! Every documented error, provoked for real: configuration problems caught
//! by `build`, bad arguments caught before any I/O, and node problems that
//! retrying cannot fix (credentials, a replica, one server listed twice),
//! which must end a waiting acquire at once.

use std::time::{Duration, Instant};

use redfence::limits::{MAX_PREFIX_LEN, MAX_RESOURCE_LEN, MAX_TTL};
use redfence::{
    Client, ConfigError, Error, FailureReason, NodeErrorKind, Phase, QuorumFailure, Retry,
};

use crate::helpers::{assert_message_style, eventually, report, secs, LOCK_KEYS};
use crate::support::{Cluster, RedisServer, ServerOptions};

/// A URL where nothing listens: argument errors must come before any I/O.
const NOWHERE: &str = "redis://127.0.0.1:1";

fn config_error(urls: &[&str]) -> ConfigError {
    match crate::helpers::client(urls.iter().copied()) {
        Err(e) => {
            assert_message_style(&e.to_string());
            e
        }
        other => panic!("expected a config error for {urls:?}, got {other:?}"),
    }
}

fn build_error(builder: redfence::Builder) -> ConfigError {
    let e = builder.build().unwrap_err();
    assert_message_style(&e.to_string());
    e
}

#[test]
fn no_nodes() {
    let e = config_error(&[]);
    assert!(matches!(e, ConfigError::NoNodes), "{e:?}");
    assert_eq!(e.to_string(), "no nodes configured");
}

#[test]
fn more_than_64_nodes() {
    let urls: Vec<String> = (0..65)
        .map(|i| format!("redis://127.0.0.1:{}", 10_000 + i))
        .collect();
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    let e = config_error(&refs);
    assert!(matches!(e, ConfigError::TooManyNodes(65)), "{e:?}");
    assert_message_style(&e.to_string());
    // 64 is fine.
    assert!(crate::helpers::client(&urls[..64]).is_ok());
}

#[test]
fn unparsable_url_is_reported_with_the_password_redacted() {
    let e = config_error(&["redis://127.0.0.1:7001", "redis://:secret@[bad"]);
    let ConfigError::InvalidUrl { index, url, .. } = &e else {
        panic!("expected InvalidUrl, got {e:?}");
    };
    assert_eq!(*index, 1);
    assert_eq!(url, "redis://:***@[bad");
    let source = std::error::Error::source(&e).expect("the parser's error is the source");
    for shown in [e.to_string(), format!("{e:?}"), source.to_string()] {
        assert!(!shown.contains("secret"), "password leaked: {shown}");
    }
    assert!(e.to_string().contains("node 1"), "{e}");

    for bad in [
        "not a url",
        "http://127.0.0.1:6379",
        "redis://127.0.0.1:6379/notadb",
    ] {
        let e = config_error(&[bad]);
        assert!(
            matches!(e, ConfigError::InvalidUrl { index: 0, .. }),
            "{bad}: {e:?}"
        );
    }
}

/// A socket URL carries its password in the query (`?pass=`), a TLS URL in
/// its userinfo; the error's URL is documented as redacted. (With the `tls`
/// feature, `tests/it/tls.rs` checks the TLS errors' redaction.)
#[cfg(not(feature = "tls"))]
#[test]
fn unsupported_url_is_redacted_too() {
    let e = config_error(&["rediss://u:hunter2@127.0.0.1:6379/?pass=hunter2"]);
    assert!(matches!(e, ConfigError::UnsupportedUrl { .. }), "{e:?}");
    for shown in [e.to_string(), format!("{e:?}")] {
        assert!(!shown.contains("hunter2"), "password leaked: {shown}");
    }
}

/// `UnsupportedUrl` documents "TLS without the feature" as one of its
/// cases; this build has no TLS feature.
#[cfg(not(feature = "tls"))]
#[test]
fn tls_url_without_the_feature_is_unsupported() {
    let e = config_error(&["rediss://127.0.0.1:6379"]);
    assert!(
        matches!(e, ConfigError::UnsupportedUrl { index: 0, .. }),
        "expected UnsupportedUrl as documented, got {e:?} ({e})"
    );
}

#[test]
fn duplicate_nodes_are_refused() {
    let e = config_error(&[
        "redis://127.0.0.1:7001",
        "redis://127.0.0.1:7002",
        "redis://127.0.0.1:7001",
    ]);
    match &e {
        ConfigError::DuplicateNode {
            addr,
            first: 0,
            second: 2,
        } => assert_eq!(addr, "127.0.0.1:7001"),
        other => panic!("expected DuplicateNode, got {other:?}"),
    }
    assert_eq!(e.to_string(), "node 2 (127.0.0.1:7001) duplicates node 0");

    // Spelling differences that name the same address are still duplicates:
    // host case, explicit db 0, credentials (never shown).
    for (a, b) in [
        ("redis://LocalHost:7001", "redis://localhost:7001"),
        ("redis://127.0.0.1:7001/0", "redis://127.0.0.1:7001"),
        ("redis://:pw@127.0.0.1:7001", "redis://127.0.0.1:7001"),
    ] {
        let e = config_error(&[a, b]);
        assert!(
            matches!(
                e,
                ConfigError::DuplicateNode {
                    first: 0,
                    second: 1,
                    ..
                }
            ),
            "{a} {b}: {e:?}"
        );
        assert!(!e.to_string().contains("pw"), "{e}");
    }
}

#[tokio::test]
async fn invalid_ttls_are_refused_before_any_io() {
    let client = crate::helpers::client([NOWHERE]).unwrap();
    for ttl in [
        Duration::ZERO,
        Duration::from_micros(500),
        Duration::MAX,
        MAX_TTL + secs(1),
    ] {
        let started = Instant::now();
        let err = client.acquire("r", ttl).await.unwrap_err();
        assert!(
            matches!(err, Error::InvalidTtl { ttl: t, .. } if t == ttl),
            "{ttl:?}: {err:?}"
        );
        assert_message_style(&err.to_string());
        let err = client.try_acquire("r", ttl).await.unwrap_err();
        assert!(matches!(err, Error::InvalidTtl { .. }), "{err:?}");
        let err = client.with_lock("r", ttl, |_| async {}).await.unwrap_err();
        assert!(matches!(err, Error::InvalidTtl { .. }), "{err:?}");
        assert!(
            started.elapsed() < secs(1),
            "validation waited for the network"
        );
    }
    let err = client.acquire("r", Duration::ZERO).await.unwrap_err();
    assert_eq!(err.to_string(), "invalid ttl 0ns: must be at least 1 ms");
    let err = client.acquire("r", MAX_TTL + secs(1)).await.unwrap_err();
    assert!(err.to_string().contains("MAX_TTL"), "{err}");
}

#[tokio::test]
async fn extend_with_an_invalid_ttl_is_refused_and_keeps_the_lock() {
    let cluster = Cluster::start(1);
    let client = crate::helpers::client(cluster.urls()).unwrap();
    let guard = client.acquire("r", secs(10)).await.unwrap();
    let until = guard.valid_until();
    for ttl in [Duration::ZERO, Duration::MAX] {
        let err = guard.extend(ttl).await.unwrap_err();
        assert!(matches!(err, Error::InvalidTtl { .. }), "{err:?}");
    }
    assert_eq!(guard.valid_until(), until);
    assert_eq!(cluster.count_keys(LOCK_KEYS), vec![1]);
    guard.release().await;
}

#[tokio::test]
async fn the_longest_ttl_is_accepted() {
    let cluster = Cluster::start(1);
    let client = crate::helpers::client(cluster.urls()).unwrap();
    let guard = client.acquire("year", MAX_TTL).await.unwrap();
    assert!(guard.validity() > MAX_TTL - MAX_TTL / 50);
    guard.release().await;
}

#[test]
fn drift_factor_outside_zero_to_one() {
    for factor in [1.0, -0.1, f64::NAN, f64::INFINITY] {
        let e = build_error(crate::helpers::builder([NOWHERE]).drift_factor(factor));
        assert!(matches!(e, ConfigError::DriftFactor(_)), "{factor}: {e:?}");
    }
    let e = build_error(crate::helpers::builder([NOWHERE]).drift_factor(1.0));
    assert_eq!(e.to_string(), "drift factor 1 is outside [0, 1)");
    assert!(crate::helpers::builder([NOWHERE])
        .drift_factor(0.0)
        .build()
        .is_ok());
}

#[test]
fn zero_durations() {
    let cases = [
        (
            crate::helpers::builder([NOWHERE]).node_timeout(Duration::ZERO),
            "node timeout",
        ),
        (
            crate::helpers::builder([NOWHERE]).connect_timeout(Duration::ZERO),
            "connect timeout",
        ),
        (
            crate::helpers::builder([NOWHERE]).reconnect_backoff_max(Duration::ZERO),
            "reconnect backoff",
        ),
    ];
    for (builder, name) in cases {
        let e = build_error(builder);
        assert!(
            matches!(e, ConfigError::ZeroDuration(n) if n == name),
            "{e:?}"
        );
        assert_eq!(e.to_string(), format!("{name} must be greater than zero"));
    }
}

#[test]
fn durations_longer_than_a_year() {
    let b = || crate::helpers::builder([NOWHERE]);
    let over = MAX_TTL + Duration::from_secs(1);
    let cases = [
        (b().node_timeout(over), "node timeout"),
        (b().connect_timeout(Duration::MAX), "connect timeout"),
        (b().reconnect_backoff_max(over), "reconnect backoff"),
        (b().min_validity(over), "min validity"),
    ];
    for (builder, name) in cases {
        let e = build_error(builder);
        assert!(
            matches!(e, ConfigError::DurationTooLong { name: n, max, .. } if n == name && max == MAX_TTL),
            "{e:?}"
        );
        assert!(e.to_string().starts_with(name), "{e}");
    }
    // A year exactly is accepted.
    assert!(b()
        .node_timeout(MAX_TTL)
        .min_validity(MAX_TTL)
        .build()
        .is_ok());
}

#[test]
fn prefix_too_long() {
    let e =
        build_error(crate::helpers::builder([NOWHERE]).key_prefix("p".repeat(MAX_PREFIX_LEN + 1)));
    assert!(
        matches!(e, ConfigError::PrefixTooLong(n) if n == MAX_PREFIX_LEN + 1),
        "{e:?}"
    );
    assert!(crate::helpers::builder([NOWHERE])
        .key_prefix(longest_prefix())
        .build()
        .is_ok());
}

/// A valid prefix of the largest length: it must end with `:`.
fn longest_prefix() -> String {
    format!("{}:", "p".repeat(MAX_PREFIX_LEN - 1))
}

#[tokio::test]
async fn invalid_resource_names() {
    let client = crate::helpers::client([NOWHERE]).unwrap();
    let long = "r".repeat(MAX_RESOURCE_LEN + 1);
    for resource in ["", long.as_str()] {
        let err = client.acquire(resource, secs(1)).await.unwrap_err();
        assert!(matches!(err, Error::InvalidResource(_)), "{err:?}");
        assert_message_style(&err.to_string());
        let err = client.try_acquire(resource, secs(1)).await.unwrap_err();
        assert!(matches!(err, Error::InvalidResource(_)), "{err:?}");
    }
    let err = client.acquire("", secs(1)).await.unwrap_err();
    assert_eq!(err.to_string(), "invalid resource name: must not be empty");
}

/// The longest name works end to end, under a long prefix too.
#[tokio::test]
async fn longest_resource_name_locks() {
    let cluster = Cluster::start(1);
    let client = crate::helpers::builder(cluster.urls())
        .key_prefix(longest_prefix())
        .build()
        .unwrap();
    let name = "r".repeat(MAX_RESOURCE_LEN);
    let guard = client.acquire(&name, secs(5)).await.unwrap();
    assert_eq!(guard.resource(), name);
    let key = format!("{}lock:{name}", longest_prefix());
    assert_ne!(cluster.nodes[0].cli(&["GET", &key]), "(nil)");
    guard.release().await;
    assert_eq!(cluster.nodes[0].cli(&["EXISTS", &key]), "0");
}

/// Checks a quorum failure that a permanent node problem ended after one
/// attempt, well before the retry deadline.
fn assert_gave_up_at_once(err: &Error, started: Instant) -> &QuorumFailure {
    let Error::NotAcquired(q) = err else {
        panic!("expected NotAcquired, got {err:?}");
    };
    assert_eq!(q.attempts, 1, "retried a permanent failure: {err}");
    assert!(
        started.elapsed() < secs(3),
        "waited {:?} for a permanent failure: {err}",
        started.elapsed()
    );
    assert_eq!(q.reason, FailureReason::Unavailable, "{err}");
    assert_message_style(&err.to_string());
    q
}

/// A waiting acquire with a deadline long enough that giving up "at once"
/// cannot be confused with reaching it.
fn patient(client: &Client, resource: &str) -> redfence::LockRequest {
    client
        .lock(resource, secs(5))
        .retry(Retry::new().with_max_wait(secs(6)))
}

/// Two URLs for one server (`127.0.0.1:P` and `localhost:P`) pass `build`
/// but must not both vote. With N = 2 the quorum needs both: impossible for
/// good, so the wait ends at once.
#[tokio::test]
async fn same_server_twice_cannot_reach_a_quorum_of_two() {
    let server = RedisServer::start();
    let alias = format!("redis://localhost:{}", server.port());
    let client = crate::helpers::client_with_timeout([server.url(), alias], secs(1));
    let started = Instant::now();
    let err = patient(&client, "twice").acquire().await.unwrap_err();
    let q = assert_gave_up_at_once(&err, started);
    assert_eq!((q.quorum, q.nodes), (2, 2));
    let same: Vec<_> = q
        .failures
        .iter()
        .filter_map(|f| match &f.kind {
            NodeErrorKind::SameServer { other, run_id } => Some((f.index, *other, run_id.clone())),
            NodeErrorKind::Backoff { last, .. } => match &**last {
                NodeErrorKind::SameServer { other, run_id } => {
                    Some((f.index, *other, run_id.clone()))
                }
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert_eq!(same.len(), 1, "{err}");
    let (index, other, run_id) = &same[0];
    assert_eq!(*index + *other, 1, "the two nodes name each other: {err}");
    let info = server.cli(&["INFO", "server"]);
    assert!(info.contains(&format!("run_id:{run_id}")), "{err}");
    assert!(report(&err).contains("same server as node"), "{err}");
    // The attempt's key on the one server was cleaned up.
    assert!(eventually(secs(2), || server.count_keys(LOCK_KEYS) == 0).await);
}

/// With [A, A', B] the real quorum of 2 is still reachable (A and B), and the
/// alias is reported as `SameServer` rather than voting.
#[tokio::test]
async fn same_server_alias_does_not_vote() {
    let a = RedisServer::start();
    let b = RedisServer::start();
    // Different db numbers defeat the build-time duplicate check; the run_id
    // check still sees one server.
    let alias = format!("redis://127.0.0.1:{}/1", a.port());
    // Without fencing the lock key is the only key, so the keyspace per db
    // shows which URL wrote.
    let client = crate::helpers::builder([a.url(), alias, b.url()])
        .node_timeout(secs(1))
        .fencing(false)
        .build()
        .unwrap();
    assert_eq!(client.quorum(), 2);
    let guard = client.acquire("alias", secs(10)).await.unwrap();
    // Exactly one of the two URLs wrote to server A (db 0 or db 1).
    let keyspace = a.cli(&["INFO", "keyspace"]);
    assert_eq!(keyspace.matches("keys=1,").count(), 1, "{keyspace}");
    guard.release().await;
    assert!(eventually(secs(2), || !a.cli(&["INFO", "keyspace"]).contains("keys=")).await);

    // Block B with a foreign value: now the alias's vote would decide, and
    // the failure must name it.
    let key = crate::helpers::lock_key("alias");
    b.cli(&["SET", &key, "other", "PX", "10000"]);
    let err = client.try_acquire("alias", secs(10)).await.unwrap_err();
    let q = err.quorum_failure().unwrap();
    assert!(q.granted <= 1, "{err}");
    assert!(
        q.failures
            .iter()
            .any(|f| f.index == 2 && matches!(f.kind, NodeErrorKind::HeldByOther { .. })),
        "{err}"
    );
    let alias_failure = q
        .failures
        .iter()
        .find(|f| f.kind.is_permanent())
        .unwrap_or_else(|| panic!("no SameServer failure: {err}"));
    assert!(alias_failure.index < 2, "{err}");
    assert!(
        alias_failure.to_string().contains("same server as node"),
        "{alias_failure}"
    );
    assert!(eventually(secs(2), || !a.cli(&["INFO", "keyspace"]).contains("keys=")).await);
}

/// A replica cannot vote: `NotMaster`, permanent.
#[tokio::test]
async fn replica_is_not_a_master() {
    let master = RedisServer::start();
    let replica = RedisServer::start_with(ServerOptions {
        replica_of: Some(master.port()),
        ..ServerOptions::default()
    });
    let client = crate::helpers::client([replica.url()]).unwrap();
    let started = Instant::now();
    let err = patient(&client, "replica").acquire().await.unwrap_err();
    let q = assert_gave_up_at_once(&err, started);
    assert_eq!(q.failures.len(), 1, "{err}");
    let f = &q.failures[0];
    assert_eq!(f.addr, format!("127.0.0.1:{}", replica.port()));
    assert!(
        matches!(&f.kind, NodeErrorKind::NotMaster { role } if role == "slave"),
        "{err}"
    );
    assert!(report(&err).contains(&f.addr), "{err}");
    assert!(report(&err).contains("not a master"), "{err}");

    // Next to two masters the replica's vote is simply missing.
    let m2 = RedisServer::start();
    let client = crate::helpers::client([master.url(), replica.url(), m2.url()]).unwrap();
    let guard = client.acquire("replica", secs(5)).await.unwrap();
    guard.release().await;
}

/// A node in cluster mode cannot vote: `ClusterMode`, permanent, at
/// connect (before the `CROSSSLOT` and `MOVED` replies a lock's scripts
/// would get). Next to two standalone masters its vote is missing.
#[tokio::test]
async fn a_cluster_mode_node_is_refused_at_connect() {
    let node = RedisServer::start_with(ServerOptions {
        extra_args: ["--cluster-enabled", "yes"].map(String::from).to_vec(),
        ..ServerOptions::default()
    });
    assert!(node.cli(&["INFO", "server"]).contains("redis_mode:cluster"));
    let client = crate::helpers::client([node.url()]).unwrap();
    let started = Instant::now();
    let err = patient(&client, "in-a-cluster")
        .acquire()
        .await
        .unwrap_err();
    let q = assert_gave_up_at_once(&err, started);
    assert_eq!(q.failures.len(), 1, "{err}");
    let f = &q.failures[0];
    assert!(matches!(f.kind, NodeErrorKind::ClusterMode), "{err}");
    assert!(f.kind.is_permanent());
    assert!(report(&err).contains("cluster mode"), "{err}");
    assert_eq!(node.count_keys("*"), 0, "nothing was written");

    let (m1, m2) = (RedisServer::start(), RedisServer::start());
    let client = crate::helpers::client([m1.url(), node.url(), m2.url()]).unwrap();
    let guard = client.acquire("in-a-cluster", secs(5)).await.unwrap();
    assert!(guard.token().is_some());
    guard.release().await;
}

fn auth_failure(err: &Error) -> &redfence::NodeFailure {
    let q = err.quorum_failure().unwrap_or_else(|| panic!("{err:?}"));
    q.failures
        .iter()
        .find(|f| {
            matches!(&f.kind, NodeErrorKind::Auth(_))
                || matches!(&f.kind, NodeErrorKind::Backoff { last, .. } if matches!(**last, NodeErrorKind::Auth(_)))
        })
        .unwrap_or_else(|| panic!("no Auth failure in {err}"))
}

async fn assert_auth_fails(urls: Vec<String>, addr: &str) {
    let client = crate::helpers::client(urls).unwrap();
    let started = Instant::now();
    let err = patient(&client, "auth").acquire().await.unwrap_err();
    assert_gave_up_at_once(&err, started);
    let f = auth_failure(&err);
    assert_eq!(f.addr, addr);
    let message = report(&err);
    assert!(message.contains(addr), "{message}");
    assert!(message.contains("authentication failed"), "{message}");
    assert!(
        !message.contains("hunter2") && !message.contains("s3cret"),
        "{message}"
    );
    // try_acquire reports it as an error, not as "held by someone else".
    let err = client.try_acquire("auth", secs(5)).await.unwrap_err();
    auth_failure(&err);
}

fn password_protected() -> RedisServer {
    RedisServer::start_with(ServerOptions {
        requirepass: Some(String::from("s3cret")),
        ..ServerOptions::default()
    })
}

#[tokio::test]
async fn wrong_password() {
    let server = password_protected();
    let port = server.port();
    let addr = format!("127.0.0.1:{port}");
    assert_auth_fails(vec![format!("redis://:hunter2@127.0.0.1:{port}")], &addr).await;
}

/// No password for a server that requires one: the server answers the
/// handshake with `NOAUTH`, which is as permanent as a wrong password.
#[tokio::test]
async fn missing_password() {
    let server = password_protected();
    let addr = format!("127.0.0.1:{}", server.port());
    assert_auth_fails(vec![server.url()], &addr).await;
}

#[tokio::test]
async fn correct_password() {
    let server = password_protected();
    let port = server.port();
    let client = crate::helpers::client([format!("redis://:s3cret@127.0.0.1:{port}")]).unwrap();
    let guard = client.acquire("auth", secs(5)).await.unwrap();
    assert_eq!(server.count_keys(LOCK_KEYS), 1);
    let released = guard.release().await;
    assert_eq!(released.confirmed, 1);
    assert_eq!(server.count_keys(LOCK_KEYS), 0);
}

#[tokio::test]
async fn acl_user_wrong_password() {
    let server = RedisServer::start_with(ServerOptions {
        acl_user: Some((String::from("alice"), String::from("s3cret"))),
        ..ServerOptions::default()
    });
    let port = server.port();
    let addr = format!("127.0.0.1:{port}");
    assert_auth_fails(
        vec![format!("redis://alice:hunter2@127.0.0.1:{port}")],
        &addr,
    )
    .await;
    assert_auth_fails(vec![format!("redis://bob:s3cret@127.0.0.1:{port}")], &addr).await;

    let client =
        crate::helpers::client([format!("redis://alice:s3cret@127.0.0.1:{port}")]).unwrap();
    let guard = client.acquire("acl", secs(5)).await.unwrap();
    assert_eq!(server.count_keys(LOCK_KEYS), 1);
    guard.release().await;
    assert_eq!(server.count_keys(LOCK_KEYS), 0);
}

/// Wrong credentials on one node of three cost only that node's vote;
/// on two of three the acquire stops at once.
#[tokio::test]
async fn wrong_password_on_a_minority_and_on_a_majority() {
    let cluster = Cluster::start_with(3, |_| ServerOptions {
        requirepass: Some(String::from("s3cret")),
        ..ServerOptions::default()
    });
    let url =
        |i: usize, pass: &str| format!("redis://:{pass}@127.0.0.1:{}", cluster.nodes[i].port());
    let client =
        crate::helpers::client([url(0, "s3cret"), url(1, "s3cret"), url(2, "hunter2")]).unwrap();
    let guard = client.acquire("minority", secs(5)).await.unwrap();
    guard.release().await;

    let client =
        crate::helpers::client([url(0, "s3cret"), url(1, "hunter2"), url(2, "hunter2")]).unwrap();
    let started = Instant::now();
    let err = patient(&client, "majority").acquire().await.unwrap_err();
    let q = assert_gave_up_at_once(&err, started);
    assert!(
        q.failures.iter().filter(|f| f.kind.is_permanent()).count() >= 2,
        "{err}"
    );
    assert_eq!(q.phase, Phase::Acquire);
    assert!(eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
}

/// Per-node failures name the node, and the whole message keeps the style.
#[tokio::test]
async fn failure_messages_name_the_nodes() {
    let cluster = Cluster::start(3);
    let dead = format!("127.0.0.1:{}", cluster.nodes[2].port());
    let mut cluster = cluster;
    cluster.node(1).kill();
    cluster.node(2).kill();
    let client = crate::helpers::client(cluster.urls()).unwrap();
    let err = client
        .lock("named", secs(5))
        .retry(Retry::once())
        .acquire()
        .await
        .unwrap_err();
    let message = report(&err);
    assert_message_style(&message);
    assert!(
        message.starts_with(
            "lock on \"named\" not acquired: acquire of \"named\" failed: too many nodes unavailable"
        ),
        "{message}"
    );
    assert!(message.contains(&dead), "{message}");
    assert!(message.contains("quorum 2"), "{message}");
    for f in err.node_failures() {
        assert!(f.to_string().starts_with(&f.addr), "{f}");
        assert!(!f.addr.contains("redis://"), "{f}");
    }
}

/// A TTL that clock drift plus `min_validity` use up entirely is refused
/// before any I/O.
#[tokio::test]
async fn ttl_without_room_for_validity_is_invalid() {
    let client = crate::helpers::builder([NOWHERE])
        .min_validity(secs(20))
        .build()
        .unwrap();
    let err = client.acquire("too-short", secs(10)).await.unwrap_err();
    assert!(matches!(err, Error::InvalidTtl { .. }), "{err}");
    assert_message_style(&err.to_string());
    // 2 ms is all drift (TTL × 0.01 + 2 ms > 2 ms), even with no minimum.
    let plain = crate::helpers::client([NOWHERE]).unwrap();
    let err = plain
        .try_acquire("tiny", Duration::from_millis(2))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidTtl { .. }), "{err}");
}

/// A node that refuses the write (out of memory under `noeviction`) is a
/// failed vote with Redis's error; a majority of them fails the acquire.
#[tokio::test]
async fn redis_error_replies_are_reported() {
    let cluster = Cluster::start(3);
    for node in &cluster.nodes[..2] {
        assert_eq!(node.cli(&["CONFIG", "SET", "maxmemory", "1"]), "OK");
    }
    let client = crate::helpers::client(cluster.urls()).unwrap();
    let err = client
        .lock("oom", secs(10))
        .retry(Retry::once())
        .acquire()
        .await
        .unwrap_err();
    let redis_errors: Vec<_> = err
        .node_failures()
        .iter()
        .filter(|f| matches!(f.kind, NodeErrorKind::Redis(_)))
        .collect();
    assert_eq!(redis_errors.len(), 2, "{err}");
    assert!(report(&err).contains("OOM"), "{err}");
    assert!(err.is_unavailable(), "{err}");
    for node in &cluster.nodes[..2] {
        assert_eq!(node.cli(&["CONFIG", "SET", "maxmemory", "0"]), "OK");
    }
    // Healthy again: the lock works.
    client
        .acquire("oom", secs(10))
        .await
        .unwrap()
        .release()
        .await;
}

/// The `NoPermission` failure of `err` (directly, or as the back-off's
/// last failure).
fn no_permission(err: &Error) -> String {
    let q = err.quorum_failure().unwrap_or_else(|| panic!("{err:?}"));
    q.failures
        .iter()
        .find_map(|f| match &f.kind {
            NodeErrorKind::NoPermission { denied, .. } => Some(denied.clone()),
            NodeErrorKind::Backoff { last, .. } => match &**last {
                NodeErrorKind::NoPermission { denied, .. } => Some(denied.clone()),
                _ => None,
            },
            _ => None,
        })
        .unwrap_or_else(|| panic!("no NoPermission failure in {err}"))
}

/// An ACL user that authenticates but may not do one thing the client
/// needs gets `NoPermission` naming the command, not "authentication
/// failed"; it is permanent (the wait ends at once), the password never
/// shows, and a script that ran part way leaves no lock key behind.
#[tokio::test]
async fn a_user_missing_a_permission_gets_no_permission_naming_the_command() {
    let server = RedisServer::start();
    let port = server.port();
    // (ACL rules after `+@all`, fencing, what the failure must name.)
    // The fenced first attempt goes as a transaction on a plain TCP
    // connection (`wire::transacted`), its commands refused one by one;
    // `-multi` runs its SET and INCR outside any transaction, and `-exec`
    // leaves the connection inside MULTI (given up: the next attempt
    // reconnects and is refused the same way, not answered `QUEUED`).
    let cases: [(&[&str], bool, &str); 7] = [
        (&["-set"], false, "run SET"),
        (&["-incr"], true, "run INCR"),
        (&["-multi"], true, "run MULTI"),
        (&["-exec"], true, "run EXEC"),
        (&["-info"], true, "run INFO"),
        (
            &["resetkeys", "~orders:*"],
            false,
            "access a key of SET outside the user's key patterns",
        ),
        (
            &["resetkeys", "~redfence:lock:*"],
            true,
            "access a key of the acquire transaction (MULTI/EXEC) outside the user's key patterns",
        ),
    ];
    for (i, (rules, fencing, names)) in cases.into_iter().enumerate() {
        let user = format!("limited{i}");
        let mut acl = vec![
            "ACL",
            "SETUSER",
            &user,
            "on",
            ">pa55word",
            "~*",
            "&*",
            "+@all",
        ];
        acl.extend_from_slice(rules);
        assert_eq!(server.cli(&acl), "OK", "{rules:?}");
        let url = format!("redis://{user}:pa55word@127.0.0.1:{port}");
        let client = crate::helpers::builder([url])
            .fencing(fencing)
            .build()
            .unwrap();
        // Twice: the second attempt is refused the same way.
        let mut err = None;
        for _ in 0..2 {
            let started = Instant::now();
            let e = patient(&client, "perm").acquire().await.unwrap_err();
            assert_gave_up_at_once(&e, started);
            assert_eq!(no_permission(&e), names, "{rules:?}: {e}");
            err = Some(e);
        }
        let err = err.expect("two attempts");
        let message = report(&err);
        assert!(
            message.contains(&format!("no permission to {names}")),
            "{message}"
        );
        assert!(!message.contains("authentication failed"), "{message}");
        assert!(!message.contains("pa55word"), "{message}");
        assert!(
            eventually(secs(2), || server.count_keys(LOCK_KEYS) == 0).await,
            "{rules:?}: a lock key was left behind"
        );
    }
    // The negative control: the same user with every permission locks.
    let all = ["ACL", "SETUSER", "limited1", "+incr"];
    assert_eq!(server.cli(&all), "OK");
    let url = format!("redis://limited1:pa55word@127.0.0.1:{port}");
    let client = crate::helpers::client([url]).unwrap();
    let guard = client.acquire("perm", secs(5)).await.unwrap();
    assert!(guard.token().is_some());
    guard.release().await;
}

/// The re-exported `redis` is the crate whose errors node failures carry:
/// a user downcasts the `source()` with the version they name through us.
#[tokio::test]
async fn node_failures_carry_errors_of_the_reexported_redis() {
    let server = RedisServer::start_with(ServerOptions {
        requirepass: Some(String::from("s3cret")),
        ..ServerOptions::default()
    });
    let client = crate::helpers::client([server.url()]).unwrap();
    let err = client.try_acquire("reexport", secs(5)).await.unwrap_err();
    let kind = &err.node_failures()[0].kind;
    let source = std::error::Error::source(kind).expect("a redis error");
    // Shared behind an `Arc` (node failures are `Clone`).
    let redis_error = source
        .downcast_ref::<std::sync::Arc<redfence::redis::RedisError>>()
        .expect("the source is a redfence::redis::RedisError");
    assert_eq!(redis_error.code(), Some("NOAUTH"), "{redis_error}");
}

/// Nodes given as the `redis::ConnectionInfo` a service already has
/// (credentials and database in its settings, not in a URL), mixed with
/// URLs: the client locks with them, names them without credentials, and
/// a wrong password in one is `Auth` like in a URL.
#[tokio::test]
async fn nodes_from_connection_info() {
    use redfence::redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| {
            RedisServer::start_with(ServerOptions {
                acl_user: Some((String::from("svc"), String::from("s3cret"))),
                ..ServerOptions::default()
            })
        })
        .collect();
    let info = |s: &RedisServer, password: &str| -> ConnectionInfo {
        let info = s.url().into_connection_info().unwrap();
        let settings = info
            .redis_settings()
            .clone()
            .set_username("svc")
            .set_password(password)
            .set_db(1);
        info.set_redis_settings(settings)
    };
    let specs: Vec<redfence::NodeSpec> = vec![
        info(&servers[0], "s3cret").into(),
        info(&servers[1], "s3cret").into(),
        format!("redis://svc:s3cret@127.0.0.1:{}/1", servers[2].port()).into(),
    ];
    let shown = format!("{specs:?}");
    assert!(!shown.contains("s3cret"), "{shown}");
    let client = crate::helpers::client(specs).unwrap();
    let guard = client.acquire("from-info", secs(5)).await.unwrap();
    assert!(guard.token().is_some());
    // On a majority (a node whose connect was still going when the round
    // was decided was not sent the SET), and in database 1.
    let in_db1 = || {
        servers
            .iter()
            .filter(|s| s.cli(&["INFO", "keyspace"]).contains("db1:keys="))
            .count()
    };
    assert!(
        in_db1() >= 2,
        "the lock is in database 1 on {} nodes",
        in_db1()
    );
    guard.release().await;

    // A wrong password in a ConnectionInfo: Auth, named by its address.
    let bad = info(&servers[0], "hunter2");
    assert!(matches!(bad.addr(), ConnectionAddr::Tcp(..)));
    let client = crate::helpers::client([bad]).unwrap();
    let err = client.try_acquire("from-info", secs(5)).await.unwrap_err();
    let f = auth_failure(&err);
    assert_eq!(f.addr, format!("127.0.0.1:{}/1", servers[0].port()));
    assert!(!report(&err).contains("hunter2"), "{err}");
}
