//! The judge's rules, checked on hand-built observations: no Redis.

use redis::Value;

use super::*;
use crate::audit::report::{Audit, Severity};

fn bulk(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}

const INFO: &str = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\nuptime_in_seconds:3725\r\n\r\n# Memory\r\nmaxmemory:0\r\nmaxmemory_policy:noeviction\r\n\r\n# Persistence\r\naof_enabled:1\r\n\r\n# Replication\r\nrole:master\r\n";

fn config(v: &str) -> Option<Result<Option<String>, String>> {
    Some(Ok(Some(v.to_owned())))
}

/// A healthy node's answers: master, noeviction, AOF always, 3 samples.
fn healthy() -> Observed {
    Observed {
        in_cluster: false,
        first_reply: Some(Duration::from_micros(300)),
        failure: None,
        auth_refused: false,
        role: Some(Ok(Value::Array(vec![
            bulk("master"),
            Value::Int(0),
            Value::Array(vec![]),
        ]))),
        info: Some(Ok(INFO.to_owned())),
        policy: config("noeviction"),
        appendonly: config("yes"),
        appendfsync: config("always"),
        save: config(""),
        min_replicas: config("0"),
        sentinel: None,
        samples: (0..3)
            .map(|i| ClockSample {
                node_us: 1_000_000_100 + i * 1000,
                sent_us: 1_000_000_000 + i * 1000,
                rtt: Duration::from_micros(200),
            })
            .collect(),
        time_error: None,
    }
}

fn only(audit: &NodeAudit, check: Check) -> &Finding {
    let found: Vec<&Finding> = audit.findings.iter().filter(|f| f.check == check).collect();
    assert_eq!(found.len(), 1, "{check:?}: {:#?}", audit.findings);
    found[0]
}

/// Lowercase first letter, no trailing period.
fn assert_style(message: &str) {
    assert!(!message.starts_with(char::is_uppercase), "{message}");
    assert!(!message.ends_with('.'), "{message}");
}

#[test]
fn version_findings() {
    let severity = |v: &str| version_finding(Some(v)).severity;
    assert_eq!(severity("2.6.17"), Severity::Error);
    assert_eq!(severity("2.8.11"), Severity::Error);
    assert_eq!(severity("2.8.12"), Severity::Warning);
    assert_eq!(severity("6.0.20"), Severity::Warning);
    assert_eq!(severity("6.2.0"), Severity::Info);
    assert_eq!(severity("7.0.15"), Severity::Info);
    assert_eq!(severity("nonsense"), Severity::Warning);
    assert_eq!(version_finding(None).severity, Severity::Warning);
}

#[test]
fn eviction_policies() {
    let f = |p: &str| eviction_finding(Some(p), Some(1 << 30), None);
    assert_eq!(f("noeviction").severity, Severity::Info);
    for p in [
        "volatile-lru",
        "volatile-lfu",
        "volatile-random",
        "volatile-ttl",
    ] {
        let finding = f(p);
        assert_eq!(finding.severity, Severity::Error, "{p}");
        assert!(
            finding.message.contains("every lock key has one"),
            "{finding}"
        );
        assert!(finding.message.contains("second holder"), "{finding}");
        assert!(finding.message.contains(p), "{finding}");
    }
    for p in ["allkeys-lru", "allkeys-lfu", "allkeys-random"] {
        let finding = f(p);
        assert_eq!(finding.severity, Severity::Error, "{p}");
        assert!(finding.message.contains("second holder"), "{finding}");
    }
    assert_eq!(f("something-new").severity, Severity::Warning);
    let unknown = eviction_finding(None, None, Some("ERR unknown command 'CONFIG'"));
    assert_eq!(unknown.severity, Severity::Warning);
    assert!(unknown.message.contains("unknown command"), "{unknown}");
    // No memory limit: still an error, but the message says why nothing
    // has been evicted yet.
    let dormant = eviction_finding(Some("allkeys-lru"), Some(0), None);
    assert_eq!(dormant.severity, Severity::Error);
    assert!(dormant.message.contains("maxmemory is 0"), "{dormant}");
}

#[test]
fn persistence_settings() {
    let f = persistence_finding;
    assert_eq!(
        f(Some(true), Some("always"), Some(""), None).severity,
        Severity::Info
    );
    let everysec = f(Some(true), Some("everysec"), Some(""), None);
    assert_eq!(everysec.severity, Severity::Warning);
    assert!(everysec.message.contains("second"), "{everysec}");
    assert!(everysec.message.contains("longest lock TTL"), "{everysec}");
    assert_eq!(
        f(Some(true), Some("no"), None, None).severity,
        Severity::Warning
    );
    assert_eq!(
        f(Some(true), None, None, Some("ERR")).severity,
        Severity::Warning
    );
    let off = f(Some(false), Some("everysec"), Some(""), None);
    assert_eq!(off.severity, Severity::Warning);
    assert!(off.message.contains("no RDB snapshots"), "{off}");
    assert!(off.message.contains("forgets every lock"), "{off}");
    let rdb = f(Some(false), None, Some("3600 1 300 100"), None);
    assert!(rdb.message.contains("3600 1 300 100"), "{rdb}");
    assert_eq!(f(None, None, None, None).severity, Severity::Warning);
    // No persistence setting is ever an error: a restart delay makes
    // each of them safe for locks.
    for aof in [None, Some(true), Some(false)] {
        for fsync in [
            None,
            Some("always"),
            Some("everysec"),
            Some("no"),
            Some("?"),
        ] {
            assert!(f(aof, fsync, None, None).severity < Severity::Error);
        }
    }
}

fn sample(offset_us: i128, rtt_us: u64) -> ClockSample {
    // node = sent + rtt/2 + offset, so the measured offset is exact.
    let sent_us = 1_700_000_000_000_000;
    ClockSample {
        node_us: sent_us + i128::from(rtt_us / 2) + offset_us,
        sent_us,
        rtt: Duration::from_micros(rtt_us),
    }
}

#[test]
fn clock_offsets() {
    assert_eq!(sample(-250, 400).offset_us(), -250);
    let c = clock(&[sample(900, 5000), sample(50, 200), sample(120, 900)]).unwrap();
    // The shortest round trip wins.
    assert_eq!(c.offset_us, 50);
    assert_eq!(c.rtt, Duration::from_micros(200));
    assert_eq!(c.spread, Some(Duration::from_micros(850)));
    assert_eq!(c.max_rtt, Duration::from_micros(5000));
    assert_eq!(clock(&[]), None);
    assert_eq!(clock(&[sample(1, 1)]).unwrap().spread, None);

    let finding = |samples: &[ClockSample]| clock_finding(clock(samples).as_ref(), None);
    assert_eq!(finding(&[sample(2_000, 300)]).severity, Severity::Info);
    // Far off: a warning either way.
    assert_eq!(finding(&[sample(250_000, 300)]).severity, Severity::Warning);
    assert_eq!(
        finding(&[sample(-250_000, 300)]).severity,
        Severity::Warning
    );
    // 150 ms measured over a 200 ms round trip could be 50 ms: no warning.
    assert_eq!(
        finding(&[sample(150_000, 200_000)]).severity,
        Severity::Info
    );
    // A jump between samples beyond what the round trips explain.
    let stepped = finding(&[sample(0, 300), sample(400_000, 300), sample(0, 300)]);
    assert_eq!(stepped.severity, Severity::Warning);
    assert!(stepped.message.contains("stepped"), "{stepped}");
    let failed = clock_finding(None, Some("ERR unknown command 'TIME'"));
    assert_eq!(failed.severity, Severity::Warning);
    assert!(failed.message.contains("unknown command"), "{failed}");
    // Extreme values: no overflow.
    let wild = ClockSample {
        node_us: i128::MAX,
        sent_us: i128::MIN,
        rtt: Duration::MAX,
    };
    let c = clock(&[wild, sample(0, 1)]).unwrap();
    assert_eq!(c.offset_us, 0);
    let _ = clock_finding(Some(&c), None).to_string();
    assert_eq!(clock(&[wild]).unwrap().offset_us, i64::MAX);
}

#[test]
fn healthy_node() {
    let a = assess(0, "127.0.0.1:7001", &healthy());
    assert!(a.reachable && a.is_ok(), "{a:#?}");
    assert!(
        a.findings.iter().all(|f| f.severity == Severity::Info),
        "{a:#?}"
    );
    assert_eq!(a.role.as_deref(), Some("master"));
    assert_eq!(a.run_id.as_deref(), Some("abc123"));
    assert_eq!(a.version.as_deref(), Some("7.0.15"));
    assert_eq!(a.uptime, Some(Duration::from_secs(3725)));
    assert_eq!(a.maxmemory_policy.as_deref(), Some("noeviction"));
    assert_eq!(a.aof, Some(true));
    assert_eq!(a.appendfsync.as_deref(), Some("always"));
    assert_eq!(a.rdb_save.as_deref(), Some(""));
    assert_eq!(a.clock_offset, Some(0));
    assert_eq!(a.clock_rtt, Some(Duration::from_micros(200)));
    assert_eq!(a.clock_spread, Some(Duration::ZERO));
    assert!(only(&a, Check::Uptime).message.contains("1h 2m 5s"));
    let line = a.to_string();
    assert!(
        line.starts_with("node 0 (127.0.0.1:7001): role master, redis 7.0.15"),
        "{line}"
    );
    assert!(line.contains("+0.000 ms"), "{line}");
}

#[test]
fn unreachable_node() {
    let seen = Observed {
        failure: Some("Connection refused (os error 111)".into()),
        ..Observed::default()
    };
    let a = assess(2, "127.0.0.1:1", &seen);
    assert!(!a.reachable && !a.is_ok());
    assert_eq!(a.findings.len(), 1);
    let f = only(&a, Check::Reachable);
    assert_eq!(f.severity, Severity::Error);
    assert!(
        f.message.starts_with("unreachable: Connection refused"),
        "{f}"
    );
    assert_eq!(a.to_string(), "node 2 (127.0.0.1:1): unreachable");
}

#[test]
fn stalled_after_the_first_answers() {
    let seen = Observed {
        failure: Some("no answer within the connect timeout (1s)".into()),
        samples: vec![],
        time_error: None,
        ..healthy()
    };
    let a = assess(0, "a:1", &seen);
    assert!(a.reachable);
    let f = only(&a, Check::Reachable);
    assert_eq!(f.severity, Severity::Error);
    assert!(f.message.contains("stopped answering"), "{f}");
    // The clock was never asked: no finding, no values.
    assert!(a.findings.iter().all(|f| f.check != Check::Clock));
    assert_eq!(a.clock_offset, None);
}

#[test]
fn replica_and_refused_role() {
    let replica = Observed {
        role: Some(Ok(Value::Array(vec![
            bulk("slave"),
            bulk("127.0.0.1"),
            Value::Int(6380),
            bulk("connected"),
            Value::Int(0),
        ]))),
        ..healthy()
    };
    let a = assess(1, "a:1", &replica);
    let f = only(&a, Check::Role);
    assert_eq!(f.severity, Severity::Error);
    assert!(f.message.contains("replica of 127.0.0.1:6380"), "{f}");
    assert_eq!(a.role.as_deref(), Some("slave"));

    let refused = Observed {
        role: Some(Err(
            "NOPERM this user has no permissions to run the 'role' command".into(),
        )),
        ..healthy()
    };
    let a = assess(1, "a:1", &refused);
    let f = only(&a, Check::Role);
    assert_eq!(f.severity, Severity::Error);
    assert!(f.message.contains("INFO says role master"), "{f}");
    assert_eq!(a.role.as_deref(), Some("master"));

    // Both refused (NOAUTH): one reachable error, nothing else judged.
    let noauth = Observed {
        auth_refused: true,
        role: Some(Err("NOAUTH Authentication required".into())),
        info: Some(Err("NOAUTH Authentication required".into())),
        ..healthy()
    };
    let a = assess(0, "a:1", &noauth);
    assert!(a.reachable);
    assert_eq!(a.findings.len(), 1, "{:#?}", a.findings);
    let f = only(&a, Check::Reachable);
    assert!(
        f.message.starts_with("refuses the credentials (NOAUTH"),
        "{f}"
    );

    // Refused at connect (a wrong password in the URL): it answered.
    let wrong = Observed {
        auth_refused: true,
        failure: Some("Password authentication failed".into()),
        ..Observed::default()
    };
    let a = assess(0, "a:1", &wrong);
    assert!(a.reachable && !a.is_ok());
    assert!(only(&a, Check::Reachable)
        .message
        .contains("Password authentication failed"));

    // Both refused for another reason (renamed): one error, nothing else.
    let renamed = Observed {
        role: Some(Err("ERR unknown command 'ROLE'".into())),
        info: Some(Err("ERR unknown command 'INFO'".into())),
        ..healthy()
    };
    let a = assess(0, "a:1", &renamed);
    assert_eq!(a.findings.len(), 1, "{:#?}", a.findings);
    let f = only(&a, Check::Reachable);
    assert!(
        f.message.starts_with("connects but refuses ROLE and INFO"),
        "{f}"
    );
}

#[test]
fn config_refused_falls_back_to_info() {
    let refused = || Some(Err("ERR unknown command 'CONFIG'".to_owned()));
    let seen = Observed {
        policy: refused(),
        appendonly: refused(),
        appendfsync: refused(),
        save: refused(),
        info: Some(Ok(INFO.replace("noeviction", "allkeys-lfu"))),
        ..healthy()
    };
    let a = assess(0, "a:1", &seen);
    assert_eq!(a.maxmemory_policy.as_deref(), Some("allkeys-lfu"));
    assert_eq!(only(&a, Check::Eviction).severity, Severity::Error);
    assert_eq!(a.aof, Some(true));
    assert_eq!(a.appendfsync, None);
    assert_eq!(a.rdb_save, None);
    let p = only(&a, Check::Persistence);
    assert_eq!(p.severity, Severity::Warning);
    assert!(p.message.contains("unknown command"), "{p}");
}

#[test]
fn odd_replies_do_not_panic() {
    let seen = Observed {
        role: Some(Ok(Value::Nil)),
        info: Some(Ok(
            "garbage\r\n:::\r\nrun_id:\r\nuptime_in_seconds:-5\r\n".into()
        )),
        policy: Some(Ok(None)),
        appendonly: config("maybe"),
        appendfsync: Some(Ok(None)),
        save: Some(Ok(None)),
        samples: vec![],
        time_error: Some("unexpected reply to TIME: Nil".into()),
        ..healthy()
    };
    let a = assess(0, "a:1", &seen);
    assert_eq!(a.role, None);
    assert_eq!(a.run_id, None);
    assert_eq!(a.uptime, None);
    assert_eq!(a.aof, None);
    assert_eq!(only(&a, Check::RunId).severity, Severity::Warning);
    assert_eq!(only(&a, Check::Eviction).severity, Severity::Warning);
    assert_eq!(only(&a, Check::Persistence).severity, Severity::Warning);
    assert_eq!(only(&a, Check::Version).severity, Severity::Warning);
    assert_eq!(only(&a, Check::Clock).severity, Severity::Warning);
    let _ = format!("{a} {a:#?}");
}

#[test]
fn shared_run_ids() {
    let mut audits: Vec<NodeAudit> = ["x", "y", "x", "z"]
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let mut a = NodeAudit::empty(i, "a:1");
            a.run_id = Some((*id).to_owned());
            a
        })
        .collect();
    audits.push(NodeAudit::empty(4, "b:1"));
    compare_run_ids(&mut audits);
    for i in [0, 2] {
        let f = only(&audits[i], Check::RunId);
        assert_eq!(f.severity, Severity::Error);
        assert!(f.message.starts_with("same run_id as node"), "{f}");
        assert!(f.message.contains(&format!("node {}", 2 - i)), "{f}");
    }
    for i in [1, 3] {
        assert_eq!(only(&audits[i], Check::RunId).severity, Severity::Info);
    }
    assert!(audits[4].findings.is_empty());
}

#[test]
fn report() {
    let mut volatile = healthy();
    volatile.policy = config("volatile-lru");
    let mut nodes = vec![
        assess(0, "a:1", &healthy()),
        assess(1, "b:1", &volatile),
        assess(
            2,
            "c:1",
            &Observed {
                failure: Some("refused".into()),
                ..Observed::default()
            },
        ),
    ];
    nodes[1].run_id = Some("other".into());
    compare_run_ids(&mut nodes);
    let audit = Audit { nodes };
    assert!(!audit.is_ok());
    let errors: Vec<(usize, Check)> = audit.errors().map(|(n, f)| (n.index, f.check)).collect();
    assert_eq!(errors, [(1, Check::Eviction), (2, Check::Reachable)]);
    assert_eq!(audit.warnings().count(), 0);
    let short = audit.to_string();
    assert!(
        short.starts_with("audit of 3 nodes: 2 errors, 0 warnings\nnode 0 (a:1): "),
        "{short}"
    );
    assert!(
        short.contains("\n  error eviction: maxmemory-policy volatile-lru"),
        "{short}"
    );
    assert!(!short.contains("info "), "{short}");
    let long = format!("{audit:#}");
    assert!(
        long.contains("\n  info persistence: appendonly yes, appendfsync always"),
        "{long}"
    );
    for (_, f) in audit
        .nodes
        .iter()
        .flat_map(|n| n.findings.iter().map(move |f| (n, f)))
    {
        assert_style(&f.message);
    }
}

#[test]
fn every_message_follows_the_house_style() {
    let mut findings = vec![
        eviction_finding(None, None, None),
        persistence_finding(None, None, None, None),
        persistence_finding(Some(false), None, None, None),
        clock_finding(None, None),
        version_finding(Some("1.0")),
        role_finding(
            Some(&Role {
                name: "sentinel".into(),
                master: None,
                replicas: vec![],
            }),
            None,
            false,
        )
        .unwrap(),
    ];
    let replicated = Role {
        name: "master".into(),
        master: None,
        replicas: vec!["127.0.0.1:9001".into()],
    };
    for in_cluster in [false, true] {
        findings.push(role_finding(Some(&replicated), None, in_cluster).unwrap());
    }
    for p in ["noeviction", "volatile-ttl", "allkeys-random", "odd"] {
        findings.push(eviction_finding(Some(p), Some(0), None));
    }
    for fsync in ["always", "everysec", "no", "odd"] {
        findings.push(persistence_finding(Some(true), Some(fsync), None, None));
    }
    for f in &findings {
        assert_style(&f.message);
    }
}

fn sentinel_report(port: u16, epoch: u64) -> crate::node::sentinel::Report {
    crate::node::sentinel::Report {
        host: "10.0.0.1".into(),
        port,
        epoch,
        master_for: Duration::from_secs(60),
        quorum: 2,
        other_sentinels: 2,
        flags: "master".into(),
    }
}

#[test]
fn a_sentinel_group_is_reported_with_its_quorum_and_failover_cost() {
    let replicated = Observed {
        role: Some(Ok(Value::Array(vec![
            bulk("master"),
            Value::Int(0),
            Value::Array(vec![Value::Array(vec![
                bulk("10.0.0.2"),
                bulk("6379"),
                bulk("0"),
            ])]),
        ]))),
        sentinel: Some(SentinelSeen {
            name: "m".into(),
            answers: vec![
                Ok(Some(sentinel_report(6379, 1))),
                Err("no answer".into()),
                Ok(Some(sentinel_report(6380, 0))),
            ],
        }),
        ..healthy()
    };
    let audit = assess(0, "sentinel:m@s1:26379", &replicated);
    let text: Vec<String> = audit
        .findings
        .iter()
        .filter(|f| f.check == Check::Sentinel)
        .map(|f| format!("{:?} {}", f.severity, f.message))
        .collect();
    let all = text.join("\n");
    // The newest epoch's master; 2 of 3 answer, the quorum is 2.
    assert!(
        all.contains("master 10.0.0.1:6379 (config epoch 1), 2 of 3 sentinels answer, quorum 2"),
        "{all}"
    );
    assert!(
        all.contains("Warning the sentinels name different masters"),
        "{all}"
    );
    assert!(
        all.contains("Warning replicas 10.0.0.2:6379: replication is asynchronous"),
        "{all}"
    );
    assert!(all.contains("Warning min-replicas-to-write 0"), "{all}");
    assert!(!all.contains("fewer than the quorum"), "{all}");
    // The plain replicated-master warning is replaced by the group's.
    assert_eq!(only(&audit, Check::Role).severity, Severity::Info);

    // One answer under a quorum of 2, min-replicas set.
    let lone = Observed {
        min_replicas: config("1"),
        sentinel: Some(SentinelSeen {
            name: "m".into(),
            answers: vec![Ok(Some(sentinel_report(6379, 0))), Err("refused".into())],
        }),
        ..healthy()
    };
    let audit = assess(0, "s", &lone);
    let all: Vec<String> = audit.findings.iter().map(|f| f.message.clone()).collect();
    let all = all.join("\n");
    assert!(all.contains("fewer than the quorum 2"), "{all}");
    assert!(
        all.contains("min-replicas-to-write 1: a master cut off"),
        "{all}"
    );
    assert!(all.contains("no connected replica"), "{all}");

    // No Sentinel answers, or none knows the name: an error.
    for (answers, said) in [
        (
            vec![Err("refused".to_owned())],
            "none of 1 sentinels answers",
        ),
        (vec![Ok(None)], "know no master named \"m\""),
    ] {
        let seen = Observed {
            sentinel: Some(SentinelSeen {
                name: "m".into(),
                answers,
            }),
            failure: Some("no master".into()),
            first_reply: None,
            ..healthy()
        };
        let audit = assess(0, "s", &seen);
        let error = audit
            .findings
            .iter()
            .find(|f| f.check == Check::Sentinel)
            .unwrap();
        assert_eq!(error.severity, Severity::Error);
        assert!(error.message.contains(said), "{}", error.message);
    }
}
