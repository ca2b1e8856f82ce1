//! `redfence elect` as real processes against real `redis-server`
//! processes: four candidates, the leader's host "dying" (kill -9) and
//! "freezing" (SIGSTOP past the TTL, then SIGCONT) in turn; a checker over
//! the recorded leadership intervals (at most one leader at any time,
//! terms strictly increasing in start order) and its negative control.
//!
//! A host is two process groups here: `redfence` (started in a group of
//! its own) and its command (which `redfence` puts in a group of its own,
//! as `exec` does). Killing or stopping a host signals both.
//!
//! The SIGSTOP case, honestly: a stopped leader's command is stopped too,
//! so it acts until the stop and not during it; its interval is counted to
//! the stop. When it is continued, its `redfence` finds the leadership
//! lost and terminates it, but the command runs for a moment (until its
//! SIGTERM handler) after the next leader started: that window, with the
//! old, smaller term, is what fencing is for (storage refuses the old
//! term once the new leader wrote). The test measures and prints it and
//! checks the old term is the smaller; it is not counted as a second
//! leader.

#[path = "../../tests/support/process.rs"]
mod process;
#[path = "../../tests/support/server.rs"]
mod server;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use process::{wait_timeout, TempDir};
use server::Cluster;

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Sends `sig` to process group `group` (`kill -SIG -- -GROUP`).
fn signal_group(group: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([format!("-{sig}"), "--".into(), format!("-{group}")])
        .stderr(Stdio::null())
        .status();
}

/// A candidate: `redfence elect` in a process group of its own, whose
/// command appends `start TERM NS PID PPID` to the history, and
/// `end TERM NS` on SIGTERM.
struct Candidate {
    child: Option<Child>,
}

impl Candidate {
    fn start(urls: &[String], name: &str, history: &Path) -> Candidate {
        let h = history.display();
        let script = format!(
            "echo \"start $REDFENCE_TOKEN $(date +%s%N) $$ $PPID\" >> {h}; \
             trap 'echo \"end $REDFENCE_TOKEN $(date +%s%N)\" >> {h}; exit 0' TERM; \
             sleep 600 & wait"
        );
        let child = Command::new(env!("CARGO_BIN_EXE_redfence"))
            .env("REDFENCE_NODES", urls.join(","))
            .env("REDFENCE_NO_RESTART_GUARD", "1")
            .env_remove("REDFENCE_KEY_PREFIX")
            .env_remove("REDFENCE_NODE_TIMEOUT")
            .args([
                "elect",
                "--ttl",
                "2s",
                "--kill-after",
                "1s",
                "--node-timeout",
                "300ms",
                name,
                "--",
                "sh",
                "-c",
                &script,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("the redfence binary runs");
        Candidate { child: Some(child) }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal_group(child.id(), "KILL");
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Start {
    term: u64,
    at: u128,
    pid: u32,
    redfence: u32,
}

/// The history's starts (in file order) and ends (by term).
fn read_history(path: &Path) -> (Vec<Start>, BTreeMap<u64, u128>) {
    let text = fs::read_to_string(path).unwrap_or_default();
    let mut starts = Vec::new();
    let mut ends = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["start", term, at, pid, ppid] => starts.push(Start {
                term: term.parse().unwrap(),
                at: at.parse().unwrap(),
                pid: pid.parse().unwrap(),
                redfence: ppid.parse().unwrap(),
            }),
            ["end", term, at] => {
                ends.insert(term.parse().unwrap(), at.parse().unwrap());
            }
            _ => panic!("bad history line {line:?}"),
        }
    }
    (starts, ends)
}

/// The checker: leadership intervals `[start, end)` (the end from the
/// history, or from `cut`, the instant the harness killed or stopped that
/// term's host, whichever is first; open when neither) never overlap, and
/// terms strictly increase in start order.
fn check(
    starts: &[Start],
    ends: &BTreeMap<u64, u128>,
    cut: &BTreeMap<u64, u128>,
) -> Result<(), String> {
    let mut by_start = starts.to_vec();
    by_start.sort_by_key(|s| s.at);
    let end_of = |term: u64| -> u128 {
        match (ends.get(&term), cut.get(&term)) {
            (Some(&e), Some(&c)) => e.min(c),
            (Some(&e), None) => e,
            (None, Some(&c)) => c,
            (None, None) => u128::MAX,
        }
    };
    for pair in by_start.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if b.at < end_of(a.term) {
            return Err(format!(
                "overlap: term {} started {} ms before term {} ended",
                b.term,
                (end_of(a.term).min(u128::MAX / 2) - b.at) / 1_000_000,
                a.term
            ));
        }
        if b.term <= a.term {
            return Err(format!("term {} started after term {}", b.term, a.term));
        }
    }
    Ok(())
}

fn wait_for_starts(history: &Path, n: usize, within: Duration) -> Vec<Start> {
    let deadline = Instant::now() + within;
    loop {
        let (starts, _) = read_history(history);
        if starts.len() >= n {
            return starts;
        }
        assert!(
            Instant::now() < deadline,
            "{n} leaders expected, history: {:?}",
            fs::read_to_string(history)
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn four_candidates_one_leader_at_a_time_through_kill_and_pause() {
    let cluster = Cluster::start(3);
    let dir = TempDir::new("cli-elect");
    fs::create_dir_all(dir.path()).unwrap();
    let history = dir.join("history");
    let mut candidates: Vec<Candidate> = (0..4)
        .map(|_| Candidate::start(&cluster.urls(), "relay", &history))
        .collect();
    let mut cut = BTreeMap::new();
    let first = wait_for_starts(&history, 1, Duration::from_secs(30)).remove(0);
    // Only one of four runs its command.
    thread::sleep(Duration::from_millis(1500));
    assert_eq!(read_history(&history).0.len(), 1);

    // The leader's host dies: redfence and its command, SIGKILL.
    let killed_at = now_ns();
    signal_group(first.redfence, "KILL");
    signal_group(first.pid, "KILL");
    cut.insert(first.term, killed_at);
    let second = wait_for_starts(&history, 2, Duration::from_secs(30)).remove(1);
    let failover_kill = (second.at - killed_at) / 1_000_000;

    // The next leader's host freezes past the TTL (2 s), then resumes.
    let stopped_at = now_ns();
    signal_group(second.redfence, "STOP");
    signal_group(second.pid, "STOP");
    cut.insert(second.term, stopped_at);
    let third = wait_for_starts(&history, 3, Duration::from_secs(30)).remove(2);
    let failover_stop = (third.at - stopped_at) / 1_000_000;
    thread::sleep(Duration::from_millis(500));
    signal_group(second.redfence, "CONT");
    signal_group(second.pid, "CONT");
    let resumed_at = now_ns();
    // Its redfence finds the leadership lost: the command gets SIGTERM and
    // redfence exits with 124.
    let index = candidates
        .iter()
        .position(|c| c.pid() == second.redfence)
        .expect("the paused leader is a candidate");
    let mut paused = candidates.remove(index);
    let mut child = paused.child.take().unwrap();
    let status = wait_timeout(&mut child, Duration::from_secs(30));
    let stderr = child
        .stderr
        .take()
        .map(|mut e| {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut e, &mut s);
            s
        })
        .unwrap_or_default();
    assert_eq!(status.and_then(|s| s.code()), Some(124), "{stderr}");
    let (_, ends) = read_history(&history);
    let zombie = ends
        .get(&second.term)
        .map(|&end| (end.saturating_sub(resumed_at)) / 1_000_000);
    assert!(zombie.is_some(), "the resumed command was not terminated");
    assert!(
        second.term < third.term,
        "the resumed leader's term is the smaller"
    );

    // Everyone stops: the leader's command gets the forwarded SIGTERM.
    for candidate in &candidates {
        let _ = Command::new("kill")
            .args(["-TERM", &candidate.pid().to_string()])
            .status();
    }
    for candidate in &mut candidates {
        if let Some(mut child) = candidate.child.take() {
            assert!(wait_timeout(&mut child, Duration::from_secs(30)).is_some());
        }
    }
    let (starts, ends) = read_history(&history);
    assert_eq!(starts.len(), 3, "{starts:?}");
    assert_eq!(check(&starts, &ends, &cut), Ok(()));
    eprintln!(
        "failover after kill -9: {failover_kill} ms; after SIGSTOP: {failover_stop} ms \
         (TTL 2 s); the resumed leader's command ran {} ms after SIGCONT until its \
         SIGTERM handler (term {} < {})",
        zombie.unwrap_or_default(),
        second.term,
        third.term
    );
    // Within a TTL (2 s) plus the validity margins and a loaded machine.
    assert!(failover_kill < 15_000 && failover_stop < 15_000);

    // The checker's negative control: two elections writing to one
    // history are two leaders at once, and it says so.
    let control = dir.join("control");
    let a = Candidate::start(&cluster.urls(), "control-a", &control);
    let b = Candidate::start(&cluster.urls(), "control-b", &control);
    let starts = wait_for_starts(&control, 2, Duration::from_secs(30));
    let (_, ends) = read_history(&control);
    let verdict = check(&starts, &ends, &BTreeMap::new());
    assert!(
        verdict.as_ref().is_err_and(|e| e.starts_with("overlap")),
        "{verdict:?}"
    );
    drop((a, b));
}
