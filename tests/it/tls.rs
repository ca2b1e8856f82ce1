//! TLS nodes (`rediss://`, feature `tls`) against real redis-servers started
//! with `--port 0 --tls-port P` and certificates made at test time
//! (`support/certs.rs`): the lock, its tokens, waiting by notification, the
//! audit and the fenced store over TLS and mutual TLS; and every way a
//! handshake can fail gives a typed `Tls` node error within the connect
//! timeout, naming the node and nothing secret.

use std::time::{Duration, Instant};

use redfence::{Client, ConfigError, Error, FencedStore, NodeErrorKind, RestartGuard, Retry, Tls};

use crate::helpers::{eventually, hand_over_by_notice, ms, report, secs, LOCK_KEYS};
use crate::support::certs::{certs, Identity};
use crate::support::cluster::RedisCluster;
use crate::support::{RedisServer, ServerOptions, ServerTls};

fn tls_server(tls: ServerTls) -> RedisServer {
    RedisServer::start_with(ServerOptions {
        tls: Some(tls),
        ..ServerOptions::default()
    })
}

fn trusting_ca() -> Tls {
    Tls::new().root_ca_pem(certs().ca_pem.clone())
}

fn with_client_cert(identity: &Identity) -> Tls {
    trusting_ca().client_identity_pem(identity.cert_pem.clone(), identity.key_pem.clone())
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

fn client(urls: Vec<String>, tls: Tls) -> Client {
    Client::builder(urls)
        .tls(tls)
        .node_timeout(ms(500))
        .connect_timeout(CONNECT_TIMEOUT)
        .restart_guard(RestartGuard::off())
        .build()
        .unwrap()
}

/// Lock, token, extend, waiting by notification (its subscription is a
/// second TLS connection per node), release; the keys are where they
/// should be, read over each server's Unix socket.
async fn lock_fence_and_wake(servers: &[RedisServer], tls: Tls) {
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    assert!(urls.iter().all(|u| u.starts_with("rediss://")), "{urls:?}");
    let holder = client(urls.clone(), tls.clone());
    let guard = holder.acquire("tls", secs(30)).await.unwrap();
    let first = guard.token().expect("a token");
    guard.extend(secs(30)).await.unwrap();
    // A majority holds the key (a node whose TLS connect was still going
    // when the round was decided was not sent the SET).
    let holding = || {
        servers
            .iter()
            .filter(|s| s.count_keys(LOCK_KEYS) == 1)
            .count()
    };
    assert!(holding() >= 2, "the key is on {} nodes", holding());
    let (second, after, released) = hand_over_by_notice(guard, client(urls, tls)).await;
    assert!(released.confirmed >= 2, "{released:?}");
    assert!(after < secs(5), "woken {after:?} after the release");
    assert!(second.token().expect("a token") > first);
    second.release().await;
    for s in servers {
        assert!(eventually(secs(2), || s.count_keys(LOCK_KEYS) == 0).await);
    }
}

#[tokio::test]
async fn tls_nodes_with_a_private_ca_lock_fence_and_wake_waiters() {
    let servers: Vec<RedisServer> = (0..3).map(|_| tls_server(certs().server())).collect();
    lock_fence_and_wake(&servers, trusting_ca()).await;
}

#[tokio::test]
async fn mutual_tls_with_a_client_certificate() {
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| tls_server(certs().mutual_server()))
        .collect();
    lock_fence_and_wake(&servers, with_client_cert(&certs().client)).await;
}

/// The failure of one acquire on a single node, and how long it took.
async fn refused(url: String, tls: Tls) -> (redfence::NodeFailure, Duration) {
    let client = Client::builder([url])
        .tls(tls)
        .connect_timeout(CONNECT_TIMEOUT)
        // Would retry for 20 s if the failure were not known permanent.
        .retry(Retry::new().with_max_wait(secs(20)))
        .restart_guard(RestartGuard::off())
        .build()
        .unwrap();
    let started = Instant::now();
    let e = client.acquire("tls", secs(10)).await.unwrap_err();
    let took = started.elapsed();
    let Error::NotAcquired(failure) = &e else {
        panic!("expected NotAcquired, got {e:?}");
    };
    let node = failure
        .failures
        .first()
        .cloned()
        .unwrap_or_else(|| panic!("no node failure in {}", report(&e)));
    (node, took)
}

/// The TLS error's reason, also when the last attempt met the back-off
/// that an earlier attempt's TLS error started (a connect that outlasts
/// the node timeout is reported by the next attempt).
fn tls_reason(kind: &NodeErrorKind) -> Option<&str> {
    match kind {
        NodeErrorKind::Tls { reason } => Some(reason),
        NodeErrorKind::Backoff { last, .. } => tls_reason(last),
        _ => None,
    }
}

fn assert_tls_refusal(node: &redfence::NodeFailure, took: Duration, says: &str, port: u16) {
    let shown = node.to_string();
    assert!(
        tls_reason(&node.kind).is_some_and(|reason| reason.contains(says)),
        "expected a TLS error saying {says:?}, got {shown}"
    );
    assert!(node.kind.is_permanent());
    assert!(
        shown.contains(&format!("127.0.0.1:{port}")),
        "the node is named: {shown}"
    );
    // Permanent, so no retry until the acquire's 20 s: one connect at most.
    assert!(took < CONNECT_TIMEOUT + secs(1), "took {took:?}: {shown}");
}

#[tokio::test]
async fn a_server_signed_by_another_ca_is_a_tls_error() {
    let server = tls_server(certs().server());
    let (node, took) = refused(
        server.url(),
        Tls::new().root_ca_pem(certs().other_ca_pem.clone()),
    )
    .await;
    assert_tls_refusal(
        &node,
        took,
        "not signed by a CA this client trusts",
        server.port(),
    );
}

/// The audit's own connections use the same TLS settings, and an untrusted
/// server is reported, within the connect timeout, as what it is.
#[tokio::test]
async fn the_audit_reports_an_untrusted_server() {
    let server = tls_server(certs().server());
    let client = Client::builder([server.url()])
        .tls(Tls::new().root_ca_pem(certs().other_ca_pem.clone()))
        .connect_timeout(CONNECT_TIMEOUT)
        .build()
        .unwrap();
    let audit = tokio::time::timeout(CONNECT_TIMEOUT + secs(1), client.audit())
        .await
        .expect("within the connect timeout");
    assert!(!audit.is_ok() && !audit.nodes[0].reachable, "{audit:#}");
    let shown = audit.to_string();
    assert!(shown.contains("certificate"), "{shown}");
}

#[tokio::test]
async fn an_expired_server_certificate_is_a_tls_error() {
    let server = tls_server(certs().server_with(&certs().expired_server, false));
    let (node, took) = refused(server.url(), trusting_ca()).await;
    assert_tls_refusal(&node, took, "expired", server.port());
}

#[tokio::test]
async fn a_certificate_for_another_host_is_a_tls_error() {
    let server = tls_server(certs().server_with(&certs().wrong_host_server, false));
    let (node, took) = refused(server.url(), trusting_ca()).await;
    assert_tls_refusal(&node, took, "not valid for name", server.port());
}

/// A plain-text server does not answer a TLS hello: without the probe the
/// connect would only time out (the control: the same server paused).
#[tokio::test]
async fn a_plain_text_server_behind_rediss_is_a_tls_error() {
    let mut plain = RedisServer::start();
    let url = plain.url().replacen("redis://", "rediss://", 1);
    let (node, took) = refused(url.clone(), trusting_ca()).await;
    assert_tls_refusal(&node, took, "plain text", plain.port());
    // Negative control: a server that answers nothing (paused) is not
    // mistaken for a plain-text one; it times out, as a stalled TLS server
    // would.
    plain.pause();
    let client = Client::builder([url])
        .tls(trusting_ca())
        .connect_timeout(CONNECT_TIMEOUT)
        .retry(Retry::once())
        .restart_guard(RestartGuard::off())
        .build()
        .unwrap();
    let e = client.acquire("tls", secs(10)).await.unwrap_err();
    let shown = report(&e);
    assert!(
        !shown.contains("TLS"),
        "a paused server is not a TLS error: {shown}"
    );
    plain.resume();
}

#[tokio::test]
async fn mutual_tls_refuses_a_client_without_a_certificate_or_with_a_foreign_one() {
    let server = tls_server(certs().mutual_server());
    let (node, took) = refused(server.url(), trusting_ca()).await;
    assert_tls_refusal(
        &node,
        took,
        "refused this client's certificate",
        server.port(),
    );
    let (node, took) = refused(server.url(), with_client_cert(&certs().foreign_client)).await;
    assert_tls_refusal(
        &node,
        took,
        "refused this client's certificate",
        server.port(),
    );
}

/// Nothing secret in any error: not the password of the URL, not the key.
#[tokio::test]
async fn tls_errors_name_the_node_and_nothing_secret() {
    let server = RedisServer::start_with(ServerOptions {
        tls: Some(certs().server()),
        requirepass: Some("hunter2".into()),
        ..ServerOptions::default()
    });
    let url = format!("rediss://default:hunter2@127.0.0.1:{}", server.port());
    let tls = Tls::new()
        .root_ca_pem(certs().other_ca_pem.clone())
        .client_identity_pem(
            certs().client.cert_pem.clone(),
            certs().client.key_pem.clone(),
        );
    let (node, _) = refused(url.clone(), tls.clone()).await;
    let key_line = certs().client.key_pem.lines().nth(1).unwrap().to_owned();
    for shown in [node.to_string(), format!("{node:?}"), format!("{tls:?}")] {
        assert!(!shown.contains("hunter2"), "password leaked: {shown}");
        assert!(!shown.contains(&key_line), "key leaked: {shown}");
    }
    // And with the right CA and password, the same URL works.
    let client = client(vec![url], trusting_ca());
    client
        .acquire("tls", secs(5))
        .await
        .unwrap()
        .release()
        .await;
}

#[test]
fn tls_settings_with_a_plain_node_or_unusable_pem_are_refused_at_build() {
    let e = Client::builder([
        "rediss://127.0.0.1:7001",
        "redis://u:hunter2@127.0.0.1:7002",
    ])
    .tls(trusting_ca())
    .build()
    .unwrap_err();
    assert!(
        matches!(e, ConfigError::TlsOnPlainNode { index: 1, .. }),
        "{e:?}"
    );
    assert!(!e.to_string().contains("hunter2"), "{e}");
    for tls in [
        Tls::new().root_ca_pem("not a certificate"),
        trusting_ca().client_identity_pem(certs().client.cert_pem.clone(), "not a key"),
    ] {
        let e = Client::builder(["rediss://127.0.0.1:7001"])
            .tls(tls)
            .build()
            .unwrap_err();
        assert!(
            matches!(e, ConfigError::InvalidTls { index: 0, .. }),
            "{e:?}"
        );
    }
}

/// A service's existing redis-rs configuration, TLS included: a
/// `ConnectionInfo` from `redis::Client::build_with_tls`, no `Builder::tls`.
#[tokio::test]
async fn nodes_from_an_existing_tls_connection_info() {
    let server = tls_server(certs().mutual_server());
    let existing = redfence::redis::Client::build_with_tls(
        server.url(),
        redfence::redis::TlsCertificates {
            client_tls: Some(redfence::redis::ClientTlsConfig {
                client_cert: certs().client.cert_pem.clone().into_bytes(),
                client_key: certs().client.key_pem.clone().into_bytes(),
            }),
            root_cert: Some(certs().ca_pem.clone().into_bytes()),
        },
    )
    .unwrap();
    let client = Client::builder([existing.get_connection_info().clone()])
        .restart_guard(RestartGuard::off())
        .build()
        .unwrap();
    let guard = client.acquire("tls", secs(10)).await.unwrap();
    assert!(guard.token().is_some());
    guard.release().await;
}

/// The audit and the fenced store over TLS: the audit reads every node's
/// settings through the same TLS connection settings, and a fenced store on
/// a TLS data connection refuses a stale token.
#[tokio::test]
async fn audit_and_fenced_store_over_tls() {
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| tls_server(certs().mutual_server()))
        .collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let locks = client(urls, with_client_cert(&certs().client));
    let audit = tokio::time::timeout(secs(30), locks.audit()).await.unwrap();
    assert!(
        audit
            .nodes
            .iter()
            .all(|n| n.reachable && n.role.as_deref() == Some("master")),
        "{audit}"
    );
    assert!(audit.is_ok(), "{audit}");

    let data = redfence::redis::Client::build_with_tls(
        servers[0].url(),
        redfence::redis::TlsCertificates {
            client_tls: Some(redfence::redis::ClientTlsConfig {
                client_cert: certs().client.cert_pem.clone().into_bytes(),
                client_key: certs().client.key_pem.clone().into_bytes(),
            }),
            root_cert: Some(certs().ca_pem.clone().into_bytes()),
        },
    )
    .unwrap()
    .get_multiplexed_async_connection()
    .await
    .unwrap();
    let store = FencedStore::new(data);
    let old = locks.acquire("tls-store", secs(10)).await.unwrap();
    let old_token = old.token().unwrap();
    old.release().await;
    let new = locks.acquire("tls-store", secs(10)).await.unwrap();
    store
        .write("tls-data", b"new", new.token().unwrap())
        .await
        .unwrap();
    let stale = store
        .write("tls-data", b"old", old_token)
        .await
        .unwrap_err();
    assert!(stale.is_stale(), "{stale}");
    new.release().await;
}

/// What a plain-text `PING` on `port` gets back (2 s at most): anything but
/// `+PONG` from a TLS port.
fn plain_text_ping(port: u16) -> String {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(&addr, secs(2)) else {
        return "(connection refused)".to_owned();
    };
    stream.set_read_timeout(Some(secs(2))).unwrap();
    let _ = stream.write_all(b"PING\r\n");
    let mut got = Vec::new();
    let _ = stream.take(64).read_to_end(&mut got);
    String::from_utf8_lossy(&got).into_owned()
}

/// A Redis Cluster whose nodes are TLS only (`--port 0`, mutual TLS, the
/// cluster bus and replication links TLS too) is one node behind
/// `rediss+cluster://`: locks on every shard, tokens that increase across
/// holders, a waiter woken by the sharded release notice (`SSUBSCRIBE` to
/// the lock's shard, over TLS) and the audit of each master. The client
/// learns the masters from the seed and reaches each with the same TLS
/// settings (its client certificate included).
#[tokio::test]
async fn a_tls_redis_cluster_is_one_node() {
    let started = Instant::now();
    let cluster = RedisCluster::start_tls(3, 0, &certs().cluster_node(true));
    eprintln!("TLS cluster up in {:?}", started.elapsed());
    let masters = cluster.master_ports();
    assert_eq!(masters.len(), 3, "{masters:?}");
    assert_eq!(
        cluster.seed_url(),
        format!("rediss+cluster://127.0.0.1:{}", masters[0])
    );

    // TLS only: no plain TCP port, and the TLS port speaks no plain text.
    for &port in &masters {
        let node = cluster.server(port);
        assert_eq!(node.cli(&["CONFIG", "GET", "port"]), "port\n0");
        assert_eq!(
            node.cli(&["CONFIG", "GET", "tls-port"]),
            format!("tls-port\n{port}")
        );
        assert_eq!(
            node.cli(&["CONFIG", "GET", "tls-cluster"]),
            "tls-cluster\nyes"
        );
        let reply = plain_text_ping(port);
        assert!(
            !reply.contains("PONG"),
            "plain text answered on {port}: {reply:?}"
        );
    }

    let cluster_client = || {
        Client::builder([cluster.seed_url()])
            .tls(with_client_cert(&certs().client))
            .restart_guard(RestartGuard::off())
            .node_timeout(secs(1))
            .build()
            .unwrap()
    };
    crate::cluster::one_cluster_story(&cluster, cluster_client).await;
    eprintln!(
        "a_tls_redis_cluster_is_one_node took {:?}",
        started.elapsed()
    );
}

/// `rediss://host/#insecure` (the redis crate's form for TLS without
/// certificate checks) is refused at build with `InsecureTls`, which names
/// the alternative, for a server and for a cluster's seed, with or without
/// TLS settings. Issue 31: it was accepted, and every acquire then failed
/// with the redis crate's "Cannot create insecure client without
/// tls-rustls-insecure feature" as a node error.
#[test]
fn an_insecure_tls_url_is_refused_at_build() {
    let urls = [
        "rediss://127.0.0.1:6379/#insecure",
        "rediss://:hunter2@127.0.0.1:6379/#insecure",
        "rediss+cluster://127.0.0.1:6379/#insecure",
    ];
    for url in urls {
        for tls in [None, Some(trusting_ca())] {
            let mut builder = Client::builder([url]).restart_guard(RestartGuard::off());
            if let Some(tls) = tls {
                builder = builder.tls(tls);
            }
            let e = builder.build().expect_err(url);
            assert!(
                matches!(e, ConfigError::InsecureTls { index: 0, .. }),
                "{url}: {e:?}"
            );
            let text = e.to_string();
            crate::helpers::assert_message_style(&text);
            assert!(text.contains("root_ca_pem"), "{text}");
            assert!(!text.contains("hunter2"), "{text}");
        }
    }
    // The same URLs without the fragment build.
    Client::builder(["rediss://127.0.0.1:6379"])
        .tls(trusting_ca())
        .build()
        .expect("a checked TLS url builds");
}
