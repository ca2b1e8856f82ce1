//! Nodes on Unix sockets (`unix://`, `redis+unix://`): a server on the same
//! host, reached through its socket file, locks, fences and wakes waiters
//! like one on TCP, and a socket and a TCP URL of one server still vote
//! once.

use std::time::Instant;

use redfence::{Client, ConfigError, NodeErrorKind, RestartGuard, Retry};

use crate::helpers::{
    eventually, hand_over_by_notice, ms, report, secs, warm_up_servers, LOCK_KEYS,
};
use crate::support::{RedisServer, ServerOptions};

fn socket_server() -> RedisServer {
    RedisServer::start_with(ServerOptions {
        unixsocket: true,
        ..ServerOptions::default()
    })
}

fn client(urls: Vec<String>) -> Client {
    Client::builder(urls)
        .node_timeout(ms(500))
        .restart_guard(RestartGuard::off())
        .build()
        .unwrap()
}

#[tokio::test]
async fn nodes_on_unix_sockets_lock_fence_and_wake_waiters() {
    let servers: Vec<RedisServer> = (0..3).map(|_| socket_server()).collect();
    // Both spellings, and a database index in the query.
    let urls: Vec<String> = servers
        .iter()
        .enumerate()
        .map(|(i, s)| match i {
            0 => s.socket_url(),
            1 => s.socket_url().replacen("unix://", "redis+unix://", 1),
            _ => format!("{}?db=0", s.socket_url()),
        })
        .collect();
    let holder = client(urls.clone());
    // Every connection up first: on a loaded machine a node's first
    // connect can outlast the node timeout, and an acquire decided at the
    // majority then never sets the key there (a CI run of 2026-12-02).
    warm_up_servers(&holder, &servers).await;
    let guard = holder.acquire("socket", secs(30)).await.unwrap();
    let first = guard.token().expect("a token");
    guard.extend(secs(30)).await.unwrap();
    for s in &servers {
        // Decided at the majority: the third SET may land a moment later.
        assert!(
            eventually(secs(2), || s.count_keys(LOCK_KEYS) == 1).await,
            "the key is on every node"
        );
    }
    // A waiter of another client: its retry policy would sleep 10 s, so
    // only the release notice (over the socket) wakes it sooner.
    let (second, after, released) = hand_over_by_notice(guard, client(urls)).await;
    assert!(released.confirmed >= 2, "{released:?}");
    assert!(after < secs(5), "woken {after:?} after the release");
    assert!(second.token().expect("a token") > first);
    second.release().await;
    for s in &servers {
        assert!(eventually(secs(2), || s.count_keys(LOCK_KEYS) == 0).await);
    }
}

/// The socket and the TCP port of one server are one vote: with N = 2 the
/// quorum needs both, so the acquire fails with `SameServer` at once. The
/// node is named by its socket path, never by credentials.
#[tokio::test]
async fn a_socket_and_a_tcp_url_of_one_server_vote_once() {
    let server = socket_server();
    let socket = format!("{}?user=default&pass=not-a-s3cret", server.socket_url());
    let client = client(vec![server.url(), socket]);
    let started = Instant::now();
    let err = client
        .lock("once", secs(5))
        .retry(Retry::new().with_max_wait(secs(6)))
        .acquire()
        .await
        .unwrap_err();
    assert!(started.elapsed() < secs(3), "{err}");
    let same = err.node_failures().iter().any(|f| {
        matches!(&f.kind, NodeErrorKind::SameServer { .. })
            || matches!(&f.kind, NodeErrorKind::Backoff { last, .. } if matches!(**last, NodeErrorKind::SameServer { .. }))
    });
    assert!(same, "{err}");
    let message = report(&err);
    assert!(message.contains("same server as node"), "{message}");
    assert!(!message.contains("not-a-s3cret"), "{message}");
    assert!(eventually(secs(2), || server.count_keys(LOCK_KEYS) == 0).await);
}

/// A socket file nobody listens on: a connection failure naming the node
/// by its path, never by its credentials.
#[tokio::test]
async fn a_missing_socket_is_a_connection_failure_naming_its_path() {
    let dir = std::env::temp_dir().join(format!("redfence-no-socket-{}", std::process::id()));
    let url = format!("unix://{}/redis.sock?pass=not-a-s3cret", dir.display());
    let client = client(vec![url]);
    let err = client.try_acquire("nowhere", secs(5)).await.unwrap_err();
    let f = &err.node_failures()[0];
    assert_eq!(f.addr, format!("unix:{}/redis.sock", dir.display()));
    assert!(matches!(f.kind, NodeErrorKind::Connect(_)), "{err}");
    let message = report(&err);
    assert!(message.contains(&f.addr), "{message}");
    assert!(!message.contains("not-a-s3cret"), "{message}");
}

#[test]
fn one_socket_twice_is_a_duplicate_node() {
    let err = Client::builder(["unix:///tmp/a.sock", "redis+unix:///tmp/a.sock"])
        .build()
        .unwrap_err();
    assert!(
        matches!(&err, ConfigError::DuplicateNode { addr, first: 0, second: 1 } if addr == "unix:/tmp/a.sock"),
        "{err:?}"
    );
    // Another database on the same socket is another lock namespace.
    Client::builder(["unix:///tmp/a.sock", "unix:///tmp/a.sock?db=1"])
        .build()
        .unwrap();
}
