//! `redfence status`: [`Client::inspect`](redfence::Client::inspect) of
//! each resource, as a table or JSON.

use redfence::{Holder, Inspection, NodeInspection};
use serde_json::{json, Value};

use crate::cli::{Common, Status, EXIT_UNAVAILABLE, EXIT_USAGE};
use crate::duration::{millis, show};
use crate::fail;

pub(crate) async fn run(common: &Common, args: Status) -> i32 {
    let client = match crate::client(common, &common.nodes) {
        Ok(client) => client,
        Err(code) => return code,
    };
    if let Some(permits) = args.permits {
        return crate::semaphore_status::run(&client, permits, &args.resources, args.json).await;
    }
    if args.rw {
        return crate::rw_status::run(&client, &args.resources, args.json).await;
    }
    let mut inspections = Vec::new();
    for resource in &args.resources {
        match client.inspect(resource).await {
            Ok(i) => inspections.push(i),
            Err(e) => return fail(EXIT_USAGE, &format!("{resource:?}: {e}")),
        }
    }
    if args.json {
        let all: Vec<Value> = inspections.iter().map(to_json).collect();
        println!("{}", Value::Array(all));
    } else {
        for (n, i) in inspections.iter().enumerate() {
            if n > 0 {
                println!();
            }
            print_table(i);
        }
    }
    let short = inspections.iter().any(|i| i.answered() < i.quorum);
    if short {
        EXIT_UNAVAILABLE
    } else {
        0
    }
}

pub(crate) fn holder(h: &Holder) -> String {
    match h {
        Holder::Us => "this client".into(),
        Holder::Other { tag: Some(tag) } => tag.clone(),
        Holder::Other { tag: None } => "(foreign value)".into(),
        _ => "?".into(),
    }
}

fn print_table(i: &Inspection) {
    let summary = match (&i.holder, i.valid_for_at_least) {
        (Some(h), Some(valid)) => format!(
            "held by {} on {}/{} nodes, valid for at least {}",
            holder(h),
            i.held_on,
            i.nodes.len(),
            show(valid)
        ),
        (Some(h), None) => format!(
            "held by {} on {}/{} nodes",
            holder(h),
            i.held_on,
            i.nodes.len()
        ),
        (None, _) => {
            let keys = i.nodes.iter().filter(|n| n.is_held()).count();
            format!(
                "free (not held on a majority; {keys}/{} nodes have a key)",
                i.nodes.len()
            )
        }
    };
    let fence = i.fence.map(|f| format!(", fence {f}")).unwrap_or_default();
    println!("{}: {summary}{fence}", i.resource);
    let rows: Vec<[String; 5]> = i
        .nodes
        .iter()
        .map(|n| {
            [
                n.index.to_string(),
                n.addr.clone(),
                state(n),
                n.expires_in
                    .map(show)
                    .unwrap_or_else(|| dash(n.is_held(), "no expiry")),
                n.fence.map(|f| f.to_string()).unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    print_rows(["NODE", "ADDRESS", "HOLDER", "TTL", "FENCE"], &rows);
}

/// Prints `header` and `rows` indented, each column as wide as its widest
/// cell: the tables of every `status` view.
pub(crate) fn print_rows<const N: usize>(header: [&str; N], rows: &[[String; N]]) {
    let header = header.map(str::to_owned);
    let mut widths = header.clone().map(|h| h.len());
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    for row in std::iter::once(&header).chain(rows) {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        println!("  {}", line.join("  ").trim_end());
    }
}

fn dash(held: bool, otherwise: &str) -> String {
    if held { otherwise } else { "-" }.into()
}

fn state(n: &NodeInspection) -> String {
    match (&n.error, &n.holder) {
        (Some(e), _) => format!("failed: {e}"),
        (None, Some(h)) => holder(h),
        (None, None) => "free".into(),
    }
}

fn to_json(i: &Inspection) -> Value {
    let holder_json = |h: &Option<Holder>| match h {
        None => Value::Null,
        Some(Holder::Us) => json!({ "self": true, "tag": Value::Null }),
        Some(Holder::Other { tag }) => json!({ "self": false, "tag": tag }),
        Some(_) => Value::Null,
    };
    let nodes: Vec<Value> = i
        .nodes
        .iter()
        .map(|n| {
            json!({
                "index": n.index,
                "addr": n.addr,
                "held": n.is_held(),
                "holder": holder_json(&n.holder),
                "ttl_ms": n.expires_in.map(millis),
                "fence": n.fence,
                "error": n.error.as_ref().map(ToString::to_string),
            })
        })
        .collect();
    json!({
        "resource": i.resource,
        "key": i.key,
        "fence_key": i.fence_key,
        "held": i.is_held(),
        "holder": holder_json(&i.holder),
        "held_on": i.held_on,
        "quorum": i.quorum,
        "answered": i.answered(),
        "valid_for_at_least_ms": i.valid_for_at_least.map(millis),
        "fence": i.fence,
        "nodes": nodes,
    })
}
