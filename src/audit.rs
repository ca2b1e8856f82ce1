//! A deployment audit: checks each configured node against what Redlock
//! assumes of it (an independent master that never evicts lock keys,
//! remembers them across a restart, and keeps time) and says, per node, what
//! breaks where it does not.
//!
//! The audit is read-only and separate from locking: each node gets a fresh
//! connection (never the lock connection, whose handshake would refuse a
//! replica before we could describe it), and the whole visit to one node is
//! bounded by the client's connect timeout, so a dead or paused node costs at
//! most that, all nodes concurrently. I/O only gathers raw answers
//! (`Observed`); turning them into findings is pure and tested without
//! Redis.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, ErrorKind, RedisError, ServerErrorKind, Value};

use crate::node::Node;

/// An offset beyond this (after allowing for the measurement's own
/// uncertainty, half the round trip) is a warning. NTP keeps healthy hosts
/// within a few milliseconds of each other; 100 ms is far outside that and
/// far below any sensible lock TTL.
const CLOCK_OFFSET_LIMIT: Duration = Duration::from_millis(100);

/// `TIME` round trips per node. Three make a change of offset visible and
/// give the minimum-round-trip sample (the most accurate one) some choice.
const CLOCK_SAMPLES: usize = 3;

/// Below this the crate cannot work: `ROLE`, which the connect handshake
/// sends, arrived in 2.8.12. Everything else it sends is older: `PUBSUB
/// NUMSUB` (2.8.0, in the release script), `SET … NX PX` (2.6.12),
/// `EVAL`/`EVALSHA`, `PTTL`, `PEXPIRE` (2.6.0), `PUBLISH` (2.0.0),
/// `MULTI`/`EXEC` (1.2.0).
const MIN_VERSION: (u32, u32, u32) = (2, 8, 12);

/// Below this, a warning: 6.0 and older are out of maintenance (no security
/// or bug fixes since 7.0 became the current release), and a URL with an ACL
/// user name (`redis://user:pass@…`) needs 6.0's two-argument `AUTH`.
const RECOMMENDED_VERSION: (u32, u32, u32) = (6, 2, 0);

/// What the audit found on every configured node, in node order. Returned by
/// [`Client::audit`](crate::Client::audit).
///
/// `Display` prints one line of facts per node followed by its warnings and
/// errors; the alternate form (`{:#}`) also prints the informational
/// findings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Audit {
    /// One entry per configured node, in the order the URLs were given.
    pub nodes: Vec<NodeAudit>,
}

impl Audit {
    /// True when no node has an [`Error`](Severity::Error) finding. Warnings
    /// do not count: they name risks that depend on how the nodes are run
    /// (a restart delay, synchronised clocks).
    pub fn is_ok(&self) -> bool {
        self.nodes.iter().all(NodeAudit::is_ok)
    }

    /// Every error, with the node it was found on, in node order.
    pub fn errors(&self) -> impl Iterator<Item = (&NodeAudit, &Finding)> + '_ {
        self.with_severity(Severity::Error)
    }

    /// Every warning, with the node it was found on, in node order.
    pub fn warnings(&self) -> impl Iterator<Item = (&NodeAudit, &Finding)> + '_ {
        self.with_severity(Severity::Warning)
    }

    fn with_severity(
        &self,
        severity: Severity,
    ) -> impl Iterator<Item = (&NodeAudit, &Finding)> + '_ {
        self.nodes.iter().flat_map(move |node| {
            node.findings
                .iter()
                .filter(move |f| f.severity == severity)
                .map(move |f| (node, f))
        })
    }
}

impl fmt::Display for Audit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (errors, warnings) = (self.errors().count(), self.warnings().count());
        write!(
            f,
            "audit of {} node{}: {} error{}, {} warning{}",
            self.nodes.len(),
            plural(self.nodes.len()),
            errors,
            plural(errors),
            warnings,
            plural(warnings),
        )?;
        for node in &self.nodes {
            write!(f, "\n{node}")?;
            for finding in &node.findings {
                if f.alternate() || finding.severity > Severity::Info {
                    write!(f, "\n  {finding}")?;
                }
            }
        }
        Ok(())
    }
}

/// What the audit learned about one node. Fields are `None` where the node
/// did not say (unreachable, a command refused, an odd reply).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NodeAudit {
    /// Position of the node in the configured list.
    pub index: usize,
    /// `host:port` of the node (never includes credentials).
    pub addr: String,
    /// Whether the node answered within the connect timeout (a refusal of
    /// the credentials counts as an answer). When it did not, a
    /// [`Check::Reachable`] error carries the cause.
    pub reachable: bool,
    /// The first word of `ROLE` (`master`, `slave`, `sentinel`), or the
    /// `role` field of `INFO replication` when `ROLE` failed.
    pub role: Option<String>,
    /// The server's `run_id` (`INFO server`): different for every server
    /// process, new after each restart.
    pub run_id: Option<String>,
    /// `redis_version` from `INFO server`.
    pub version: Option<String>,
    /// Time since the server process started (`uptime_in_seconds`).
    pub uptime: Option<Duration>,
    /// `maxmemory-policy` (`CONFIG GET`, or `INFO memory` when `CONFIG` is
    /// renamed or forbidden).
    pub maxmemory_policy: Option<String>,
    /// Whether the append-only file is on (`CONFIG GET appendonly`, or
    /// `aof_enabled` from `INFO persistence`).
    pub aof: Option<bool>,
    /// `appendfsync` (`always`, `everysec`, `no`); only `CONFIG GET` reports
    /// it.
    pub appendfsync: Option<String>,
    /// The RDB `save` schedule (`CONFIG GET save`); `Some("")` means no
    /// snapshots.
    pub rdb_save: Option<String>,
    /// The node's clock minus this client's, in **microseconds** (positive:
    /// the node is ahead), from the sample with the shortest round trip.
    /// Measured as `node_time − (t_send + t_recv) / 2`, so it is exact to
    /// within half of [`clock_rtt`](Self::clock_rtt).
    pub clock_offset: Option<i64>,
    /// Round trip of the `TIME` sample behind `clock_offset`.
    pub clock_rtt: Option<Duration>,
    /// Largest minus smallest offset over the samples (3, taken back to
    /// back). Within the round trips when both clocks run steadily; more
    /// means one of them was stepped while we watched.
    pub clock_spread: Option<Duration>,
    /// What each check concluded, grouped by check in [`Check`] order.
    pub findings: Vec<Finding>,
}

impl NodeAudit {
    /// True when this node has no [`Error`](Severity::Error) finding.
    pub fn is_ok(&self) -> bool {
        self.findings.iter().all(|f| f.severity < Severity::Error)
    }

    fn empty(index: usize, addr: &str) -> Self {
        Self {
            index,
            addr: addr.to_owned(),
            reachable: false,
            role: None,
            run_id: None,
            version: None,
            uptime: None,
            maxmemory_policy: None,
            aof: None,
            appendfsync: None,
            rdb_save: None,
            clock_offset: None,
            clock_rtt: None,
            clock_spread: None,
            findings: Vec::new(),
        }
    }

    fn push(&mut self, finding: Finding) {
        self.findings.push(finding);
    }
}

impl fmt::Display for NodeAudit {
    /// One line of facts; `?` where unknown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {} ({}): ", self.index, self.addr)?;
        if !self.reachable {
            return f.write_str("unreachable");
        }
        let unknown = || "?".to_owned();
        let aof = match (self.aof, &self.appendfsync) {
            (Some(true), Some(fsync)) => format!("on, appendfsync {fsync}"),
            (Some(true), None) => "on, appendfsync ?".to_owned(),
            (Some(false), _) => "off".to_owned(),
            (None, _) => unknown(),
        };
        write!(
            f,
            "role {}, redis {}, up {}, run_id {}, maxmemory-policy {}, aof {}, save {}, clock ",
            self.role.clone().unwrap_or_else(unknown),
            self.version.clone().unwrap_or_else(unknown),
            self.uptime.map_or_else(unknown, fmt_uptime),
            self.run_id.clone().unwrap_or_else(unknown),
            self.maxmemory_policy.clone().unwrap_or_else(unknown),
            aof,
            self.rdb_save
                .as_ref()
                .map_or_else(unknown, |s| format!("{s:?}")),
        )?;
        match (self.clock_offset, self.clock_rtt) {
            (Some(offset), Some(rtt)) => {
                write!(f, "{} (rtt {}", fmt_offset(offset), fmt_ms(rtt))?;
                if let Some(spread) = self.clock_spread {
                    write!(f, ", spread {}", fmt_ms(spread))?;
                }
                f.write_str(")")
            }
            _ => f.write_str("?"),
        }
    }
}

/// One conclusion of one check on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Finding {
    /// How much it matters.
    pub severity: Severity,
    /// Which check produced it.
    pub check: Check,
    /// What was found and, for warnings and errors, what it breaks and what
    /// to change. Lowercase, no trailing period.
    pub message: String,
}

impl Finding {
    fn new(severity: Severity, check: Check, message: impl Into<String>) -> Self {
        Self {
            severity,
            check,
            message: message.into(),
        }
    }

    fn info(check: Check, message: impl Into<String>) -> Self {
        Self::new(Severity::Info, check, message)
    }

    fn warning(check: Check, message: impl Into<String>) -> Self {
        Self::new(Severity::Warning, check, message)
    }

    fn error(check: Check, message: impl Into<String>) -> Self {
        Self::new(Severity::Error, check, message)
    }
}

impl fmt::Display for Finding {
    /// `severity check: message`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.severity, self.check, self.message)
    }
}

/// How much a finding matters. Ordered: `Info < Warning < Error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Severity {
    /// A fact, for the report; nothing to change.
    Info,
    /// Safe only under an assumption the audit cannot check (a restart
    /// delay, synchronised clocks), or the audit could not tell.
    Warning,
    /// Breaks Redlock's assumptions: locks can be granted twice, or the node
    /// cannot vote.
    Error,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
        })
    }
}

/// Which check a finding comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Check {
    /// The node answered within the connect timeout.
    Reachable,
    /// `ROLE`: only a master may vote.
    Role,
    /// `run_id`: every URL must reach a different server process.
    RunId,
    /// `maxmemory-policy`: lock keys must never be evicted.
    Eviction,
    /// AOF, `appendfsync` and RDB snapshots: what a restart forgets.
    Persistence,
    /// The Redis version.
    Version,
    /// Time since the server started.
    Uptime,
    /// The node's clock against this client's.
    Clock,
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Check::Reachable => "reachable",
            Check::Role => "role",
            Check::RunId => "run_id",
            Check::Eviction => "eviction",
            Check::Persistence => "persistence",
            Check::Version => "version",
            Check::Uptime => "uptime",
            Check::Clock => "clock",
        })
    }
}

/// Audits every node concurrently; see [`Client::audit`](crate::Client::audit).
pub(crate) async fn run(nodes: &[Arc<Node>]) -> Audit {
    // Concurrent in this task rather than spawned: dropping the audit drops
    // every probe and its connection with it.
    let observed = futures::future::join_all(nodes.iter().map(|node| observe(node))).await;
    let mut audits: Vec<NodeAudit> = nodes
        .iter()
        .zip(&observed)
        .map(|(node, seen)| assess(node.index(), node.addr(), seen))
        .collect();
    compare_run_ids(&mut audits);
    for audit in &mut audits {
        // Stable: within one check, findings keep the order they were made.
        audit.findings.sort_by_key(|f| f.check);
    }
    Audit { nodes: audits }
}

/// The raw answers of one node, before any judgement. Each `Option` is
/// `None` when the question was never asked (the probe stopped first).
#[derive(Debug, Default)]
struct Observed {
    /// Time from the start of the visit to the first batch of answers; set
    /// once the node has answered anything.
    first_reply: Option<Duration>,
    /// Why the visit ended early (connect failed, deadline passed).
    failure: Option<String>,
    /// The node answered, but refused the URL's credentials (or wants some):
    /// while connecting (the error is in `failure`) or on `ROLE` and `INFO`.
    auth_refused: bool,
    role: Option<Result<Value, String>>,
    info: Option<Result<String, String>>,
    /// `CONFIG GET` of each parameter; `Ok(None)` when the server does not
    /// know the parameter.
    policy: Option<Result<Option<String>, String>>,
    appendonly: Option<Result<Option<String>, String>>,
    appendfsync: Option<Result<Option<String>, String>>,
    save: Option<Result<Option<String>, String>>,
    samples: Vec<ClockSample>,
    /// Why clock sampling stopped before [`CLOCK_SAMPLES`] samples.
    time_error: Option<String>,
}

/// One `TIME` round trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ClockSample {
    /// The node's clock, microseconds since the Unix epoch.
    node_us: i128,
    /// This host's wall clock when the request was sent, same unit.
    sent_us: i128,
    /// Measured on the monotonic clock, so a step of this host's wall clock
    /// during the round trip cannot distort it.
    rtt: Duration,
}

impl ClockSample {
    /// `node − (t_send + t_recv) / 2`, with `t_recv = t_send + rtt`.
    fn offset_us(&self) -> i128 {
        let half_rtt = i128::try_from(self.rtt.as_micros() / 2).unwrap_or(i128::MAX);
        self.node_us
            .saturating_sub(self.sent_us.saturating_add(half_rtt))
    }
}

/// Visits one node within its connect timeout and records whatever it
/// answered before the visit ended.
async fn observe(node: &Node) -> Observed {
    let timeout = node.connect_timeout();
    let mut seen = Observed::default();
    let outcome =
        tokio::time::timeout(timeout, probe(node.redis_client(), timeout, &mut seen)).await;
    // The probe's future (and its borrow of `seen`) is gone here, finished
    // or dropped at the deadline; what it recorded so far stays. The
    // driver's connect timeout equals ours and may fire first: either way
    // the node did not answer in time.
    let failure = match outcome {
        Ok(Ok(())) => None,
        Ok(Err(e)) if !e.is_timeout() => {
            seen.auth_refused = is_auth(&e);
            Some(describe(&e))
        }
        Ok(Err(_)) | Err(_) => Some(format!(
            "no answer within the connect timeout ({timeout:?})"
        )),
    };
    seen.failure = failure;
    seen
}

/// The credentials were refused (or are required): as `node::classify`
/// decides it for the lock connection.
fn is_auth(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::AuthenticationFailed | ErrorKind::Server(ServerErrorKind::NoPerm)
    ) || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
}

async fn probe(
    client: &redis::Client,
    timeout: Duration,
    seen: &mut Observed,
) -> redis::RedisResult<()> {
    let started = Instant::now();
    // The outer deadline bounds everything; the driver's own response
    // timeout would only race it.
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(None);
    let conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    // One round trip: the commands are queued together on the multiplexed
    // connection, but each keeps its own reply, so a refused `CONFIG`
    // (renamed, or an ACL without it) does not hide the `INFO` answer.
    let (role, info, policy, appendonly, appendfsync, save) = tokio::join!(
        query_raw(&conn, redis::cmd("ROLE")),
        query_raw(&conn, redis::cmd("INFO")),
        config_get(&conn, "maxmemory-policy"),
        config_get(&conn, "appendonly"),
        config_get(&conn, "appendfsync"),
        config_get(&conn, "save"),
    );
    seen.first_reply = Some(started.elapsed());
    // Without a password in the URL nothing is sent at connect, and a
    // server that requires one says so here (NOAUTH).
    if let (Err(e), Err(_)) = (&role, &info) {
        seen.auth_refused = is_auth(e);
    }
    seen.role = Some(role.map_err(|e| describe(&e)));
    seen.info = Some(
        info.map_err(|e| describe(&e))
            .and_then(|v| text(&v).ok_or_else(|| unexpected("INFO", &v))),
    );
    seen.policy = Some(policy);
    seen.appendonly = Some(appendonly);
    seen.appendfsync = Some(appendfsync);
    seen.save = Some(save);

    // Sequential, so each round trip is measured alone.
    for _ in 0..CLOCK_SAMPLES {
        // The wall clock, not the monotonic one: the point is to compare
        // wall clocks. Lock logic never does this.
        let sent_wall = SystemTime::now();
        let sent = Instant::now();
        let reply = query(&conn, redis::cmd("TIME")).await;
        let rtt = sent.elapsed();
        match reply.and_then(|v| parse_time(&v).ok_or_else(|| unexpected("TIME", &v))) {
            Ok(node_us) => seen.samples.push(ClockSample {
                node_us,
                sent_us: unix_micros(sent_wall),
                rtt,
            }),
            Err(e) => {
                seen.time_error = Some(e);
                break;
            }
        }
    }
    Ok(())
}

/// Runs `cmd`; a server's error reply becomes its text. A broken connection
/// does too: the later steps then fail the same way and the deadline bounds
/// the rest.
async fn query(conn: &MultiplexedConnection, cmd: Cmd) -> Result<Value, String> {
    query_raw(conn, cmd).await.map_err(|e| describe(&e))
}

async fn query_raw(conn: &MultiplexedConnection, cmd: Cmd) -> redis::RedisResult<Value> {
    let mut conn = conn.clone();
    cmd.query_async::<Value>(&mut conn).await
}

fn describe(e: &RedisError) -> String {
    e.to_string().trim().to_owned()
}

async fn config_get(conn: &MultiplexedConnection, name: &str) -> Result<Option<String>, String> {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg(name);
    let reply = query(conn, cmd).await?;
    parse_config_get(&reply, name).ok_or_else(|| unexpected("CONFIG GET", &reply))
}

fn unexpected(command: &str, reply: &Value) -> String {
    let mut shown = format!("{reply:?}");
    if shown.len() > 80 {
        let mut end = 80;
        while !shown.is_char_boundary(end) {
            end -= 1;
        }
        shown.truncate(end);
        shown.push('…');
    }
    format!("unexpected reply to {command}: {shown}")
}

fn unix_micros(t: SystemTime) -> i128 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i128::try_from(d.as_micros()).unwrap_or(i128::MAX),
        Err(before) => -i128::try_from(before.duration().as_micros()).unwrap_or(i128::MAX),
    }
}

// ---------------------------------------------------------------------------
// Parsing: defensive, `None` on anything unexpected, never a panic.

/// A reply as text: bulk, simple and verbatim strings, and integers.
fn text(v: &Value) -> Option<String> {
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
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        (name.trim() == field).then(|| value.trim())
    })
}

/// `CONFIG GET name`: a flat array of name/value pairs (RESP2) or a map
/// (RESP3). `Some(None)` when the server does not know the parameter (an
/// empty reply); `None` for a reply of another shape.
fn parse_config_get(reply: &Value, name: &str) -> Option<Option<String>> {
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
struct Role {
    name: String,
    /// `host:port` of the master, for a replica.
    master: Option<String>,
    /// `host:port` of each connected replica, for a master.
    replicas: Vec<String>,
}

/// `ROLE`: `[role, …]`; a replica's reply continues with the master's host
/// and port, a master's with its offset and `[[host, port, offset], …]`,
/// one entry per connected replica.
fn parse_role(reply: &Value) -> Option<Role> {
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
fn role_from_info(info: &str) -> Option<Role> {
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
fn parse_time(reply: &Value) -> Option<i128> {
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
fn parse_version(version: &str) -> Option<(u32, u32, u32)> {
    let mut parts = version.trim().split('.').map(|part| {
        let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u32>().ok()
    });
    let major = parts.next()??;
    let minor = parts.next().flatten().unwrap_or(0);
    let patch = parts.next().flatten().unwrap_or(0);
    Some((major, minor, patch))
}

// ---------------------------------------------------------------------------
// Judgement: pure functions from observations to findings.

/// Fills one node's audit from its answers. Everything except the run_id
/// comparison, which needs all nodes.
fn assess(index: usize, addr: &str, seen: &Observed) -> NodeAudit {
    let mut audit = NodeAudit::empty(index, addr);
    if seen.auth_refused {
        let cause = match (&seen.failure, &seen.role) {
            (Some(failure), _) => failure.as_str(),
            (None, Some(Err(role))) => role.as_str(),
            _ => "refused",
        };
        audit.reachable = true;
        audit.push(Finding::error(
            Check::Reachable,
            format!(
                "refuses the credentials ({cause}): the client cannot use this node; check the user and password in its URL"
            ),
        ));
        return audit;
    }
    let Some(first_reply) = seen.first_reply else {
        let cause = seen.failure.as_deref().unwrap_or("no answer");
        audit.push(Finding::error(
            Check::Reachable,
            format!(
                "unreachable: {cause}; it cannot vote, so every lock needs its majority from the other nodes"
            ),
        ));
        return audit;
    };
    audit.reachable = true;
    let info = seen
        .info
        .as_ref()
        .and_then(|i| i.as_ref().ok())
        .map(String::as_str);
    let field = |name: &str| info.and_then(|i| info_field(i, name)).map(str::to_owned);

    let refused = match (&seen.role, &seen.info) {
        (Some(Err(role)), Some(Err(_))) => Some(role.as_str()),
        _ => None,
    };
    audit.push(match (&seen.failure, refused) {
        (Some(failure), _) => Finding::error(
            Check::Reachable,
            format!(
                "answered, then stopped answering: {failure}; the checks after that point are missing"
            ),
        ),
        (None, Some(error)) => Finding::error(
            Check::Reachable,
            format!(
                "connects but refuses ROLE and INFO ({error}); the client's connect handshake sends both, so it cannot use this node"
            ),
        ),
        (None, None) => Finding::info(
            Check::Reachable,
            format!("answered in {}", fmt_ms(first_reply)),
        ),
    });
    if refused.is_some() {
        return audit;
    }

    // Role: from ROLE, or from INFO when ROLE was refused.
    let (mut role, role_error) = match &seen.role {
        Some(Ok(reply)) => (parse_role(reply), None),
        Some(Err(e)) => (info.and_then(role_from_info), Some(e.as_str())),
        None => (None, None),
    };
    // `ROLE` lists a replica only once it is in sync; `INFO` from the
    // moment it connects.
    if let (Some(role), Some(from_info)) = (role.as_mut(), info.and_then(role_from_info)) {
        if from_info.replicas.len() > role.replicas.len() {
            role.replicas = from_info.replicas;
        }
    }
    audit.role = role.as_ref().map(|r| r.name.clone());
    if let Some(finding) = role_finding(role.as_ref(), role_error) {
        audit.push(finding);
    }

    audit.run_id = field("run_id").filter(|id| !id.is_empty());
    match &seen.info {
        Some(Err(e)) => audit.push(Finding::error(
            Check::RunId,
            format!(
                "the INFO command failed ({e}): the client's connect handshake reads run_id from INFO server, so it cannot use this node"
            ),
        )),
        Some(Ok(_)) if audit.run_id.is_none() => audit.push(Finding::warning(
            Check::RunId,
            "no run_id in INFO server, so two URLs reaching this one server cannot be told apart",
        )),
        _ => {}
    }

    // Eviction: CONFIG GET, else INFO memory.
    let config_error = [
        &seen.policy,
        &seen.appendonly,
        &seen.appendfsync,
        &seen.save,
    ]
    .into_iter()
    .find_map(|r| match r {
        Some(Err(e)) => Some(e.clone()),
        _ => None,
    });
    audit.maxmemory_policy = config_value(&seen.policy).or_else(|| field("maxmemory_policy"));
    let maxmemory = field("maxmemory").and_then(|m| m.parse::<u64>().ok());
    if seen.policy.is_some() || info.is_some() {
        audit.push(eviction_finding(
            audit.maxmemory_policy.as_deref(),
            maxmemory,
            config_error.as_deref(),
        ));
    }

    // Persistence: CONFIG GET, else INFO persistence (which knows whether
    // AOF is on, but not appendfsync or the save schedule).
    audit.aof = match config_value(&seen.appendonly).as_deref() {
        Some("yes") => Some(true),
        Some("no") => Some(false),
        _ => match field("aof_enabled").as_deref() {
            Some("1") => Some(true),
            Some("0") => Some(false),
            _ => None,
        },
    };
    audit.appendfsync = config_value(&seen.appendfsync);
    audit.rdb_save = config_value(&seen.save);
    if seen.appendonly.is_some() || info.is_some() {
        audit.push(persistence_finding(
            audit.aof,
            audit.appendfsync.as_deref(),
            audit.rdb_save.as_deref(),
            config_error.as_deref(),
        ));
    }

    if info.is_some() {
        audit.version = field("redis_version");
        audit.push(version_finding(audit.version.as_deref()));
        audit.uptime = field("uptime_in_seconds")
            .and_then(|s| s.parse::<u64>().ok())
            .map(Duration::from_secs);
        if let Some(uptime) = audit.uptime {
            audit.push(Finding::info(
                Check::Uptime,
                format!("up for {}", fmt_uptime(uptime)),
            ));
        }
    }

    // The clock runs last; an earlier deadline leaves it unasked.
    if !seen.samples.is_empty() || seen.time_error.is_some() {
        let clock = clock(&seen.samples);
        if let Some(c) = &clock {
            audit.clock_offset = Some(c.offset_us);
            audit.clock_rtt = Some(c.rtt);
            audit.clock_spread = c.spread;
        }
        audit.push(clock_finding(clock.as_ref(), seen.time_error.as_deref()));
    }
    audit
}

/// A `CONFIG GET` value, when the server gave one.
fn config_value(answer: &Option<Result<Option<String>, String>>) -> Option<String> {
    answer.as_ref()?.as_ref().ok()?.clone()
}

fn role_finding(role: Option<&Role>, role_error: Option<&str>) -> Option<Finding> {
    if let Some(error) = role_error {
        // The handshake fails on a ROLE error before it reads the role.
        return Some(Finding::error(
            Check::Role,
            format!(
                "the ROLE command failed ({error}): the client's connect handshake sends ROLE, so it cannot use this node{}",
                match role {
                    Some(r) => format!(" (INFO says role {})", r.name),
                    None => String::new(),
                }
            ),
        ));
    }
    let role = role?;
    Some(match (role.name.as_str(), &role.master) {
        ("master", _) if !role.replicas.is_empty() => Finding::warning(
            Check::Role,
            format!(
                "a master with {} connected replica{} ({}): replication is asynchronous, so if a failover promotes one, locks this master granted but had not yet copied are gone and a second holder can be granted; Redlock wants independent masters with no failover, or a promoted node kept out of quorums for the longest lock TTL",
                role.replicas.len(),
                if role.replicas.len() == 1 { "" } else { "s" },
                role.replicas.join(", ")
            ),
        ),
        ("master", _) => Finding::info(Check::Role, "master"),
        ("slave" | "replica", master) => Finding::error(
            Check::Role,
            format!(
                "a replica{}, not a master: the client refuses to use it, so it never votes, and Redlock needs every node to be an independent master",
                master.as_ref().map_or_else(String::new, |m| format!(" of {m}"))
            ),
        ),
        (other, _) => Finding::error(
            Check::Role,
            format!("role {other:?}, not master: the client refuses to use it, so it never votes"),
        ),
    })
}

/// Lock keys carry a TTL and fences a retention, so any policy but
/// `noeviction` can remove them under memory pressure.
fn eviction_finding(
    policy: Option<&str>,
    maxmemory: Option<u64>,
    config_error: Option<&str>,
) -> Finding {
    const CONSEQUENCE: &str = "an evicted lock key lets a second holder in while the first still holds the lock; set maxmemory-policy noeviction";
    // With no memory limit (64-bit builds) nothing is evicted yet, but the
    // policy is one `CONFIG SET maxmemory` away from applying.
    let dormant = if maxmemory == Some(0) {
        " (maxmemory is 0, so nothing is evicted until a memory limit is set)"
    } else {
        ""
    };
    match policy {
        Some("noeviction") => Finding::info(
            Check::Eviction,
            "maxmemory-policy noeviction: keys are never evicted; when memory is full the node refuses new locks (an OOM error is a failed vote) instead",
        ),
        Some(p) if p.starts_with("volatile-") => Finding::error(
            Check::Eviction,
            format!(
                "maxmemory-policy {p} evicts keys that have a TTL when memory runs short, and every lock key has one{dormant}: {CONSEQUENCE}"
            ),
        ),
        Some(p) if p.starts_with("allkeys-") => Finding::error(
            Check::Eviction,
            format!(
                "maxmemory-policy {p} evicts any key when memory runs short, lock keys included{dormant}: {CONSEQUENCE}"
            ),
        ),
        Some(p) => Finding::warning(
            Check::Eviction,
            format!("unrecognised maxmemory-policy {p:?}: unless it never evicts, {CONSEQUENCE}"),
        ),
        None => Finding::warning(
            Check::Eviction,
            format!(
                "maxmemory-policy unknown (CONFIG GET: {}; INFO memory has no maxmemory_policy): unless it is noeviction, {CONSEQUENCE}",
                config_error.unwrap_or("no value")
            ),
        ),
    }
}

fn persistence_finding(
    aof: Option<bool>,
    appendfsync: Option<&str>,
    save: Option<&str>,
    config_error: Option<&str>,
) -> Finding {
    // What losing acknowledged writes means for the lock, and the remedy.
    const RESTART: &str = "a lock it forgot can then be granted to a second holder; after a crash keep the node down for at least the longest lock TTL before it rejoins (the restart guard of a later release enforces this)";
    match (aof, appendfsync) {
        (Some(true), Some("always")) => Finding::info(
            Check::Persistence,
            "appendonly yes, appendfsync always: each write is on disk before it is acknowledged, so a restart after a crash remembers every lock and fence (given a disk that honours fsync)",
        ),
        (Some(true), Some("everysec")) => Finding::warning(
            Check::Persistence,
            format!(
                "appendonly yes, appendfsync everysec: writes are fsynced about once a second, so a host crash or power loss can lose roughly the last second of acknowledged locks and fence moves (up to about 2 s when the disk stalls); {RESTART}, or use appendfsync always"
            ),
        ),
        (Some(true), Some("no")) => Finding::warning(
            Check::Persistence,
            format!(
                "appendonly yes, appendfsync no: the operating system decides when writes reach the disk (typically within 30 s on Linux), so a host crash or power loss can lose that much of acknowledged locks and fence moves; {RESTART}, or use appendfsync always"
            ),
        ),
        (Some(true), other) => Finding::warning(
            Check::Persistence,
            format!(
                "appendonly yes, but appendfsync is {}: unless it is always, a host crash can lose recently acknowledged locks and fence moves; {RESTART}",
                match (other, config_error) {
                    (Some(v), _) => format!("{v:?}"),
                    (None, Some(e)) => format!("unknown (CONFIG GET: {e})"),
                    (None, None) => "unknown".to_owned(),
                }
            ),
        ),
        (Some(false), _) => {
            let memory = match save.map(str::trim) {
                Some("") => "appendonly no and no RDB snapshots: a restart forgets every lock and fence on this node".to_owned(),
                Some(schedule) => format!(
                    "appendonly no: a restart reloads only the last RDB snapshot (save {schedule:?}), forgetting every lock and fence written since"
                ),
                None => "appendonly no: a restart forgets every lock and fence written since the last RDB snapshot, if any".to_owned(),
            };
            Finding::warning(Check::Persistence, format!("{memory}; {RESTART}"))
        }
        (None, _) => Finding::warning(
            Check::Persistence,
            format!(
                "persistence unknown (CONFIG GET: {}; INFO persistence has no aof_enabled): unless AOF is on with appendfsync always, a restart can forget locks, and {RESTART}",
                config_error.unwrap_or("no value")
            ),
        ),
    }
}

fn version_finding(version: Option<&str>) -> Finding {
    let Some(raw) = version else {
        return Finding::warning(Check::Version, "no redis_version in INFO server");
    };
    match parse_version(raw) {
        None => Finding::warning(
            Check::Version,
            format!("unrecognised redis_version {raw:?}"),
        ),
        Some(v) if v < MIN_VERSION => Finding::error(
            Check::Version,
            format!(
                "redis {raw} predates ROLE (2.8.12), which the client's connect handshake sends: the client cannot use this node"
            ),
        ),
        Some(v) if v < RECOMMENDED_VERSION => Finding::warning(
            Check::Version,
            format!(
                "redis {raw} is older than 6.2: 6.0 and earlier no longer get security or bug fixes, and URLs with an ACL user name need 6.0"
            ),
        ),
        Some(_) => Finding::info(Check::Version, format!("redis {raw}")),
    }
}

/// The clock comparison drawn from the samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Clock {
    offset_us: i64,
    rtt: Duration,
    /// `None` with fewer than two samples.
    spread: Option<Duration>,
    /// Longest round trip among the samples: bounds how far apart two
    /// offsets of steady clocks can be.
    max_rtt: Duration,
    samples: usize,
}

fn clock(samples: &[ClockSample]) -> Option<Clock> {
    // The sample with the shortest round trip has the least room for
    // asymmetric delays, so it is the most accurate (as in NTP).
    let best = samples.iter().min_by_key(|s| s.rtt)?;
    let offsets = samples.iter().map(ClockSample::offset_us);
    let (lo, hi) = (offsets.clone().min()?, offsets.max()?);
    let spread = (samples.len() > 1)
        .then(|| Duration::from_micros(u64::try_from(hi.saturating_sub(lo)).unwrap_or(u64::MAX)));
    Some(Clock {
        offset_us: clamp_i64(best.offset_us()),
        rtt: best.rtt,
        spread,
        max_rtt: samples.iter().map(|s| s.rtt).max().unwrap_or_default(),
        samples: samples.len(),
    })
}

fn clamp_i64(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

fn clock_finding(clock: Option<&Clock>, time_error: Option<&str>) -> Finding {
    let Some(c) = clock else {
        return Finding::warning(
            Check::Clock,
            format!(
                "the TIME command failed ({}): the node's clock was not compared",
                time_error.unwrap_or("no answer")
            ),
        );
    };
    let offset = Duration::from_micros(c.offset_us.unsigned_abs());
    // The true offset lies within half a round trip of the measured one;
    // warn only when even the most favourable reading exceeds the limit.
    let certain = offset.saturating_sub(c.rtt / 2);
    let measured = format!(
        "{} (rtt {}{})",
        fmt_offset(c.offset_us),
        fmt_ms(c.rtt),
        c.spread.map_or_else(String::new, |s| format!(
            ", spread {} over {} samples",
            fmt_ms(s),
            c.samples
        ))
    );
    if certain > CLOCK_OFFSET_LIMIT {
        return Finding::warning(
            Check::Clock,
            format!(
                "clock offset {measured}: an offset alone is harmless, since lock validity depends only on the clocks advancing at the same rate, but one above {CLOCK_OFFSET_LIMIT:?} means the node's host or the client's is not synchronised (check NTP); if the node's clock is stepped to correct it, its lock keys expire early (a step forward) or late by as much"
            ),
        );
    }
    // Two offsets of steady clocks differ by at most the larger round trip.
    if let Some(spread) = c.spread {
        if spread.saturating_sub(c.max_rtt) > CLOCK_OFFSET_LIMIT {
            return Finding::warning(
                Check::Clock,
                format!(
                    "clock offset {measured}: the offset changed between back-to-back samples by more than the round trips explain, so the node's clock or the client's is being stepped; a node clock that steps forward expires lock keys early"
                ),
            );
        }
    }
    Finding::info(
        Check::Clock,
        format!(
            "clock offset {measured}; a fixed offset is harmless, since lock validity depends only on the clocks advancing at the same rate"
        ),
    )
}

/// Marks nodes that share a `run_id`: two URLs that reach one server.
fn compare_run_ids(audits: &mut [NodeAudit]) {
    let ids: Vec<Option<String>> = audits.iter().map(|a| a.run_id.clone()).collect();
    for (i, audit) in audits.iter_mut().enumerate() {
        let Some(id) = &ids[i] else { continue };
        let twins: Vec<usize> = ids
            .iter()
            .enumerate()
            .filter(|&(j, other)| j != i && other.as_ref() == Some(id))
            .map(|(j, _)| j)
            .collect();
        let finding = if twins.is_empty() {
            Finding::info(
                Check::RunId,
                format!("{id}, distinct from every other node that answered"),
            )
        } else {
            let others: Vec<String> = twins.iter().map(|j| format!("node {j}")).collect();
            Finding::error(
                Check::RunId,
                format!(
                    "same run_id as {} ({id}): the URLs reach one Redis process, which would vote more than once; the client lets only the first to connect vote, so the set has fewer independent nodes than configured",
                    others.join(", ")
                ),
            )
        };
        audit.push(finding);
    }
}

// ---------------------------------------------------------------------------
// Formatting.

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Signed milliseconds with microsecond precision: `+0.042 ms`.
fn fmt_offset(us: i64) -> String {
    let sign = if us < 0 { '-' } else { '+' };
    let abs = us.unsigned_abs();
    format!("{sign}{}.{:03} ms", abs / 1000, abs % 1000)
}

/// Milliseconds with microsecond precision: `0.283 ms`.
fn fmt_ms(d: Duration) -> String {
    let us = d.as_micros();
    format!("{}.{:03} ms", us / 1000, us % 1000)
}

/// `3d 4h 5m 6s`, leading zero units left out.
fn fmt_uptime(d: Duration) -> String {
    let s = d.as_secs();
    let (days, hours, mins, secs) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    match (days, hours, mins) {
        (0, 0, 0) => format!("{secs}s"),
        (0, 0, _) => format!("{mins}m {secs}s"),
        (0, _, _) => format!("{hours}h {mins}m {secs}s"),
        _ => format!("{days}d {hours}h {mins}m {secs}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(unexpected("X", &Value::BulkString(vec![0xff; 500])).len() < 200);
        assert_eq!(text(&Value::Okay).as_deref(), Some("OK"));
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
            )
            .unwrap(),
            role_finding(
                Some(&Role {
                    name: "master".into(),
                    master: None,
                    replicas: vec!["127.0.0.1:9001".into()],
                }),
                None,
            )
            .unwrap(),
        ];
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

    /// The report can cross threads, and so can the audit itself (for a
    /// health check spawned on a multi-threaded runtime).
    #[test]
    fn send_and_sync() {
        fn shared<T: Send + Sync + 'static>() {}
        shared::<Audit>();
        fn sendable<T: Send>(_: &T) {}
        let client = crate::Client::new(["redis://127.0.0.1:1"]).unwrap();
        // Built, never polled: nothing connects.
        let audit = client.audit();
        sendable(&audit);
    }

    #[test]
    fn formatting() {
        assert_eq!(fmt_offset(0), "+0.000 ms");
        assert_eq!(fmt_offset(-1_234_567), "-1234.567 ms");
        assert_eq!(fmt_offset(i64::MIN).chars().next(), Some('-'));
        assert_eq!(fmt_ms(Duration::from_nanos(283_469)), "0.283 ms");
        assert_eq!(fmt_ms(Duration::from_millis(1500)), "1500.000 ms");
        assert!(fmt_ms(Duration::MAX).ends_with(" ms"));
        assert_eq!(fmt_uptime(Duration::from_secs(59)), "59s");
        assert_eq!(fmt_uptime(Duration::from_secs(61)), "1m 1s");
        assert_eq!(fmt_uptime(Duration::from_secs(90_061)), "1d 1h 1m 1s");
        assert!(Severity::Info < Severity::Warning && Severity::Warning < Severity::Error);
    }
}
