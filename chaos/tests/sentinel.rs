//! The `sentinel-failover` nemesis and its guard-off control, run as a
//! real process against real Sentinel groups (five of them: a master, a
//! replica and three Sentinels each, 25 `redis-server` processes on
//! loopback, started and killed by the binary): with the restart guard no
//! violation, without it the checker must see one. The counts come from
//! the results table the binary prints, the same rows CI reads.

mod common;

use common::row;

/// 12 s each: room for a round of three or four failovers and its
/// guard window with seconds to spare (a round needs about 5 s), and on
/// most runs a second round.
#[test]
fn sentinel_failovers_are_safe_with_the_guard_and_the_control_shows_the_violation() {
    let dir = std::env::temp_dir().join(format!("redfence-chaos-sentinel-{}", std::process::id()));
    let (stdout, report, success) = run(&dir, "sentinel-failover,sentinel-failover-noguard", 7);
    let guarded = row(&stdout, "sentinel-failover");
    let control = row(&stdout, "sentinel-failover-noguard");
    // Each run injected faults: one start event per group failed over,
    // at least three per round.
    assert_eq!(faults(&stdout).len(), 2, "{report}");
    assert!(
        faults(&stdout).iter().all(|&n| n >= 3),
        "faults injected {:?}\n{report}",
        faults(&stdout)
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
    // The control's violation depends on timing (a failed-over master must
    // be among a holder's majority while the previous holder's keys live
    // on the others): a CI run's 12 s once showed none (2 rounds, 6
    // faults). It runs again, alone, with the next seeds, up to twice; the
    // checker must see a violation in one of them. Fencing stays on in the
    // control: the store refuses what the lock let through, in every run.
    let mut shown = (control.overlaps + control.tokens > 0).then_some(control.verdict.clone());
    let mut stale = control.stale_accepted;
    let mut reports = vec![report.clone()];
    for seed in [8, 9] {
        if shown.is_some() {
            break;
        }
        let (again, again_report, _) = run(&dir, "sentinel-failover-noguard", seed);
        let r = row(&again, "sentinel-failover-noguard");
        assert!(
            faults(&again).iter().all(|&n| n >= 3),
            "faults injected {:?}\n{again_report}",
            faults(&again)
        );
        if r.overlaps + r.tokens > 0 {
            shown = Some(r.verdict.clone());
        }
        stale += r.stale_accepted;
        reports.push(again_report);
    }
    let all = reports.join("\n");
    let shown = shown
        .unwrap_or_else(|| panic!("the control showed no violation with seeds 7, 8 and 9\n{all}"));
    assert_eq!(stale, 0, "{all}");
    assert_eq!(shown, "PASS (violation shown)", "{all}");
    // The binary fails a control that shows nothing; a rerun showed it.
    let success = success || control.overlaps + control.tokens == 0;
    assert!(success, "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The faults each run injected, in the order of the results.
fn faults(stdout: &str) -> Vec<u64> {
    stdout
        .lines()
        .filter_map(|l| l.trim().strip_prefix("faults injected: "))
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// The nemeses `nemeses` for 12 s with `seed` (`common::chaos`).
fn run(dir: &std::path::Path, nemeses: &str, seed: u64) -> (String, String, bool) {
    common::chaos(dir, &["--nemesis", nemeses, "--duration", "12s"], seed)
}
