//! The README's first command, `cargo run --example quickstart`, on a
//! machine without `redis-server`: one clean line naming the fix, exit
//! status 1, no panic and no backtrace. Runs the example binary that
//! `cargo test` builds beside the test binaries, with a `PATH` that has no
//! `redis-server` on it.

use std::path::PathBuf;
use std::process::Command;

fn example(name: &str) -> PathBuf {
    // target/<profile>/deps/quickstart-<hash> → target/<profile>/examples/
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let path = profile_dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: `cargo test` builds the examples",
        path.display()
    );
    path
}

#[test]
fn without_redis_server_the_quickstart_says_how_to_install_it() {
    let output = Command::new(example("quickstart"))
        .env("PATH", "/nonexistent")
        .env_remove("REDFENCE_NODES")
        .env_remove("REDFENCE_DATA")
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("the example runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    let line = lines[0];
    assert!(line.starts_with("error: redis-server not found"), "{line}");
    for fix in [
        "apt-get install redis-server",
        "brew install redis",
        "docker compose up -d",
    ] {
        assert!(line.contains(fix), "names {fix:?}: {line}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("stack backtrace"), "{stderr}");
}
