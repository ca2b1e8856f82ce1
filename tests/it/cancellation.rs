//! Futures dropped at arbitrary points: an acquire cut off mid-flight, a
//! release cut off, a `with_lock` cut off while its closure runs, guards
//! dropped instead of released. Afterwards the resource must be free and no
//! key may be left behind. The TTL is long (30 s) so that a leaked key is
//! still there when the test looks, instead of quietly expiring.

use std::time::{Duration, Instant};

use futures::FutureExt;
use redfence::Client;
use tokio::time::timeout;

use crate::helpers::{
    client_with_timeout, eventually, ms, new_client, pttl, secs, warm_up, LOCK_KEYS,
};
use crate::support::Cluster;

const TTL: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
struct Outcomes {
    cut_off: usize,
    acquired: usize,
}

/// A random budget of 0..2 ms, with every tenth one long enough to let the
/// acquire through, so both "dropped mid-flight" and "acquired, then dropped
/// or released" happen on any machine (and `chaos` drops every tenth acquire
/// after its first poll).
fn budget(i: usize) -> Duration {
    if i % 10 == 9 {
        ms(200)
    } else {
        Duration::from_micros(rand::random_range(0..2_000))
    }
}

/// Runs `rounds` acquires under random deadlines; whatever got through is
/// dropped, released under a random deadline, or released in full.
async fn chaos(client: &Client, resource: &str, rounds: usize) -> Outcomes {
    let mut outcomes = Outcomes::default();
    for i in 0..rounds {
        let acquired = if i % 10 == 4 {
            // Polled once (its requests on their way), then dropped: a
            // cut-off in every run, however fast the nodes answer. (A zero
            // `timeout` is not one: tokio's timer rounds it up to the next
            // millisecond, time enough for an idle machine to answer.)
            client.acquire(resource, TTL).now_or_never().ok_or(())
        } else {
            timeout(budget(i), client.acquire(resource, TTL))
                .await
                .map_err(|_| ())
        };
        match acquired {
            Err(()) => outcomes.cut_off += 1,
            Ok(Ok(guard)) => {
                outcomes.acquired += 1;
                match i % 3 {
                    0 => drop(guard),
                    1 => {
                        let _ = timeout(budget(i + 1), guard.release()).await;
                    }
                    _ => {
                        guard.release().await;
                    }
                }
            }
            Ok(Err(e)) => panic!("round {i}: {e}"),
        }
    }
    outcomes
}

/// Nothing left on any node, and the lock is free right away.
async fn assert_free(cluster: &Cluster, client: &Client, resource: &str) {
    let n = cluster.nodes.len();
    let clean = eventually(secs(3), || cluster.count_keys(LOCK_KEYS) == vec![0; n]).await;
    if !clean {
        let key = crate::helpers::lock_key(resource);
        let ttls: Vec<i64> = cluster.nodes.iter().map(|node| pttl(node, &key)).collect();
        panic!(
            "lock keys leaked: {:?}, pttl {ttls:?}",
            cluster.count_keys(LOCK_KEYS)
        );
    }
    let started = Instant::now();
    let guard = client.try_acquire(resource, TTL).await.unwrap();
    assert!(guard.is_some(), "resource still locked");
    assert!(started.elapsed() < secs(2));
    guard.unwrap().release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_acquires_leave_no_lock() {
    let cluster = Cluster::start(3);
    let client = client_with_timeout(cluster.urls(), ms(300));
    warm_up(&client, &cluster).await;
    let outcomes = chaos(&client, "chaos", 200).await;
    assert!(outcomes.cut_off > 0, "{outcomes:?}");
    assert!(outcomes.acquired > 0, "{outcomes:?}");
    assert_free(&cluster, &client, "chaos").await;
}

/// The first calls of a fresh client are cut off while it is still
/// connecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_while_connecting_leaves_no_lock() {
    let cluster = Cluster::start(3);
    for _ in 0..20 {
        let client = crate::helpers::client(cluster.urls()).unwrap();
        let budget = Duration::from_micros(rand::random_range(0..3_000));
        if let Ok(result) = timeout(budget, client.acquire("connecting", TTL)).await {
            drop(result.unwrap());
        }
        // The client itself goes away too; its background releases must not
        // depend on it.
        drop(client);
    }
    assert_free(&cluster, &new_client(&cluster), "connecting").await;
}

/// `with_lock` cut off while its closure runs: the closure's future is
/// dropped first, then the lock is released in the background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_with_lock_releases() {
    let cluster = Cluster::start(3);
    let client = new_client(&cluster);
    warm_up(&client, &cluster).await;
    for round in 0..20 {
        let cut = timeout(
            ms(50),
            client.with_lock("scoped-chaos", TTL, |_| tokio::time::sleep(secs(10))),
        )
        .await;
        assert!(
            cut.is_err(),
            "round {round}: the closure cannot finish in time"
        );
        // Freed long before the TTL.
        assert!(
            eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await,
            "round {round}: {:?}",
            cluster.count_keys(LOCK_KEYS)
        );
    }
    assert_free(&cluster, &client, "scoped-chaos").await;
}

/// With a frozen node every request to it queues up in its socket; when it
/// thaws it runs our SETs and our releases in order, leaving nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_acquires_with_a_frozen_node_leave_no_lock() {
    let mut cluster = Cluster::start(3);
    let client = client_with_timeout(cluster.urls(), ms(300));
    warm_up(&client, &cluster).await;
    cluster.node(1).pause();
    let outcomes = chaos(&client, "frozen-chaos", 60).await;
    assert!(outcomes.cut_off > 0, "{outcomes:?}");
    cluster.node(1).resume();
    assert_free(&cluster, &client, "frozen-chaos").await;
}
