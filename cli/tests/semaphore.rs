//! `redfence exec --permits K`: K + 1 real processes at a time, several
//! runs each, on one semaphore; a history checker over the intervals the
//! commands record never sees more than K at once, and each slot's tokens
//! increase across its holders. The control: the same checker on runs
//! given K + 1 permits catches K + 1 holders.

#[path = "../../tests/support/process.rs"]
mod process;
#[path = "../../tests/support/server.rs"]
mod server;

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::Duration;

use process::{wait_timeout, TempDir};
use server::Cluster;

fn redfence(urls: &[String]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_redfence"));
    cmd.env("REDFENCE_NODES", urls.join(","))
        .env("REDFENCE_NO_RESTART_GUARD", "1")
        .env_remove("REDFENCE_KEY_PREFIX")
        .env_remove("REDFENCE_NODE_TIMEOUT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn finish(mut child: Child, within: Duration) -> Output {
    if wait_timeout(&mut child, within).is_none() {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        panic!("redfence still running after {within:?}: {out:?}");
    }
    child.wait_with_output().unwrap()
}

/// One run's record: when its command started and ended (ns, wall clock
/// of this one machine), its slot and token. Written in one line at the
/// end, inside the hold, so the recorded interval lies within the permit's.
#[derive(Debug, Clone)]
struct Run {
    start: u128,
    end: u128,
    slot: u32,
    token: u64,
}

fn parse(text: &str) -> Vec<Run> {
    text.lines()
        .map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(f.len(), 4, "bad line {line:?}");
            Run {
                start: f[0].parse().unwrap(),
                end: f[1].parse().unwrap(),
                slot: f[2].parse().unwrap(),
                token: f[3].parse().unwrap(),
            }
        })
        .collect()
}

/// The history checker: the most runs that overlap at any instant must
/// be at most `bound`; per slot, runs never overlap and tokens increase
/// in start order. `Err` names the violation.
fn check(runs: &[Run], bound: usize) -> Result<usize, String> {
    let mut events: Vec<(u128, i32)> = runs
        .iter()
        .flat_map(|r| [(r.start, 1), (r.end, -1)])
        .collect();
    // An end and a start at one instant do not overlap: ends first.
    events.sort_unstable();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, delta) in events {
        now += delta;
        most = most.max(now);
    }
    let most = usize::try_from(most).unwrap_or(0);
    if most > bound {
        return Err(format!("{most} holders at once, bound {bound}"));
    }
    let mut per_slot: HashMap<u32, Vec<&Run>> = HashMap::new();
    for r in runs {
        per_slot.entry(r.slot).or_default().push(r);
    }
    for (slot, mut runs) in per_slot {
        runs.sort_by_key(|r| r.start);
        for pair in runs.windows(2) {
            if pair[1].start < pair[0].end {
                return Err(format!("slot {slot}: two holders at once"));
            }
            if pair[1].token <= pair[0].token {
                return Err(format!(
                    "slot {slot}: token {} after {}",
                    pair[1].token, pair[0].token
                ));
            }
        }
    }
    Ok(most)
}

/// `workers` threads, each running `runs` execs one after another with
/// `--permits permits`, all on semaphore `name`; returns the records.
fn hammer(
    cluster: &Cluster,
    log: &Path,
    name: &str,
    permits: u32,
    workers: usize,
    runs: usize,
    hold: &str,
) -> Vec<Run> {
    let script = format!(
        "s=$(date +%s%N); sleep {hold}; e=$(date +%s%N); \
         echo \"$s $e $REDFENCE_SLOT $REDFENCE_TOKEN\" >> {}",
        log.display()
    );
    let permits = permits.to_string();
    let threads: Vec<_> = (0..workers)
        .map(|_| {
            let (urls, script, permits, name) = (
                cluster.urls(),
                script.clone(),
                permits.clone(),
                name.to_owned(),
            );
            thread::spawn(move || {
                for _ in 0..runs {
                    let child = redfence(&urls)
                        .args([
                            "exec",
                            "--permits",
                            &permits,
                            "--wait",
                            "120s",
                            "--ttl",
                            "10s",
                            &name,
                            "--",
                            "sh",
                            "-c",
                            &script,
                        ])
                        .spawn()
                        .unwrap();
                    let out = finish(child, Duration::from_secs(150));
                    assert_eq!(
                        out.status.code(),
                        Some(0),
                        "{}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    parse(&fs::read_to_string(log).unwrap())
}

#[test]
fn k_plus_one_processes_never_see_more_than_k_holders() {
    let cluster = Cluster::start(3);
    let dir = TempDir::new("cli-semaphore");
    fs::create_dir_all(dir.path()).unwrap();
    let log = dir.join("runs");
    let k = 2;
    let runs = hammer(&cluster, &log, "backup", k, 3, 4, "0.2");
    assert_eq!(runs.len(), 12);
    let most = check(&runs, k as usize).unwrap_or_else(|e| panic!("{e}: {runs:#?}"));
    assert!(most >= 1);
    assert!(runs.iter().all(|r| r.slot < k), "{runs:?}");

    // The control: K + 1 permits, K + 1 commands started together and
    // held long enough to overlap; the checker must report K + 1.
    let log = dir.join("control");
    let runs = hammer(&cluster, &log, "control", k + 1, 3, 1, "2");
    let caught = check(&runs, k as usize);
    assert!(
        caught
            .as_ref()
            .is_err_and(|e| e.starts_with(&format!("{} holders", k + 1))),
        "the checker missed K + 1 holders: {caught:?} {runs:#?}"
    );
}

#[test]
fn exec_permits_passes_the_slot_and_refuses_k_zero() {
    let cluster = Cluster::start(1);
    let out = finish(
        redfence(&cluster.urls())
            .args([
                "exec",
                "--permits",
                "2",
                "nightly",
                "--",
                "sh",
                "-c",
                "echo \"$REDFENCE_SLOT $REDFENCE_RESOURCE $REDFENCE_TOKEN\"",
            ])
            .spawn()
            .unwrap(),
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let f: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(f.len(), 3, "{text}");
    let slot: u32 = f[0].parse().unwrap();
    assert!(slot < 2);
    assert_eq!(f[1], format!("nightly:permit:{slot}"));
    assert!(f[2].parse::<u64>().unwrap() > 0);
    let out = finish(
        redfence(&cluster.urls())
            .args(["exec", "--permits", "0", "nightly", "--", "true"])
            .spawn()
            .unwrap(),
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid number of permits 0"));
}
