//! `redfence doctor`: the deployment audit
//! ([`Client::audit`](redfence::Client::audit)) as a report; exit 0 clean,
//! 1 with warnings, 2 with errors.

use redfence::{Audit, Severity};
use serde_json::{json, Value};

use crate::cli::{Common, Doctor};
use crate::duration::millis;

pub(crate) async fn run(common: &Common, args: Doctor) -> i32 {
    let client = match crate::client(common, &common.nodes) {
        Ok(client) => client,
        Err(code) => return code,
    };
    let audit = client.audit().await;
    if args.json {
        println!("{}", to_json(&audit));
    } else if args.verbose {
        println!("{audit:#}");
    } else {
        println!("{audit}");
    }
    status(&audit)
}

fn status(audit: &Audit) -> i32 {
    if audit.errors().next().is_some() {
        2
    } else if audit.warnings().next().is_some() {
        1
    } else {
        0
    }
}

fn to_json(audit: &Audit) -> Value {
    let nodes: Vec<Value> = audit
        .nodes
        .iter()
        .map(|n| {
            let findings: Vec<Value> = n
                .findings
                .iter()
                .map(|f| {
                    json!({
                        "severity": f.severity.to_string(),
                        "check": f.check.to_string(),
                        "message": f.message,
                    })
                })
                .collect();
            json!({
                "index": n.index,
                "addr": n.addr,
                "reachable": n.reachable,
                "role": n.role,
                "run_id": n.run_id,
                "version": n.version,
                "uptime_ms": n.uptime.map(millis),
                "maxmemory_policy": n.maxmemory_policy,
                "aof": n.aof,
                "appendfsync": n.appendfsync,
                "rdb_save": n.rdb_save,
                "clock_offset_ms": n.clock_offset,
                "findings": findings,
            })
        })
        .collect();
    let count = |s: Severity| {
        audit
            .nodes
            .iter()
            .flat_map(|n| &n.findings)
            .filter(|f| f.severity == s)
            .count()
    };
    json!({
        "ok": audit.is_ok(),
        "errors": count(Severity::Error),
        "warnings": count(Severity::Warning),
        "status": status(audit),
        "nodes": nodes,
    })
}
