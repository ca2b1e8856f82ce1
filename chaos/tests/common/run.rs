//! Running the chaos binary from a process test.

use std::path::Path;
use std::process::Command;

/// Runs the chaos binary with `args` and `seed`, its histories under
/// `dir`: its stdout, a report of both streams for messages, and whether
/// it exited 0.
pub fn chaos(dir: &Path, args: &[&str], seed: u64) -> (String, String, bool) {
    let out = Command::new(env!("CARGO_BIN_EXE_chaos"))
        .args(args)
        .args(["--seed", &seed.to_string(), "--history-dir"])
        .arg(dir)
        .output()
        .expect("the chaos binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report = format!("{stdout}\n--- stderr ---\n{stderr}");
    (stdout, report, out.status.success())
}
