//! Tests whose outcome needs the machine to answer a loopback round trip
//! within about a millisecond. Cargo runs test binaries one after another,
//! so in their own binary they run with no other test loading the machine
//! (in the `it` binary, on a loaded 2-core CI machine, no round trip of 30 s
//! of attempts came back inside the millisecond). They still retry, and
//! assert on what came back, never on how long it took.

#[path = "support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use redfence::{Client, FailureReason, RestartGuard, Retry};

use support::Cluster;

/// A majority that grants later than `TTL − drift − min_validity` yields no
/// lock: `ValidityExhausted`. With TTL 3 ms, a
/// drift of 2 ms and a minimum of 0.999 ms, 1 µs of the TTL is useful; the
/// node budget never falls below 1 ms, so a grant that comes back after
/// 1 µs and within the budget is a quorum reached too late. Grants that miss
/// the budget fail as unavailable instead. None may succeed. One node and a
/// plain `SET` (fencing off), the cheapest round trip.
#[tokio::test]
async fn grant_too_late_for_the_minimum_validity_is_not_granted() {
    let cluster = Cluster::start(1);
    // Fresh server: the restart guard would refuse its votes (see
    // tests/it/helpers.rs).
    let client = Client::builder(cluster.urls())
        .restart_guard(RestartGuard::off())
        .drift_factor(0.0)
        .min_validity(Duration::from_micros(999))
        .fencing(false)
        .build()
        .unwrap();
    // Connect first, so the attempts below measure round trips only.
    let _ = client.try_acquire("warm", Duration::from_secs(5)).await;
    // At least 50 attempts, and more (up to 60 s) until one landed in the
    // gap.
    let (mut exhausted, mut unavailable) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    for i in 0.. {
        if i >= 50 && (exhausted > 0 || Instant::now() > deadline) {
            break;
        }
        let err = client
            .lock(format!("late-{i}"), Duration::from_millis(3))
            .retry(Retry::once())
            .acquire()
            .await
            .expect_err("granted with less validity than the minimum");
        let q = err.quorum_failure().unwrap();
        match q.reason {
            FailureReason::ValidityExhausted => {
                assert!(q.granted >= q.quorum, "{err}");
                exhausted += 1;
            }
            FailureReason::Unavailable => {
                assert!(err.is_timeout(), "{err}");
                unavailable += 1;
            }
            other => panic!("unexpected {other:?}: {err}"),
        }
    }
    assert!(
        exhausted > 0,
        "no attempt got its grant inside the 1 ms budget ({unavailable} timed out)"
    );
}
