//! `redfence status --rw NAME`: a read-write lock's readers, its writer
//! and a waiting writer, per node, read by the real binary while this
//! test's own client holds and waits (the library, on the same servers).

#[path = "../../tests/support/process.rs"]
mod process;
#[path = "../../tests/support/server.rs"]
mod server;

use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use process::wait_timeout;
use redfence::{Client, RestartGuard, Retry};
use server::Cluster;

fn status(urls: &[String], args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_redfence"))
        .env("REDFENCE_NODES", urls.join(","))
        .env("REDFENCE_NO_RESTART_GUARD", "1")
        .env_remove("REDFENCE_KEY_PREFIX")
        .env_remove("REDFENCE_NODE_TIMEOUT")
        .arg("status")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the redfence binary runs");
    let within = Duration::from_secs(30);
    if wait_timeout(&mut child, within).is_none() {
        let _ = child.kill();
        panic!("status still running after {within:?}");
    }
    child.wait_with_output().unwrap()
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls `status --rw prices` until `check` holds on its output, or 20 s.
fn eventually(urls: &[String], check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = text(&status(urls, &["--rw", "prices"]));
        if check(&out) || Instant::now() >= deadline {
            return out;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn status_rw_shows_readers_the_writer_and_a_waiting_writer_per_node() {
    let mut cluster = Cluster::start(3);
    let urls = cluster.urls();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = rt
        .block_on(async {
            Client::builder(urls.clone())
                .restart_guard(RestartGuard::off())
                .build()
        })
        .unwrap();
    let tag = client.id().to_owned();
    let lock = client.rw_lock("prices").unwrap();
    let ttl = Duration::from_secs(60);
    let reads = rt.block_on(async {
        let a = lock.acquire_read(ttl).await.unwrap();
        let b = lock.acquire_read(ttl).await.unwrap();
        [a, b]
    });

    // Two reads, held by this test's client (another client to the
    // binary: it shows the tag).
    let out = status(&urls, &["--rw", "prices"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let shown = text(&out);
    assert!(
        shown.starts_with("prices: 2 reader(s) on a majority, fence "),
        "{shown}"
    );
    assert_eq!(
        shown.matches(&format!("  read by {tag} on ")).count(),
        2,
        "{shown}"
    );
    // Per node: no writer, and the node's live readers (a fresh client's
    // first holds may live on a bare majority).
    let rows: Vec<&str> = shown
        .lines()
        .filter(|l| l.starts_with("  0 ") || l.starts_with("  1 ") || l.starts_with("  2 "))
        .collect();
    assert_eq!(rows.len(), 3, "{shown}");
    let readers: usize = rows
        .iter()
        .map(|r| {
            let cells: Vec<&str> = r.split_whitespace().collect();
            assert_eq!(cells[2], "-", "a writer on {r:?}");
            cells[3].parse::<usize>().expect("a reader count")
        })
        .sum();
    assert!(readers >= 4, "{shown}");
    // The secret part of a reader's value never shows; the control: the
    // value on the node does carry it.
    let value = cluster
        .nodes
        .iter()
        .find_map(|n| {
            let entries = n.cli(&["KEYS", "redfence:rw:e:*"]);
            let entry = entries.lines().next().filter(|e| !e.is_empty())?;
            Some(n.cli(&["GET", entry]))
        })
        .expect("a reader entry on a node");
    let (value_tag, secret) = value.trim().split_once(':').expect("tag:secret");
    assert_eq!(value_tag, tag);
    assert!(!shown.contains(secret), "{shown}");
    // A mutex of the same name is another lock: the plain view sees none.
    let plain = text(&status(&urls, &["prices"]));
    assert!(plain.starts_with("prices: free"), "{plain}");

    // A writer waits behind the readers: its marker shows, per node.
    let waiting = {
        let lock = lock.clone();
        rt.spawn(async move {
            let retry = Retry::new().with_max_wait(Duration::from_secs(30));
            lock.write(ttl).retry(retry).acquire().await
        })
    };
    let shown = eventually(&urls, |t| t.contains("; a writer waits on "));
    assert!(
        shown.starts_with("prices: 2 reader(s) on a majority; a writer waits on "),
        "{shown}"
    );
    assert!(shown.contains(&format!("{tag} (")), "{shown}");
    let out = status(&urls, &["--rw", "--json", "prices"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let lock_json = &json[0];
    assert_eq!(lock_json["rw_lock"], "prices", "{json}");
    assert_eq!(lock_json["readers"].as_array().map(Vec::len), Some(2));
    assert!(lock_json["writer"].is_null(), "{json}");
    assert!(lock_json["writer_waiting_on"].as_u64() >= Some(1), "{json}");
    assert_eq!(lock_json["answered"], 3, "{json}");
    assert!(!out
        .stdout
        .windows(secret.len())
        .any(|w| w == secret.as_bytes()));

    // The readers leave: the writer gets in, and its marker goes.
    rt.block_on(async {
        for r in reads {
            r.release().await;
        }
    });
    let write = rt
        .block_on(waiting)
        .unwrap()
        .expect("the writer gets in once the readers leave");
    let shown = eventually(&urls, |t| !t.contains("a writer waits"));
    assert!(
        shown.starts_with(&format!("prices: written by {tag} on ")),
        "{shown}"
    );
    assert!(!shown.contains("a writer waits"), "{shown}");
    // The view's fence is the highest of the nodes', at least the
    // writer's token (a node whose fence was seeded later can be above
    // it: a CI run showed 1796538271629517 beside a token ...625576).
    let token = write.token().expect("fencing is on by default").get();
    let shown_fence: u64 = shown
        .lines()
        .next()
        .and_then(|l| l.rsplit_once(", fence "))
        .and_then(|(_, f)| f.trim().parse().ok())
        .expect("the view's fence");
    assert!(shown_fence >= token, "{shown_fence} < {token}: {shown}");

    // Bad input: a usage error, nothing read.
    let out = status(&urls, &["--rw", ""]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = status(&urls, &["--rw", "--permits", "2", "prices"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");

    // Two of three nodes gone: each is reported, bounded by the node
    // timeout, and the exit status says the view is short of a majority.
    cluster.nodes[1].kill();
    cluster.nodes[2].kill();
    let started = Instant::now();
    let out = status(&urls, &["--rw", "prices"]);
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    assert_eq!(text(&out).matches("failed: ").count(), 2, "{}", text(&out));
    assert!(started.elapsed() < Duration::from_secs(20));
    rt.block_on(write.release());
}
