//! Single-flight against real nodes: one computation for a stampede of
//! callers on an expired key (and the naive cache-aside code computing
//! many times under the same load, proving the counter sees it), a
//! cancelled computer freeing the key at once, a dropped waiter leaving
//! the computation alone, a computer whose lease ran out refused by the
//! fence, serve-stale, the waiter's deadline, the computer's error given
//! to its waiters, and XFetch refreshing a hot key before it expires.
//! Time margins are generous (a loaded 2-core machine): the assertions are
//! about counts and order.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redfence::{Client, OnceError, SingleFlight};
use tokio::time::timeout;

use crate::helpers::{builder, client_with_timeout, ms, secs, warm_client};
use crate::support::Cluster;

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct DbError(String);

type Result<T> = std::result::Result<T, OnceError<DbError>>;

/// A computation that counts itself, takes `took`, and returns `value`.
async fn counted(
    count: Arc<AtomicUsize>,
    took: Duration,
    value: &str,
) -> std::result::Result<Vec<u8>, DbError> {
    count.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(took).await;
    Ok(value.as_bytes().to_vec())
}

/// Puts `value` in the entry of `once`, fresh for `fresh`.
async fn seed(once: &SingleFlight, value: &str, fresh: Duration) {
    let once = once.clone().value_ttl(fresh);
    let value = value.to_owned();
    let got: Result<Vec<u8>> = once
        .get_or_compute(|| async move { Ok(value.into_bytes()) })
        .await;
    got.unwrap();
}

async fn two_clients(cluster: &Cluster) -> Vec<Client> {
    vec![warm_client(cluster).await, warm_client(cluster).await]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stampede_on_an_expired_key_computes_once_and_everyone_gets_the_value() {
    let cluster = Cluster::start(3);
    let clients = two_clients(&cluster).await;
    let once = |c: &Client| c.once("product:1").wait(secs(60));
    seed(&once(&clients[0]), "v1", ms(50)).await;
    tokio::time::sleep(ms(300)).await;

    let count = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for client in &clients {
        for _ in 0..100 {
            let once = once(client);
            let count = Arc::clone(&count);
            tasks.push(tokio::spawn(async move {
                let got: Result<Vec<u8>> =
                    once.get_or_compute(|| counted(count, ms(20), "v2")).await;
                got
            }));
        }
    }
    for task in tasks {
        let got = tokio::time::timeout(secs(90), task).await.unwrap().unwrap();
        assert_eq!(got.unwrap(), b"v2");
    }
    assert_eq!(count.load(Ordering::SeqCst), 1, "computations per expiry");
}

/// The negative control: the same load on the naive cache-aside code
/// (GET; on a miss compute and SET with a TTL) computes many times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_single_flight_the_same_stampede_computes_many_times() {
    let cluster = Cluster::start(1);
    let url = cluster.urls()[0].clone();
    let count = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        for _ in 0..100 {
            let mut conn = conn.clone();
            let count = Arc::clone(&count);
            tasks.push(tokio::spawn(async move {
                let cached: Option<Vec<u8>> = redis::cmd("GET")
                    .arg("naive:product:1")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                if let Some(value) = cached {
                    return value;
                }
                let value = counted(count, ms(20), "v2").await.unwrap();
                let () = redis::cmd("SET")
                    .arg("naive:product:1")
                    .arg(&value)
                    .arg("PX")
                    .arg(60_000)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                value
            }));
        }
    }
    for task in tasks {
        assert_eq!(task.await.unwrap(), b"v2");
    }
    let computations = count.load(Ordering::SeqCst);
    assert!(computations > 1, "{computations} computations");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_computer_frees_the_key_at_once_for_the_next_caller() {
    let cluster = Cluster::start(3);
    let clients = two_clients(&cluster).await;
    // A 30 s lease: a release only by the cancellation lets the next
    // caller in within seconds.
    let once = |c: &Client| c.once("product:2").ttl(secs(30)).wait(secs(60));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let computer = {
        let once = once(&clients[0]);
        tokio::spawn(async move {
            let got: Result<Vec<u8>> = once
                .get_or_compute(|| async move {
                    let _ = started_tx.send(());
                    tokio::time::sleep(secs(120)).await;
                    Ok(b"never".to_vec())
                })
                .await;
            got
        })
    };
    started_rx.await.unwrap();
    // A waiter on the other client, queued behind the computer.
    let count = Arc::new(AtomicUsize::new(0));
    let waiter = {
        let once = once(&clients[1]);
        let count = Arc::clone(&count);
        tokio::spawn(async move {
            let got: Result<Vec<u8>> = once.get_or_compute(|| counted(count, ms(20), "v")).await;
            got
        })
    };
    // And one on the computer's own client, following its flight.
    let follower = {
        let once = once(&clients[0]);
        let count = Arc::clone(&count);
        tokio::spawn(async move {
            let got: Result<Vec<u8>> = once.get_or_compute(|| counted(count, ms(20), "v")).await;
            got
        })
    };
    tokio::time::sleep(ms(500)).await;
    assert!(!waiter.is_finished(), "the waiter waits for the computer");
    assert!(
        !follower.is_finished(),
        "the follower waits for the computer"
    );
    let cancelled = Instant::now();
    computer.abort();
    let got = tokio::time::timeout(secs(20), waiter)
        .await
        .unwrap()
        .unwrap();
    let followed = tokio::time::timeout(secs(20), follower)
        .await
        .unwrap()
        .unwrap();
    let took = cancelled.elapsed();
    assert_eq!(got.unwrap(), b"v");
    assert_eq!(followed.unwrap(), b"v");
    assert_eq!(count.load(Ordering::SeqCst), 1, "one of them computed");
    assert!(
        took < secs(10),
        "next computation {took:?} after the cancellation (lease 30 s)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_leaves_the_computation_alone() {
    let cluster = Cluster::start(3);
    let clients = two_clients(&cluster).await;
    let once = |c: &Client| c.once("product:3").wait(secs(60));
    let count = Arc::new(AtomicUsize::new(0));
    let computer = {
        let once = once(&clients[0]);
        let count = Arc::clone(&count);
        tokio::spawn(async move {
            let got: Result<Vec<u8>> = once.get_or_compute(|| counted(count, secs(1), "v")).await;
            got
        })
    };
    while count.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(ms(10)).await;
    }
    let waiter = {
        let once = once(&clients[1]);
        let count = Arc::clone(&count);
        tokio::spawn(async move {
            let got: Result<Vec<u8>> = once.get_or_compute(|| counted(count, ms(1), "w")).await;
            got
        })
    };
    tokio::time::sleep(ms(200)).await;
    waiter.abort();
    assert_eq!(computer.await.unwrap().unwrap(), b"v");
    let again: Result<Vec<u8>> = once(&clients[1])
        .get_or_compute(|| counted(Arc::clone(&count), ms(1), "w"))
        .await;
    assert_eq!(again.unwrap(), b"v");
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_computer_whose_lease_ran_out_cannot_overwrite_the_newer_value() {
    let cluster = Cluster::start(3);
    let clients = two_clients(&cluster).await;
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let slow = {
        let once = clients[0].once("product:4").ttl(ms(300));
        tokio::spawn(async move {
            let got: Result<Vec<u8>> = once
                .get_or_compute(|| async move {
                    let _ = started_tx.send(());
                    let _ = finish_rx.await;
                    Ok(b"old".to_vec())
                })
                .await;
            got
        })
    };
    started_rx.await.unwrap();
    // The slow computer's lease runs out; the next caller computes.
    tokio::time::sleep(ms(800)).await;
    let count = Arc::new(AtomicUsize::new(0));
    let newer: Result<Vec<u8>> = clients[1]
        .once("product:4")
        .wait(secs(30))
        .get_or_compute(|| counted(Arc::clone(&count), ms(1), "new"))
        .await;
    assert_eq!(newer.unwrap(), b"new");
    assert_eq!(count.load(Ordering::SeqCst), 1);
    finish_tx.send(()).unwrap();
    let err = slow.await.unwrap().unwrap_err();
    assert!(err.is_stale(), "{err:?}");
    let OnceError::Stale {
        presented, current, ..
    } = err
    else {
        unreachable!()
    };
    assert!(presented < current);
    let read: Result<Vec<u8>> = clients[0]
        .once("product:4")
        .get_or_compute(|| counted(Arc::clone(&count), ms(1), "third"))
        .await;
    assert_eq!(read.unwrap(), b"new", "the newer value stands");
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_stale_returns_the_old_value_while_one_caller_recomputes_and_when_it_fails() {
    let cluster = Cluster::start(3);
    let clients = two_clients(&cluster).await;
    let once = |c: &Client| c.once("product:5").serve_stale(true).wait(secs(60));
    seed(&once(&clients[0]), "v1", ms(50)).await;
    tokio::time::sleep(ms(300)).await;

    let count = Arc::new(AtomicUsize::new(0));
    let computer = {
        let once = once(&clients[0]);
        let count = Arc::clone(&count);
        tokio::spawn(async move {
            let got: Result<Vec<u8>> = once.get_or_compute(|| counted(count, secs(2), "v2")).await;
            got
        })
    };
    while count.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(ms(10)).await;
    }
    let asked = Instant::now();
    let stale: Result<Vec<u8>> = once(&clients[1])
        .get_or_compute(|| counted(Arc::clone(&count), ms(1), "other"))
        .await;
    assert_eq!(stale.unwrap(), b"v1");
    assert!(
        !computer.is_finished(),
        "served {:?} before the recomputation ended",
        asked.elapsed()
    );
    assert_eq!(computer.await.unwrap().unwrap(), b"v2");
    assert_eq!(count.load(Ordering::SeqCst), 1);

    // A failed recomputation serves the previous value too.
    let once = |c: &Client| c.once("product:5b").serve_stale(true);
    seed(&once(&clients[0]), "v3", ms(50)).await;
    tokio::time::sleep(ms(300)).await;
    let failed: Result<Vec<u8>> = once(&clients[1])
        .get_or_compute(|| async { Err(DbError("db down".into())) })
        .await;
    assert_eq!(failed.unwrap(), b"v3");
    // Without serve-stale, the computer gets its own error.
    let failed: Result<Vec<u8>> = clients[1]
        .once("product:5b")
        .get_or_compute(|| async { Err(DbError("db down".into())) })
        .await;
    let err = failed.unwrap_err();
    assert_eq!(err.compute_error().map(|e| e.0.as_str()), Some("db down"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_never_waits_past_its_deadline_and_gets_the_computers_error() {
    let cluster = Cluster::start(3);
    let clients = two_clients(&cluster).await;
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (fail_tx, fail_rx) = tokio::sync::oneshot::channel::<()>();
    let computer = {
        let once = clients[0].once("product:6").ttl(secs(30));
        tokio::spawn(async move {
            let got: Result<Vec<u8>> = once
                .get_or_compute(|| async move {
                    let _ = started_tx.send(());
                    let _ = fail_rx.await;
                    Err(DbError("db down".into()))
                })
                .await;
            got
        })
    };
    started_rx.await.unwrap();
    let count = Arc::new(AtomicUsize::new(0));

    // A short deadline: a typed error, well before the computer ends.
    let asked = Instant::now();
    let late: Result<Vec<u8>> = clients[1]
        .once("product:6")
        .wait(ms(300))
        .get_or_compute(|| counted(Arc::clone(&count), ms(1), "w"))
        .await;
    let took = asked.elapsed();
    let err = late.unwrap_err();
    assert!(err.is_deadline(), "{err:?}");
    assert!(took < secs(5), "deadline 300 ms honoured in {took:?}");

    // A patient waiter gets the computer's error, and does not compute.
    let waiter = {
        let once = clients[1].once("product:6").wait(secs(60));
        let count = Arc::clone(&count);
        tokio::spawn(async move {
            let got: Result<Vec<u8>> = once.get_or_compute(|| counted(count, ms(1), "w")).await;
            got
        })
    };
    tokio::time::sleep(ms(500)).await;
    fail_tx.send(()).unwrap();
    let own = computer.await.unwrap().unwrap_err();
    assert!(matches!(own, OnceError::Compute { .. }), "{own:?}");
    let theirs = tokio::time::timeout(secs(30), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    match theirs {
        OnceError::Failed { message, .. } => assert_eq!(message, "db down"),
        other => panic!("{other:?}"),
    }
    assert_eq!(count.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xfetch_refreshes_a_hot_key_before_it_expires_by_one_caller() {
    let cluster = Cluster::start(3);
    let clients = two_clients(&cluster).await;
    // δ ≈ 100 ms, β = 4: recomputed about 400 ms·(−ln u) before expiry.
    let once = |c: &Client| {
        c.once("product:7")
            .value_ttl(secs(3))
            .early(4.0)
            .wait(secs(60))
    };
    let count = Arc::new(AtomicUsize::new(0));
    // Before the write: the value expires at least 3 s after this, on
    // the nodes' clocks, so a refresh less than 3 s after it is early.
    let written = Instant::now();
    let first: Result<Vec<u8>> = once(&clients[0])
        .get_or_compute(|| counted(Arc::clone(&count), ms(100), "v"))
        .await;
    first.unwrap();
    let refreshed_at = Arc::new(std::sync::Mutex::new(None::<Duration>));
    let mut tasks = Vec::new();
    for client in &clients {
        for _ in 0..10 {
            let once = once(client);
            let count = Arc::clone(&count);
            let refreshed_at = Arc::clone(&refreshed_at);
            tasks.push(tokio::spawn(async move {
                let mut slowest = Duration::ZERO;
                // Hot: a call every 20 ms until the refresh (or 10 s).
                while count.load(Ordering::SeqCst) < 2 && written.elapsed() < secs(10) {
                    let asked = Instant::now();
                    let count2 = Arc::clone(&count);
                    let refreshed_at = Arc::clone(&refreshed_at);
                    let got: Result<Vec<u8>> = once
                        .get_or_compute(|| async move {
                            *refreshed_at.lock().unwrap() = Some(written.elapsed());
                            counted(count2, ms(100), "v").await
                        })
                        .await;
                    assert_eq!(got.unwrap(), b"v");
                    slowest = slowest.max(asked.elapsed());
                    tokio::time::sleep(ms(20)).await;
                }
                slowest
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(count.load(Ordering::SeqCst), 2, "one early recomputation");
    let at = refreshed_at.lock().unwrap().expect("refreshed");
    assert!(
        at < secs(3),
        "refreshed {at:?} after the write, before its expiry (3 s)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_other_errors_are_typed_fencing_off_invalid_key_and_no_majority() {
    let mut cluster = Cluster::start(3);
    let never = |count: &Arc<AtomicUsize>| counted(Arc::clone(count), ms(1), "v");
    let count = Arc::new(AtomicUsize::new(0));

    let unfenced = builder(cluster.urls()).fencing(false).build().unwrap();
    let got: Result<Vec<u8>> = unfenced.once("k").get_or_compute(|| never(&count)).await;
    assert!(matches!(got, Err(OnceError::FencingOff)), "{got:?}");

    let client = client_with_timeout(cluster.urls(), ms(500));
    let got: Result<Vec<u8>> = client.once("").get_or_compute(|| never(&count)).await;
    assert!(matches!(got, Err(OnceError::Lock { .. })), "{got:?}");
    assert_eq!(count.load(Ordering::SeqCst), 0);

    // The nodes vanish during the computation: the write reaches no
    // majority.
    let got: Result<Vec<u8>> = client
        .once("k")
        .get_or_compute(|| async {
            cluster.node(1).kill();
            cluster.node(2).kill();
            Ok(b"v".to_vec())
        })
        .await;
    match got {
        Err(OnceError::Unavailable {
            phase,
            answered,
            quorum,
            ..
        }) => {
            // The decision comes at the second failure: the live node's
            // acceptance may not have been heard yet.
            assert_eq!((phase, quorum), ("write", 2));
            assert!(answered < quorum, "{answered}");
        }
        other => panic!("{other:?}"),
    }
    // And the read answers from one node of three.
    let got: Result<Vec<u8>> = client.once("k").get_or_compute(|| never(&count)).await;
    match got {
        Err(OnceError::Unavailable { phase, quorum, .. }) => {
            assert_eq!((phase, quorum), ("read", 2))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(count.load(Ordering::SeqCst), 0);
}

/// One stored value: the value, its fence, fresh until, the computation's time.
type Record = (Vec<u8>, u64, Instant, Duration);

/// The user's store of the `OnceStore` tests: a map behind a std mutex,
/// freshness on this process's monotonic clock, the fenced `≥` comparison
/// as the trait requires; `failing` makes every call a backend error.
#[derive(Default)]
struct MemStore {
    records: std::sync::Mutex<std::collections::HashMap<String, Record>>,
    failing: std::sync::atomic::AtomicBool,
    writes: AtomicUsize,
    /// Holds the next read after its snapshot: says so on the first
    /// channel, returns the snapshot when the second fires (a read that
    /// began before a write and answers after it).
    held_read: std::sync::Mutex<Option<HeldRead>>,
}

type HeldRead = (
    tokio::sync::oneshot::Sender<()>,
    tokio::sync::oneshot::Receiver<()>,
);

#[derive(Debug, thiserror::Error)]
#[error("store down")]
struct StoreDown;

impl redfence::OnceStore for MemStore {
    async fn read(
        &self,
        key: &str,
    ) -> std::result::Result<Option<redfence::OnceRecord>, redfence::StoreError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(redfence::StoreError::Backend(Box::new(StoreDown)));
        }
        let snapshot = self
            .records
            .lock()
            .unwrap()
            .get(key)
            .map(|(value, token, until, delta)| {
                redfence::OnceRecord::new(
                    value.clone(),
                    redfence::FencingToken::new(*token),
                    until.saturating_duration_since(Instant::now()),
                    *delta,
                )
            });
        let held = self.held_read.lock().unwrap().take();
        if let Some((taken, go)) = held {
            let _ = taken.send(());
            let _ = go.await;
        }
        Ok(snapshot)
    }

    async fn write(
        &self,
        key: &str,
        value: &[u8],
        token: redfence::FencingToken,
        fresh: Duration,
        delta: Duration,
    ) -> std::result::Result<(), redfence::StoreError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(redfence::StoreError::Backend(Box::new(StoreDown)));
        }
        let mut records = self.records.lock().unwrap();
        if let Some((_, current, _, _)) = records.get(key) {
            if *current > token.get() {
                return Err(redfence::StoreError::Stale(redfence::StaleToken::new(
                    key,
                    token,
                    redfence::FencingToken::new(*current),
                )));
            }
        }
        self.writes.fetch_add(1, Ordering::SeqCst);
        let until = Instant::now() + fresh;
        records.insert(key.to_owned(), (value.to_vec(), token.get(), until, delta));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_store_gets_one_computation_per_expiry_and_refuses_a_computer_whose_lease_ran_out()
{
    let mut cluster = Cluster::start(3);
    let clients = two_clients(&cluster).await;
    let store = Arc::new(MemStore::default());
    let once = |c: &Client| c.once("product:9").wait(secs(60));
    let seeded: Result<Vec<u8>> = once(&clients[0])
        .value_ttl(ms(50))
        .get_or_compute_in(&*store, || async { Ok(b"v1".to_vec()) })
        .await;
    assert_eq!(seeded.unwrap(), b"v1");
    tokio::time::sleep(ms(300)).await;

    let count = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for client in &clients {
        for _ in 0..50 {
            let (once, count, store) = (once(client), Arc::clone(&count), Arc::clone(&store));
            tasks.push(tokio::spawn(async move {
                let got: Result<Vec<u8>> = once
                    .get_or_compute_in(&*store, || counted(count, ms(20), "v2"))
                    .await;
                got
            }));
        }
    }
    for task in tasks {
        let got = tokio::time::timeout(secs(90), task).await.unwrap().unwrap();
        assert_eq!(got.unwrap(), b"v2");
    }
    assert_eq!(count.load(Ordering::SeqCst), 1, "computations per expiry");
    // Nothing on the nodes: the value lives in the user's store.
    let entry_key = once(&clients[0]).entry_key().to_owned();
    let on_nodes = cluster.node(0).cli(&["EXISTS", &entry_key]);
    assert_eq!(on_nodes.trim(), "0");

    // A computer paused past its lease is overtaken; the store's fence
    // refuses its late write.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let slow = {
        let (once, store) = (
            clients[0].once("product:10").ttl(ms(300)),
            Arc::clone(&store),
        );
        tokio::spawn(async move {
            let got: Result<Vec<u8>> = once
                .get_or_compute_in(&*store, || async move {
                    let _ = started_tx.send(());
                    let _ = finish_rx.await;
                    Ok(b"old".to_vec())
                })
                .await;
            got
        })
    };
    started_rx.await.unwrap();
    tokio::time::sleep(ms(800)).await;
    let newer: Result<Vec<u8>> = clients[1]
        .once("product:10")
        .wait(secs(30))
        .get_or_compute_in(&*store, || counted(Arc::clone(&count), ms(1), "new"))
        .await;
    assert_eq!(newer.unwrap(), b"new");
    finish_tx.send(()).unwrap();
    let err = slow.await.unwrap().unwrap_err();
    assert!(err.is_stale(), "{err:?}");
    let read: Result<Vec<u8>> = clients[0]
        .once("product:10")
        .get_or_compute_in(&*store, || counted(Arc::clone(&count), ms(1), "third"))
        .await;
    assert_eq!(read.unwrap(), b"new", "the newer value stands");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_users_store_is_a_typed_store_error() {
    let cluster = Cluster::start(3);
    let client = warm_client(&cluster).await;
    let store = MemStore::default();
    store.failing.store(true, Ordering::SeqCst);
    let count = Arc::new(AtomicUsize::new(0));
    let got: Result<Vec<u8>> = client
        .once("k")
        .get_or_compute_in(&store, || counted(Arc::clone(&count), ms(1), "v"))
        .await;
    match got {
        Err(OnceError::Store { phase, source, .. }) => {
            assert_eq!(phase, "read");
            assert!(matches!(source, redfence::StoreError::Backend(_)));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(count.load(Ordering::SeqCst), 0);
    // Reads work, writes fail: the computed value is not stored.
    let store = Arc::new(MemStore::default());
    let failing = Arc::clone(&store);
    let got: Result<Vec<u8>> = client
        .once("k2")
        .get_or_compute_in(&*store, || async move {
            failing.failing.store(true, Ordering::SeqCst);
            Ok(b"v".to_vec())
        })
        .await;
    assert!(
        matches!(got, Err(OnceError::Store { phase: "write", .. })),
        "{got:?}"
    );
    assert_eq!(store.writes.load(Ordering::SeqCst), 0);
}

/// What each expiry of the cross-process test does: the computation's
/// time, and whether it fails.
const EXPIRIES: [(u64, bool); 3] = [(20, false), (300, true), (3000, false)];
/// The waiters' deadline in the cross-process test (the third expiry's
/// computation outlasts it).
const PROC_WAIT_MS: u64 = 1000;
const PROC_TASKS: usize = 250;

/// One instance of the cross-process test (a re-execution of this test
/// binary; does nothing otherwise): per `go` line on stdin, 250 tasks ask
/// for the key (`O_MODE` `once`: `get_or_compute`; `naive`: GET, on a miss
/// compute and SET on node 0), each printing `R computed outcome ms`.
#[test]
fn instance() {
    if std::env::var("REDFENCE_ONCE_INSTANCE").is_err() {
        return;
    }
    use std::io::BufRead;
    let var = |k: &str| std::env::var(k).expect(k);
    let urls: Vec<String> = var("O_URLS").split(',').map(str::to_owned).collect();
    let naive = var("O_MODE") == "naive";
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(async {
        let client = builder(urls.clone()).build().unwrap();
        let _: Result<Vec<u8>> = client
            .once("warm")
            .get_or_compute(|| async { Ok(vec![]) })
            .await;
        client
    });
    let cache = redis::Client::open(urls[0].as_str()).unwrap();
    println!("READY");
    for (line, &(took, fails)) in std::io::stdin().lock().lines().zip(EXPIRIES.iter()) {
        if line.unwrap() != "go" {
            return;
        }
        let count = Arc::new(AtomicUsize::new(0));
        let lines = rt.block_on(async {
            let conn = cache.get_multiplexed_async_connection().await.unwrap();
            let tasks: Vec<_> = (0..PROC_TASKS)
                .map(|_| {
                    let once = client
                        .once("procs")
                        .value_ttl(ms(300))
                        .error_ttl(ms(300))
                        .wait(ms(PROC_WAIT_MS));
                    let (count, mut conn) = (Arc::clone(&count), conn.clone());
                    tokio::spawn(async move {
                        let mine = Arc::new(AtomicUsize::new(0));
                        let compute = {
                            let mine = Arc::clone(&mine);
                            move || async move {
                                mine.fetch_add(1, Ordering::SeqCst);
                                let got = counted(count, ms(took), "v").await;
                                if fails {
                                    Err(DbError("db down".into()))
                                } else {
                                    got
                                }
                            }
                        };
                        let asked = Instant::now();
                        let outcome = if naive {
                            let cached: Option<Vec<u8>> = redis::cmd("GET")
                                .arg("naive:procs")
                                .query_async(&mut conn)
                                .await
                                .unwrap();
                            match cached {
                                Some(_) => "value".to_owned(),
                                None => {
                                    let v = compute().await.unwrap_or_default();
                                    let () = redis::cmd("SET")
                                        .arg("naive:procs")
                                        .arg(v)
                                        .arg("PX")
                                        .arg(300)
                                        .query_async(&mut conn)
                                        .await
                                        .unwrap();
                                    "value".to_owned()
                                }
                            }
                        } else {
                            match once.get_or_compute(compute).await {
                                Ok(v) if v == b"v" => "value".to_owned(),
                                Ok(v) => format!("other:{v:?}"),
                                Err(OnceError::Compute { .. }) => "compute-error".to_owned(),
                                Err(OnceError::Failed { .. }) => "failed".to_owned(),
                                Err(OnceError::Deadline { .. }) => "deadline".to_owned(),
                                Err(e) => format!("other:{e}"),
                            }
                        };
                        let computed = mine.load(Ordering::SeqCst);
                        format!("R {computed} {outcome} {}", asked.elapsed().as_millis())
                    })
                })
                .collect();
            let mut lines = Vec::new();
            for task in tasks {
                lines.push(task.await.unwrap());
            }
            lines
        });
        for line in lines {
            println!("{line}");
        }
        println!("DONE");
    }
}

/// The cross-process stampede: returns, per expiry, each request's
/// (computed, outcome, ms) over both processes.
fn two_processes(cluster: &Cluster, mode: &str) -> Vec<Vec<(usize, String, u64)>> {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    let exe = std::env::current_exe().expect("the test binary");
    let mut children: Vec<_> = (0..2)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "once::instance",
                    "--exact",
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .env("REDFENCE_ONCE_INSTANCE", "1")
                .env("O_URLS", cluster.urls().join(","))
                .env("O_MODE", mode)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawning an instance")
        })
        .collect();
    let mut outs: Vec<_> = children
        .iter_mut()
        .map(|c| BufReader::new(c.stdout.take().unwrap()).lines())
        .collect();
    let mut ins: Vec<_> = children
        .iter_mut()
        .map(|c| c.stdin.take().unwrap())
        .collect();
    for out in &mut outs {
        // The test harness's own output comes first, on the same line.
        for line in out.by_ref() {
            if line.unwrap().ends_with("READY") {
                break;
            }
        }
    }
    let mut expiries = Vec::new();
    for _ in EXPIRIES {
        // The previous expiry's value (300 ms) has expired.
        std::thread::sleep(ms(700));
        for input in &mut ins {
            writeln!(input, "go").unwrap();
            input.flush().unwrap();
        }
        let mut requests = Vec::new();
        for out in &mut outs {
            for line in out.by_ref() {
                let line = line.unwrap();
                if line == "DONE" {
                    break;
                }
                let Some(rest) = line.strip_prefix("R ") else {
                    continue;
                };
                // `R computed outcome ms`; an `other:` outcome carries an
                // error's message, spaces and all.
                let parsed = rest.split_once(' ').and_then(|(computed, rest)| {
                    let (outcome, took) = rest.rsplit_once(' ')?;
                    Some((
                        computed.parse().ok()?,
                        outcome.to_owned(),
                        took.parse().ok()?,
                    ))
                });
                let Some((computed, outcome, took)) = parsed else {
                    panic!("a child's line: {line}");
                };
                requests.push((computed, outcome, took));
            }
        }
        expiries.push(requests);
    }
    drop(ins);
    for mut child in children {
        let status = child.wait().unwrap();
        assert!(status.success(), "an instance failed: {status}");
    }
    expiries
}

/// Computations per expiry, from the requests' own records.
fn computations(requests: &[(usize, String, u64)]) -> usize {
    requests.iter().map(|(c, _, _)| c).sum()
}

#[test]
fn two_processes_of_250_tasks_compute_once_per_expiry_and_no_waiter_passes_its_deadline() {
    let cluster = Cluster::start(3);
    let expiries = two_processes(&cluster, "once");
    assert_eq!(expiries.len(), EXPIRIES.len());
    for (i, (requests, &(took, fails))) in expiries.iter().zip(EXPIRIES.iter()).enumerate() {
        assert_eq!(requests.len(), 2 * PROC_TASKS, "expiry {i}");
        assert_eq!(computations(requests), 1, "expiry {i}: computations");
        for (computed, outcome, elapsed) in requests {
            let expected: &[&str] = match (*computed > 0, fails, took > PROC_WAIT_MS) {
                (true, true, _) => &["compute-error"],
                (true, false, _) => &["value"],
                (false, true, _) => &["failed"],
                (false, false, false) => &["value"],
                (false, false, true) => &["deadline"],
            };
            assert!(
                expected.contains(&outcome.as_str()),
                "expiry {i}: {outcome}"
            );
            if *computed == 0 {
                // Generous for a loaded machine: the deadline plus 2 s.
                assert!(
                    *elapsed <= PROC_WAIT_MS + 2000,
                    "expiry {i}: waited {elapsed} ms"
                );
            }
        }
    }
}

/// The negative control: the same two processes with naive cache-aside
/// code; the checker counts many computations per expiry.
#[test]
fn without_the_helper_two_processes_compute_many_times_per_expiry() {
    let cluster = Cluster::start(3);
    let expiries = two_processes(&cluster, "naive");
    assert!(
        computations(&expiries[0]) > 1,
        "{} computations",
        computations(&expiries[0])
    );
}

/// A caller whose first look came before another computer's write, and
/// whose `try_acquire` came after that computer's release, reads again
/// under the lock and takes the value: one computation, not two (the
/// fault suite's finding; without the read under the lock this computes
/// twice and returns its own value).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_granted_after_another_computed_takes_its_value_without_computing() {
    let cluster = Cluster::start(3);
    let clients = two_clients(&cluster).await;
    let store = Arc::new(MemStore::default());
    let (taken_tx, taken_rx) = tokio::sync::oneshot::channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel();
    *store.held_read.lock().unwrap() = Some((taken_tx, go_rx));
    let count = Arc::new(AtomicUsize::new(0));
    let late = {
        let (once, store, count) = (
            clients[1].once("product:11").wait(secs(30)),
            Arc::clone(&store),
            Arc::clone(&count),
        );
        tokio::spawn(async move {
            let got: Result<Vec<u8>> = once
                .get_or_compute_in(&*store, || counted(count, ms(1), "late"))
                .await;
            got
        })
    };
    // Its look saw the empty store; now another client computes, writes
    // and releases before that look answers.
    taken_rx.await.unwrap();
    let first: Result<Vec<u8>> = clients[0]
        .once("product:11")
        .get_or_compute_in(&*store, || counted(Arc::clone(&count), ms(1), "first"))
        .await;
    assert_eq!(first.unwrap(), b"first");
    go_tx.send(()).unwrap();
    let got = tokio::time::timeout(secs(30), late).await.unwrap().unwrap();
    assert_eq!(got.unwrap(), b"first");
    assert_eq!(count.load(Ordering::SeqCst), 1, "computations");
}

/// A `try_acquire` that reaches no majority either way waits for the
/// holder as a refusal does, instead of returning `OnceError::Lock` at once
/// (the fault suite's finding). The computer holds on nodes 0 and 2 (node 1
/// was down); node 1 comes back empty and node 2 stops answering: the
/// second caller's look reads nodes 0 and 1, and its attempt is refused by
/// node 0, granted by node 1 and unanswered by node 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_meets_a_silent_node_waits_for_the_computer() {
    let mut cluster = Cluster::start(3);
    let computer_client = client_with_timeout(cluster.urls(), ms(200));
    crate::helpers::warm_up(&computer_client, &cluster).await;
    cluster.node(1).kill();
    let count = Arc::new(AtomicUsize::new(0));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let computer = {
        let once = computer_client.once("product:12").ttl(secs(30));
        let count = Arc::clone(&count);
        tokio::spawn(async move {
            let got: Result<Vec<u8>> = once
                .get_or_compute(|| async move {
                    count.fetch_add(1, Ordering::SeqCst);
                    let _ = started_tx.send(());
                    let _ = finish_rx.await;
                    Ok(b"computed".to_vec())
                })
                .await;
            got
        })
    };
    timeout(secs(20), started_rx).await.unwrap().unwrap();
    cluster.node(1).restart();
    // A client of the new server (the warm-up helper counts every lock
    // key, the computer's too): connected to all three, then node 2 stops.
    let client = client_with_timeout(cluster.urls(), ms(500));
    let warm = client.acquire("warm-up", secs(5)).await.unwrap();
    warm.release().await;
    cluster.node(2).pause();
    let waiter = {
        let once = client.once("product:12").wait(secs(60));
        let count = Arc::clone(&count);
        tokio::spawn(async move {
            let got: Result<Vec<u8>> = once
                .get_or_compute(|| counted(count, ms(1), "second"))
                .await;
            got
        })
    };
    tokio::time::sleep(ms(1500)).await;
    let early = waiter.is_finished();
    cluster.node(2).resume();
    assert!(!early, "returned at once: {:?}", waiter.await);
    finish_tx.send(()).unwrap();
    assert_eq!(computer.await.unwrap().unwrap(), b"computed");
    let got = timeout(secs(60), waiter).await.unwrap().unwrap();
    assert_eq!(got.unwrap(), b"computed");
    assert_eq!(count.load(Ordering::SeqCst), 1, "computations");
}
