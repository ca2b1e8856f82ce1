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

/// `redfence status --permits K NAME`: two `exec --permits 3` processes
/// hold two slots; status lists every slot, the two held with a holder's
/// tag, the time left within the TTL and the slot's fence (at least the
/// token each command was given), the third free; after the holders exit,
/// all three free. K = 0 is a usage error.
#[test]
fn status_lists_a_semaphores_slots_and_their_holders() {
    let cluster = Cluster::start(3);
    let dir = TempDir::new("cli-semaphore-status");
    fs::create_dir_all(dir.path()).unwrap();
    let mut holders = Vec::new();
    let mut held: HashMap<u32, u64> = HashMap::new();
    for i in 0..2 {
        let file = dir.join(&format!("holder{i}"));
        let script = format!(
            "echo \"$REDFENCE_SLOT $REDFENCE_TOKEN\" > {}.tmp && mv {0}.tmp {0}; sleep 30",
            file.display()
        );
        let child = redfence(&cluster.urls())
            .args([
                "exec",
                "--permits",
                "3",
                "--ttl",
                "30s",
                "backup",
                "--",
                "sh",
                "-c",
                &script,
            ])
            .spawn()
            .unwrap();
        holders.push(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !file.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "no permit for holder {i}"
            );
            thread::sleep(Duration::from_millis(20));
        }
        let text = fs::read_to_string(&file).unwrap();
        let (slot, token) = text.trim().split_once(' ').expect("slot and token");
        held.insert(slot.parse().unwrap(), token.parse().unwrap());
    }
    assert_eq!(held.len(), 2, "two slots: {held:?}");
    let status = |args: &[&str]| {
        finish(
            redfence(&cluster.urls())
                .arg("status")
                .args(args)
                .spawn()
                .unwrap(),
            Duration::from_secs(30),
        )
    };

    let out = status(&["--permits", "3", "backup"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.starts_with("backup: 2 of 3 permits held\n"), "{text}");
    for slot in 0..3u32 {
        let prefix = format!("  {slot}     backup:permit:{slot}  ");
        let row = text
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no row for slot {slot}: {text}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        // SLOT RESOURCE HOLDER NODES TTL FENCE
        assert_eq!(cells.len(), 6, "{row}");
        match held.get(&slot) {
            Some(&token) => {
                assert_eq!(cells[2].len(), 16, "a client tag: {row}");
                assert!(cells[2].chars().all(|c| c.is_ascii_hexdigit()), "{row}");
                assert!(cells[4].ends_with('s'), "a time left: {row}");
                assert!(cells[5].parse::<u64>().unwrap() >= token, "{row}");
            }
            None => assert_eq!(&cells[2..5], ["free", "0/3", "-"], "{row}"),
        }
    }

    let out = status(&["--permits", "3", "--json", "backup"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sem = &json[0];
    assert_eq!(
        (sem["semaphore"].as_str(), sem["permits"].as_u64()),
        (Some("backup"), Some(3))
    );
    assert_eq!(sem["held"], 2, "{sem}");
    for slot in 0..3u32 {
        let s = &sem["slots"][slot as usize];
        assert_eq!(s["resource"], format!("backup:permit:{slot}"), "{s}");
        match held.get(&slot) {
            Some(&token) => {
                assert_eq!(s["held"], true, "{s}");
                assert!(s["holder"].as_str().is_some_and(|t| t.len() == 16), "{s}");
                let ttl = s["valid_for_at_least_ms"].as_u64().unwrap();
                assert!(ttl > 0 && ttl <= 30_000, "{s}");
                assert!(s["fence"].as_u64().unwrap() >= token, "{s}");
            }
            None => assert!(s["held"] == false && s["holder"].is_null(), "{s}"),
        }
    }

    // The holders end (SIGTERM, forwarded to their commands): they
    // release, and every slot reads free.
    for child in holders {
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        finish(child, Duration::from_secs(30));
    }
    let out = status(&["--permits", "3", "backup"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.starts_with("backup: 0 of 3 permits held\n"), "{text}");

    let out = status(&["--permits", "0", "backup"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid number of permits 0"));
}
