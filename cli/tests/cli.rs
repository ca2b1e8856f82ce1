//! The `redfence` binary, run as a real process against real
//! `redis-server` processes: exclusion across concurrent invocations, the
//! conflict status of `--no-wait`, a lease lost mid-command, signals, exit
//! statuses passed through, `doctor`'s statuses, `status`, `release`,
//! `bench`, completions, and usage errors (one line, status 2, no panic).
//!
//! Time margins are generous (a loaded 2-core machine); nothing asserts a
//! speed.

#[path = "../../tests/support/cluster.rs"]
mod cluster;
#[path = "../../tests/support/process.rs"]
mod process;
#[path = "../../tests/support/proxy.rs"]
mod proxy;
#[path = "../../tests/support/sentinel.rs"]
mod sentinel;
#[path = "../../tests/support/server.rs"]
mod server;

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use process::{send_signal, wait_timeout, TempDir};
use server::{Cluster, RedisServer, ServerOptions};

const LOCK_KEYS: &str = "redfence:lock:*";

fn lock_key(resource: &str) -> String {
    format!("redfence:lock:{resource}")
}

/// `redfence` with the nodes of `urls` in `REDFENCE_NODES` and the restart
/// guard off (the servers just started).
fn redfence(urls: &[String]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_redfence"));
    cmd.env("REDFENCE_NODES", urls.join(","))
        .env("REDFENCE_NO_RESTART_GUARD", "1")
        .env_remove("REDFENCE_KEY_PREFIX")
        .env_remove("REDFENCE_NODE_TIMEOUT")
        .stdin(Stdio::null());
    cmd
}

fn output(cmd: &mut Command) -> Output {
    cmd.output().expect("the redfence binary runs")
}

fn spawn(cmd: &mut Command) -> Child {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the redfence binary runs")
}

/// Waits (bounded) for `child` and collects its output; kills it and fails
/// the test if it does not exit in time.
fn finish(mut child: Child, within: Duration) -> Output {
    if wait_timeout(&mut child, within).is_none() {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        panic!("redfence still running after {within:?}: {out:?}");
    }
    child.wait_with_output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls `check` every 20 ms until it holds or `within` passed.
fn eventually(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

fn no_lock_keys(cluster: &Cluster) -> bool {
    eventually(Duration::from_secs(3), || {
        cluster.count_keys(LOCK_KEYS).iter().all(|&n| n == 0)
    })
}

fn contains(path: &Path, text: &str) -> bool {
    fs::read_to_string(path).is_ok_and(|s| s.contains(text))
}

/// A fresh directory, removed on drop.
fn dir(kind: &str) -> TempDir {
    let dir = TempDir::new(kind);
    fs::create_dir_all(dir.path()).unwrap();
    dir
}

/// A `sh -c` script.
fn sh(script: &str) -> [String; 3] {
    ["sh".into(), "-c".into(), script.into()]
}

fn exec_args<'a>(flags: &[&'a str], resource: &'a str, command: &'a [String]) -> Vec<&'a str> {
    let mut args = vec!["exec"];
    args.extend_from_slice(flags);
    args.push(resource);
    args.push("--");
    args.extend(command.iter().map(String::as_str));
    args
}

/// A holder: `redfence exec RESOURCE -- sh -c 'echo started >> F; …'`,
/// returned once the command started.
fn hold(cluster: &Cluster, flags: &[&str], resource: &str, script: &str, log: &Path) -> Child {
    let command = sh(&format!("echo started >> {}; {script}", log.display()));
    let child = spawn(redfence(&cluster.urls()).args(exec_args(flags, resource, &command)));
    assert!(
        eventually(Duration::from_secs(20), || contains(log, "started")),
        "the holder's command never started"
    );
    child
}

#[test]
fn eight_concurrent_execs_never_interleave_and_all_run() {
    let cluster = Cluster::start(3);
    let dir = dir("cli-contention");
    let file = dir.join("log");
    let script = format!(
        "echo \"start $$\" >> {f}; sleep 0.2; echo \"end $$\" >> {f}",
        f = file.display()
    );
    let command = sh(&script);
    let children: Vec<Child> = (0..8)
        .map(|_| {
            spawn(redfence(&cluster.urls()).args(exec_args(
                &["--wait", "120s", "--ttl", "10s"],
                "batch",
                &command,
            )))
        })
        .collect();
    for child in children {
        let out = finish(child, Duration::from_secs(150));
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let text = fs::read_to_string(&file).unwrap();
    assert_eq!(serial_runs(&text), Ok(8), "{text}");
    assert!(
        no_lock_keys(&cluster),
        "{:?}",
        cluster.count_keys(LOCK_KEYS)
    );

    // The control: the same eight scripts started at once without
    // redfence interleave, and the check above sees it.
    let file = dir.join("unlocked");
    let script = format!(
        "echo \"start $$\" >> {f}; sleep 0.2; echo \"end $$\" >> {f}",
        f = file.display()
    );
    let [shell, flag, body] = sh(&script);
    let children: Vec<Child> = (0..8)
        .map(|_| spawn(Command::new(&shell).args([&flag, &body])))
        .collect();
    for child in children {
        assert!(finish(child, Duration::from_secs(30)).status.success());
    }
    let text = fs::read_to_string(&file).unwrap();
    assert!(
        serial_runs(&text).is_err_and(|e| e.starts_with("interleaved")),
        "the unlocked runs did not interleave:\n{text}"
    );
}

/// How many runs the log shows, if each run's `start PID` is followed by
/// its own `end PID` (no other run in between) and every PID ran once.
fn serial_runs(text: &str) -> Result<usize, String> {
    let lines: Vec<&str> = text.lines().collect();
    if !lines.len().is_multiple_of(2) {
        return Err(format!("{} lines, not pairs", lines.len()));
    }
    let mut pids = Vec::new();
    for pair in lines.chunks(2) {
        let pid = pair[0]
            .strip_prefix("start ")
            .ok_or_else(|| format!("interleaved: {:?} where a start belongs", pair[0]))?;
        if pair[1] != format!("end {pid}") {
            return Err(format!("interleaved: {:?} after start {pid}", pair[1]));
        }
        pids.push(pid);
    }
    let runs = pids.len();
    pids.sort_unstable();
    pids.dedup();
    if pids.len() != runs {
        return Err("a run twice".into());
    }
    Ok(runs)
}

#[test]
fn no_wait_on_a_held_lock_exits_with_the_conflict_status_without_running() {
    let cluster = Cluster::start(3);
    let dir = dir("cli-no-wait");
    let holder = hold(
        &cluster,
        &[],
        "held",
        "sleep 60 & wait",
        &dir.join("holder"),
    );
    let marker = dir.join("ran");
    let touch = ["touch".to_owned(), marker.display().to_string()];
    for (flags, code) in [
        (&["--no-wait"][..], 1),
        (&["-n", "--conflict-exit-code", "9"][..], 9),
    ] {
        let out = output(redfence(&cluster.urls()).args(exec_args(flags, "held", &touch)));
        assert_eq!(out.status.code(), Some(code), "{flags:?}: {out:?}");
        assert!(!out.stderr.windows(8).any(|w| w == b"panicked"));
    }
    assert!(!marker.exists(), "the command ran");
    // A bounded wait that runs out: 75, the command did not run either.
    let out =
        output(redfence(&cluster.urls()).args(exec_args(&["--wait", "300ms"], "held", &touch)));
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert!(
        stderr(&out).contains("could not acquire \"held\""),
        "{}",
        stderr(&out)
    );
    assert!(!marker.exists(), "the command ran");

    send_signal(holder.id(), "TERM").unwrap();
    let out = finish(holder, Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(143), "{out:?}");
    assert!(
        no_lock_keys(&cluster),
        "{:?} {}",
        cluster.count_keys(LOCK_KEYS),
        cluster.nodes[0].cli(&["KEYS", "*"])
    );
    // Free now: the same command runs.
    let out = output(redfence(&cluster.urls()).args(exec_args(&["--no-wait"], "held", &touch)));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(marker.exists());
}

#[test]
fn a_lease_lost_mid_command_terminates_it_with_status_124_and_says_why() {
    let mut cluster = Cluster::start(3);
    let dir = dir("cli-lost");
    let log = dir.join("log");
    let script = format!(
        "trap 'echo TERM >> {}; exit 7' TERM; sleep 60 & wait",
        log.display()
    );
    let child = hold(&cluster, &["--ttl", "3s"], "lost", &script, &log);
    for i in 0..2 {
        cluster.node(i).cli(&["DEL", &lock_key("lost")]);
    }
    let out = finish(child, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("lock on \"lost\" lost"), "{err}");
    assert!(err.contains("no longer held on a majority"), "{err}");
    assert!(err.contains("terminating the command"), "{err}");
    assert!(err.contains("exit status 7"), "{err}");
    assert!(contains(&log, "TERM"), "the command never got SIGTERM");
    assert!(
        no_lock_keys(&cluster),
        "{:?}",
        cluster.count_keys(LOCK_KEYS)
    );
}

#[test]
fn one_node_killed_mid_command_does_not_cost_the_lease() {
    let mut cluster = Cluster::start(3);
    let dir = dir("cli-one-down");
    let log = dir.join("log");
    // Three TTLs long: the watchdog must extend on the two left.
    let child = hold(&cluster, &["--ttl", "2s"], "survives", "sleep 6", &log);
    assert_eq!(cluster.count_keys(&lock_key("survives")), vec![1, 1, 1]);
    cluster.node(2).kill();
    let out = finish(child, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));
}

#[test]
fn a_command_that_ignores_sigterm_after_a_loss_gets_sigkill_after_kill_after() {
    let mut cluster = Cluster::start(3);
    let dir = dir("cli-kill-after");
    let log = dir.join("log");
    // Ignored signals stay ignored across exec: the sleeps ignore it too.
    let script = "trap '' TERM; while :; do sleep 0.1; done";
    let child = hold(
        &cluster,
        &["--ttl", "3s", "--kill-after", "1s"],
        "stubborn",
        script,
        &log,
    );
    for i in 0..2 {
        cluster.node(i).cli(&["DEL", &lock_key("stubborn")]);
    }
    let out = finish(child, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("SIGKILL after 1.0s"), "{err}");
    assert!(err.contains("killed by signal 9"), "{err}");
}

#[test]
fn sigterm_to_exec_reaches_the_child_and_releases_the_lock() {
    let cluster = Cluster::start(3);
    let dir = dir("cli-sigterm");
    let log = dir.join("log");
    let script = format!(
        "trap 'echo got TERM >> {}; exit 5' TERM; sleep 60 & wait",
        log.display()
    );
    let child = hold(&cluster, &[], "signalled", &script, &log);
    assert!(
        cluster
            .count_keys(&lock_key("signalled"))
            .iter()
            .sum::<usize>()
            >= 2
    );
    send_signal(child.id(), "TERM").unwrap();
    let out = finish(child, Duration::from_secs(20));
    assert!(contains(&log, "got TERM"), "the child never got SIGTERM");
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    assert!(
        no_lock_keys(&cluster),
        "{:?}",
        cluster.count_keys(LOCK_KEYS)
    );

    // SIGINT and SIGHUP go through too; a child without a trap dies of it.
    for (sig, code) in [("INT", 130), ("HUP", 129)] {
        let log = dir.join(sig);
        let child = hold(&cluster, &[], "signalled", "sleep 60", &log);
        send_signal(child.id(), sig).unwrap();
        let out = finish(child, Duration::from_secs(20));
        assert_eq!(out.status.code(), Some(code), "{sig}: {out:?}");
        assert!(no_lock_keys(&cluster), "{sig}");
    }
}

#[test]
fn sigterm_while_waiting_exits_143_without_running_and_leaves_no_key() {
    let cluster = Cluster::start(3);
    let dir = dir("cli-wait-signal");
    let holder = hold(
        &cluster,
        &[],
        "queued",
        "sleep 60 & wait",
        &dir.join("holder"),
    );
    let marker = dir.join("ran");
    let touch = ["touch".to_owned(), marker.display().to_string()];
    let waiter =
        spawn(redfence(&cluster.urls()).args(exec_args(&["--wait", "60s"], "queued", &touch)));
    // Give it time to make its first attempt and start waiting.
    thread::sleep(Duration::from_secs(1));
    send_signal(waiter.id(), "TERM").unwrap();
    let out = finish(waiter, Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(143), "{out:?}");
    assert!(!marker.exists(), "the command ran");
    send_signal(holder.id(), "TERM").unwrap();
    finish(holder, Duration::from_secs(20));
    assert!(
        no_lock_keys(&cluster),
        "{:?}",
        cluster.count_keys(LOCK_KEYS)
    );
}

#[test]
fn the_commands_exit_status_and_environment_pass_through() {
    let cluster = Cluster::start(3);
    for (script, code) in [
        ("exit 0", 0),
        ("exit 3", 3),
        ("kill -KILL $$", 137),
        ("kill -TERM $$", 143),
    ] {
        let out = output(redfence(&cluster.urls()).args(exec_args(&[], "status", &sh(script))));
        assert_eq!(out.status.code(), Some(code), "{script}: {out:?}");
    }
    let out = output(redfence(&cluster.urls()).args(exec_args(
        &[],
        "env",
        &sh("echo \"$REDFENCE_RESOURCE $REDFENCE_TOKEN $REDFENCE_VALID_UNTIL\""),
    )));
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    let fields: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(fields.len(), 3, "{text}");
    assert_eq!(fields[0], "env");
    assert!(fields[1].parse::<u64>().is_ok_and(|t| t > 0), "{text}");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let until: u128 = fields[2].parse().unwrap();
    assert!(until > now_ms - 60_000 && until < now_ms + 60_000, "{text}");
    assert!(no_lock_keys(&cluster));
}

#[test]
fn nodes_down_exit_69_without_running_the_command() {
    let mut cluster = Cluster::start(3);
    let dir = dir("cli-down");
    let marker = dir.join("ran");
    cluster.node(1).kill();
    cluster.node(2).kill();
    let touch = ["touch".to_owned(), marker.display().to_string()];
    for flags in [&["--no-wait"][..], &["--wait", "1s"][..]] {
        let out = output(redfence(&cluster.urls()).args(exec_args(flags, "down", &touch)));
        assert_eq!(out.status.code(), Some(69), "{flags:?}: {out:?}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("too many nodes unavailable"), "{err}");
    }
    assert!(!marker.exists(), "the command ran");
    assert_eq!(cluster.nodes[0].count_keys(LOCK_KEYS), 0);
}

#[test]
fn a_command_that_cannot_start_is_a_clear_error_and_leaves_no_key() {
    let cluster = Cluster::start(3);
    let dir = dir("cli-nostart");
    let not_exec = dir.join("script");
    fs::write(&not_exec, "#!/bin/sh\necho hi\n").unwrap();
    for (program, code, says) in [
        (
            dir.join("missing").display().to_string(),
            127,
            "No such file",
        ),
        (not_exec.display().to_string(), 126, "Permission denied"),
    ] {
        let out = output(redfence(&cluster.urls()).args(exec_args(
            &[],
            "nostart",
            std::slice::from_ref(&program),
        )));
        assert_eq!(out.status.code(), Some(code), "{out:?}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with("error: cannot run") && err.contains(says),
            "{err}"
        );
        assert!(no_lock_keys(&cluster), "{program}");
    }
}

#[test]
fn doctor_exits_2_on_errors_1_on_warnings_0_when_clean() {
    let durable = || ServerOptions {
        appendonly: true,
        appendfsync_always: true,
        ..ServerOptions::default()
    };
    let doctor = |urls: &[String], json: bool| {
        let mut cmd = redfence(urls);
        cmd.arg("doctor");
        if json {
            cmd.arg("--json");
        }
        output(&mut cmd)
    };
    let clean = Cluster::start_with(3, |_| durable());
    let out = doctor(&clean.urls(), false);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(
        stdout(&out).starts_with("audit of 3 nodes: 0 errors, 0 warnings"),
        "{}",
        stdout(&out)
    );
    let out = doctor(&clean.urls(), true);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["status"], 0);
    assert_eq!(json["nodes"].as_array().map(Vec::len), Some(3));

    // Without persistence: a warning.
    let bare = Cluster::start(3);
    let out = doctor(&bare.urls(), false);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("persistence"), "{}", stdout(&out));

    // A replica: an error.
    let master = RedisServer::start_with(durable());
    let replica = RedisServer::start_with(ServerOptions {
        replica_of: Some(master.port()),
        ..durable()
    });
    let other = RedisServer::start_with(durable());
    let out = doctor(&[master.url(), replica.url(), other.url()], true);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(json["errors"].as_u64().is_some_and(|e| e >= 1), "{json}");
    assert_eq!(json["nodes"][1]["role"], "slave", "{json}");

    // One server under two spellings: an error.
    let twice = [
        other.url(),
        format!("redis://localhost:{}", other.port()),
        master.url(),
    ];
    let out = doctor(&twice, false);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(stdout(&out).contains("same run_id"), "{}", stdout(&out));
}

/// A Sentinel node through `--nodes` (its commas rejoined): `doctor`
/// reports the group and warns about what a failover loses.
#[test]
fn doctor_reports_a_sentinel_group() {
    let group = sentinel::SentinelGroup::start();
    let mut cmd = redfence(&[group.url()]);
    cmd.arg("doctor");
    let out = output(&mut cmd);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("min-replicas-to-write 0"), "{text}");
    assert!(text.contains("a failover loses the locks"), "{text}");
    let mut cmd = redfence(&[group.url()]);
    cmd.args(["doctor", "--json"]);
    let json = stdout(&output(&mut cmd));
    assert!(json.contains("3 of 3 sentinels answer, quorum 2"), "{json}");
}

#[test]
fn status_shows_the_holders_tag_and_never_the_secret() {
    let cluster = Cluster::start(3);
    let dir = dir("cli-status");
    let holder = hold(&cluster, &[], "shown", "sleep 60 & wait", &dir.join("log"));
    // A fresh client's first lock may live on a bare majority.
    let held = cluster.count_keys(&lock_key("shown")).iter().sum::<usize>();
    let value = cluster
        .nodes
        .iter()
        .map(|n| n.cli(&["GET", &lock_key("shown")]))
        .find(|v| v.contains(':'))
        .expect("a node holds the key");
    let (tag, secret) = value.split_once(':').unwrap();
    let out = output(redfence(&cluster.urls()).args(["status", "shown", "free"]));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = stdout(&out);
    assert!(
        text.contains(&format!("shown: held by {tag} on {held}/3 nodes")),
        "{text}"
    );
    assert!(text.contains("free: free"), "{text}");
    assert!(!text.contains(secret), "{text}");
    let out = output(redfence(&cluster.urls()).args(["status", "--json", "shown"]));
    let raw = stdout(&out);
    assert!(!raw.contains(secret), "{raw}");
    // The negative control: the value does carry it.
    assert!(value.contains(secret));
    let json: serde_json::Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(json[0]["held"], true);
    assert_eq!(json[0]["holder"]["tag"], tag);
    assert_eq!(json[0]["held_on"], held);
    assert!(json[0]["valid_for_at_least_ms"]
        .as_u64()
        .is_some_and(|ms| ms > 0));
    assert!(json[0]["fence"].as_u64().is_some());
    send_signal(holder.id(), "TERM").unwrap();
    finish(holder, Duration::from_secs(20));
}

#[test]
fn release_force_deletes_the_lock_only_when_confirmed() {
    let cluster = Cluster::start(3);
    let dir = dir("cli-release");
    let log = dir.join("log");
    let holder = hold(&cluster, &[], "stuck", "sleep 60 & wait", &log);
    // Without --force, or without --yes off a terminal: refused, kept.
    for args in [
        &["release", "stuck"][..],
        &["release", "--force", "stuck"][..],
    ] {
        let out = output(redfence(&cluster.urls()).args(args));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    }
    // A fresh client's first lock may live on a bare majority: requests
    // still connecting when the quorum answered are not sent.
    let held = cluster.count_keys(&lock_key("stuck")).iter().sum::<usize>();
    assert!(held >= 2, "{:?}", cluster.count_keys(LOCK_KEYS));
    let out =
        output(redfence(&cluster.urls()).args(["release", "--force", "--yes", "--json", "stuck"]));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["deleted"], held, "{json}");
    assert_eq!(json["complete"], true, "{json}");
    assert_eq!(cluster.count_keys(&lock_key("stuck")), vec![0, 0, 0]);
    // The holder's watchdog then finds its lock gone: 124.
    let out = finish(holder, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
}

#[test]
fn bench_measures_both_targets_and_prints_plain_lines_off_a_terminal() {
    let cluster = Cluster::start(3);
    let out = output(redfence(&cluster.urls()).args([
        "bench",
        "--concurrency",
        "1,2",
        "--duration",
        "300ms",
        "--json",
    ]));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = json.as_array().unwrap();
    assert_eq!(runs.len(), 4, "{json}");
    for run in runs {
        assert!(run["cycles"].as_u64().is_some_and(|c| c > 0), "{run}");
        assert_eq!(run["failures"], 0, "{run}");
    }
    assert_eq!(runs[0]["nodes"], 3);
    assert_eq!(runs[2]["nodes"], 1);
    let err = stderr(&out);
    assert_eq!(
        err.lines().filter(|l| l.starts_with("bench: ")).count(),
        4,
        "{err}"
    );
    assert!(!err.contains('\r'), "{err:?}");
    assert!(no_lock_keys(&cluster));
}

#[test]
fn completions_are_printed_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let out = output(Command::new(env!("CARGO_BIN_EXE_redfence")).args(["completions", shell]));
        assert!(out.status.success(), "{shell}: {out:?}");
        assert!(stdout(&out).contains("redfence"), "{shell}");
    }
}

#[test]
fn help_lists_examples_and_exit_statuses() {
    let out = output(Command::new(env!("CARGO_BIN_EXE_redfence")).arg("--help"));
    assert!(out.status.success());
    assert!(stdout(&out).contains("redfence exec --no-wait nightly-dedup"));
    let out = output(Command::new(env!("CARGO_BIN_EXE_redfence")).args(["exec", "--help"]));
    assert!(out.status.success());
    for needle in ["124", "75", "69", "127", "128+N", "--conflict-exit-code"] {
        assert!(stdout(&out).contains(needle), "{needle}");
    }
}

#[test]
fn usage_errors_are_one_line_with_status_2_and_never_a_panic() {
    let urls = vec!["redis://127.0.0.1:1".to_owned()];
    let cases: &[(&[&str], &str)] = &[
        (&["--bogus"], "unexpected argument '--bogus'"),
        (&["frobnicate"], "unrecognized subcommand 'frobnicate'"),
        (
            &["exec", "--ttl", "soon", "r", "--", "true"],
            "bad duration \"soon\"",
        ),
        (&["exec", "--ttl", "0s", "r", "--", "true"], "invalid ttl"),
        (
            &["exec", "--ttl", "100000h", "r", "--", "true"],
            "must be at most",
        ),
        (
            &["exec", "--ttl", "99999999999999999999h", "r", "--", "true"],
            "bad duration",
        ),
        (&["exec", "r"], "required arguments were not provided"),
        (
            &["exec", "--no-wait", "--wait", "1s", "r", "--", "true"],
            "cannot be used with",
        ),
        (&["exec", "", "--", "true"], "invalid resource name"),
        (&["--nodes", "bad://host", "status", "r"], "invalid url"),
        (&["--nodes", "", "status", "r"], "no nodes configured"),
        (
            &["--nodes", "redis://127.0.0.1:notaport", "doctor"],
            "invalid url",
        ),
        (
            &["exec", "--conflict-exit-code", "300", "r", "--", "true"],
            "300",
        ),
        (&["bench", "--concurrency", "0"], "--concurrency"),
        (&["completions", "cmd.exe"], "invalid value"),
    ];
    for (args, says) in cases {
        let out = output(redfence(&urls).args(*args));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(says),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    // REDFENCE_NODES unset: the same one-line error.
    let out = output(
        Command::new(env!("CARGO_BIN_EXE_redfence"))
            .env_remove("REDFENCE_NODES")
            .args(["status", "r"]),
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stderr(&out).starts_with("error: no nodes configured"));
}

/// A Redis Cluster as the node, from the shell: `exec` runs the command
/// with a token, `doctor` audits every master of the one node, and no lock
/// key is left on any master.
#[test]
fn a_redis_cluster_node_works_from_the_shell() {
    let cluster = cluster::RedisCluster::start(3, 0);
    let urls = [cluster.seed_url()];
    let out = output(redfence(&urls).args(exec_args(
        &[],
        "cluster-job",
        &sh("echo \"$REDFENCE_TOKEN\""),
    )));
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout(&out).trim().parse::<u64>().is_ok_and(|t| t > 0),
        "{out:?}"
    );
    let out = output(redfence(&urls).arg("doctor"));
    let text = stdout(&out);
    assert!(text.starts_with("audit of 1 node (3 servers):"), "{text}");
    for port in cluster.master_ports() {
        assert!(text.contains(&format!("master 127.0.0.1:{port}")), "{text}");
    }
    for port in cluster.master_ports() {
        assert_eq!(cluster.server(port).count_keys(LOCK_KEYS), 0, "{port}");
    }
}
