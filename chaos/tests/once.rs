//! The single-flight workload (`--workload once`, issue 34) under a plain
//! nemesis, and its negative control (`--workload once-unlocked`: naive
//! cache-aside without the helper), run as a real process. Each
//! computation is a grant of its key in the history, so the row's
//! overlapping computations are the history checker's count; the other
//! columns are `once_check.rs`'s. Counts, not times: what is asserted holds
//! on a loaded 2-core machine.

#[path = "common/run.rs"]
mod run;

use run::chaos;

/// One row of the single-flight results table, by its nemesis.
struct Row {
    requests: u64,
    values: u64,
    computations: u64,
    overlaps: u64,
    gone_back: u64,
    late: u64,
    untyped: u64,
    verdict: String,
}

fn row(table: &str, nemesis: &str) -> Row {
    let line = table
        .lines()
        .find(|l| l.starts_with(&format!("| {nemesis} |")))
        .unwrap_or_else(|| panic!("no row for {nemesis} in:\n{table}"));
    let cells: Vec<&str> = line.split('|').map(str::trim).collect();
    // "", nemesis, duration, clients, keys, requests, values, computations,
    // overlapping computations, reads gone back, waiters late, untyped
    // outcomes, writes refused, computations per expiry, expected, verdict.
    let n = |i: usize| -> u64 {
        cells[i]
            .parse()
            .unwrap_or_else(|_| panic!("cell {i} of {line:?} is not a count"))
    };
    Row {
        requests: n(5),
        values: n(6),
        computations: n(7),
        overlaps: n(8),
        gone_back: n(9),
        late: n(10),
        untyped: n(11),
        verdict: cells[15].to_owned(),
    }
}

/// 8 s of `pause` (1–2 lock nodes SIGSTOPped for 100–1500 ms, nodes keep
/// their data, so every check is judged): no two computations of a key
/// inside their leases, no read older than an acknowledged value, every
/// waiter back by its deadline, every outcome a value or a typed error.
#[test]
fn single_flight_is_safe_under_paused_nodes() {
    let dir = std::env::temp_dir().join(format!("redfence-chaos-once-{}", std::process::id()));
    let (stdout, report, success) = chaos(
        &dir,
        &[
            "--workload",
            "once",
            "--nemesis",
            "pause",
            "--duration",
            "8s",
        ],
        7,
    );
    assert!(
        stdout.contains("## Results (seed 7, once workload,"),
        "{report}"
    );
    let r = row(&stdout, "pause");
    // Values expire every 100 ms: computations all through the run, and
    // far more requests served than computed.
    assert!(r.computations >= 10, "{report}");
    assert!(r.values > r.computations, "{report}");
    assert!(r.requests >= r.values, "{report}");
    assert_eq!(
        (r.overlaps, r.gone_back, r.late, r.untyped),
        (0, 0, 0, 0),
        "overlapping computations, a read gone back, a late waiter or an untyped outcome\n{report}"
    );
    assert_eq!(r.verdict, "PASS", "{report}");
    assert!(success, "{report}");
    // The history is the single-flight's (the file name says so).
    let names: Vec<String> = std::fs::read_dir(&dir)
        .expect("the history dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    assert!(
        names.iter().any(|n| n.ends_with("-once.jsonl")),
        "{names:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The control: the same loop as cache-aside without the helper. Every
/// worker that misses computes, so the checker must see computations of
/// one key overlap.
#[test]
fn the_checker_catches_overlapping_computations_without_the_helper() {
    let dir = std::env::temp_dir().join(format!("redfence-chaos-once-ctl-{}", std::process::id()));
    let (stdout, report, success) = chaos(
        &dir,
        &[
            "--workload",
            "once-unlocked",
            "--nemesis",
            "pause",
            "--duration",
            "8s",
        ],
        7,
    );
    let r = row(&stdout, "pause");
    assert!(r.computations > 0, "{report}");
    assert!(r.overlaps > 0, "the control showed no overlap\n{report}");
    // Unfenced writes land out of order, so reads go back as well (not
    // judged in the control, but the reads check must see them).
    assert!(r.gone_back > 0, "{report}");
    assert_eq!(r.verdict, "PASS (violation shown)", "{report}");
    assert!(success, "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}
