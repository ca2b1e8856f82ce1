//! Redis Sentinel nodes: one vote is a master that Sentinels watch and
//! replace by one of its replicas when it fails. The node's server
//! (`node::server`) asks the Sentinels where the master is at every
//! (re)connect, never per request: the address is cached in the
//! connection, so an acquire costs the same round trips as on a plain node.
//!
//! Discovery has deadlines: every Sentinel is asked at once
//! (`SENTINEL MASTER <name>`, one round trip on a fresh connection), each
//! bounded by the node's connect timeout, and the first answer that is not
//! older than what this node already knows wins ([`Demotions`]). The server
//! it names must then answer `ROLE` as a master in the usual handshake: a
//! Sentinel that names a replica (a split, a failover under way) is not
//! believed.
//!
//! **A failover is a restart.** A replica promoted by the Sentinels may lack
//! the last writes of the master it replaces (replication is asynchronous),
//! so it may not hold the locks that master granted. The handshake reports
//! its uptime as no more than the time the Sentinel has known it as master
//! (`role-reported-time`), so even a client that never saw the old master
//! counts it as started at its promotion; a client that did see the old one
//! sees another `run_id` and counts it as started now (`restart::Lineage`,
//! kept across connections). Either way it is out of quorums for the restart
//! guard's window and, with fencing, re-seeded before it votes again.
//!
//! A demoted master that still answers (a paused master resumed, a lagging
//! Sentinel naming it) is never used again for the group: a write it
//! refuses with `-READONLY` drops the connection, and [`Demotions`] refuses
//! the old master's `run_id` until a later failover (a higher config epoch)
//! names it again.
//!
//! Credentials: the URL's `user:pass@` is the master's (and its replicas'),
//! as on a plain node; Sentinels with a password of their own
//! (`requirepass`, or an ACL user) take it as query parameters,
//! `?sentinel_user=U&sentinel_password=P` ([`parse_url`]). TLS
//! (`rediss+sentinel://`) is for both: the Sentinels' clients and the
//! master's are built with the client's `Tls` settings.
//!
//! Not done here: listening for `+switch-master`; see DESIGN.md, "Redis
//! Sentinel nodes", for what that leaves open.

use std::sync::Mutex;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use redis::{AsyncConnectionConfig, Value};

use crate::error::failure::NodeErrorKind;

/// Makes the master's `redis::Client` from its URL's settings (with the
/// TLS settings for `rediss://`); the same as a cluster's (`config.rs`
/// builds both).
pub(crate) type MakeClient = std::sync::Arc<
    dyn Fn(redis::ConnectionInfo) -> redis::RedisResult<redis::Client> + Send + Sync,
>;

/// The default Sentinel port.
pub(crate) const DEFAULT_PORT: u16 = 26379;

/// A Sentinel-managed master: where to ask, and what to ask for.
pub(crate) struct Sentinel {
    /// The master's name in the Sentinels' configuration.
    name: String,
    /// One client per Sentinel (plain or TLS as the URL says, with the
    /// Sentinels' credentials if the URL gives any).
    sentinels: Vec<redis::Client>,
    /// `scheme://[user:pass@]` and `/db` around the master's `host:port`.
    master_url: MasterUrl,
    make: MakeClient,
    demotions: Mutex<Demotions>,
    /// The master the last connect reached (subscriptions and the audit
    /// connect to it).
    current: Mutex<Option<redis::Client>>,
}

impl std::fmt::Debug for Sentinel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sentinel")
            .field("name", &self.name)
            .field("sentinels", &self.sentinels.len())
            .finish_non_exhaustive()
    }
}

/// How to build the master's URL from the address the Sentinels give.
#[derive(Debug, Clone)]
pub(crate) struct MasterUrl {
    pub(crate) scheme: &'static str,
    /// `user:pass@`, or empty.
    pub(crate) userinfo: String,
    pub(crate) db: i64,
}

impl MasterUrl {
    pub(crate) fn at(&self, host: &str, port: u16) -> String {
        format!(
            "{}://{}{host}:{port}/{}",
            self.scheme, self.userinfo, self.db
        )
    }
}

/// What one Sentinel said of the master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Report {
    pub(crate) host: String,
    pub(crate) port: u16,
    /// Bumped by every failover: a Sentinel that still names the old master
    /// reports a lower one.
    pub(crate) epoch: u64,
    /// How long this Sentinel has known the server in its role: since the
    /// failover that promoted it, at most.
    pub(crate) master_for: Duration,
    /// The quorum configured for the master, and how many other Sentinels
    /// this one knows.
    pub(crate) quorum: u64,
    pub(crate) other_sentinels: u64,
    /// The Sentinel's flags for the master (`master`, `s_down`, `o_down`…).
    pub(crate) flags: String,
}

/// The master the Sentinels named, ready to connect to.
pub(crate) struct Located {
    pub(crate) client: redis::Client,
    pub(crate) report: Report,
}

impl Sentinel {
    pub(crate) fn new(
        name: String,
        sentinels: Vec<redis::Client>,
        master_url: MasterUrl,
        make: MakeClient,
    ) -> Self {
        Self {
            name,
            sentinels,
            master_url,
            make,
            demotions: Mutex::new(Demotions::default()),
            current: Mutex::new(None),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The config epoch of the newest master admitted.
    pub(crate) fn epoch(&self) -> u64 {
        self.demotions().epoch
    }

    pub(crate) fn current(&self) -> Option<redis::Client> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn set_current(&self, client: redis::Client) {
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(client);
    }

    fn demotions(&self) -> std::sync::MutexGuard<'_, Demotions> {
        self.demotions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks every Sentinel at once, each bounded by `timeout`; the first
    /// answer not older than the newest failover this node saw wins.
    pub(crate) async fn locate(&self, timeout: Duration) -> Result<Located, NodeErrorKind> {
        let newest = self.demotions().epoch;
        let mut asks: FuturesUnordered<_> = self
            .sentinels
            .iter()
            .map(|client| ask(client, &self.name, timeout))
            .collect();
        let (mut unknown, mut stale, mut last) = (0usize, Vec::new(), None);
        while let Some(answer) = asks.next().await {
            match answer {
                Ok(Some(report)) if report.epoch >= newest => return self.located(report),
                Ok(Some(report)) => stale.push(report),
                Ok(None) => unknown += 1,
                Err(reason) => last = Some(reason),
            }
        }
        // A majority of the Sentinels agree on a master at a lower epoch
        // than this node saw: they were redeployed with a fresh
        // configuration, not lagging behind a failover (a lagging one is
        // outvoted). Start over from what they say.
        if let Some(first) = stale.first() {
            let same = stale
                .iter()
                .all(|r| (r.host.as_str(), r.port) == (first.host.as_str(), first.port));
            if same && stale.len() * 2 > self.sentinels.len() {
                let report = first.clone();
                tracing::warn!(master = %self.name, epoch = report.epoch, "a majority of the sentinels report an older config epoch: starting over from it");
                *self.demotions() = Demotions::default();
                return self.located(report);
            }
        }
        if unknown > 0 && stale.is_empty() {
            return Err(NodeErrorKind::UnknownMaster {
                name: self.name.clone(),
            });
        }
        Err(NodeErrorKind::NoSentinel {
            asked: self.sentinels.len(),
            reason: match (stale.len(), last) {
                (s, _) if s > 0 => format!("{s} named a master older than the last failover seen"),
                (_, Some(reason)) => reason,
                _ => String::from("the master name is unknown to some"),
            },
        })
    }

    fn located(&self, report: Report) -> Result<Located, NodeErrorKind> {
        let url = self.master_url.at(&report.host, report.port);
        let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())
            .map_err(|e| NodeErrorKind::Redis(std::sync::Arc::new(e)))?;
        let client = (self.make)(info).map_err(|e| NodeErrorKind::Redis(std::sync::Arc::new(e)))?;
        Ok(Located { client, report })
    }

    /// The server `run_id`, named master at `epoch`, may be used: not a
    /// master this node saw replaced since (at that epoch or a later one).
    pub(crate) fn admit(&self, run_id: &str, epoch: u64) -> bool {
        self.demotions().admit(run_id, epoch)
    }

    /// The server `run_id` is no longer the group's master (it refused a
    /// write, or the Sentinels named another).
    pub(crate) fn demote(&self, run_id: &str) {
        tracing::warn!(master = %self.name, %run_id, "demoted master: not used again for this group");
        self.demotions().demote(run_id);
    }

    /// Every Sentinel's report (or why it gave none), for the audit.
    pub(crate) async fn survey(&self, timeout: Duration) -> Vec<Result<Option<Report>, String>> {
        futures::future::join_all(
            self.sentinels
                .iter()
                .map(|client| ask(client, &self.name, timeout)),
        )
        .await
    }
}

/// One Sentinel's answer: `Ok(None)` when it knows no master of that name.
async fn ask(
    client: &redis::Client,
    name: &str,
    timeout: Duration,
) -> Result<Option<Report>, String> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(None);
    let query = async {
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| e.to_string())?;
        let reply = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(name)
            .query_async::<Value>(&mut conn)
            .await;
        match reply {
            Ok(value) => parse_master(&value)
                .map(Some)
                .ok_or_else(|| String::from("an unreadable SENTINEL MASTER reply")),
            Err(e) if e.to_string().contains("No such master") => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    };
    match tokio::time::timeout(timeout, query).await {
        Ok(answer) => answer,
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

/// The fields of a `SENTINEL MASTER` reply (a flat array of names and
/// values, or a RESP3 map).
pub(crate) fn parse_master(value: &Value) -> Option<Report> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    };
    let pairs: Vec<(String, String)> = match value {
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|p| Some((text(p.first()?)?, text(p.get(1)?)?)))
            .collect(),
        Value::Map(items) => items
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, text(v)?)))
            .collect(),
        _ => return None,
    };
    let field = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let number = |name: &str| field(name).and_then(|v| v.parse::<u64>().ok());
    Some(Report {
        host: field("ip")?.to_owned(),
        port: field("port")?.parse().ok()?,
        epoch: number("config-epoch").unwrap_or(0),
        master_for: Duration::from_millis(number("role-reported-time").unwrap_or(0)),
        quorum: number("quorum").unwrap_or(0),
        other_sentinels: number("num-other-sentinels").unwrap_or(0),
        flags: field("flags").unwrap_or_default().to_owned(),
    })
}

/// Which masters of one group this node saw replaced, and the newest
/// failover (config epoch) it saw. Pure.
#[derive(Debug, Default)]
pub(crate) struct Demotions {
    /// The highest config epoch of a master this node connected to.
    epoch: u64,
    /// `(run_id, epoch)`: that server stopped being master at that epoch;
    /// only a later failover (a higher epoch) can make it master again.
    demoted: Vec<(String, u64)>,
}

impl Demotions {
    /// Whether the server `run_id`, named master at `epoch`, may be used;
    /// if so, `epoch` is the newest seen from now on.
    pub(crate) fn admit(&mut self, run_id: &str, epoch: u64) -> bool {
        if epoch < self.epoch {
            return false;
        }
        if self
            .demoted
            .iter()
            .any(|(id, at)| id == run_id && epoch <= *at)
        {
            return false;
        }
        self.epoch = epoch;
        true
    }

    pub(crate) fn demote(&mut self, run_id: &str) {
        let epoch = self.epoch;
        match self.demoted.iter_mut().find(|(id, _)| id == run_id) {
            Some(entry) => entry.1 = entry.1.max(epoch),
            None => self.demoted.push((run_id.to_owned(), epoch)),
        }
        // A bounded list: only recent masters can be reached again.
        if self.demoted.len() > 16 {
            self.demoted.remove(0);
        }
    }
}

/// `redis+sentinel://[user[:pass]@]h1[:p1],h2[:p2]/name[/db][?sentinel_user=U&sentinel_password=P]`
/// (and `rediss+sentinel://` for TLS) into the Sentinels' `host:port`s,
/// the master's name, how to build its URL and the Sentinels' own
/// credentials. `None` when the scheme is not a Sentinel one; `Err` says
/// what is wrong.
pub(crate) fn parse_url(url: &str) -> Option<Result<Parsed, &'static str>> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "redis+sentinel" => "redis",
        "rediss+sentinel" => "rediss",
        _ => return None,
    };
    Some(parse_rest(scheme, rest))
}

/// The query parameter naming the Sentinels' ACL user.
pub(crate) const USER_PARAM: &str = "sentinel_user";
/// The query parameter holding the Sentinels' password (`requirepass` on
/// the Sentinels); redacted wherever a URL is shown.
pub(crate) const PASSWORD_PARAM: &str = "sentinel_password";

/// A parsed Sentinel URL.
#[derive(Debug, Clone)]
pub(crate) struct Parsed {
    pub(crate) sentinels: Vec<(String, u16)>,
    pub(crate) name: String,
    pub(crate) master_url: MasterUrl,
    /// `[user]:pass@` for the Sentinels (percent-encoded), or empty: the
    /// URL's `user:pass@` is the master's, not theirs.
    pub(crate) sentinel_userinfo: String,
}

impl Parsed {
    /// One Sentinel's URL, with the Sentinels' credentials.
    pub(crate) fn sentinel_url(&self, host: &str, port: u16) -> String {
        format!(
            "{}://{}{host}:{port}",
            self.master_url.scheme, self.sentinel_userinfo
        )
    }
}

fn parse_rest(scheme: &'static str, rest: &str) -> Result<Parsed, &'static str> {
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => (format!("{}@", &authority[..at]), &authority[at + 1..]),
        None => (String::new(), authority),
    };
    let mut sentinels = Vec::new();
    for host in hosts.split(',') {
        if host.is_empty() {
            return Err("names an empty sentinel address");
        }
        let (h, p) = match host.rsplit_once(':') {
            Some((h, p)) => (h, p.parse::<u16>().map_err(|_| "has a bad sentinel port")?),
            None => (host, DEFAULT_PORT),
        };
        if h.is_empty() || p == 0 {
            return Err("has a bad sentinel address");
        }
        sentinels.push((h.to_ascii_lowercase(), p));
    }
    let (path, query) = match path.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (path, None),
    };
    let (name, db) = path.split_once('/').unwrap_or((path, "0"));
    if name.is_empty() {
        return Err("names no master: redis+sentinel://host:26379,host:26379/mastername");
    }
    if name.contains('#') || query.is_some_and(|q| q.contains('#')) {
        return Err("has a fragment, which Sentinel urls do not take");
    }
    let db = if db.is_empty() {
        0
    } else {
        db.parse::<i64>().map_err(|_| "has a bad database number")?
    };
    Ok(Parsed {
        sentinels,
        name: name.to_owned(),
        master_url: MasterUrl {
            scheme,
            userinfo,
            db,
        },
        sentinel_userinfo: match query {
            Some(query) => sentinel_userinfo(query)?,
            None => String::new(),
        },
    })
}

/// `sentinel_user=U&sentinel_password=P` into `U:P@` (`:P@` without a
/// user), each percent-decoded and encoded again for a URL's userinfo.
fn sentinel_userinfo(query: &str) -> Result<String, &'static str> {
    const ONLY: &str = "takes only the query parameters sentinel_user and sentinel_password";
    let (mut user, mut password) = (None, None);
    for param in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = param.split_once('=').ok_or(ONLY)?;
        let slot = match key {
            USER_PARAM => &mut user,
            PASSWORD_PARAM => &mut password,
            _ => return Err(ONLY),
        };
        if slot.is_some() {
            return Err("repeats a sentinel_user or sentinel_password parameter");
        }
        *slot = Some(reencode(value).ok_or("has a bad percent-encoding in a query parameter")?);
    }
    match (user, password) {
        (_, None) if query.split('&').any(|p| !p.is_empty()) => {
            Err("has sentinel_user without sentinel_password")
        }
        (_, None) => Ok(String::new()),
        (user, Some(password)) => Ok(format!("{}:{password}@", user.unwrap_or_default())),
    }
}

/// A percent-encoded query value, decoded and encoded again with every byte
/// but the unreserved ones escaped (safe in a URL's userinfo). `+` is kept
/// as `+`, not a space. `None` on a bad escape.
fn reencode(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            decoded.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            decoded.push(b);
            i += 1;
        }
    }
    Some(
        decoded
            .iter()
            .map(|&b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    char::from(b).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let p = parse_url("redis+sentinel://a:1,B:2,c/mymaster")
            .unwrap()
            .unwrap();
        assert_eq!(
            p.sentinels,
            vec![("a".into(), 1), ("b".into(), 2), ("c".into(), DEFAULT_PORT)]
        );
        assert_eq!(p.name, "mymaster");
        assert_eq!(p.master_url.at("h", 7), "redis://h:7/0");
        let p = parse_url("rediss+sentinel://u:pw@a:1/m/3")
            .unwrap()
            .unwrap();
        assert_eq!(p.master_url.at("h", 7), "rediss://u:pw@h:7/3");
        assert!(parse_url("redis://a:1").is_none());
        for bad in [
            "redis+sentinel://a:1",
            "redis+sentinel://a:1/",
            "redis+sentinel://a:x/m",
            "redis+sentinel://a:1,,b:2/m",
            "redis+sentinel://:1/m",
            "redis+sentinel://a:1/m/x",
            "redis+sentinel://a:1/m?db=1",
            "redis+sentinel://a:1/m?sentinel_user=u",
            "redis+sentinel://a:1/m?sentinel_password",
            "redis+sentinel://a:1/m?sentinel_password=a&sentinel_password=b",
            "redis+sentinel://a:1/m?sentinel_password=%zz",
            "redis+sentinel://a:1/m?sentinel_password=%4",
            "redis+sentinel://a:1/m#x",
        ] {
            assert!(parse_url(bad).unwrap().is_err(), "{bad}");
        }
    }

    #[test]
    fn sentinel_credentials_are_theirs_not_the_masters() {
        let p = parse_url("rediss+sentinel://u:pw@a:1,b:2/m/3?sentinel_password=s%40c:r/t+")
            .unwrap()
            .unwrap();
        assert_eq!(p.master_url.at("h", 7), "rediss://u:pw@h:7/3");
        assert_eq!(p.sentinel_url("a", 1), "rediss://:s%40c%3Ar%2Ft%2B@a:1");
        let p = parse_url("redis+sentinel://a:1/m?sentinel_user=sen&sentinel_password=x")
            .unwrap()
            .unwrap();
        assert_eq!(p.master_url.at("h", 7), "redis://h:7/0");
        assert_eq!(p.sentinel_url("a", 1), "redis://sen:x@a:1");
        let p = parse_url("redis+sentinel://a:1/m/2?").unwrap().unwrap();
        assert_eq!(
            (p.sentinel_url("a", 1).as_str(), p.master_url.db),
            ("redis://a:1", 2)
        );
        // What redis-rs makes of it: the password as given.
        let p = parse_url("redis+sentinel://a:1/m?sentinel_user=sen&sentinel_password=p%40ss:w/d")
            .unwrap()
            .unwrap();
        let info = redis::IntoConnectionInfo::into_connection_info(p.sentinel_url("a", 1).as_str())
            .unwrap();
        assert_eq!(info.redis_settings().username(), Some("sen"));
        assert_eq!(info.redis_settings().password(), Some("p@ss:w/d"));
    }

    #[test]
    fn master_replies() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let flat = Value::Array(
            [
                "name",
                "m",
                "ip",
                "127.0.0.1",
                "port",
                "7000",
                "flags",
                "master",
                "role-reported-time",
                "1500",
                "config-epoch",
                "3",
                "quorum",
                "2",
                "num-other-sentinels",
                "2",
            ]
            .iter()
            .map(|s| bulk(s))
            .collect(),
        );
        let r = parse_master(&flat).unwrap();
        assert_eq!((r.host.as_str(), r.port, r.epoch), ("127.0.0.1", 7000, 3));
        assert_eq!(r.master_for, Duration::from_millis(1500));
        assert_eq!((r.quorum, r.other_sentinels), (2, 2));
        let map = Value::Map(vec![(bulk("ip"), bulk("h")), (bulk("port"), Value::Int(1))]);
        assert_eq!(parse_master(&map).unwrap().port, 1);
        assert!(parse_master(&Value::Nil).is_none());
        assert!(parse_master(&Value::Array(vec![bulk("ip")])).is_none());
    }

    #[test]
    fn a_demoted_master_comes_back_only_after_a_later_failover() {
        let mut d = Demotions::default();
        assert!(d.admit("a", 0));
        d.demote("a");
        // A lagging Sentinel still naming it at the same epoch: refused.
        assert!(!d.admit("a", 0));
        // The promoted replica, one failover later.
        assert!(d.admit("b", 1));
        // An answer older than the newest failover seen: refused, whoever.
        assert!(!d.admit("c", 0));
        // A failover back to the old master: a new epoch, admitted.
        assert!(d.admit("a", 2));
        for i in 0..40 {
            d.demote(&format!("x{i}"));
        }
        assert!(d.demoted.len() <= 16);
    }
}
