//! RESP3 nodes (`?protocol=resp3`): the lock, its tokens, extend, waiting by
//! notification (the subscription connection speaks RESP3 too, where
//! messages arrive as pushes) and the audit work as over RESP2. The server's
//! `CLIENT LIST` shows which protocol each connection speaks, so the test
//! knows the client really switched (and, as the negative control, that a
//! plain URL stays on RESP2).

use redfence::Client;

use crate::helpers::{client_with_timeout, eventually, hand_over_by_notice, ms, secs, LOCK_KEYS};
use crate::support::{Cluster, RedisServer, ServerOptions};

/// `resp=N` of each client connection on `node` other than the asking one,
/// with its type (`pubsub` for subscriptions, `normal` otherwise).
fn protocols(node: &RedisServer) -> Vec<(String, String)> {
    node.cli(&["CLIENT", "LIST"])
        .lines()
        .filter(|line| !line.contains("cmd=client|list"))
        .map(|line| {
            let field = |name: &str| {
                line.split_whitespace()
                    .find_map(|kv| kv.strip_prefix(name))
                    .unwrap_or_default()
                    .to_owned()
            };
            (field("resp="), field("name="))
        })
        .collect()
}

fn resp3_url(node: &RedisServer) -> String {
    format!("{}/?protocol=resp3", node.url())
}

fn client(urls: Vec<String>) -> Client {
    client_with_timeout(urls, ms(500))
}

#[tokio::test]
async fn lock_tokens_waiting_and_audit_over_resp3() {
    let cluster = Cluster::start_with(3, |_| ServerOptions {
        appendonly: true,
        appendfsync_always: true,
        ..ServerOptions::default()
    });
    let urls: Vec<String> = cluster.nodes.iter().map(resp3_url).collect();
    let holder = client(urls.clone());
    let guard = holder.acquire("resp3", secs(30)).await.unwrap();
    let first = guard.token().expect("a token");
    guard.extend(secs(30)).await.unwrap();
    let holding = || {
        cluster
            .count_keys(LOCK_KEYS)
            .iter()
            .filter(|&&n| n == 1)
            .count()
    };
    assert!(holding() >= 2, "the key is on a majority");
    let (second, after, released) = hand_over_by_notice(guard, client(urls.clone())).await;
    assert!(released.confirmed >= 2, "{released:?}");
    assert!(
        after < secs(5),
        "woken {after:?} after the release: the notice was heard"
    );
    assert!(second.token().expect("a token") > first);
    // Every connection of both clients, subscriptions included, is RESP3.
    for node in &cluster.nodes {
        let seen = protocols(node);
        assert!(
            seen.len() >= 2,
            "a command and a subscription connection: {seen:?}"
        );
        assert!(seen.iter().all(|(resp, _)| resp == "3"), "{seen:?}");
    }
    second.release().await;
    assert!(eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == [0, 0, 0]).await);

    let audit = tokio::time::timeout(secs(30), client(urls).audit())
        .await
        .unwrap();
    assert!(audit.is_ok(), "{audit:#}");
    for node in &audit.nodes {
        assert!(node.reachable, "{audit:#}");
        assert_eq!(node.role.as_deref(), Some("master"), "{audit:#}");
        assert_eq!(node.aof, Some(true), "{audit:#}");
        assert_eq!(node.appendfsync.as_deref(), Some("always"), "{audit:#}");
        assert!(
            node.run_id.is_some() && node.version.is_some() && node.uptime.is_some(),
            "{node:#?}"
        );
    }
}

/// The control: the same check sees RESP2 on a plain URL, so the test above
/// can tell the two apart.
#[tokio::test]
async fn a_plain_url_stays_on_resp2() {
    let node = RedisServer::start();
    let c = client(vec![node.url()]);
    c.acquire("resp2", secs(5)).await.unwrap().release().await;
    let seen = protocols(&node);
    assert!(
        !seen.is_empty() && seen.iter().all(|(resp, _)| resp == "2"),
        "{seen:?}"
    );
}
