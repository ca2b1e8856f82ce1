//! What the fault suite's process tests share: running the binary, and a
//! row of the results table it prints (the rows CI reads), by its nemesis.

mod run;

pub use run::chaos;

/// One row of the results table, by its nemesis.
pub struct Row {
    pub granted: u64,
    pub overlaps: u64,
    pub tokens: u64,
    pub lost_updates: u64,
    pub stale_accepted: u64,
    pub verdict: String,
}

pub fn row(table: &str, nemesis: &str) -> Row {
    let line = table
        .lines()
        .find(|l| l.starts_with(&format!("| {nemesis} |")))
        .unwrap_or_else(|| panic!("no row for {nemesis} in:\n{table}"));
    let cells: Vec<&str> = line.split('|').map(str::trim).collect();
    // "", nemesis, duration, clients, resources, granted, overlaps,
    // tokens, lost updates, stale accepted, stale rejected, availability,
    // recovery, expected, verdict, "".
    let n = |i: usize| -> u64 {
        cells[i]
            .parse()
            .unwrap_or_else(|_| panic!("cell {i} of {line:?} is not a count"))
    };
    Row {
        granted: n(5),
        overlaps: n(6),
        tokens: n(7),
        lost_updates: n(8),
        stale_accepted: n(9),
        verdict: cells[14].to_owned(),
    }
}
