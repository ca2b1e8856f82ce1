//! The main job in a few lines: acquire, check validity, extend, see that a
//! second client cannot take the lock, release, and run a closure under the
//! lock.
//!
//! ```sh
//! cargo run --example quickstart                  # starts 5 local redis-server nodes
//! REDFENCE_NODES=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003,redis://127.0.0.1:7004,redis://127.0.0.1:7005 \
//!     cargo run --example quickstart              # or uses yours (docker compose up -d)
//! ```

mod common;

use std::process::ExitCode;
use std::time::Duration;

use common::BoxError;

fn main() -> ExitCode {
    common::run(quickstart)
}

async fn quickstart(nodes: Vec<String>) -> Result<(), BoxError> {
    // Build once at startup and clone into tasks; nothing connects yet.
    let client = common::client(&nodes)?;
    println!(
        "\nclient: {} nodes, a lock needs {} of them",
        client.nodes(),
        client.quorum()
    );

    // Waits (retrying for up to 10 s by default) until the lock is ours.
    let guard = client
        .acquire("quickstart:report", Duration::from_secs(10))
        .await?;
    println!(
        "acquired {:?} for 10s: valid for {:.3?} (TTL minus the time the \
         acquire took, minus a clock-drift margin)",
        guard.resource(),
        guard.validity()
    );

    // Long work extends before the validity runs out.
    let validity = guard.extend(Duration::from_secs(30)).await?;
    println!("extended to 30s: valid for {validity:.3?}");

    // Another process (here: a second client) cannot take it meanwhile.
    // try_acquire makes one attempt; Ok(None) means "held by someone else".
    let other = common::client(&nodes)?;
    match other
        .try_acquire("quickstart:report", Duration::from_secs(10))
        .await?
    {
        None => println!("second client try_acquire: None, the lock is held"),
        Some(_) => return Err("second client got a lock that is held".into()),
    }

    let released = guard.release().await;
    // Release returns as soon as a majority confirmed: the lock is free for
    // others from then on; the remaining nodes finish in the background.
    println!(
        "released: {} of {} nodes confirmed ({} still finishing in the background)",
        released.confirmed, released.nodes, released.pending
    );

    // with_lock acquires, runs the closure to completion, then releases,
    // also when the closure fails. The closure sees a read-only lease.
    let total = other
        .with_lock(
            "quickstart:report",
            Duration::from_secs(10),
            |lease| async move {
                println!(
                    "with_lock: second client holds {:?}, valid for {:.3?}, working...",
                    lease.resource(),
                    lease.validity()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
                (1..=10).sum::<u32>()
            },
        )
        .await?;
    println!("with_lock: closure returned {total}; the lock is released again");
    Ok(())
}
