//! `cargo bench --bench peers -- --instructions`: the client's instructions
//! per cycle, counted by callgrind, each subject in its own process.
//!
//! CPU time on a shared 2-core machine moves with whatever else runs;
//! instruction counts do not. For every row (a subject at 1 or 5 nodes,
//! concurrency 1 or 32) this binary runs itself under `valgrind
//! --tool=callgrind` twice, with `--peers-count` and a fixed number of
//! cycles per task (`SHORT` then `LONG`), against the same 5 servers, and
//! reports `(I_long - I_short) / (cycles_long - cycles_short)`: the
//! process's start, connects, script loading and exit cancel out, and
//! what remains is the cost of one cycle (acquire then release), every
//! thread of the process included (callgrind runs them one at a time).
//! The `LONG` run's profile is kept in `target/callgrind/` for
//! `callgrind_annotate --inclusive=yes` (where the instructions went).
//!
//! Not a time: valgrind runs about 50 times slower, so timeouts and the
//! order in which replies arrive differ from a real run; the counts are
//! the client's work, not its latency.

use super::*;

/// Cycles per task of the two runs.
const SHORT: u64 = 10;
const LONG: u64 = 60;

/// The child under callgrind: `kind concurrency cycles tag url...`; runs
/// one priming cycle and then `cycles` per task, and says how many ran.
pub fn count_child(args: &[String]) -> Result<(), String> {
    let [kind, concurrency, cycles, tag, urls @ ..] = args else {
        return Err(format!(
            "expected: kind concurrency cycles tag url..., got {args:?}"
        ));
    };
    let kind = Kind::from_arg(kind).ok_or_else(|| format!("{kind:?}: no such subject"))?;
    let concurrency: usize = concurrency
        .parse()
        .map_err(|_| format!("{concurrency:?}: not a concurrency"))?;
    let cycles: u64 = cycles
        .parse()
        .map_err(|_| format!("{cycles:?}: not a count"))?;
    let rt = runtime();
    let subject = Arc::new(rt.block_on(child::subject(kind, urls))?);
    rt.block_on(subject.cycle(&format!("{tag}prime"), 0, 0))
        .map_err(|e| format!("priming failed: {e}"))?;
    let samples = rt.block_on(async {
        let samples = drive_count(
            Arc::clone(&subject),
            format!("{tag}run"),
            concurrency,
            cycles,
        )
        .await;
        child::settle(&subject).await.map(|()| samples)
    })?;
    if samples.failed > 0 {
        return Err(format!(
            "{} cycles failed: {}",
            samples.failed,
            samples.first_error.unwrap_or_default()
        ));
    }
    println!("cycles={}", samples.cycles() + 1);
    Ok(())
}

/// One callgrind run: the instructions of the whole process, and its
/// cycles.
fn callgrind(
    exe: &std::path::Path,
    out: &std::path::Path,
    kind: Kind,
    concurrency: usize,
    cycles: u64,
    tag: &str,
    urls: &[String],
) -> Result<(u64, u64), String> {
    let output = Command::new("valgrind")
        .env("REDFENCE_BENCH_NODE_TIMEOUT_MS", "5000")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(exe)
        .arg(COUNT_ARG)
        .arg(kind.arg())
        .arg(concurrency.to_string())
        .arg(cycles.to_string())
        .arg(tag)
        .args(urls)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("starting valgrind: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let said = stderr
            .lines()
            .find(|l| l.starts_with("peers count child:"))
            .unwrap_or("(nothing said)");
        return Err(format!(
            "{} {concurrency} {cycles}: {}; {said}",
            kind.arg(),
            output.status
        ));
    }
    let done = stdout
        .lines()
        .find_map(|l| l.strip_prefix("cycles="))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| format!("no cycle count in {stdout:?}"))?;
    let profile =
        std::fs::read_to_string(out).map_err(|e| format!("reading {}: {e}", out.display()))?;
    let total = profile
        .lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|n| n.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| format!("no summary in {}", out.display()))?;
    Ok((total, done))
}

pub fn parent() -> i32 {
    if Command::new("valgrind").arg("--version").output().is_err() {
        eprintln!(
            "valgrind is not on PATH; install it (Debian: sudo apt-get install valgrind) \
             to count instructions"
        );
        return 2;
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("finding this bench's binary: {e}");
            return 1;
        }
    };
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/callgrind");
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("creating {}: {e}", dir.display());
        return 1;
    }
    let cluster = Cluster::start(5);
    let sha = redis::Script::new(RELEASE_LUA).get_hash().to_owned();
    for node in &cluster.nodes {
        if node.cli(&["SCRIPT", "LOAD", RELEASE_LUA]) != sha {
            eprintln!("SCRIPT LOAD of the release script failed");
            return 1;
        }
    }
    let mut out = String::from(
        "| nodes | c | subject | instructions per cycle | ÷ rslock |\n|---:|---:|---|---:|---:|\n",
    );
    let mut failed = false;
    for (nodes, concurrency) in [(1, 1), (1, 32), (5, 1), (5, 32)] {
        let urls: Vec<String> = cluster.nodes[..nodes]
            .iter()
            .map(RedisServer::url)
            .collect();
        let mut rows: Vec<(Kind, u64)> = Vec::new();
        for kind in Kind::ALL.into_iter().filter(|k| k.runs_on(nodes)) {
            let file = |n: u64| dir.join(format!("{}-{nodes}n-c{concurrency}-{n}.out", kind.arg()));
            let tag = |n: u64| format!("ins{nodes}{concurrency}{}{n}", kind.arg());
            let short = callgrind(
                &exe,
                &file(SHORT),
                kind,
                concurrency,
                SHORT,
                &tag(SHORT),
                &urls,
            );
            let long = callgrind(
                &exe,
                &file(LONG),
                kind,
                concurrency,
                LONG,
                &tag(LONG),
                &urls,
            );
            match (short, long) {
                (Ok((i1, c1)), Ok((i2, c2))) if c2 > c1 => {
                    rows.push((kind, i2.saturating_sub(i1) / (c2 - c1)));
                }
                (a, b) => {
                    eprintln!(
                        "{} at {nodes} nodes, c={concurrency}: {a:?} {b:?}",
                        kind.arg()
                    );
                    failed = true;
                }
            }
        }
        let rslock = rows.iter().find(|(k, _)| *k == Kind::Rslock).map(|r| r.1);
        for (kind, per) in rows {
            let ratio = rslock.map_or("-".to_owned(), |r| format!("{:.2}×", per as f64 / r as f64));
            let _ = writeln!(
                out,
                "| {nodes} | {concurrency} | {} | {per} | {ratio} |",
                kind.name()
            );
        }
    }
    println!("{out}");
    println!("profiles (the {LONG}-cycle runs): {}", dir.display());
    i32::from(failed)
}
