//! The election workload (`--workload election`, issue 34) under a plain
//! nemesis and its negative control, run as a real process: nodes killed
//! and restarted empty, with the restart guard no two leaders and no term
//! out of order, without it the checker must see one or the other. Every
//! worker is a candidate; its leaderships are the history's grants (the
//! term the token), so these are the checker's own counts from the results
//! table the binary prints, the rows CI reads. Counts, not times: what is
//! asserted holds on a loaded 2-core machine.

mod common;

use common::{chaos, row};

/// 8 s each, the short form's duration: `kill-nopersist-guard` (a node
/// killed and restarted empty every 50–250 ms, the guard on) and its
/// control `kill-nopersist` (the guard off).
#[test]
fn election_is_safe_with_the_guard_and_the_control_shows_two_leaders() {
    let dir = std::env::temp_dir().join(format!("redfence-chaos-election-{}", std::process::id()));
    let (stdout, report, success) = chaos(
        &dir,
        &[
            "--workload",
            "election",
            "--nemesis",
            "kill-nopersist-guard,kill-nopersist",
            "--duration",
            "8s",
        ],
        7,
    );
    assert!(
        stdout.contains("## Results (seed 7, election workload,"),
        "{report}"
    );
    let guarded = row(&stdout, "kill-nopersist-guard");
    let control = row(&stdout, "kill-nopersist");
    // Leaders were elected under the faults, each a grant of the history.
    assert!(guarded.granted > 0 && control.granted > 0, "{report}");
    assert_eq!(
        (
            guarded.overlaps,
            guarded.tokens,
            guarded.lost_updates,
            guarded.stale_accepted
        ),
        (0, 0, 0, 0),
        "two leaders or a term out of order with the restart guard on\n{report}"
    );
    assert_eq!(guarded.verdict, "PASS", "{report}");
    assert!(
        control.overlaps + control.tokens > 0,
        "the control showed neither two leaders nor a term out of order\n{report}"
    );
    // The terms are fencing tokens: the store refuses what the election
    // let through.
    assert_eq!(control.stale_accepted, 0, "{report}");
    assert_eq!(control.verdict, "PASS (violation shown)", "{report}");
    assert!(success, "{report}");
    // The histories are the election's (the file names say so).
    let names: Vec<String> = std::fs::read_dir(&dir)
        .expect("the history dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    assert!(
        names.iter().any(|n| n.ends_with("-election.jsonl")),
        "{names:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
