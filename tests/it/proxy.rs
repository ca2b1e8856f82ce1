//! The fault-injecting proxy (`support/proxy.rs`) against real
//! `redis-server` processes: each fault does to a client what the fault
//! tests rely on it to do, and Redlock through it behaves as it does with a
//! real partition: a black-holed minority costs a timeout, a black-holed
//! majority is an unavailable lock, and the lock comes back after healing.
//!
//! Every wait is bounded by an explicit timeout. Time bounds are lower bounds
//! (a delay happened) or far above the expected value (a queue, not a
//! sleep per chunk), never tight upper bounds on a loaded machine.

use std::future::Future;
use std::io;
use std::time::{Duration, Instant};

use redfence::{Client, LockGuard, NodeErrorKind};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisResult};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

use crate::helpers::{client_with_timeout, eventually, ms, proxy_to, secs, warm_up, LOCK_KEYS};
use crate::support::proxy::Fault;
use crate::support::{Cluster, RedisServer};

/// Bound on anything that should happen promptly; hitting it is a failure.
const PROMPT: Duration = secs(5);
/// How long a client waits before concluding that a black-holed command got
/// no answer. Long against a local round trip, short for the suite.
const SILENCE: Duration = ms(300);

/// `fut`, failing the test if it takes longer than [`PROMPT`].
async fn prompt<T>(what: &str, fut: impl Future<Output = T>) -> T {
    timeout(PROMPT, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: no outcome within {PROMPT:?}"))
}

/// A redis-rs connection without a response timeout of its own: the tests
/// bound each command themselves, so a timeout is never mistaken for an
/// error reply.
async fn connect(url: &str) -> RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(None)
        .set_response_timeout(None);
    redis::Client::open(url)?
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

async fn ping(conn: &mut MultiplexedConnection) -> RedisResult<String> {
    redis::cmd("PING").query_async(conn).await
}

/// A fresh connection through `url` answers PING.
async fn fresh_ping(url: &str) -> RedisResult<String> {
    ping(&mut connect(url).await?).await
}

/// Reads until the peer closes: `true` on end of stream or an error (a
/// reset), `false` if the connection is still open after `within`.
async fn peer_closes(stream: &mut TcpStream, within: Duration) -> bool {
    let drain = async {
        let mut buf = [0; 512];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    timeout(within, drain).await.is_ok()
}

async fn read_exact_within(stream: &mut TcpStream, n: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0; n];
    prompt("reading a reply", stream.read_exact(&mut buf)).await?;
    Ok(buf)
}

/// Whether a thread named `name` exists in this process, or `None` where
/// `/proc` is not available.
fn thread_exists(name: &str) -> Option<bool> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    Some(tasks.flatten().any(|task| {
        std::fs::read_to_string(task.path().join("comm")).is_ok_and(|comm| comm.trim() == name)
    }))
}

#[tokio::test]
async fn pass_forwards_and_counts() {
    let server = RedisServer::start();
    let proxy = proxy_to(&server);
    assert_eq!(proxy.fault(), Fault::Pass);
    assert_eq!(
        (proxy.connections_accepted(), proxy.bytes_forwarded()),
        (0, 0)
    );
    assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}", proxy.port()));
    assert_eq!(proxy.addr().port(), proxy.port());

    let mut conn = prompt("connect", connect(&proxy.url())).await.unwrap();
    assert_eq!(prompt("PING", ping(&mut conn)).await.unwrap(), "PONG");
    let before = proxy.bytes_forwarded();
    let set: String = prompt(
        "SET",
        redis::cmd("SET")
            .arg("through-proxy")
            .arg("v1")
            .query_async(&mut conn),
    )
    .await
    .unwrap();
    assert_eq!(set, "OK");
    let got: String = prompt(
        "GET",
        redis::cmd("GET")
            .arg("through-proxy")
            .query_async(&mut conn),
    )
    .await
    .unwrap();
    assert_eq!(got, "v1");
    // It reached the real server, not something that merely answers RESP.
    assert_eq!(server.cli(&["GET", "through-proxy"]), "v1");
    assert_eq!(proxy.connections_accepted(), 1);
    assert_eq!(proxy.open_connections(), 1);
    assert!(proxy.bytes_forwarded() > before, "{proxy:?}");
}

#[tokio::test]
async fn delay_applies_to_each_direction_without_throttling() {
    let server = RedisServer::start();
    let proxy = proxy_to(&server);
    let mut conn = prompt("connect", connect(&proxy.url())).await.unwrap();
    prompt("PING", ping(&mut conn)).await.unwrap();

    let delay = ms(50);
    proxy.set(Fault::Delay(delay));
    let started = Instant::now();
    assert_eq!(prompt("PING", ping(&mut conn)).await.unwrap(), "PONG");
    let round_trip = started.elapsed();
    assert!(round_trip >= 2 * delay, "round trip {round_trip:?}");

    // Twenty PINGs, each written on its own a few ms apart so the proxy reads
    // them as separate chunks (and Redis answers them as separate chunks).
    // Queued with deadlines they take about one round trip plus the sending
    // time; a proxy that slept per chunk would need at least 20 × 50 ms in
    // each direction.
    let mut raw = TcpStream::connect(proxy.addr()).await.unwrap();
    raw.set_nodelay(true).unwrap();
    let count = 20;
    let started = Instant::now();
    for _ in 0..count {
        raw.write_all(b"PING\r\n").await.unwrap();
        tokio::time::sleep(ms(5)).await;
    }
    let replies = read_exact_within(&mut raw, count * b"+PONG\r\n".len())
        .await
        .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(replies, b"+PONG\r\n".repeat(count));
    assert!(elapsed >= 2 * delay, "{elapsed:?}");
    let serialised = 2 * delay * u32::try_from(count).unwrap();
    assert!(
        elapsed < serialised / 2,
        "{count} pipelined PINGs took {elapsed:?}: the delay throttles"
    );

    // Bulk: 20 × 64 KiB in one pipeline is about 80 reads of the proxy's
    // 16 KiB buffer. Queued, they all arrive about one delay later; a proxy
    // that slept before each read would need 80 × 50 ms.
    let mut pipe = redis::pipe();
    for i in 0..count {
        pipe.cmd("SET")
            .arg(format!("bulk:{i}"))
            .arg(vec![b'x'; 64 * 1024])
            .ignore();
    }
    let started = Instant::now();
    prompt("bulk pipeline", pipe.query_async::<()>(&mut conn))
        .await
        .unwrap();
    let elapsed = started.elapsed();
    assert!(elapsed >= 2 * delay, "{elapsed:?}");
    assert!(
        elapsed < serialised / 2,
        "{count} × 64 KiB took {elapsed:?}: the delay throttles"
    );
    assert_eq!(server.cli(&["STRLEN", "bulk:19"]), "65536");
}

#[tokio::test]
async fn blackhole_times_out_and_heals_for_new_connections() {
    let server = RedisServer::start();
    let proxy = proxy_to(&server);
    let mut conn = prompt("connect", connect(&proxy.url())).await.unwrap();
    prompt("PING", ping(&mut conn)).await.unwrap();

    proxy.set(Fault::Blackhole);
    // `set` is visible to the proxy before this PING is written, so it is
    // discarded: a timeout, not an error and not an answer.
    assert!(
        timeout(SILENCE, ping(&mut conn)).await.is_err(),
        "a black-holed PING was answered or failed"
    );
    // New connections are accepted, then swallowed.
    let accepted = proxy.connections_accepted();
    let mut raw = TcpStream::connect(proxy.addr()).await.unwrap();
    raw.write_all(b"PING\r\n").await.unwrap();
    assert!(
        !peer_closes(&mut raw, SILENCE).await,
        "a black-holed connection was closed"
    );
    assert!(
        timeout(SILENCE, fresh_ping(&proxy.url())).await.is_err(),
        "a new connection got through a black hole"
    );
    assert!(
        eventually(PROMPT, || proxy.connections_accepted() >= accepted + 2).await,
        "{proxy:?}"
    );
    assert_eq!(server.cli(&["PING"]), "PONG", "the server itself is fine");

    // The old connection lost bytes and is out of step; a new one works.
    proxy.set(Fault::Pass);
    assert_eq!(
        prompt("PING after healing", fresh_ping(&proxy.url()))
            .await
            .unwrap(),
        "PONG"
    );
}

#[tokio::test]
async fn stall_holds_bytes_and_delivers_them_on_healing() {
    let server = RedisServer::start();
    let proxy = proxy_to(&server);
    let mut conn = prompt("connect", connect(&proxy.url())).await.unwrap();
    prompt("PING", ping(&mut conn)).await.unwrap();

    proxy.set(Fault::Stall);
    let set = redis::cmd("SET").arg("held").arg("v").clone();
    let sent = timeout(SILENCE, set.query_async::<String>(&mut conn)).await;
    assert!(sent.is_err(), "a stalled SET returned: {sent:?}");
    assert_eq!(server.cli(&["EXISTS", "held"]), "0", "the SET got through");

    // Healing delivers the held SET (its reply goes to the abandoned
    // request), and the connection is still in step.
    proxy.set(Fault::Pass);
    assert_eq!(
        prompt("PING after healing", ping(&mut conn)).await.unwrap(),
        "PONG"
    );
    let got: String = prompt("GET", redis::cmd("GET").arg("held").query_async(&mut conn))
        .await
        .unwrap();
    assert_eq!(got, "v");
}

#[tokio::test]
async fn stall_open_holds_the_open_connections_and_passes_new_ones() {
    let server = RedisServer::start();
    let proxy = proxy_to(&server);
    let mut old = prompt("connect", connect(&proxy.url())).await.unwrap();
    prompt("PING", ping(&mut old)).await.unwrap();

    proxy.stall_open();
    assert_eq!(proxy.fault(), Fault::StallBefore(1));
    let set = redis::cmd("SET").arg("held-open").arg("v").clone();
    let sent = timeout(SILENCE, set.query_async::<String>(&mut old)).await;
    assert!(
        sent.is_err(),
        "the open connection's SET returned: {sent:?}"
    );
    // A new connection passes, in both directions.
    let mut new = prompt("connect", connect(&proxy.url())).await.unwrap();
    assert_eq!(prompt("PING new", ping(&mut new)).await.unwrap(), "PONG");
    assert_eq!(
        server.cli(&["EXISTS", "held-open"]),
        "0",
        "the SET got through"
    );

    // Healing delivers the held SET, and the old connection is in step.
    proxy.set(Fault::Pass);
    assert_eq!(
        prompt("PING after healing", ping(&mut old)).await.unwrap(),
        "PONG"
    );
    assert_eq!(server.cli(&["GET", "held-open"]), "v");
}

#[tokio::test]
async fn drop_replies_runs_commands_the_client_never_hears_of() {
    let server = RedisServer::start();
    let proxy = proxy_to(&server);
    let mut conn = prompt("connect", connect(&proxy.url())).await.unwrap();
    prompt("PING", ping(&mut conn)).await.unwrap();

    proxy.set(Fault::DropReplies);
    let set = redis::cmd("SET").arg("unacknowledged").arg("v").clone();
    let sent = timeout(SILENCE, set.query_async::<String>(&mut conn)).await;
    assert!(sent.is_err(), "a dropped reply arrived: {sent:?}");
    assert!(
        eventually(PROMPT, || server.cli(&["GET", "unacknowledged"]) == "v").await,
        "the SET never ran"
    );
}

#[tokio::test]
async fn reset_aborts_open_and_new_connections_until_pass() {
    let server = RedisServer::start();
    let proxy = proxy_to(&server);
    let mut conn = prompt("connect", connect(&proxy.url())).await.unwrap();
    prompt("PING", ping(&mut conn)).await.unwrap();
    let mut raw = TcpStream::connect(proxy.addr()).await.unwrap();
    raw.write_all(b"PING\r\n").await.unwrap();
    assert_eq!(read_exact_within(&mut raw, 7).await.unwrap(), b"+PONG\r\n");

    proxy.set(Fault::Reset);
    assert!(
        peer_closes(&mut raw, PROMPT).await,
        "an open connection survived a reset"
    );
    assert!(
        eventually(PROMPT, || proxy.open_connections() == 0).await,
        "{proxy:?}"
    );
    // An error, promptly: not a hang, not an answer.
    let err = prompt("PING on a reset connection", ping(&mut conn))
        .await
        .unwrap_err();
    assert!(
        err.is_io_error() || err.is_connection_dropped(),
        "unexpected error: {err}"
    );
    let accepted = proxy.connections_accepted();
    let err = prompt("a new connection", fresh_ping(&proxy.url()))
        .await
        .unwrap_err();
    assert!(
        err.is_io_error() || err.is_connection_dropped() || err.is_connection_refusal(),
        "unexpected error: {err}"
    );
    // The kernel completes the handshake before the proxy accepts, so the
    // reset shows up either as a failed connect or on the first read.
    if let Ok(mut raw) = TcpStream::connect(proxy.addr()).await {
        assert!(
            peer_closes(&mut raw, PROMPT).await,
            "a new connection stayed open"
        );
    }
    assert!(proxy.connections_accepted() >= accepted + 2, "{proxy:?}");

    proxy.set(Fault::Pass);
    assert_eq!(
        prompt("PING after Pass", fresh_ping(&proxy.url()))
            .await
            .unwrap(),
        "PONG"
    );
}

#[tokio::test]
async fn drop_closes_connections_and_ends_the_thread() {
    let server = RedisServer::start();
    let proxy = proxy_to(&server);
    let thread = format!("proxy-{}", proxy.port());
    let mut conn = prompt("connect", connect(&proxy.url())).await.unwrap();
    prompt("PING", ping(&mut conn)).await.unwrap();
    let mut raw = TcpStream::connect(proxy.addr()).await.unwrap();
    raw.write_all(b"PING\r\n").await.unwrap();
    read_exact_within(&mut raw, 7).await.unwrap();
    assert_ne!(thread_exists(&thread), Some(false), "no thread {thread}");

    // Also while a connection has bytes held: nothing may wait for them.
    proxy.set(Fault::Stall);
    raw.write_all(b"PING\r\n").await.unwrap();
    drop(proxy);

    assert!(
        peer_closes(&mut raw, PROMPT).await,
        "a connection outlived the proxy"
    );
    assert!(prompt("PING after drop", ping(&mut conn)).await.is_err());
    // `drop` waited for the thread to finish; the kernel may take a moment
    // longer to remove it from /proc.
    assert!(
        eventually(PROMPT, || thread_exists(&thread) != Some(true)).await,
        "{thread} still running"
    );
}

/// Node 2 of three is behind a black hole from the start: the lock is taken
/// and released on the other two, and whatever is said about node 2 is a
/// timeout (or that the release was never sent there), never an error.
#[tokio::test]
async fn redlock_survives_a_blackholed_minority() {
    let cluster = Cluster::start(3);
    let proxy = proxy_to(&cluster.nodes[2]);
    proxy.set(Fault::Blackhole);
    let client = client_with_timeout(
        [cluster.nodes[0].url(), cluster.nodes[1].url(), proxy.url()],
        ms(100),
    );

    for round in 0..3 {
        let guard = client
            .acquire("partitioned-minority", secs(10))
            .await
            .unwrap();
        assert_eq!(
            cluster.count_keys(LOCK_KEYS),
            vec![1, 1, 0],
            "round {round}"
        );
        let released = guard.release().await;
        assert_eq!(released.confirmed, 2, "round {round}: {released:?}");
        assert!(
            released.failures.len() + released.pending <= 1,
            "round {round}: {released:?}"
        );
        for f in &released.failures {
            assert_eq!(f.index, 2, "round {round}: {released:?}");
            assert!(
                f.kind.is_timeout() || matches!(f.kind, NodeErrorKind::Skipped),
                "round {round}: {released:?}"
            );
        }
        assert!(
            eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await,
            "round {round}"
        );
    }
}

/// Two of three behind black holes: a single try fails as unavailable with
/// timeouts for exactly those two; once healed, the lock is available again.
///
/// The black holes are in place before the client first connects, so its
/// connects time out and it reconnects after healing. On connections opened
/// *before* a black hole the client does not recover: the discarded bytes
/// leave redis-rs's reply matching out of step, and redfence keeps a
/// connection that only timed out. Partitions of open connections are
/// tested with [`Fault::Stall`] below.
#[tokio::test]
async fn redlock_blackholed_majority_is_unavailable_until_healed() {
    let cluster = Cluster::start(3);
    let proxies = [proxy_to(&cluster.nodes[1]), proxy_to(&cluster.nodes[2])];
    for proxy in &proxies {
        proxy.set(Fault::Blackhole);
    }
    let client = client_with_timeout(
        [cluster.nodes[0].url(), proxies[0].url(), proxies[1].url()],
        ms(100),
    );

    let err = client
        .try_acquire("partitioned-majority", secs(10))
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    assert!(err.is_timeout(), "{err}");
    let failed: Vec<usize> = err.node_failures().iter().map(|f| f.index).collect();
    assert_eq!(failed, vec![1, 2], "{err}");
    assert!(
        err.node_failures().iter().all(|f| f.kind.is_timeout()),
        "{err}"
    );
    // The grant on node 0 was given back.
    assert!(eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);

    for proxy in &proxies {
        proxy.set(Fault::Pass);
    }
    let guard = acquire_within(&client, "partitioned-majority", secs(10)).await;
    guard.release().await;
}

/// The same partition on connections that were open before it, healing the
/// way TCP does ([`Fault::Stall`]): the held commands are delivered late,
/// the connections stay in step, and the lock comes back.
#[tokio::test]
async fn redlock_recovers_from_a_stalled_majority_on_open_connections() {
    let cluster = Cluster::start(3);
    let proxies = [proxy_to(&cluster.nodes[1]), proxy_to(&cluster.nodes[2])];
    let client = client_with_timeout(
        [cluster.nodes[0].url(), proxies[0].url(), proxies[1].url()],
        ms(100),
    );
    warm_up(&client, &cluster).await;

    for proxy in &proxies {
        proxy.set(Fault::Stall);
    }
    let err = client
        .try_acquire("stalled-majority", secs(10))
        .await
        .unwrap_err();
    assert!(err.is_unavailable() && err.is_timeout(), "{err}");

    for proxy in &proxies {
        proxy.set(Fault::Pass);
    }
    let guard = acquire_within(&client, "stalled-majority", secs(10)).await;
    guard.release().await;
    // The SETs held during the stall were followed by their releases on the
    // same connections, so nothing is left behind.
    assert!(eventually(secs(5), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
}

/// Retries single attempts until one succeeds or `within` has passed.
async fn acquire_within(client: &Client, resource: &str, within: Duration) -> LockGuard {
    let deadline = Instant::now() + within;
    loop {
        let outcome = client.try_acquire(resource, secs(10)).await;
        match outcome {
            Ok(Some(guard)) => return guard,
            other if Instant::now() >= deadline => {
                panic!("{resource}: not acquired within {within:?}: {other:?}")
            }
            _ => tokio::time::sleep(ms(50)).await,
        }
    }
}

/// A black hole that swallowed bytes leaves the open connection out of step
/// for good: the replies that follow go to the oldest requests still
/// waiting, which gave up long ago, so every new request times out. Once the
/// path works, a fresh connection tried beside the silent one answers and
/// replaces it. Node 0 is killed after the heal, so every lock needs node
/// 2's vote: without the replacement none is ever granted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_out_of_step_is_replaced_once_the_path_heals() {
    let mut cluster = Cluster::start(3);
    let proxy = proxy_to(&cluster.nodes[2]);
    let urls = vec![cluster.nodes[0].url(), cluster.nodes[1].url(), proxy.url()];
    let client = crate::helpers::builder(urls)
        .node_timeout(ms(200))
        .connect_timeout(ms(500))
        .build()
        .unwrap();
    warm_up(&client, &cluster).await;
    proxy.set(Fault::Blackhole);
    for _ in 0..3 {
        let guard = client.acquire("bh", secs(5)).await.unwrap();
        guard.release().await;
    }
    proxy.set(Fault::Pass);
    cluster.node(0).kill();
    let guard = client
        .lock("bh", secs(5))
        .retry(redfence::Retry::new().with_max_wait(secs(15)))
        .acquire()
        .await
        .expect("node 2 votes again after its connection was replaced");
    guard.release().await;
}
