//! `redfence status --rw NAME…`: each read-write lock, read at once with
//! [`RwLock::inspect`](redfence::RwLock::inspect): the write or the reads
//! held on a majority, and per node the writer, the live readers, whether
//! a writer waits (its marker stops new readers there) and the fence, as a
//! table or JSON. Self-contained, as `semaphore_status`.

use redfence::{Client, RwEntry, RwHold, RwInspection, RwNodeInspection};
use serde_json::{json, Value};

use crate::cli::{EXIT_UNAVAILABLE, EXIT_USAGE};
use crate::duration::{millis, show};
use crate::fail;
use crate::status::{holder, print_rows};

/// Inspects the read-write locks `names` and prints them; the exit status
/// as `status`'s: 69 when a lock was read from fewer than a majority of
/// nodes.
pub(crate) async fn run(client: &Client, names: &[String], json: bool) -> i32 {
    let mut locks = Vec::new();
    for name in names {
        match client.rw_lock(name) {
            Ok(lock) => locks.push(lock.inspect().await),
            Err(e) => return fail(EXIT_USAGE, &format!("{name:?}: {e}")),
        }
    }
    if json {
        let all: Vec<Value> = locks.iter().map(to_json).collect();
        println!("{}", Value::Array(all));
    } else {
        for (n, lock) in locks.iter().enumerate() {
            if n > 0 {
                println!();
            }
            print_table(lock);
        }
    }
    if locks.iter().any(|i| i.answered() < i.quorum) {
        EXIT_UNAVAILABLE
    } else {
        0
    }
}

fn hold(h: &RwHold, of: usize) -> String {
    format!(
        "{} on {}/{of} nodes, valid for at least {}",
        holder(&h.holder),
        h.held_on,
        show(h.valid_for_at_least)
    )
}

fn print_table(i: &RwInspection) {
    let n = i.nodes.len();
    let summary = match (&i.writer, i.readers.len()) {
        (Some(w), _) => format!("written by {}", hold(w, n)),
        (None, 0) => "free (no write nor read on a majority)".to_owned(),
        (None, r) => format!("{r} reader(s) on a majority"),
    };
    let waiting = if i.writer_waiting_on > 0 {
        format!("; a writer waits on {}/{n} nodes", i.writer_waiting_on)
    } else {
        String::new()
    };
    let fence = i.fence.map(|f| format!(", fence {f}")).unwrap_or_default();
    println!("{}: {summary}{waiting}{fence}", i.name);
    for r in &i.readers {
        println!("  read by {}", hold(r, n));
    }
    let rows: Vec<[String; 6]> = i.nodes.iter().map(row).collect();
    print_rows(
        [
            "NODE",
            "ADDRESS",
            "WRITER",
            "READERS",
            "WRITER WAITING",
            "FENCE",
        ],
        &rows,
    );
}

fn entry(e: &RwEntry) -> String {
    match e.expires_in {
        Some(ttl) => format!("{} ({})", holder(&e.holder), show(ttl)),
        None => format!("{} (no expiry)", holder(&e.holder)),
    }
}

fn row(n: &RwNodeInspection) -> [String; 6] {
    let (index, addr) = (n.index.to_string(), n.addr.clone());
    if let Some(e) = &n.error {
        let dash = || "-".to_owned();
        return [index, addr, format!("failed: {e}"), dash(), dash(), dash()];
    }
    [
        index,
        addr,
        n.writer.as_ref().map_or_else(|| "-".into(), entry),
        n.readers.len().to_string(),
        n.waiting_writer.as_ref().map_or_else(|| "-".into(), entry),
        n.fence.map_or_else(|| "-".into(), |f| f.to_string()),
    ]
}

fn to_json(i: &RwInspection) -> Value {
    let entry = |e: &RwEntry| {
        json!({
            "holder": holder(&e.holder),
            "ttl_ms": e.expires_in.map(millis),
        })
    };
    let hold = |h: &RwHold| {
        json!({
            "holder": holder(&h.holder),
            "held_on": h.held_on,
            "valid_for_at_least_ms": millis(h.valid_for_at_least),
        })
    };
    let nodes: Vec<Value> = i
        .nodes
        .iter()
        .map(|n| {
            json!({
                "index": n.index,
                "addr": n.addr,
                "writer": n.writer.as_ref().map(entry),
                "readers": n.readers.iter().map(entry).collect::<Vec<_>>(),
                "indexed": n.indexed,
                "writer_waiting": n.waiting_writer.as_ref().map(entry),
                "fence": n.fence,
                "error": n.error.as_ref().map(ToString::to_string),
            })
        })
        .collect();
    json!({
        "rw_lock": i.name,
        "quorum": i.quorum,
        "answered": i.answered(),
        "writer": i.writer.as_ref().map(hold),
        "readers": i.readers.iter().map(hold).collect::<Vec<_>>(),
        "writer_waiting_on": i.writer_waiting_on,
        "fence": i.fence,
        "nodes": nodes,
    })
}
