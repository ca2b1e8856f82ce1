use std::time::Duration;

use crate::support::Cluster;

#[tokio::test]
async fn smoke_acquire_release_on_three_nodes() {
    let cluster = Cluster::start(3);
    let client = crate::helpers::client(cluster.urls()).unwrap();
    let guard = client
        .acquire("smoke", Duration::from_secs(5))
        .await
        .unwrap();
    assert!(guard.validity() > Duration::from_secs(4));
    // At least a majority holds the key; a node still connecting when the
    // majority answered is skipped (see fanout.rs).
    let held: usize = cluster.count_keys("redfence:lock:*").iter().sum();
    assert!((2..=3).contains(&held), "{held}");
    assert!(client
        .try_acquire("smoke", Duration::from_secs(5))
        .await
        .unwrap()
        .is_none());
    let new = guard.extend(Duration::from_secs(8)).await.unwrap();
    assert!(new > Duration::from_secs(7));
    let r = guard.release().await;
    assert!(r.confirmed >= 2, "{r:?}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(cluster.count_keys("redfence:lock:*"), vec![0, 0, 0]);
}
