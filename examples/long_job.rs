//! A nightly report that takes longer than any sensible TTL, on two
//! instances of the same service.
//!
//! 1. Instance A runs the report under a 1 s lock that its watchdog extends
//!    (every third of the validity) for as long as the work takes: 3 s here.
//!    Instance B asks for the same lock meanwhile; it waits for the release
//!    notice instead of polling, and starts the moment A is done.
//! 2. The lock is then lost under A's feet (an operator deletes the keys;
//!    in production: nodes paused or partitioned away, a failover). The
//!    watchdog's next extend finds the keys gone, the work is cancelled at
//!    its current await point, and `run` returns `LockLost` with the reason:
//!    the job knows it is no longer protected instead of finishing blind.
//!
//! ```sh
//! cargo run --example long_job
//! ```

mod common;

use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redfence::{AutoExtend, Error, LossReason};

use common::BoxError;

const RESOURCE: &str = "report:nightly";
const TTL: Duration = Duration::from_secs(1);

fn main() -> ExitCode {
    common::run(long_job)
}

async fn long_job(nodes: Vec<String>) -> Result<(), BoxError> {
    let a = common::client(&nodes)?;
    let b = common::client(&nodes)?;

    // 1. A long job under a short, auto-extended lock; B waits its turn.
    let started = Instant::now();
    let job_a = tokio::spawn({
        let a = a.clone();
        async move {
            a.lock(RESOURCE, TTL)
                .auto_extend(AutoExtend::new())
                .run(|lease| async move {
                    for step in 1..=6 {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        println!(
                            "A: report step {step}/6 at {:.1?}, lock valid for another {:.0?}",
                            started.elapsed(),
                            lease.validity()
                        );
                    }
                    Instant::now()
                })
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let guard = b.acquire(RESOURCE, TTL).await?;
    let got_it = Instant::now();
    let a_done = job_a.await??;
    println!(
        "B: got the lock {:.1?} after start ({:.1?} after A finished), A held it {:.1}× its TTL",
        started.elapsed(),
        got_it.saturating_duration_since(a_done),
        a_done.duration_since(started).as_secs_f64() / TTL.as_secs_f64()
    );
    guard.release().await;

    // 2. The lock is lost while A works: the work stops, and A is told why.
    let steps = Arc::new(AtomicU32::new(0));
    let job_a = tokio::spawn({
        let (a, steps) = (a.clone(), steps.clone());
        async move {
            a.lock(RESOURCE, TTL)
                .auto_extend(AutoExtend::new())
                .run(|_lease| async move {
                    loop {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        steps.fetch_add(1, Ordering::SeqCst);
                    }
                })
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let key = format!("{}lock:{RESOURCE}", redfence::limits::DEFAULT_PREFIX);
    for url in &nodes {
        let mut conn = redis::Client::open(url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        let _: i64 = redis::cmd("DEL").arg(&key).query_async(&mut conn).await?;
    }
    println!("operator: deleted {key} on every node");
    let deleted_at = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(10), job_a).await??;
    let stopped_after = steps.load(Ordering::SeqCst);
    match outcome {
        Err(Error::LockLost(lost)) if lost.reason == LossReason::NotHeld => {
            println!(
                "A: {lost}\nA: work cancelled {:.0?} after the keys vanished, at step {stopped_after}",
                deleted_at.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
            if steps.load(Ordering::SeqCst) != stopped_after {
                return Err("the cancelled work kept running".into());
            }
            Ok(())
        }
        Err(e) => Err(format!("expected the lock to be lost, got: {e}").into()),
        Ok(()) => Err("the work finished although the lock was gone".into()),
    }
}
