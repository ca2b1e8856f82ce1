//! The read-write workload (`--workload rw`) under a plain nemesis and its
//! negative control, and the read-write check's own control
//! (`--workload rw-unsafe`), run as a real process. Each write is a grant
//! of `r0:write` (the per-resource checks: writers exclude each other,
//! their tokens increase, the counter they increment loses nothing), each
//! read a grant of a resource of its own; the bound check adds a writer
//! beside any other holder, and the tokens across modes. Counts, not
//! times: what is asserted holds on a loaded 2-core machine.

mod common;

use common::{chaos, row};

/// Nemesis `name`'s section of the details.
fn section<'a>(stdout: &'a str, name: &str) -> &'a str {
    stdout
        .split("\n== ")
        .find(|s| s.starts_with(&format!("{name} (")))
        .unwrap_or_else(|| panic!("no section for {name} in:\n{stdout}"))
}

/// The number after `after` on the line of `section` that starts with
/// `prefix` (trimmed).
fn count(section: &str, prefix: &str, after: &str) -> u64 {
    let line = section
        .lines()
        .find(|l| l.trim_start().starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line in:\n{section}"));
    let (_, rest) = line
        .split_once(after)
        .unwrap_or_else(|| panic!("no {after:?} in {line:?}"));
    rest.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count after {after:?} in {line:?}"))
}

/// Nemesis `name`'s read-write lines.
struct RwLines {
    /// Grants that put a writer beside another holder.
    beside: u64,
    /// Tokens out of order across modes.
    tokens: u64,
    /// Read holds, and the most of them at once.
    reads: u64,
    most_readers: u64,
    /// Write holds.
    writes: u64,
}

fn rw_lines(stdout: &str, name: &str) -> RwLines {
    let s = section(stdout, name);
    RwLines {
        beside: count(s, "bound (one writer alone", "): "),
        tokens: count(s, "tokens across modes", "): "),
        reads: count(s, "holds by mode", "mode: "),
        most_readers: count(s, "holds by mode", "(at most "),
        writes: count(s, "holds by mode", "at once), "),
    }
}

/// 8 s each: `kill-nopersist-guard` (a node killed and restarted empty
/// every 50–250 ms, the restart guard on) and its control
/// `kill-nopersist` (the guard off), one lock, 8 workers, a quarter of
/// the rounds writes.
#[test]
fn rw_is_safe_with_the_guard_and_the_control_shows_a_violation() {
    let dir = std::env::temp_dir().join(format!("redfence-chaos-rw-{}", std::process::id()));
    let (stdout, report, success) = chaos(
        &dir,
        &[
            "--workload",
            "rw",
            "--nemesis",
            "kill-nopersist-guard,kill-nopersist",
            "--duration",
            "8s",
        ],
        7,
    );
    assert!(
        stdout.contains("## Results (seed 7, rw workload,"),
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
        "a writer beside another holder, a token out of order or a lost update with the guard on\n{report}"
    );
    let lines = rw_lines(&stdout, "kill-nopersist-guard");
    assert_eq!((lines.beside, lines.tokens), (0, 0), "{report}");
    assert_eq!(guarded.verdict, "PASS", "{report}");
    // The control's violation depends on timing (a restarted node must be
    // among a writer's majority while another holder's keys live
    // elsewhere): one 8 s run showed none in a CI run (77 grants). It runs
    // again, alone, with the next seeds, up to twice; the checker must see
    // a violation in one of them.
    let mut shown = (control.overlaps + control.tokens > 0).then_some(control.verdict.clone());
    let mut reports = vec![report.clone()];
    for seed in [8, 9] {
        if shown.is_some() {
            break;
        }
        let (again, again_report, _) = chaos(
            &dir,
            &[
                "--workload",
                "rw",
                "--nemesis",
                "kill-nopersist",
                "--duration",
                "8s",
            ],
            seed,
        );
        let r = row(&again, "kill-nopersist");
        if r.overlaps + r.tokens > 0 {
            shown = Some(r.verdict.clone());
        }
        reports.push(again_report);
    }
    let all = reports.join("\n");
    let shown = shown.unwrap_or_else(|| {
        panic!("the control showed neither a writer beside another holder nor a token out of order, with seeds 7, 8 and 9\n{all}")
    });
    assert_eq!(shown, "PASS (violation shown)", "{all}");
    let success = success || control.overlaps + control.tokens == 0;
    // Both modes ran, and readers shared the lock. The guard's
    // quarantines leave few grants in the guarded row (as few as 7: once
    // no write at all, once one reader at a time throughout), so the
    // evidence is asked of the two rows together.
    let unguarded = rw_lines(&stdout, "kill-nopersist");
    assert!(
        lines.reads + unguarded.reads > 0 && lines.writes + unguarded.writes > 0,
        "{report}"
    );
    assert!(
        lines.most_readers.max(unguarded.most_readers) >= 2,
        "no two readers at once\n{report}"
    );
    assert!(success, "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The read-write check's own control: the writers take a mutex of the
/// lock's name, which excludes them from each other but not from the
/// readers. The writers' own checks stay clean, so only the read-write
/// check can see it.
#[test]
fn the_rw_check_catches_writers_that_bypass_the_readers() {
    let dir = std::env::temp_dir().join(format!("redfence-chaos-rwu-{}", std::process::id()));
    let (stdout, report, success) = chaos(
        &dir,
        &[
            "--workload",
            "rw-unsafe",
            "--nemesis",
            "pause",
            "--duration",
            "4s",
        ],
        7,
    );
    let r = row(&stdout, "pause");
    let lines = rw_lines(&stdout, "pause");
    assert!(lines.beside > 0 && lines.writes > 0, "{report}");
    // The column counts the writers beside readers; no two writers held
    // at once and their counter lost nothing.
    assert_eq!(r.overlaps, lines.beside, "{report}");
    assert_eq!((r.lost_updates, r.stale_accepted), (0, 0), "{report}");
    assert_eq!(r.verdict, "PASS (violation shown)", "{report}");
    assert!(success, "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}
