//! The `sentinel-failover` nemesis and its guard-off control, run as a
//! real process against real Sentinel groups (five of them: a master, a
//! replica and three Sentinels each, 25 `redis-server` processes on
//! loopback, started and killed by the binary): with the restart guard no
//! violation, without it the checker must see one. The counts come from
//! the results table the binary prints, the same rows CI reads.

use std::process::Command;

mod common;

use common::row;

/// 12 s each: room for a round of three or four failovers and its
/// guard window with seconds to spare (a round needs about 5 s), and on
/// most runs a second round.
#[test]
fn sentinel_failovers_are_safe_with_the_guard_and_the_control_shows_the_violation() {
    let dir = std::env::temp_dir().join(format!("redfence-chaos-sentinel-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_chaos"))
        .args([
            "--nemesis",
            "sentinel-failover,sentinel-failover-noguard",
            "--duration",
            "12s",
            "--seed",
            "7",
            "--history-dir",
        ])
        .arg(&dir)
        .output()
        .expect("the chaos binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report = format!("{stdout}\n--- stderr ---\n{stderr}");
    let guarded = row(&stdout, "sentinel-failover");
    let control = row(&stdout, "sentinel-failover-noguard");
    // Each run injected faults: one start event per group failed over,
    // at least three per round.
    let injected: Vec<u64> = stdout
        .lines()
        .filter_map(|l| l.trim().strip_prefix("faults injected: "))
        .filter_map(|n| n.parse().ok())
        .collect();
    assert!(
        injected.len() == 2 && injected.iter().all(|&n| n >= 3),
        "faults injected {injected:?}\n{report}"
    );
    assert!(guarded.granted > 0, "{report}");
    assert_eq!(
        (
            guarded.overlaps,
            guarded.tokens,
            guarded.lost_updates,
            guarded.stale_accepted
        ),
        (0, 0, 0, 0),
        "a violation with the restart guard on\n{report}"
    );
    assert_eq!(guarded.verdict, "PASS", "{report}");
    assert!(
        control.overlaps + control.tokens > 0,
        "the control showed no violation\n{report}"
    );
    // Fencing stays on in the control: the store refuses what the lock let
    // through.
    assert_eq!(control.stale_accepted, 0, "{report}");
    assert_eq!(control.verdict, "PASS (violation shown)", "{report}");
    assert!(out.status.success(), "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}
