//! `Client::inspect`, `Client::id` and `Client::force_release` against real
//! nodes: a free lock, one held by this client and by another (named by its
//! tag), one left on a minority only, TTL and fence reported, a dead node
//! reported as such; the forced release deletes the key everywhere and the
//! old holder's later fenced write is refused once the next holder wrote;
//! the secret part of a value never shows in any output.

use redfence::{Client, Error, ForceOutcome, Holder, StoreError};

use crate::helpers::{lock_key, secs, warm_client};
use crate::support::Cluster;

#[tokio::test]
async fn a_free_lock_is_free_on_every_node_with_its_fence() {
    let cluster = Cluster::start(3);
    let client = warm_client(&cluster).await;
    let guard = client.acquire("free", secs(10)).await.unwrap();
    let token = guard.token().unwrap().get();
    guard.release().await;
    let i = client.inspect("free").await.unwrap();
    assert!(!i.is_held(), "{i}");
    assert_eq!((i.held_on, i.quorum, i.answered()), (0, 2, 3));
    assert_eq!(i.valid_for_at_least, None);
    assert_eq!(i.key, lock_key("free"));
    assert_eq!(
        i.fence_key.as_deref(),
        Some(client.fence_key("free").as_str())
    );
    assert!(i
        .nodes
        .iter()
        .all(|n| n.holder.is_none() && n.error.is_none()));
    // The last token handed out is the largest fence of a majority.
    assert_eq!(i.fence, Some(token), "{i}");
}

#[tokio::test]
async fn a_lock_held_by_this_client_reports_its_ttl_and_token() {
    let cluster = Cluster::start(3);
    let client = warm_client(&cluster).await;
    let guard = client.acquire("mine", secs(10)).await.unwrap();
    let token = guard.token().map(|t| t.get());
    // A fresh bucket: a node whose transaction answered after the round
    // decided seeds its fence in the background (`wire::transacted`, the
    // `SEED` script); every node holds the token once that landed.
    let deadline = std::time::Instant::now() + secs(5);
    let i = loop {
        let i = client.inspect("mine").await.unwrap();
        if i.nodes.iter().all(|n| n.fence == token) || std::time::Instant::now() > deadline {
            break i;
        }
        tokio::time::sleep(crate::helpers::ms(20)).await;
    };
    assert_eq!(i.holder, Some(Holder::Us), "{i}");
    assert_eq!(i.held_on, 3);
    let valid = i.valid_for_at_least.unwrap();
    assert!(valid > secs(5) && valid <= secs(10), "{valid:?}");
    for node in &i.nodes {
        assert_eq!(node.holder, Some(Holder::Us));
        let ttl = node.expires_in.unwrap();
        assert!(ttl > secs(5) && ttl <= secs(10), "{ttl:?}");
        assert_eq!(node.fence, token, "{i}");
    }
    assert_eq!(i.fence, token);
    assert_eq!(client.id().len(), 16);
    assert_eq!(client.clone().id(), client.id(), "clones share the tag");
    guard.release().await;
}

#[tokio::test]
async fn a_lock_held_by_another_client_names_its_tag() {
    let cluster = Cluster::start(3);
    let other = warm_client(&cluster).await;
    let me = warm_client(&cluster).await;
    assert_ne!(me.id(), other.id());
    let guard = other.acquire("theirs", secs(10)).await.unwrap();
    let i = me.inspect("theirs").await.unwrap();
    let theirs = Holder::Other {
        tag: Some(other.id().to_owned()),
    };
    assert_eq!(i.holder.as_ref(), Some(&theirs), "{i}");
    assert!(i.to_string().contains(other.id()), "{i}");
    // The holder sees itself.
    let own = other.inspect("theirs").await.unwrap();
    assert_eq!(own.holder, Some(Holder::Us));
    guard.release().await;
}

#[tokio::test]
async fn a_key_on_a_minority_only_is_not_held() {
    let mut cluster = Cluster::start(3);
    let client = warm_client(&cluster).await;
    let guard = client.acquire("minority", secs(10)).await.unwrap();
    // Every write of the acquire has run: the deletes are the last word.
    assert!(crate::helpers::landed(&cluster.nodes, "minority", secs(5)).await);
    for i in 0..2 {
        cluster.node(i).cli(&["DEL", &lock_key("minority")]);
    }
    let i = client.inspect("minority").await.unwrap();
    assert!(!i.is_held(), "{i}");
    assert_eq!(i.held_on, 0);
    assert!(!i.nodes[0].is_held() && !i.nodes[1].is_held());
    assert_eq!(i.nodes[2].holder, Some(Holder::Us));
    assert!(i.nodes[2].expires_in.is_some());
    drop(guard);
}

#[tokio::test]
async fn a_dead_node_is_reported_and_the_rest_still_summarised() {
    let mut cluster = Cluster::start(3);
    let client = warm_client(&cluster).await;
    let guard = client.acquire("dead", secs(10)).await.unwrap();
    cluster.node(1).kill();
    let i = client.inspect("dead").await.unwrap();
    assert_eq!(i.answered(), 2, "{i}");
    assert!(i.nodes[1].error.is_some());
    assert_eq!(i.holder, Some(Holder::Us));
    assert_eq!(i.held_on, 2);
    drop(guard);
}

#[tokio::test]
async fn force_release_deletes_everywhere_and_fencing_refuses_the_old_holder() {
    let cluster = Cluster::start(3);
    let old = warm_client(&cluster).await;
    let admin = warm_client(&cluster).await;
    let conn = redis::Client::open(cluster.nodes[0].url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let store = redfence::FencedStore::new(conn).timeout(secs(2));

    let held = old.acquire("forced", secs(30)).await.unwrap();
    let forced = admin.force_release("forced").await.unwrap();
    assert_eq!(forced.deleted(), 3, "{forced:?}");
    assert!(forced.is_complete());
    assert!(forced
        .nodes
        .iter()
        .all(|n| matches!(n.outcome, ForceOutcome::Deleted)));
    assert_eq!(cluster.count_keys(&lock_key("forced")), vec![0, 0, 0]);
    // A second time there is nothing left.
    let again = admin.force_release("forced").await.unwrap();
    assert_eq!(again.deleted(), 0);

    let next = admin
        .try_acquire("forced", secs(30))
        .await
        .unwrap()
        .expect("free at once");
    assert!(next.token().unwrap() > held.token().unwrap());
    store
        .write("row", "new", next.token().unwrap())
        .await
        .unwrap();
    match store.write("row", "old", held.token().unwrap()).await {
        Err(StoreError::Stale(stale)) => assert_eq!(stale.current, next.token().unwrap()),
        other => panic!("the old holder's write went through: {other:?}"),
    }
    next.release().await;
    drop(held);
}

#[tokio::test]
async fn the_secret_part_of_a_value_never_shows() {
    let cluster = Cluster::start(3);
    let client = warm_client(&cluster).await;
    let other = warm_client(&cluster).await;
    let guard = other.acquire("secret", secs(10)).await.unwrap();
    let value = cluster.nodes[0].cli(&["GET", &lock_key("secret")]);
    let (tag, secret) = value.split_once(':').expect("tag:secret");
    assert_eq!(tag, other.id());
    assert_eq!(secret.len(), 22);
    let i = client.inspect("secret").await.unwrap();
    let outputs = [format!("{i}"), format!("{i:?}"), format!("{i:#?}")];
    for text in &outputs {
        assert!(!text.contains(secret), "{text}");
        assert!(text.contains(tag), "{text}");
    }
    // The negative control: the same formatting of the raw value shows it.
    assert!(format!("{value:?}").contains(secret));
    guard.release().await;
}

#[tokio::test]
async fn an_invalid_resource_is_a_typed_error() {
    let client = Client::new(["redis://127.0.0.1:1"]).unwrap();
    assert!(matches!(
        client.inspect("").await,
        Err(Error::InvalidResource(_))
    ));
    let long = "x".repeat(2000);
    assert!(matches!(
        client.force_release(&long).await,
        Err(Error::InvalidResource(_))
    ));
}
