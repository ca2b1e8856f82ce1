//! A failover behind a stable address (a managed Redis endpoint's DNS
//! name, Sentinel behind a VIP), as issue 31 reproduced it: the replica
//! misses the last acquire (replication is asynchronous), the master dies,
//! the replica is promoted, and the address now reaches it. The client
//! that saw the old server counts the new one as started now; the defect
//! was that any connection drop inside the window, and any request that
//! does not vote, reconnected, read the promoted server's real uptime and
//! let it vote at once: a second holder with the first holder's token.
//!
//! Here a TCP proxy stands for the address: it is repointed from the
//! master to its replica, cut off from replication before the acquire (so
//! it has the lock key and the fence as they were one acquisition
//! earlier). Inside the window the test drops every connection again and
//! again (`CLIENT KILL`, the proxy's reset) and sends requests that do not
//! vote before each attempt. Each test also runs the same steps with the
//! guard off, the negative control that shows the second holder and the
//! repeated token the guard prevents.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use redfence::{Client, LockGuard, NodeErrorKind, RestartGuard, Retry};

use crate::helpers::{eventually, ms, proxy_to, secs};
use crate::support::proxy::{Fault, FaultProxy};
use crate::support::{RedisServer, ServerOptions};

/// The first holder's lease, and the guard's window (the longest TTL the
/// client asked for).
const TTL: Duration = Duration::from_secs(4);

/// A master and its replica, the master behind a proxy.
struct Pair {
    master: RedisServer,
    replica: RedisServer,
    proxy: FaultProxy,
}

impl Pair {
    fn start() -> Pair {
        let master = RedisServer::start();
        let replica = RedisServer::start_with(ServerOptions {
            replica_of: Some(master.port()),
            ..ServerOptions::default()
        });
        let proxy = proxy_to(&master);
        Pair {
            master,
            replica,
            proxy,
        }
    }

    /// Waits until the replica holds `key` as the master does.
    async fn replicated(&self, key: &str) {
        let (master, replica) = (&self.master, &self.replica);
        let same = eventually(secs(10), || {
            let m = master.cli(&["GET", key]);
            !m.is_empty() && replica.cli(&["GET", key]) == m
        })
        .await;
        assert!(same, "the replica never caught up on {key}");
    }

    /// Cuts the replica off from replication: it keeps what it has.
    fn cut_off(&self) {
        assert_eq!(self.replica.cli(&["REPLICAOF", "NO", "ONE"]), "OK");
    }

    /// The master dies and the address now reaches the replica; the
    /// client's connections through the proxy are reset.
    async fn fail_over(&mut self) {
        self.master.kill();
        self.proxy
            .repoint(SocketAddr::from((Ipv4Addr::LOCALHOST, self.replica.port())));
        self.drop_connections().await;
    }

    /// Every client connection to the new master is dropped: by the
    /// proxy (a load balancer's reset) and by the server (`CLIENT KILL`).
    async fn drop_connections(&self) {
        self.proxy.set(Fault::Reset);
        let proxy = &self.proxy;
        assert!(eventually(secs(3), || proxy.open_connections() == 0).await);
        self.proxy.set(Fault::Pass);
        self.replica.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
    }
}

fn client(urls: Vec<String>, guard: RestartGuard) -> Client {
    Client::builder(urls)
        .node_timeout(ms(300))
        .restart_guard(guard)
        .build()
        .unwrap()
}

/// What the attempts inside the first lease found.
#[derive(Debug, Default)]
struct Window {
    /// A second holder, with its token, while the first lease was valid.
    second: Option<(u64, Duration)>,
    /// Attempts in which the failed-over node was reported young or
    /// re-seeding.
    quarantined: usize,
    attempts: usize,
    /// Connection drops inside the window.
    drops: usize,
    /// What the last attempt that granted nothing heard.
    last: Option<String>,
}

impl Window {
    /// The control's second token repeats the lost one: the promoted
    /// server's fence is one acquisition behind. Every earlier attempt
    /// that granted nothing (a node a loaded machine answered too late)
    /// may have raised the fences it reached by one, so the second token
    /// is the lost one when it came at the first attempt, and at most
    /// that many above it otherwise.
    fn assert_repeats(&self, token: u64, lost: u64) {
        let earlier = self.attempts as u64 - 1;
        assert!(
            token <= lost + earlier && (earlier > 0 || token == lost),
            "the control's token {token}, the lost {lost}, after {earlier} attempts that granted nothing: {self:?}"
        );
    }
}

/// Until `first` runs out: drop every connection, send a request that
/// does not vote (it reconnects), then attempt; stop at a second holder.
async fn attempts_inside(
    pair: &Pair,
    client: &Client,
    first: &LockGuard,
    failed_over: usize,
) -> (Window, Option<LockGuard>) {
    let mut window = Window::default();
    // A margin so that no grant counted here came after the first lease.
    while first.validity() > ms(300) {
        pair.drop_connections().await;
        window.drops += 1;
        // Requests that do not vote: a look at another lock, and the
        // release of another lock's guard that never existed (both
        // reconnect). Their outcome does not matter.
        let _ = client.inspect("failover-other").await;
        let _ = client.force_release("failover-other").await;
        window.attempts += 1;
        match client.try_acquire("failover", TTL).await {
            Ok(Some(guard)) => {
                let left = first.validity();
                window.second = Some((guard.token().map_or(0, |t| t.get()), left));
                return (window, Some(guard));
            }
            Ok(None) => window.last = Some("contended".into()),
            Err(e) => {
                window.last = Some(e.to_string());
                window.quarantined += e
                    .node_failures()
                    .iter()
                    .filter(|f| {
                        f.index == failed_over
                            && matches!(
                                f.kind,
                                NodeErrorKind::Restarted { .. } | NodeErrorKind::Reseeding
                            )
                    })
                    .count();
            }
        }
        tokio::time::sleep(ms(100)).await;
    }
    (window, None)
}

/// After the first lease, the lock is granted again (once the window and
/// the re-seed are over), with a token above the lost holder's.
async fn next_token(client: &Client) -> u64 {
    let guard = client
        .lock("failover", TTL)
        .retry(Retry::new().with_max_wait(secs(20)))
        .acquire()
        .await
        .expect("granted after the window");
    let token = guard.token().unwrap().get();
    guard.release().await;
    token
}

/// Single-node mode, the most common deployment behind one address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_behind_one_address_keeps_the_guard_across_reconnects() {
    for guarded in [true, false] {
        let mut pair = Pair::start();
        let guard = if guarded {
            RestartGuard::new().with_window(TTL)
        } else {
            RestartGuard::off()
        };
        let client = client(vec![pair.proxy.url()], guard);
        // Both servers older than the window before the first vote.
        tokio::time::sleep(TTL + ms(1200)).await;
        // The fence exists, and the replica has it.
        let warm = client.acquire("failover", TTL).await.unwrap();
        let fence_key = client.fence_key("failover");
        warm.release().await;
        pair.replicated(&fence_key).await;
        pair.cut_off();
        // The last acquire, which the replica misses.
        let first = client.acquire("failover", TTL).await.unwrap();
        let lost = first.token().unwrap().get();
        pair.fail_over().await;
        let (window, second) = attempts_inside(&pair, &client, &first, 0).await;
        if guarded {
            assert!(
                window.second.is_none(),
                "a second holder while the first lease was valid: {window:?}, the first's token {lost}"
            );
            assert!(window.attempts >= 3 && window.drops >= 3, "{window:?}");
            // Every attempt that reached the promoted server heard it is
            // young; some may have met a connection just dropped instead.
            assert!(
                window.quarantined >= 3 && window.quarantined * 2 >= window.attempts,
                "the promoted server was not reported young inside its window: {window:?}"
            );
            first.release().await;
            let next = next_token(&client).await;
            assert!(next > lost, "token {next} after the lost holder's {lost}");
        } else {
            // The negative control: the promoted replica lacks the lock
            // and its fence is one acquisition behind.
            let (token, left) = window
                .second
                .unwrap_or_else(|| panic!("the control shows no second holder: {window:?}"));
            assert!(left > Duration::ZERO);
            window.assert_repeats(token, lost);
            drop(second);
            first.release().await;
        }
    }
}

/// Three nodes: the first lock lives on the failing-over node and one
/// other (the third was unreachable then). After the failover the
/// promoted server and the third node would make a majority without the
/// first holder's keys; the guard keeps the promoted one out across every
/// reconnect of the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_keep_the_failed_over_node_out_across_reconnects() {
    for guarded in [true, false] {
        let mut pair = Pair::start();
        let second_node = RedisServer::start();
        let third = RedisServer::start();
        let third_proxy = proxy_to(&third);
        let guard = if guarded {
            RestartGuard::new().with_window(TTL)
        } else {
            RestartGuard::off()
        };
        let client = client(
            vec![pair.proxy.url(), second_node.url(), third_proxy.url()],
            guard,
        );
        tokio::time::sleep(TTL + ms(1200)).await;
        // Every node has the fence, at one value: a node a loaded machine
        // answered too late would seed its fence from the clock later,
        // above the lost token, and hide the control's repeated one.
        let fence_key = client.fence_key("failover");
        let fences = || {
            [
                pair.master.cli(&["GET", &fence_key]),
                second_node.cli(&["GET", &fence_key]),
                third.cli(&["GET", &fence_key]),
            ]
        };
        for _ in 0..20 {
            let warm = client.acquire("failover", TTL).await.unwrap();
            warm.release().await;
            let [a, b, c] = fences();
            if !a.is_empty() && a == b && b == c {
                break;
            }
        }
        let [a, b, c] = fences();
        assert!(
            !a.is_empty() && a == b && b == c,
            "fences {a:?} {b:?} {c:?}"
        );
        pair.replicated(&fence_key).await;
        pair.cut_off();
        // The warm-up's last release returned at two confirmations of
        // three: its delete on the third node may still be on its way,
        // and the reset below would cut it off (in CI, under load, the
        // check after the first acquire found a lock key there once,
        // presumably this one).
        assert!(
            eventually(secs(5), || third.count_keys("redfence:lock:*") == 0).await,
            "the warm-up's release did not reach the third node"
        );
        // The third node refuses connections while the first lock is
        // taken: the lock lives on nodes 0 and 1.
        third_proxy.set(Fault::Reset);
        let closed = eventually(secs(3), || third_proxy.open_connections() == 0).await;
        assert!(closed, "the third node's connections stayed open");
        let first = client.acquire("failover", TTL).await.unwrap();
        let lost = first.token().unwrap().get();
        third_proxy.set(Fault::Pass);
        assert_eq!(third.count_keys("redfence:lock:*"), 0);
        pair.fail_over().await;
        let (window, second) = attempts_inside(&pair, &client, &first, 0).await;
        if guarded {
            assert!(
                window.second.is_none(),
                "a second holder while the first lease was valid: {window:?}, the first's token {lost}"
            );
            // Under load the window holds fewer rounds, and an attempt
            // refused by the holder's node may end before the promoted
            // server's answer is heard (contended, not an error): at
            // least one attempt must have met the quarantine.
            assert!(
                window.attempts >= 2 && window.quarantined >= 1,
                "{window:?}"
            );
            first.release().await;
            let next = next_token(&client).await;
            assert!(next > lost, "token {next} after the lost holder's {lost}");
        } else {
            let (token, left) = window
                .second
                .unwrap_or_else(|| panic!("the control shows no second holder: {window:?}"));
            assert!(left > Duration::ZERO);
            window.assert_repeats(token, lost);
            drop(second);
            first.release().await;
        }
    }
}
