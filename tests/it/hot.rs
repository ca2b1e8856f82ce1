//! Hot locks (issue 16): many requests racing on few resources.

use std::sync::Arc;

use redfence::{Client, RestartGuard};

use crate::helpers::{calls, ms, secs};
use crate::support::{Cluster, RedisServer};

/// `errorstat_{code}` from `INFO errorstats`: replies with that error code
/// the node has sent since it started (0 when none).
fn errors_replied(node: &RedisServer, code: &str) -> u64 {
    let info = node.cli(&["INFO", "errorstats"]);
    let prefix = format!("errorstat_{code}:count=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// 500 requests at once on a client that has not connected yet (the flash
/// sale's opening second): 50 resources, each locked and released by ten
/// tasks. How often each node answers `NOSCRIPT` and loads a script.
async fn cold_race(cluster: &Cluster, client: &Client) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
    let tasks: Vec<_> = (0..500)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let resource = format!("cold-{}", i % 50);
                let guard = client
                    .lock(&resource, secs(10))
                    .retry(redfence::Retry::new().with_max_wait(secs(60)))
                    .acquire()
                    .await
                    .expect("every request gets the lock in turn");
                guard.release().await;
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let per_node =
        |f: &dyn Fn(&RedisServer) -> u64| cluster.nodes.iter().map(f).collect::<Vec<_>>();
    (
        per_node(&|n| errors_replied(n, "NOSCRIPT")),
        per_node(&|n| calls(n, "script|load")),
        per_node(&|n| calls(n, "eval")),
    )
}

/// The incident: at the start of the flash sale, each lock node answered
/// 203–238 `EVALSHA`s with `NOSCRIPT`, every concurrent first use paying a
/// round trip before one `EVAL` loaded the script. The handshake now loads
/// the lock's seventeen scripts (the mutex's and the fence's seed, the multi-resource acquire,
/// release and extend, the read-write lock's admissions and downgrade)
/// before the connection carries a command, so a cold start costs one load
/// per script per node connection and no `NOSCRIPT`, however many requests
/// race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_start_loads_each_script_once_per_connection() {
    let cluster = Cluster::start(3);
    let client = Client::builder(cluster.urls())
        .node_timeout(ms(500))
        .restart_guard(RestartGuard::off())
        .build()
        .unwrap();
    let (noscript, loads, evals) = cold_race(&cluster, &client).await;
    assert_eq!(noscript, [0, 0, 0], "NOSCRIPT replies per node");
    // One command connection per node, seventeen scripts each.
    assert_eq!(loads, [17, 17, 17], "SCRIPT LOADs per node");
    assert_eq!(evals, [0, 0, 0], "EVAL fallbacks per node");

    // The control: the same race after the script caches were flushed
    // behind the connected client's back shows NOSCRIPT replies and EVAL
    // fallbacks (43–87 per node in one run), so the counts above can see a
    // storm. A flush under a connected client is the one case left: each
    // request that raced the first `EVAL` pays its own.
    for node in &cluster.nodes {
        assert_eq!(node.cli(&["SCRIPT", "FLUSH"]), "OK");
    }
    let client = Arc::new(client);
    let (noscript, _, evals) = cold_race(&cluster, &client).await;
    assert!(
        noscript.iter().all(|&n| n > 0),
        "NOSCRIPT after a flush: {noscript:?}"
    );
    assert!(
        evals.iter().all(|&n| n > 0),
        "EVAL fallbacks after a flush: {evals:?}"
    );
}

/// The read-write lock's first use on a fresh client: 200 requests at
/// once, reads and writes (one in four) on 20 locks. Its admissions are
/// in the handshake's preload, so no node answers `NOSCRIPT` and every
/// script is loaded once per connection. The control, as above: after a
/// flush behind the client's back the same race pays `NOSCRIPT` and
/// `EVAL` fallbacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_start_of_rw_locks_pays_no_noscript() {
    async fn race(cluster: &Cluster, client: &Client) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
        let tasks: Vec<_> = (0..200)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move {
                    let lock = client.rw_lock(&format!("cold-rw-{}", i % 20)).unwrap();
                    let request = if i % 4 == 0 {
                        lock.write(secs(10))
                    } else {
                        lock.read(secs(10))
                    };
                    let guard = request
                        .retry(redfence::Retry::new().with_max_wait(secs(60)))
                        .acquire()
                        .await
                        .expect("every request gets the lock in turn");
                    guard.release().await;
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let per_node =
            |f: &dyn Fn(&RedisServer) -> u64| cluster.nodes.iter().map(f).collect::<Vec<_>>();
        (
            per_node(&|n| errors_replied(n, "NOSCRIPT")),
            per_node(&|n| calls(n, "script|load")),
            per_node(&|n| calls(n, "eval")),
        )
    }
    let cluster = Cluster::start(3);
    let client = Client::builder(cluster.urls())
        .node_timeout(ms(500))
        .restart_guard(RestartGuard::off())
        .build()
        .unwrap();
    let (noscript, loads, evals) = race(&cluster, &client).await;
    assert_eq!(noscript, [0, 0, 0], "NOSCRIPT replies per node");
    assert_eq!(loads, [17, 17, 17], "SCRIPT LOADs per node");
    assert_eq!(evals, [0, 0, 0], "EVAL fallbacks per node");

    for node in &cluster.nodes {
        assert_eq!(node.cli(&["SCRIPT", "FLUSH"]), "OK");
    }
    let (noscript, _, evals) = race(&cluster, &client).await;
    assert!(
        noscript.iter().all(|&n| n > 0),
        "NOSCRIPT after a flush: {noscript:?}"
    );
    assert!(
        evals.iter().all(|&n| n > 0),
        "EVAL fallbacks after a flush: {evals:?}"
    );
}
