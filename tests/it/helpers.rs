//! Small helpers shared by the test modules: key names and polling.

use std::time::{Duration, Instant};

use std::net::{Ipv4Addr, SocketAddr};

use crate::support::proxy::FaultProxy;
use crate::support::RedisServer;

/// Every lock key the client writes with the default prefix.
pub const LOCK_KEYS: &str = "redfence:lock:*";

/// The fence key of `resource` under the default prefix: the key of its
/// bucket, as a client computes it (building a client sends nothing).
pub fn fence_key(resource: &str) -> String {
    redfence::Client::new(["redis://127.0.0.1:1"])
        .expect("a valid URL")
        .fence_key(resource)
}

/// The Redis key of `resource`'s lock under the default prefix.
pub fn lock_key(resource: &str) -> String {
    format!("{}lock:{resource}", redfence::limits::DEFAULT_PREFIX)
}

/// The pub/sub channel of `key`'s release notices on database 0.
pub fn notice_channel(key: &str) -> String {
    format!("{key}@0")
}

pub const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub const fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Polls `check` every 20 ms until it holds or `within` has passed; returns
/// whether it held. For effects that finish in the background (a release
/// that returned at a majority, a dropped guard), never for timing claims.
pub async fn eventually(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(ms(20)).await;
    }
}

/// Waits (up to `within`) until a fenced acquire of `resource` has landed
/// on every node of `servers`, with nothing of it still on the way: the
/// lock key is there and the fence is seeded (at least 2^40). A fresh
/// bucket's first acquire is a transaction that sets the key, then a
/// script that seeds the fence and sets the key again (or, once the
/// round decided, a seed alone): only a seeded fence says that the last
/// write has run. A test that changes the keys next waits for this, so
/// that its change is the last word on every node.
pub async fn landed(servers: &[RedisServer], resource: &str, within: Duration) -> bool {
    let (key, fence) = (lock_key(resource), fence_key(resource));
    eventually(within, || {
        servers.iter().all(|node| {
            node.count_keys(&key) == 1
                && node
                    .cli(&["GET", &fence])
                    .parse::<u64>()
                    .is_ok_and(|f| f >= 1 << 40)
        })
    })
    .await
}

/// `PTTL` of `key` on `node`, in milliseconds (-2 when absent).
pub fn pttl(node: &RedisServer, key: &str) -> i64 {
    let reply = node.cli(&["PTTL", key]);
    reply
        .parse()
        .unwrap_or_else(|_| panic!("PTTL {key} on {}: {reply}", node.port()))
}

/// A display string follows the house style: starts lowercase, no trailing
/// period.
/// An error and its `source()` chain on one line, `a: b: c`, as an error
/// reporter (anyhow's `{:#}`) prints it: what a user reads in a log.
pub fn report(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

pub fn assert_message_style(message: &str) {
    let first = message.chars().next().expect("empty error message");
    assert!(
        !first.is_uppercase(),
        "error message starts uppercase: {message:?}"
    );
    assert!(
        !message.ends_with('.'),
        "error message ends with a period: {message:?}"
    );
}

/// A builder for the nodes at `urls`, with the restart guard off: every
/// test starts its own servers a moment before, and the guard cannot tell a
/// server that just started from one that just restarted without its data
/// (it would keep them all out for one TTL). The guard itself is tested in
/// `restart.rs`, on real restarts.
pub fn builder<I, S>(urls: I) -> redfence::Builder
where
    I: IntoIterator<Item = S>,
    S: Into<redfence::NodeSpec>,
{
    redfence::Client::builder(urls).restart_guard(redfence::RestartGuard::off())
}

/// `Client::new` for test servers: see [`builder`].
pub fn client<I, S>(urls: I) -> Result<redfence::Client, redfence::ConfigError>
where
    I: IntoIterator<Item = S>,
    S: Into<redfence::NodeSpec>,
{
    builder(urls).build()
}

/// A client for the nodes at `urls` (see [`builder`]) whose node timeout
/// is `node_timeout`: the one setting the fault, lifecycle and waiting tests
/// tune (small, so a dead or frozen node costs little; large enough for a
/// loaded machine's round trips).
pub fn client_with_timeout<I, S>(urls: I, node_timeout: Duration) -> redfence::Client
where
    I: IntoIterator<Item = S>,
    S: Into<redfence::NodeSpec>,
{
    builder(urls).node_timeout(node_timeout).build().unwrap()
}

/// A client with a node timeout (1 s) far above any local round trip, for
/// tests whose outcome must not depend on a loaded machine answering within
/// the default 100 ms. Tests of timeouts set their own.
pub fn new_client(cluster: &crate::support::Cluster) -> redfence::Client {
    client_with_timeout(cluster.urls(), secs(1))
}

/// A client whose connections to every node are already open, so the next
/// operation reaches all N nodes at once. A fresh client connects lazily,
/// and requests still waiting for their connection when the outcome becomes
/// certain are dropped: its first lock usually lives on a bare majority.
/// Takes and releases resource `c` every 100 ms until `done()`, failing
/// with `what` after `within`: any fenced acquire finds a node young and
/// starts its fences' re-seed, which other resources then wait for.
pub async fn nudge_until(
    client: &redfence::Client,
    within: Duration,
    what: &str,
    mut done: impl FnMut() -> bool,
) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        if let Ok(guard) = client
            .lock("c", secs(1))
            .retry(redfence::Retry::new().with_max_wait(secs(15)))
            .acquire()
            .await
        {
            guard.release().await;
        }
        tokio::time::sleep(ms(100)).await;
    }
}

pub async fn warm_client(cluster: &crate::support::Cluster) -> redfence::Client {
    let client = new_client(cluster);
    warm_up(&client, cluster).await;
    client
}

/// Takes and frees a throw-away lock until every node has answered once.
/// Bounds generous for a loaded CI machine (a release returns at the
/// quorum; the last node's delete may come later).
pub async fn warm_up(client: &redfence::Client, cluster: &crate::support::Cluster) {
    warm_up_servers(client, &cluster.nodes).await;
}

/// [`warm_up`] on servers that are not a `Cluster`.
pub async fn warm_up_servers(client: &redfence::Client, servers: &[RedisServer]) {
    let n = servers.len();
    let count = || -> Vec<usize> { servers.iter().map(|s| s.count_keys(LOCK_KEYS)).collect() };
    let deadline = Instant::now() + secs(20);
    loop {
        let guard = client.acquire("warm-up", secs(5)).await.unwrap();
        let all = count() == vec![1; n];
        guard.release().await;
        assert!(
            eventually(secs(10), || count() == vec![0; n]).await,
            "warm-up lock not released: {:?}",
            count()
        );
        if all {
            return;
        }
        assert!(Instant::now() < deadline, "nodes never all reached");
    }
}

/// Calls of one command on a node, from `INFO commandstats` (0 when never
/// called).
pub fn calls(node: &RedisServer, command: &str) -> u64 {
    let info = node.cli(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A fault proxy in front of `server`, on a free loopback port.
pub fn proxy_to(server: &RedisServer) -> FaultProxy {
    FaultProxy::start(SocketAddr::from((Ipv4Addr::LOCALHOST, server.port())))
        .unwrap_or_else(|e| panic!("starting a proxy to redis {}: {e}", server.port()))
}

/// Starts a waiter of `waiting` (another client than the holder's) on
/// `guard`'s resource with [`notice_only_retry`], releases `guard` once the
/// waiter is queued, and returns the waiter's guard, how long after the
/// release it got the lock (well under 10 s only when a release notice woke
/// it) and the release's report.
pub async fn hand_over_by_notice(
    guard: redfence::LockGuard,
    waiting: redfence::Client,
) -> (redfence::LockGuard, Duration, redfence::Released) {
    let resource = guard.resource().to_owned();
    let waiter = tokio::spawn(async move {
        let got = waiting
            .lock(&resource, secs(30))
            .retry(notice_only_retry())
            .acquire()
            .await;
        (got, std::time::Instant::now())
    });
    // Long enough for the waiter's first attempt and its subscription.
    tokio::time::sleep(ms(500)).await;
    let released_at = std::time::Instant::now();
    let released = guard.release().await;
    let (got, at) = waiter.await.unwrap();
    let second = got.expect("the waiter gets the lock");
    (second, at - released_at, released)
}

/// A retry policy that would sleep 10 s between attempts (no jitter, 30 s
/// at most): a waiter using it that gets the lock within seconds of a
/// release was woken by the release notice.
pub fn notice_only_retry() -> redfence::Retry {
    redfence::Retry::new()
        .with_delay(secs(10))
        .with_jitter(std::time::Duration::ZERO)
        .with_max_jitter(std::time::Duration::ZERO)
        .with_max_wait(secs(30))
}
