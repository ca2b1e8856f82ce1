//! Least-privilege ACL users: each feature, run as a user with exactly the
//! rules the ACL table of docs/operations.md gives it (read from the file,
//! so the documentation cannot drift from what is tested), works. The other
//! direction, a missing permission named in a `NoPermission` failure, is
//! `errors::a_user_missing_a_permission_gets_no_permission_naming_the_command`.

use redfence::{Client, RestartGuard, Retry};

use crate::helpers::{calls, eventually, hand_over_by_notice, ms, secs, LOCK_KEYS};
use crate::support::Cluster;

/// The rows of docs/operations.md's ACL table, in order: (feature, rules).
pub(crate) fn readme_rules() -> Vec<(String, Vec<String>)> {
    let readme = include_str!("../../docs/operations.md");
    let section = readme
        .split("## Least-privilege ACL users")
        .nth(1)
        .expect("docs/operations.md has the ACL section");
    let rows: Vec<(String, Vec<String>)> = section
        .lines()
        .skip_while(|l| !l.starts_with("| feature"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let l = l.replace("\\|", "\u{0}");
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let rules = cells[2].trim_matches('`').replace('\u{0}', "|");
            (
                cells[1].to_owned(),
                rules.split_whitespace().map(str::to_owned).collect(),
            )
        })
        .collect();
    assert_eq!(rows.len(), 6, "{rows:?}");
    rows
}

/// A user `name` with the rules of the rows `rows` on every node,
/// and its URLs.
fn user(cluster: &Cluster, name: &str, rows: &[usize]) -> Vec<String> {
    user_with(cluster, name, rows, &[])
}

/// [`user`], with the rules `extra` beside the rows'.
pub(crate) fn user_with(
    cluster: &Cluster,
    name: &str,
    rows: &[usize],
    extra: &[&str],
) -> Vec<String> {
    let table = readme_rules();
    for node in &cluster.nodes {
        let mut acl: Vec<String> = ["ACL", "SETUSER", name, "reset", "on", ">pa55word"]
            .map(String::from)
            .to_vec();
        for &row in rows {
            acl.extend(table[row].1.iter().cloned());
        }
        acl.extend(extra.iter().map(|rule| (*rule).to_owned()));
        let args: Vec<&str> = acl.iter().map(String::as_str).collect();
        assert_eq!(node.cli(&args), "OK", "{args:?}");
    }
    cluster
        .nodes
        .iter()
        .map(|n| format!("redis://{name}:pa55word@127.0.0.1:{}", n.port()))
        .collect()
}

fn builder(urls: Vec<String>) -> redfence::Builder {
    Client::builder(urls)
        .node_timeout(ms(500))
        .restart_guard(RestartGuard::off())
}

#[tokio::test]
async fn the_lock_alone_needs_the_first_row() {
    let cluster = Cluster::start(3);
    let urls = user(&cluster, "plain", &[0]);
    let client = builder(urls)
        .fencing(false)
        .wake_on_release(false)
        .build()
        .unwrap();
    let guard = client.acquire("acl-plain", secs(30)).await.unwrap();
    guard.extend(secs(30)).await.unwrap();
    // A second client waits (its retries probe the holder's TTL: SET and
    // PTTL) until the first releases.
    let other = client.clone();
    let waiter = tokio::spawn(async move {
        other
            .lock("acl-plain", secs(30))
            .retry(Retry::new().with_delay(ms(50)).with_max_wait(secs(10)))
            .acquire()
            .await
    });
    tokio::time::sleep(ms(200)).await;
    assert!(guard.release().await.confirmed >= 2);
    let second = waiter.await.unwrap().expect("the waiter gets the lock");
    second.release().await;
    assert!(eventually(secs(2), || cluster.count_keys(LOCK_KEYS) == vec![0; 3]).await);
}

#[tokio::test]
async fn fencing_needs_the_second_row() {
    let cluster = Cluster::start(3);
    let urls = user(&cluster, "fenced", &[0, 1]);
    let client = builder(urls).wake_on_release(false).build().unwrap();
    let first = client.acquire("acl-fenced", secs(30)).await.unwrap();
    let t1 = first.token().expect("a token");
    first.release().await;
    let second = client.acquire("acl-fenced", secs(30)).await.unwrap();
    assert!(second.token().expect("a token") > t1);
    second.release().await;
}

/// The waiter's retry policy would sleep 10 s: it gets the lock well before
/// only because the release notice reached it. It waited in the fair
/// queue (an `RPUSH` on the home node) and no command was refused on any
/// node: a refusal inside the release script on the home node would leave
/// the key there, and a refused join would fall back to the classic wait
/// without anyone noticing.
#[tokio::test]
async fn waiting_by_notification_needs_the_third_row() {
    let cluster = Cluster::start(3);
    let urls = user(&cluster, "waiter", &[0, 2]);
    let holder = builder(urls.clone()).fencing(false).build().unwrap();
    let waiting = builder(urls).fencing(false).build().unwrap();
    let guard = holder.acquire("acl-notify", secs(30)).await.unwrap();
    let (second, after, _) = hand_over_by_notice(guard, waiting).await;
    second.release().await;
    assert!(
        after < secs(5),
        "woken {after:?} after the release: no notice arrived"
    );
    let joins: u64 = cluster.nodes.iter().map(|n| calls(n, "rpush")).sum();
    assert_eq!(joins, 1, "one join of the fair queue");
    for node in &cluster.nodes {
        let info = node.cli(&["INFO", "commandstats"]);
        let refused: Vec<&str> = info
            .lines()
            .filter(|l| !l.contains("rejected_calls=0,") && l.contains("rejected_calls="))
            .collect();
        assert!(refused.is_empty(), "refused commands: {refused:?}");
    }
}

/// Young servers: the guard keeps each out of quorums for the window, then
/// re-seeds its fences from the others (`MGET`, the re-seed script).
#[tokio::test]
async fn the_restart_guard_and_reseed_need_the_fourth_row() {
    let cluster = Cluster::start(3);
    let urls = user(&cluster, "guarded", &[0, 1, 3]);
    let client = Client::builder(urls)
        .node_timeout(ms(500))
        .wake_on_release(false)
        .restart_guard(RestartGuard::new().with_window(ms(500)))
        .build()
        .unwrap();
    let guard = client
        .lock("acl-guard", secs(1))
        .retry(Retry::new().with_max_wait(secs(20)))
        .acquire()
        .await
        .expect("acquired once the window is over and the nodes re-seeded");
    assert!(guard.token().is_some());
    guard.release().await;
}

/// The audit as the limited user finds what it finds as the default user
/// (who may do everything): no check went unanswered for lack of a right.
#[tokio::test]
async fn the_audit_needs_the_fifth_row() {
    let cluster = Cluster::start(3);
    let urls = user(&cluster, "auditor", &[0, 4]);
    let limited = builder(urls).build().unwrap().audit().await;
    let full = builder(cluster.urls()).build().unwrap().audit().await;
    let checks = |audit: &redfence::Audit| -> Vec<Vec<String>> {
        audit
            .nodes
            .iter()
            .map(|n| {
                let mut found: Vec<String> = n
                    .findings
                    .iter()
                    .map(|f| format!("{:?} {:?}", f.check, f.severity))
                    .collect();
                found.sort();
                found
            })
            .collect()
    };
    assert_eq!(checks(&limited), checks(&full), "{limited:?}");
    // What CONFIG GET reads (INFO alone has no appendfsync or save).
    let settings = |audit: &redfence::Audit| -> Vec<_> {
        audit
            .nodes
            .iter()
            .map(|n| {
                (
                    n.maxmemory_policy.clone(),
                    n.aof,
                    n.appendfsync.clone(),
                    n.rdb_save.clone(),
                )
            })
            .collect()
    };
    assert_eq!(settings(&limited), settings(&full));
    for node in &limited.nodes {
        assert!(node.reachable && node.run_id.is_some(), "{node:?}");
        assert!(
            node.appendfsync.is_some() && node.clock_offset.is_some(),
            "{node:?}"
        );
    }
}

/// Without `+subscribe` waiters cannot be notified: they wait by their
/// retry policy, and the subscriber retries its refused `SUBSCRIBE` with
/// back-off instead of opening connection after connection (it did, in a
/// tight loop, until this test).
#[tokio::test]
async fn without_subscribe_waiters_poll_and_the_subscriber_backs_off() {
    let cluster = Cluster::start(1);
    let urls = user(&cluster, "nosub", &[0]);
    let holder = builder(urls.clone()).fencing(false).build().unwrap();
    let waiting = builder(urls)
        .fencing(false)
        .reconnect_backoff_max(secs(1))
        .build()
        .unwrap();
    let guard = holder.acquire("acl-nosub", secs(30)).await.unwrap();
    let connections = || -> u64 {
        let info = cluster.nodes[0].cli(&["INFO", "stats"]);
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("INFO stats has total_connections_received")
    };
    let before = connections();
    let waiter = tokio::spawn(async move {
        waiting
            .lock("acl-nosub", secs(30))
            .retry(Retry::new().with_delay(ms(300)).with_max_wait(secs(20)))
            .acquire()
            .await
    });
    tokio::time::sleep(secs(2)).await;
    let during = connections() - before;
    guard.release().await;
    let second = waiter
        .await
        .unwrap()
        .expect("the waiter gets it by polling");
    second.release().await;
    // Back-off from 25 ms doubling to 1 s: about 7 tries in 2 s, plus the
    // waiter's own connection and the test's INFO connections.
    assert!(during <= 20, "{during} connections in 2 s");
}
