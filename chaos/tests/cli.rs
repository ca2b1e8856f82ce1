//! The suite's command line, run as a real process. Also the reason the
//! tests build the `chaos` binary: `.ci/run` runs that very binary for the
//! short form instead of building it again with other features.

use std::process::{Command, Output};

fn chaos(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_chaos"))
        .args(args)
        .output()
        .expect("the chaos binary runs")
}

#[test]
fn list_names_every_nemesis_and_exits_0() {
    let out = chaos(&["--list"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(names.len(), 15, "{text}");
    for name in [
        "kill-aof",
        "failover",
        "failover-noguard",
        "sentinel-failover",
        "sentinel-failover-noguard",
        "pause",
        "clock-jump",
        "evict",
        "no-fencing",
    ] {
        assert!(names.contains(&name), "{name} missing from:\n{text}");
    }
}

#[test]
fn a_usage_error_exits_2_with_one_error_line_and_no_panic() {
    for (args, says) in [
        (&["--nemesis", "nope"][..], "unknown nemesis \"nope\""),
        (&["--duration", "soon"][..], "bad duration \"soon\""),
        (&["--seed"][..], "--seed needs a value"),
        (&["--resources", "0"][..], "--resources must be 1 to 16"),
        (
            &["--store", "mongo"][..],
            "--store \"mongo\": expected redis, mysql, postgres or sqlite",
        ),
        (
            &["--workload", "queue"][..],
            "--workload \"queue\": expected mutex, election, semaphore",
        ),
        (&["--permits", "0"][..], "--permits must be 1 to 16"),
        (
            &["--writers-percent", "101"][..],
            "--writers-percent must be 0 to 100",
        ),
    ] {
        let out = chaos(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("error: ") && first.contains(says),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}: nothing runs");
    }
}
