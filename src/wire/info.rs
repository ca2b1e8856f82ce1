//! Replies that describe the server rather than a lock: `INFO` fields,
//! `ROLE`, `CONFIG GET`, `TIME`, the version string, and which errors mean
//! refused credentials. The connect handshake (`node`) and the deployment
//! audit (`audit`) both read servers through these, so the two can never
//! disagree about what a server said.
//!
//! Pure functions over `redis` types: defensive, `None` on anything
//! unexpected, never a panic. Nothing here does I/O or knows the rest of
//! the crate.

use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

use crate::wire::scripts;

/// A reply as text: bulk, simple and verbatim strings, and integers.
pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Okay => Some("OK".to_owned()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

/// The value of `field` in an `INFO` reply (`field:value` lines).
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        (name.trim() == field).then(|| value.trim())
    })
}

/// `uptime_in_seconds` from `INFO server`.
pub(crate) fn uptime(info: &str) -> Option<Duration> {
    info_field(info, "uptime_in_seconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// `CONFIG GET name`: a flat array of name/value pairs (RESP2) or a map
/// (RESP3). `Some(None)` when the server does not know the parameter (an
/// empty reply); `None` for a reply of another shape.
pub(crate) fn parse_config_get(reply: &Value, name: &str) -> Option<Option<String>> {
    let pairs: Vec<(Option<String>, Option<String>)> = match reply {
        Value::Array(items) => {
            if items.len() % 2 != 0 {
                return None;
            }
            items
                .chunks(2)
                .map(|pair| (text(&pair[0]), text(&pair[1])))
                .collect()
        }
        Value::Map(pairs) => pairs.iter().map(|(k, v)| (text(k), text(v))).collect(),
        _ => return None,
    };
    if pairs.is_empty() {
        return Some(None);
    }
    pairs
        .into_iter()
        .find(|(k, _)| k.as_deref().is_some_and(|k| k.eq_ignore_ascii_case(name)))
        .map(|(_, v)| v)
}

/// What `ROLE` says: the role, and for a replica its master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Role {
    /// `master`, `slave` (or `replica`), `sentinel`.
    pub(crate) name: String,
    /// `host:port` of the master, for a replica.
    pub(crate) master: Option<String>,
    /// `host:port` of each connected replica, for a master.
    pub(crate) replicas: Vec<String>,
}

/// `ROLE`: `[role, …]`; a replica's reply continues with the master's host
/// and port, a master's with its offset and `[[host, port, offset], …]`,
/// one entry per connected replica.
pub(crate) fn parse_role(reply: &Value) -> Option<Role> {
    let Value::Array(items) = reply else {
        return None;
    };
    let name = text(items.first()?)?;
    let master = match (items.get(1).and_then(text), items.get(2).and_then(text)) {
        (Some(host), Some(port)) if name == "slave" || name == "replica" => {
            Some(format!("{host}:{port}"))
        }
        _ => None,
    };
    let replicas = match (name.as_str(), items.get(2)) {
        ("master", Some(Value::Array(replicas))) => replicas
            .iter()
            .filter_map(|r| match r {
                Value::Array(r) => Some(format!("{}:{}", text(r.first()?)?, text(r.get(1)?)?)),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    Some(Role {
        name,
        master,
        replicas,
    })
}

/// The role from `INFO replication`, for when `ROLE` itself failed.
pub(crate) fn role_from_info(info: &str) -> Option<Role> {
    let name = info_field(info, "role")?.to_owned();
    let master = match (
        info_field(info, "master_host"),
        info_field(info, "master_port"),
    ) {
        (Some(host), Some(port)) => Some(format!("{host}:{port}")),
        _ => None,
    };
    // `slaveN:ip=…,port=…,state=…` per connected replica.
    let count: usize = info_field(info, "connected_slaves")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let replicas = (0..count)
        .filter_map(|i| {
            let line = info_field(info, &format!("slave{i}"))?;
            let part = |key: &str| {
                line.split(',')
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            };
            Some(format!("{}:{}", part("ip")?, part("port")?))
        })
        .collect();
    Some(Role {
        name,
        master,
        replicas,
    })
}

/// `TIME`: `[seconds, microseconds]` as strings; microseconds since the
/// epoch.
pub(crate) fn parse_time(reply: &Value) -> Option<i128> {
    let Value::Array(items) = reply else {
        return None;
    };
    let [secs, micros] = items.as_slice() else {
        return None;
    };
    let secs: i128 = text(secs)?.trim().parse().ok()?;
    let micros: i128 = text(micros)?.trim().parse().ok()?;
    if !(0..1_000_000).contains(&micros) {
        return None;
    }
    secs.checked_mul(1_000_000)?.checked_add(micros)
}

/// `major.minor.patch`, each the leading digits of its part (`7.2.4-rc1`
/// is 7.2.4); a missing part is 0.
pub(crate) fn parse_version(version: &str) -> Option<(u32, u32, u32)> {
    let mut parts = version.trim().split('.').map(|part| {
        let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u32>().ok()
    });
    let major = parts.next()??;
    let minor = parts.next().flatten().unwrap_or(0);
    let patch = parts.next().flatten().unwrap_or(0);
    Some((major, minor, patch))
}

/// The credentials were refused, or the server wants some: a wrong
/// password or user at connect, `NOAUTH` when the URL has none. (`NOPERM`,
/// a user who may not do something, is [`permission_denied`].)
pub(crate) fn is_auth_error(e: &RedisError) -> bool {
    matches!(e.kind(), ErrorKind::AuthenticationFailed)
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
}

/// What an ACL refused, when `e` is a permission error: `NOPERM` for a
/// command we sent (Redis names the command, or says a key or channel was
/// outside the user's patterns), or the error Redis raises inside a script
/// (it names the script by its SHA1, not the command; we name the script
/// and the commands it runs). `command` is the command we sent, for the
/// key and channel cases.
pub(crate) fn permission_denied(e: &RedisError, command: &str) -> Option<String> {
    let text = e.to_string();
    if let Some(rest) = text.split("The user executing the script can't ").nth(1) {
        let what = if rest.starts_with("run") {
            "run a command"
        } else if rest.starts_with("access") {
            "access a key outside the user's key patterns"
        } else if rest.starts_with("publish") {
            "publish on a channel outside the user's channel patterns"
        } else {
            "do something"
        };
        return Some(match scripts::named_in(rest) {
            Some(script) => format!(
                "{what} in the {} script, which runs {}",
                script.name,
                script.commands().join(", ")
            ),
            None => format!("{what} in a script"),
        });
    }
    // An `EXEC` refused by the ACL ends its transaction with `EXECABORT`,
    // the `NOPERM` in its text (Redis 7).
    let aborted = e.code() == Some("EXECABORT") && e.to_string().contains("NOPERM");
    if e.kind() != ErrorKind::Server(ServerErrorKind::NoPerm)
        && e.code() != Some("NOPERM")
        && !aborted
    {
        return None;
    }
    let detail = e.detail().unwrap_or_default();
    Some(
        if let Some(name) = detail
            .split("permissions to run the '")
            .nth(1)
            .and_then(|rest| rest.split('\'').next())
        {
            format!("run {}", name.to_ascii_uppercase())
        } else if detail.contains("one of the keys") {
            format!("access a key of {command} outside the user's key patterns")
        } else if detail.contains("one of the channels") {
            format!("use a channel of {command} outside the user's channel patterns")
        } else {
            format!("run {command}")
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_errors_name_what_was_denied() {
        // The texts of Redis 7.0.15.
        let noperm = |detail: &str| {
            RedisError::from((
                ErrorKind::Server(ServerErrorKind::NoPerm),
                "",
                detail.to_owned(),
            ))
        };
        let denied = |e: &RedisError| permission_denied(e, "EVALSHA");
        assert_eq!(
            denied(&noperm(
                "this user has no permissions to run the 'pubsub|numsub' command"
            ))
            .as_deref(),
            Some("run PUBSUB|NUMSUB")
        );
        assert_eq!(
            denied(&noperm(
                "this user has no permissions to access one of the keys used as arguments"
            ))
            .as_deref(),
            Some("access a key of EVALSHA outside the user's key patterns")
        );
        assert_eq!(
            denied(&noperm(
                "this user has no permissions to access one of the channels used as arguments"
            ))
            .as_deref(),
            Some("use a channel of EVALSHA outside the user's channel patterns")
        );
        let in_script = |what: &str, sha: &str| {
            redis::make_extension_error(
                "ERR".to_owned(),
                Some(format!(
                    "The user executing the script can't {what} script: {sha}, on @user_script:2."
                )),
            )
        };
        let acquire = scripts::lock_scripts()[0];
        let sha = redis::Script::new(include_str!("lua/acquire.lua"))
            .get_hash()
            .to_owned();
        assert_eq!(acquire.name, "acquire");
        assert_eq!(
            denied(&in_script("run this command or subcommand", &sha)).as_deref(),
            Some("run a command in the acquire script, which runs SET, GET, LRANGE, LREM, RPUSH, PTTL, PEXPIRE, INCR, INCRBY")
        );
        assert_eq!(
            denied(&in_script(
                "publish to the channel mentioned in the command",
                "0000"
            ))
            .as_deref(),
            Some("publish on a channel outside the user's channel patterns in a script")
        );
        assert_eq!(
            denied(&redis::make_extension_error("BUSY".to_owned(), None)),
            None
        );
        assert_eq!(denied(&noperm("x")).as_deref(), Some("run EVALSHA"));
        // An `EXEC` the ACL refuses: Redis 7.0.15's reply.
        let aborted = redis::make_extension_error(
            "EXECABORT".to_owned(),
            Some(
                "Transaction discarded because of: NOPERM this user has no permissions to run \
                 the 'exec' command"
                    .to_owned(),
            ),
        );
        assert_eq!(denied(&aborted).as_deref(), Some("run EXEC"));
        let other = redis::make_extension_error(
            "EXECABORT".to_owned(),
            Some("Transaction discarded because of previous errors.".to_owned()),
        );
        assert_eq!(denied(&other), None);
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    const INFO: &str = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\nuptime_in_seconds:3725\r\n\r\n# Memory\r\nmaxmemory:0\r\nmaxmemory_policy:noeviction\r\n\r\n# Persistence\r\naof_enabled:1\r\n\r\n# Replication\r\nrole:master\r\n";

    #[test]
    fn info_fields() {
        assert_eq!(info_field(INFO, "redis_version"), Some("7.0.15"));
        assert_eq!(info_field(INFO, "maxmemory_policy"), Some("noeviction"));
        assert_eq!(info_field(INFO, "role"), Some("master"));
        assert_eq!(info_field(INFO, "missing"), None);
        assert_eq!(info_field("", "run_id"), None);
        // A prefix of another field's name is not that field.
        assert_eq!(info_field("maxmemory_policy:x\r\n", "maxmemory"), None);
        // Values containing ':' keep it.
        assert_eq!(info_field("executable:/a:b\n", "executable"), Some("/a:b"));
        assert_eq!(uptime(INFO), Some(Duration::from_secs(3725)));
        assert_eq!(uptime("uptime_in_seconds:-5\r\n"), None);
        assert_eq!(uptime(""), None);
    }

    /// What the connect handshake reads from `INFO server`.
    #[test]
    fn server_identity() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n";
        assert_eq!(info_field(info, "run_id"), Some("abc123"));
        assert_eq!(info_field(info, "redis_version"), Some("7.0.15"));
        assert_eq!(uptime(info), Some(Duration::from_secs(42)));
        assert_eq!(info_field("", "run_id"), None);
    }

    #[test]
    fn texts() {
        assert_eq!(text(&Value::Okay).as_deref(), Some("OK"));
        assert_eq!(text(&bulk("x")).as_deref(), Some("x"));
        assert_eq!(text(&Value::Int(-3)).as_deref(), Some("-3"));
        assert_eq!(text(&Value::Nil), None);
        assert_eq!(text(&Value::Array(vec![])), None);
    }

    #[test]
    fn config_get_replies() {
        let resp2 = Value::Array(vec![bulk("maxmemory-policy"), bulk("volatile-lru")]);
        assert_eq!(
            parse_config_get(&resp2, "maxmemory-policy"),
            Some(Some("volatile-lru".to_owned()))
        );
        let resp3 = Value::Map(vec![(bulk("save"), bulk(""))]);
        assert_eq!(parse_config_get(&resp3, "save"), Some(Some(String::new())));
        // Unknown parameter: an empty reply.
        assert_eq!(parse_config_get(&Value::Array(vec![]), "x"), Some(None));
        // Odd shapes: no panic, no value.
        assert_eq!(parse_config_get(&Value::Array(vec![bulk("a")]), "a"), None);
        assert_eq!(parse_config_get(&Value::Nil, "a"), None);
        assert_eq!(parse_config_get(&Value::Int(3), "a"), None);
        let other = Value::Array(vec![bulk("b"), bulk("1")]);
        assert_eq!(parse_config_get(&other, "a"), None);
        // Names match case-insensitively; a nil value is no value.
        let upper = Value::Array(vec![bulk("APPENDONLY"), Value::Nil]);
        assert_eq!(parse_config_get(&upper, "appendonly"), Some(None));
    }

    #[test]
    fn role_replies() {
        let master = Value::Array(vec![bulk("master"), Value::Int(0), Value::Array(vec![])]);
        assert_eq!(
            parse_role(&master),
            Some(Role {
                name: "master".into(),
                master: None,
                replicas: vec![],
            })
        );
        // RESP2 and RESP3 spell the role as a bulk or a simple string.
        let simple = Value::Array(vec![Value::SimpleString("master".into())]);
        assert_eq!(parse_role(&simple).map(|r| r.name), Some("master".into()));
        let replicated = Value::Array(vec![
            bulk("master"),
            Value::Int(3129659),
            Value::Array(vec![
                Value::Array(vec![bulk("127.0.0.1"), bulk("9001"), bulk("3129242")]),
                Value::Array(vec![bulk("127.0.0.1"), bulk("9002"), bulk("3129543")]),
            ]),
        ]);
        assert_eq!(
            parse_role(&replicated).unwrap().replicas,
            ["127.0.0.1:9001", "127.0.0.1:9002"]
        );
        let replica = Value::Array(vec![
            bulk("slave"),
            bulk("127.0.0.1"),
            Value::Int(6380),
            bulk("connected"),
            Value::Int(14),
        ]);
        assert_eq!(
            parse_role(&replica),
            Some(Role {
                name: "slave".into(),
                master: Some("127.0.0.1:6380".into()),
                replicas: vec![],
            })
        );
        let sentinel = Value::Array(vec![bulk("sentinel"), Value::Array(vec![])]);
        assert_eq!(
            parse_role(&sentinel).map(|r| r.name),
            Some("sentinel".into())
        );
        for odd in [
            Value::Nil,
            Value::Array(vec![]),
            bulk("master"),
            Value::Array(vec![Value::Nil]),
        ] {
            assert_eq!(parse_role(&odd), None, "{odd:?}");
        }
        let info = "role:slave\r\nmaster_host:10.0.0.1\r\nmaster_port:7000\r\n";
        assert_eq!(
            role_from_info(info),
            Some(Role {
                name: "slave".into(),
                master: Some("10.0.0.1:7000".into()),
                replicas: vec![],
            })
        );
        let info = "role:master\r\nconnected_slaves:2\r\nslave0:ip=10.0.0.2,port=7001,state=online,offset=5,lag=0\r\nslave1:ip=10.0.0.3,port=7002,state=online,offset=5,lag=1\r\n";
        assert_eq!(
            role_from_info(info).unwrap().replicas,
            ["10.0.0.2:7001", "10.0.0.3:7002"]
        );
        assert_eq!(role_from_info(""), None);
    }

    #[test]
    fn time_replies() {
        let t = Value::Array(vec![bulk("1700000000"), bulk("123456")]);
        assert_eq!(parse_time(&t), Some(1_700_000_000_123_456));
        for odd in [
            Value::Nil,
            Value::Array(vec![bulk("1")]),
            Value::Array(vec![bulk("x"), bulk("1")]),
            Value::Array(vec![bulk("1"), bulk("1000000")]),
            Value::Array(vec![bulk("1"), bulk("-1")]),
            Value::Array(vec![bulk("1"), bulk("2"), bulk("3")]),
            Value::Array(vec![
                bulk("999999999999999999999999999999999999999"),
                bulk("0"),
            ]),
        ] {
            assert_eq!(parse_time(&odd), None, "{odd:?}");
        }
    }

    #[test]
    fn versions() {
        assert_eq!(parse_version("7.0.15"), Some((7, 0, 15)));
        assert_eq!(parse_version("7.2.4-rc1"), Some((7, 2, 4)));
        assert_eq!(parse_version("8"), Some((8, 0, 0)));
        assert_eq!(parse_version("255.255.255"), Some((255, 255, 255)));
        assert_eq!(parse_version(""), None);
        assert_eq!(parse_version("x.1"), None);
        assert_eq!(parse_version("99999999999.0"), None);
    }

    #[test]
    fn auth_errors() {
        let code = |c: &str| redis::make_extension_error(c.to_owned(), None);
        assert!(is_auth_error(&code("NOAUTH")));
        assert!(is_auth_error(&code("WRONGPASS")));
        assert!(is_auth_error(&RedisError::from((
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ))));
        assert!(!is_auth_error(&RedisError::from((
            ErrorKind::Server(ServerErrorKind::NoPerm),
            "no permissions",
        ))));
        assert!(!is_auth_error(&code("BUSY")));
        assert!(!is_auth_error(&RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "unknown command",
        ))));
    }
}
