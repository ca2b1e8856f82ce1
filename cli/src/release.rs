//! `redfence release --force`: [`Client::force_release`](redfence::Client::force_release),
//! after showing who holds the lock and asking (unless `--yes`).

use std::io::{BufRead as _, IsTerminal as _, Write as _};

use redfence::{ForceOutcome, ForceReleased};
use serde_json::{json, Value};

use crate::cli::{Common, Release, EXIT_UNAVAILABLE, EXIT_USAGE};
use crate::fail;

pub(crate) async fn run(common: &Common, args: Release) -> i32 {
    if !args.force {
        return fail(
            EXIT_USAGE,
            "release needs --force: it deletes the lock whatever its holder (see --help)",
        );
    }
    let client = match crate::client(common, &common.nodes) {
        Ok(client) => client,
        Err(code) => return code,
    };
    if !args.yes {
        if !std::io::stdin().is_terminal() {
            return fail(
                EXIT_USAGE,
                "refusing to release by force without --yes when stdin is not a terminal",
            );
        }
        match client.inspect(&args.resource).await {
            Ok(i) => eprintln!("{i}"),
            Err(e) => return fail(EXIT_USAGE, &e.to_string()),
        }
        eprint!(
            "delete the lock {:?} on all {} nodes, whoever holds it? [y/N] ",
            args.resource,
            client.nodes()
        );
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        let _ = std::io::stdin().lock().read_line(&mut answer);
        if !matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
            return fail(EXIT_USAGE, "not confirmed, nothing deleted");
        }
    }
    let released = match client.force_release(&args.resource).await {
        Ok(released) => released,
        Err(e) => return fail(EXIT_USAGE, &e.to_string()),
    };
    if args.json {
        println!("{}", to_json(&args.resource, &released));
    } else {
        println!(
            "{}: deleted on {} of {} nodes{}",
            args.resource,
            released.deleted(),
            released.nodes.len(),
            if released.is_complete() {
                String::new()
            } else {
                format!(
                    "; {} did not answer, their key may remain",
                    released.failed()
                )
            }
        );
        for node in &released.nodes {
            println!(
                "  node {} ({}): {}",
                node.index,
                node.addr,
                outcome(&node.outcome)
            );
        }
    }
    if released.is_complete() {
        0
    } else {
        EXIT_UNAVAILABLE
    }
}

fn outcome(o: &ForceOutcome) -> String {
    match o {
        ForceOutcome::Deleted => "deleted".into(),
        ForceOutcome::Absent => "no key".into(),
        ForceOutcome::Failed(e) => format!("failed: {e}"),
        _ => "?".into(),
    }
}

fn to_json(resource: &str, r: &ForceReleased) -> Value {
    let nodes: Vec<Value> = r
        .nodes
        .iter()
        .map(|n| {
            let (name, error) = match &n.outcome {
                ForceOutcome::Deleted => ("deleted", None),
                ForceOutcome::Absent => ("absent", None),
                ForceOutcome::Failed(e) => ("failed", Some(e.to_string())),
                _ => ("unknown", None),
            };
            json!({ "index": n.index, "addr": n.addr, "outcome": name, "error": error })
        })
        .collect();
    json!({
        "resource": resource,
        "key": r.key,
        "deleted": r.deleted(),
        "failed": r.failed(),
        "complete": r.is_complete(),
        "nodes": nodes,
    })
}
