//! The semaphore workload (`--workload semaphore`, issue 33) under a plain
//! nemesis and its negative control, and the bound's own control
//! (`--workload semaphore-overcommit`), run as a real process. Each grant
//! of the history is a permit: a slot's lock, so the row's per-resource
//! counts are the slots' exclusion and token order; the bound check adds
//! the grants that made a semaphore's holders more than K. Counts, not
//! times: what is asserted holds on a loaded 2-core machine.

mod common;

use common::{chaos, row};

/// The bound line of nemesis `name`'s details: (grants above K, most
/// holders of one semaphore at once).
fn bound(stdout: &str, name: &str) -> (u64, u64) {
    let section = stdout
        .split("\n== ")
        .find(|s| s.starts_with(&format!("{name} (")))
        .unwrap_or_else(|| panic!("no section for {name} in:\n{stdout}"));
    let line = section
        .lines()
        .find(|l| l.trim_start().starts_with("bound (at most"))
        .unwrap_or_else(|| panic!("no bound line for {name} in:\n{section}"));
    let (_, rest) = line.split_once("): ").expect("the bound line's counts");
    let above = rest.split_whitespace().next().expect("grants above K");
    let most = rest.rsplit(' ').next().expect("most holders");
    (above.parse().unwrap(), most.parse().unwrap())
}

/// 8 s each: `kill-nopersist-guard` (a node killed and restarted empty
/// every 50–250 ms, the restart guard on) and its control
/// `kill-nopersist` (the guard off), K = 2 over one semaphore: 8 workers
/// for 2 permits.
#[test]
fn semaphore_is_safe_with_the_guard_and_the_control_shows_a_violation() {
    let dir = std::env::temp_dir().join(format!("redfence-chaos-sem-{}", std::process::id()));
    let (stdout, report, success) = chaos(
        &dir,
        &[
            "--workload",
            "semaphore",
            "--permits",
            "2",
            "--resources",
            "1",
            "--nemesis",
            "kill-nopersist-guard,kill-nopersist",
            "--duration",
            "8s",
        ],
        7,
    );
    assert!(
        stdout.contains("## Results (seed 7, semaphore workload,"),
        "{report}"
    );
    let guarded = row(&stdout, "kill-nopersist-guard");
    let control = row(&stdout, "kill-nopersist");
    assert!(guarded.granted > 0 && control.granted > 0, "{report}");
    assert_eq!(
        (
            guarded.overlaps,
            guarded.tokens,
            guarded.lost_updates,
            guarded.stale_accepted
        ),
        (0, 0, 0, 0),
        "holders above K, a slot shared, or a token out of order with the guard on\n{report}"
    );
    // The bound was reached (both permits held at once), never passed.
    assert_eq!(bound(&stdout, "kill-nopersist-guard"), (0, 2), "{report}");
    assert_eq!(guarded.verdict, "PASS", "{report}");
    assert!(
        control.overlaps + control.tokens > 0,
        "the control showed neither a shared slot, holders above K, nor a token out of order\n{report}"
    );
    // The slots' tokens are fencing tokens: the store refuses what the
    // broken slots let through.
    assert_eq!(control.stale_accepted, 0, "{report}");
    assert_eq!(control.verdict, "PASS (violation shown)", "{report}");
    assert!(success, "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The bound check's own control: the worker processes ask for 3 permits
/// of a semaphore the checker bounds at 2. Every slot still excludes and
/// its tokens still increase, so only the bound check can see it.
#[test]
fn the_bound_check_catches_k_plus_one_holders() {
    let dir = std::env::temp_dir().join(format!("redfence-chaos-semk-{}", std::process::id()));
    let (stdout, report, success) = chaos(
        &dir,
        &[
            "--workload",
            "semaphore-overcommit",
            "--resources",
            "1",
            "--nemesis",
            "pause",
            "--duration",
            "4s",
        ],
        7,
    );
    let r = row(&stdout, "pause");
    let (above, most) = bound(&stdout, "pause");
    assert!(above > 0 && most == 3, "{report}");
    // The column counts the grants above K; no slot was shared.
    assert_eq!(r.overlaps, above, "{report}");
    assert_eq!((r.tokens, r.lost_updates, r.stale_accepted), (0, 0, 0));
    assert_eq!(r.verdict, "PASS (violation shown)", "{report}");
    assert!(success, "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}
