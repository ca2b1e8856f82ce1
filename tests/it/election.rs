//! Leader election against real nodes: one leader among candidates, the
//! next one woken by the resign's notice or elected once the leader's keys
//! expire (a partitioned leader), terms strictly increasing, `leader()`
//! and `proclaim`, a stale leader's proclaim refused by the record's
//! fence, `observe()`, `lost()` before a new leader when the nodes are
//! paused, and every typed error. Time margins are generous: the
//! assertions are about order and counts, and "well under the fallback".

use std::time::{Duration, Instant};

use redfence::{Client, ElectionError, Holder, Leadership};

use crate::helpers::{builder, eventually, ms, new_client, notice_only_retry, proxy_to, secs};
use crate::support::proxy::Fault;
use crate::support::Cluster;

fn term(leadership: &Leadership) -> u64 {
    leadership.term().get()
}

/// Candidates of `clients` campaigning on `name`, each a task that
/// returns its leadership and the instant it won.
fn campaign_all(
    clients: &[Client],
    name: &str,
    ttl: Duration,
) -> Vec<tokio::task::JoinHandle<(usize, Leadership, Instant)>> {
    clients
        .iter()
        .enumerate()
        .map(|(i, client)| {
            let election = client.election(name).ttl(ttl).retry(notice_only_retry());
            tokio::spawn(async move {
                let won = election.campaign(format!("candidate-{i}")).await.unwrap();
                (i, won, Instant::now())
            })
        })
        .collect()
}

/// Waits for the first of `tasks` to finish and returns it with the rest.
async fn first_winner(
    tasks: Vec<tokio::task::JoinHandle<(usize, Leadership, Instant)>>,
) -> (
    (usize, Leadership, Instant),
    Vec<tokio::task::JoinHandle<(usize, Leadership, Instant)>>,
) {
    let (won, _, rest) = tokio::time::timeout(secs(60), futures::future::select_all(tasks))
        .await
        .expect("a candidate is elected");
    (won.unwrap(), rest)
}

#[tokio::test]
async fn one_leader_at_a_time_the_next_woken_by_the_resign_terms_increasing() {
    let cluster = Cluster::start(3);
    let clients: Vec<Client> = (0..4).map(|_| new_client(&cluster)).collect();
    let mut tasks = campaign_all(&clients, "relay", secs(10));
    let mut terms = Vec::new();
    let mut elected = Vec::new();
    for round in 0..4 {
        let ((i, leadership, _), rest) = first_winner(tasks).await;
        tasks = rest;
        // Nobody else is elected while it leads.
        tokio::time::sleep(ms(700)).await;
        assert!(
            tasks.iter().all(|t| !t.is_finished()),
            "round {round}: a second leader"
        );
        let leader = clients[i]
            .election("relay")
            .leader()
            .await
            .unwrap()
            .expect("a leader is reported");
        assert_eq!(leader.term, leadership.term());
        assert_eq!(leader.value_str(), Some(format!("candidate-{i}").as_str()));
        assert_eq!(leader.holder, Holder::Us);
        let other = (i + 1) % 4;
        let seen = clients[other]
            .election("relay")
            .leader()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(seen.term, leadership.term());
        assert!(matches!(seen.holder, Holder::Other { tag: Some(_) }));
        terms.push(term(&leadership));
        elected.push(i);
        let resigned = Instant::now();
        leadership.resign().await;
        if tasks.is_empty() {
            break;
        }
        // The next candidate is woken by the release notice: its retry
        // policy would sleep 10 s between attempts otherwise.
        assert!(
            eventually(secs(5), || tasks.iter().any(|t| t.is_finished())).await,
            "round {round}: nobody elected within 5 s of the resign"
        );
        eprintln!("round {round}: next leader after {:?}", resigned.elapsed());
    }
    assert_eq!(terms.len(), 4);
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "terms {terms:?}");
    elected.sort_unstable();
    assert_eq!(elected, vec![0, 1, 2, 3]);
    // After the last resign nobody leads.
    assert!(clients[0]
        .election("relay")
        .leader()
        .await
        .unwrap()
        .is_none());
}

#[tokio::test]
async fn a_partitioned_leader_loses_before_its_successor_is_elected() {
    let cluster = Cluster::start(3);
    let proxies: Vec<_> = cluster.nodes.iter().map(proxy_to).collect();
    let cut_off = builder(proxies.iter().map(|p| p.url()))
        .node_timeout(secs(1))
        .build()
        .unwrap();
    let other = new_client(&cluster);
    let first = cut_off
        .election("scheduler")
        .ttl(secs(3))
        .campaign("a")
        .await
        .unwrap();
    let lost = tokio::spawn({
        let lost = first.lost();
        async move { (lost.await, Instant::now()) }
    });
    let next = tokio::spawn(async move {
        let won = other
            .election("scheduler")
            .ttl(secs(3))
            .retry(notice_only_retry())
            .campaign("b")
            .await
            .unwrap();
        (won, Instant::now())
    });
    tokio::time::sleep(ms(500)).await;
    assert!(!next.is_finished(), "elected while the leader was healthy");
    let cut = Instant::now();
    for proxy in &proxies {
        proxy.set(Fault::Blackhole);
    }
    let (loss, lost_at) = tokio::time::timeout(secs(20), lost).await.unwrap().unwrap();
    let (second, elected_at) = tokio::time::timeout(secs(30), next).await.unwrap().unwrap();
    assert!(
        lost_at < elected_at,
        "lost {:?} after the cut, successor elected {:?} after it",
        lost_at - cut,
        elected_at - cut
    );
    assert!(term(&second) > term(&first));
    // The successor came by the keys' expiry, within about a TTL of the
    // cut (its retry policy would have waited 10 s between attempts).
    assert!(elected_at - cut < secs(9), "{:?}", elected_at - cut);
    eprintln!(
        "partition: lost after {:?} ({}), successor after {:?}",
        lost_at - cut,
        loss.reason,
        elected_at - cut
    );
    second.resign().await;
}

#[tokio::test]
async fn proclaim_updates_the_record_and_a_stale_leaders_is_refused() {
    let cluster = Cluster::start(3);
    let a = new_client(&cluster);
    let b = new_client(&cluster);
    let mut first = a.election("outbox").campaign("10.0.0.1").await.unwrap();
    first.proclaim("10.0.0.1:8080").await.unwrap();
    assert_eq!(first.value(), b"10.0.0.1:8080");
    let leader = b.election("outbox").leader().await.unwrap().unwrap();
    assert_eq!(leader.value_str(), Some("10.0.0.1:8080"));
    assert_eq!(leader.term, first.term());

    // An operator breaks the lock: a new leader is elected while the old
    // one still believes it leads (its watchdog has not looked yet).
    let election = b.election("outbox");
    let forced = b.force_release(election.resource()).await.unwrap();
    assert!(forced.is_complete());
    let second = election.campaign("10.0.0.2").await.unwrap();
    assert!(second.term() > first.term());
    assert!(
        first.lease().is_valid(),
        "the old leader has not noticed yet"
    );
    let refused = first.proclaim("10.0.0.1:9090").await.unwrap_err();
    match &refused {
        ElectionError::Superseded { term, current, .. } => {
            assert_eq!(*term, first.term());
            assert_eq!(*current, second.term());
        }
        other => panic!("not refused as stale: {other:?}"),
    }
    assert!(refused.is_superseded());
    assert_eq!(
        first.value(),
        b"10.0.0.1:8080",
        "the refused value is not kept"
    );
    let leader = a.election("outbox").leader().await.unwrap().unwrap();
    assert_eq!(leader.value_str(), Some("10.0.0.2"));
    assert_eq!(leader.term, second.term());
    second.resign().await;
    drop(first);
}

#[tokio::test]
async fn observe_yields_each_leader_once_in_term_order() {
    let cluster = Cluster::start(3);
    let watcher = new_client(&cluster);
    let mut observer = watcher.election("cron").observe_interval(ms(100)).observe();
    let leaders = tokio::spawn(async move {
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(observer.next_leader().await);
        }
        // No fourth: the last leader is yielded once.
        let more = tokio::time::timeout(ms(800), observer.next_leader()).await;
        (seen, more.is_err())
    });
    let mut terms = Vec::new();
    for name in ["a", "b", "c"] {
        let client = new_client(&cluster);
        let leadership = client.election("cron").campaign(name).await.unwrap();
        terms.push(leadership.term());
        // Longer than the interval and a read, on a loaded machine.
        tokio::time::sleep(ms(1200)).await;
        if name == "c" {
            let (seen, no_more) = tokio::time::timeout(secs(20), leaders)
                .await
                .unwrap()
                .unwrap();
            let values: Vec<_> = seen
                .iter()
                .map(|l| l.value_str().unwrap().to_owned())
                .collect();
            assert_eq!(values, ["a", "b", "c"]);
            let seen_terms: Vec<_> = seen.iter().map(|l| l.term).collect();
            assert_eq!(seen_terms, terms);
            assert!(no_more, "a leader yielded twice");
            leadership.resign().await;
            return;
        }
        leadership.resign().await;
    }
}

#[tokio::test]
async fn lost_fires_when_the_nodes_pause_past_the_ttl_before_anyone_else_leads() {
    let mut cluster = Cluster::start(3);
    let a = new_client(&cluster);
    let b = new_client(&cluster);
    let mut first = a
        .election("paused")
        .ttl(secs(2))
        .campaign("a")
        .await
        .unwrap();
    let lost = tokio::spawn({
        let lost = first.lost();
        async move { (lost.await, Instant::now()) }
    });
    for i in 0..3 {
        cluster.node(i).pause();
    }
    let paused = Instant::now();
    // Past the TTL: every key expires while the nodes are stopped, as far
    // as their clocks are concerned once they resume.
    tokio::time::sleep(secs(3)).await;
    let candidate = tokio::spawn(async move {
        let won = b
            .election("paused")
            .ttl(secs(2))
            .campaign("b")
            .await
            .unwrap();
        (won, Instant::now())
    });
    for i in 0..3 {
        cluster.node(i).resume();
    }
    let (loss, lost_at) = tokio::time::timeout(secs(10), lost).await.unwrap().unwrap();
    let (second, elected_at) = tokio::time::timeout(secs(40), candidate)
        .await
        .unwrap()
        .unwrap();
    assert!(
        lost_at < elected_at,
        "{:?} vs {:?}",
        lost_at - paused,
        elected_at - paused
    );
    assert!(term(&second) > term(&first));
    // A lost leadership proclaims nothing.
    let err = first.proclaim("still me").await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    assert!(matches!(&err, ElectionError::Lost(l) if l.reason == loss.reason));
    second.resign().await;
}

#[tokio::test]
async fn the_typed_errors() {
    let mut cluster = Cluster::start(3);
    // Fencing off: refused before anything is sent.
    let unfenced = builder(cluster.urls()).fencing(false).build().unwrap();
    let err = unfenced.election("x").campaign("v").await.unwrap_err();
    assert!(matches!(err, ElectionError::FencingOff), "{err:?}");
    assert!(err.to_string().contains("fencing(false)"), "{err}");

    // A name the lock refuses.
    let client = new_client(&cluster);
    let long = "n".repeat(2000);
    for name in ["", long.as_str()] {
        let err = client.election(name).campaign("v").await.unwrap_err();
        assert!(
            matches!(&err, ElectionError::Lock { source, .. }
                if matches!(**source, redfence::Error::InvalidResource(_))),
            "{err:?}"
        );
    }

    // The campaign's deadline while another leads.
    let leader = client.election("busy").campaign("a").await.unwrap();
    let other = new_client(&cluster);
    let started = Instant::now();
    let err = other
        .election("busy")
        .campaign_deadline(secs(1))
        .campaign("b")
        .await
        .unwrap_err();
    let took = started.elapsed();
    match &err {
        ElectionError::Deadline { rounds, last, .. } => {
            assert!(*rounds >= 1);
            assert!(last.as_ref().is_some_and(|e| e.is_contended()), "{err:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(took >= secs(1) && took < secs(6), "{took:?}");

    // A majority down: neither the leader nor its record can be read or
    // written.
    cluster.node(1).kill();
    cluster.node(2).kill();
    let err = other.election("busy").leader().await.unwrap_err();
    assert!(
        matches!(
            &err,
            ElectionError::Unavailable {
                phase: "read",
                quorum: 2,
                ..
            }
        ),
        "{err:?}"
    );
    let mut leader = leader;
    let err = leader.proclaim("c").await.unwrap_err();
    assert!(
        matches!(&err, ElectionError::Unavailable { phase: "publish", answered, quorum: 2, failures, .. } if *answered <= 1 && failures.len() == 2),
        "{err:?}"
    );
}
