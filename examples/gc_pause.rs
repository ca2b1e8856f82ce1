//! "The holder was paused past its lease, and its late write overwrote the
//! next holder's."
//!
//! Two workers credit the same account under the lock: read the balance,
//! add their amount, write it back. Worker 1 takes the lock with a 300 ms
//! lease, reads, and then stalls (a GC pause, a page-fault storm, a SIGSTOP)
//! for at least 600 ms and until worker 2 is done. Its lease runs out in the
//! middle; worker 2 is granted the lock, reads, and writes its credit. Then
//! worker 1 wakes up and writes the balance it computed from the old read.
//!
//! - Without fencing (a plain `SET`), worker 1's late write silently
//!   overwrites worker 2's credit: one credit is lost. No lease can prevent
//!   this; the lock was correct, the holder just did not run.
//! - With the fencing token checked by the storage ([`FencedStore`]), worker
//!   1's write carries an older token than worker 2's and is refused
//!   ([`StoreError::Stale`]); worker 1 learns it lost the lock, takes it
//!   again, re-reads and re-applies its credit. Both credits land.
//!
//! The example fails (exit code 1) if the fenced run loses a credit, or if
//! the unfenced run does not (the negative control that shows the problem is
//! real).

mod common;

use std::process::ExitCode;
use std::time::Duration;

use redfence::{FencedStore, FencingToken, StoreError};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

use common::{BoxError, DataStore};

const LEASE: Duration = Duration::from_millis(300);
const PAUSE: Duration = Duration::from_millis(600);
const START: i64 = 1000;
const CREDIT_1: i64 = 100;
const CREDIT_2: i64 = 50;

fn main() -> ExitCode {
    common::run(|nodes| async move {
        let data = DataStore::from_env_or_start().await?;
        let conn = data.connect().await?;

        println!("\nwithout fencing: a plain SET after the pause");
        let key = data.key("account:plain");
        let lost = unfenced(&nodes, conn.clone(), &key).await?;
        let _: () = conn.clone().del(&key).await?;

        println!("\nwith fencing: FencedStore refuses the stale token");
        let key = data.key("account:fenced");
        let fenced = fenced(&nodes, conn.clone(), &key).await?;
        let _: () = conn.clone().del(&key).await?;

        let want = START + CREDIT_1 + CREDIT_2;
        println!("\nexpected balance {want}: without fencing {lost}, with fencing {fenced}");
        if fenced != want {
            return Err(format!("the fenced run lost a credit: {fenced} != {want}").into());
        }
        if lost == want {
            return Err("the unfenced run lost nothing: the pause did not overlap".into());
        }
        Ok(())
    })
}

/// The race with plain reads and writes: returns the final balance.
async fn unfenced(
    nodes: &[String],
    conn: MultiplexedConnection,
    key: &str,
) -> Result<i64, BoxError> {
    let (one, two) = (common::client(nodes)?, common::client(nodes)?);
    let mut c = conn.clone();
    let _: () = c.set(key, START).await?;

    let g1 = one.acquire("account", LEASE).await?;
    let read1: i64 = c.get(key).await?;
    println!("  worker 1: lock granted, read {read1}, now pausing for {PAUSE:?}");
    let done = tokio::sync::Notify::new();
    let late = async {
        pause(&done).await;
        let mut c = conn.clone();
        let _: () = c.set(key, read1 + CREDIT_1).await?;
        println!(
            "  worker 1: woke up, wrote {} (lease over: validity {:?})",
            read1 + CREDIT_1,
            g1.validity()
        );
        Ok::<_, BoxError>(())
    };
    let other = async {
        let g2 = two.acquire("account", Duration::from_secs(5)).await?;
        let mut c = conn.clone();
        let read2: i64 = c.get(key).await?;
        let _: () = c.set(key, read2 + CREDIT_2).await?;
        println!(
            "  worker 2: lock granted, read {read2}, wrote {}",
            read2 + CREDIT_2
        );
        g2.release().await;
        done.notify_one();
        Ok::<_, BoxError>(())
    };
    tokio::try_join!(late, other)?;
    drop(g1);
    let balance: i64 = c.get(key).await?;
    println!("  final balance {balance}");
    Ok(balance)
}

/// The same race through the fenced store: a refused write makes worker 1
/// start over under a new lock.
async fn fenced(nodes: &[String], conn: MultiplexedConnection, key: &str) -> Result<i64, BoxError> {
    let (one, two) = (common::client(nodes)?, common::client(nodes)?);
    let store = FencedStore::new(conn);
    store
        .write(key, START.to_string(), FencingToken::new(0))
        .await?;

    let g1 = one.acquire("account", LEASE).await?;
    let t1 = g1.token().ok_or("fencing is on by default")?;
    let read1 = balance(&store, key).await?;
    println!("  worker 1: lock granted with token {t1}, read {read1}, now pausing for {PAUSE:?}");
    let done = tokio::sync::Notify::new();
    let late = async {
        pause(&done).await;
        match store.write(key, (read1 + CREDIT_1).to_string(), t1).await {
            Err(StoreError::Stale(stale)) => {
                println!("  worker 1: woke up, write refused: {stale}");
                // Start over: a new lock, a fresh read.
                let g = one.acquire("account", Duration::from_secs(5)).await?;
                let t = g.token().ok_or("fencing is on by default")?;
                let read = balance(&store, key).await?;
                store.write(key, (read + CREDIT_1).to_string(), t).await?;
                println!(
                    "  worker 1: retried with token {t}: read {read}, wrote {}",
                    read + CREDIT_1
                );
                g.release().await;
                Ok(())
            }
            Ok(()) => Err::<(), BoxError>("the stale write was accepted".into()),
            Err(e) => Err(e.into()),
        }
    };
    let other = async {
        let g2 = two.acquire("account", Duration::from_secs(5)).await?;
        let t2 = g2.token().ok_or("fencing is on by default")?;
        let read2 = balance(&store, key).await?;
        store.write(key, (read2 + CREDIT_2).to_string(), t2).await?;
        println!(
            "  worker 2: lock granted with token {t2}, read {read2}, wrote {}",
            read2 + CREDIT_2
        );
        g2.release().await;
        done.notify_one();
        Ok::<_, BoxError>(())
    };
    tokio::try_join!(late, other)?;
    drop(g1);
    let balance = balance(&store, key).await?;
    println!("  final balance {balance}");
    Ok(balance)
}

/// Worker 1's stall: at least `PAUSE`, and until worker 2 is done, so the
/// story plays out in the same order however long worker 2 waits for the
/// lock. `notify_one` keeps the wake-up if it comes first.
async fn pause(done: &tokio::sync::Notify) {
    tokio::join!(tokio::time::sleep(PAUSE), done.notified());
}

async fn balance(store: &FencedStore<MultiplexedConnection>, key: &str) -> Result<i64, BoxError> {
    let stored = store.read(key).await?.ok_or("no balance")?;
    Ok(std::str::from_utf8(&stored.value)?.parse()?)
}
