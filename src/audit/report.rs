//! What an audit reports: the public [`Audit`], [`NodeAudit`], [`Finding`],
//! [`Severity`] and [`Check`], how they print, and the raw answers
//! (`Observed`) that the probe hands to the judge. Plain data, no I/O.
//!
//! `Observed` sits here rather than beside the probe that fills it: the
//! judge reads it and is tested by building it by hand, so it belongs below
//! both of them, not inside the I/O.

use std::fmt;
use std::time::Duration;

use redis::Value;

/// What the audit found on every configured node, in node order. Returned by
/// [`Client::audit`](crate::Client::audit).
///
/// `Display` prints one line of facts per node followed by its warnings and
/// errors; the alternate form (`{:#}`) also prints the informational
/// findings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Audit {
    /// One entry per configured node, in the order the URLs were given; a
    /// cluster node has one per master (`NodeAudit::index` is the node's).
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
        // A cluster node is audited master by master: one entry each.
        let mut indexes: Vec<usize> = self.nodes.iter().map(|n| n.index).collect();
        indexes.dedup();
        let servers = if indexes.len() == self.nodes.len() {
            String::new()
        } else {
            format!(" ({} servers)", self.nodes.len())
        };
        write!(
            f,
            "audit of {} node{}{servers}: {} error{}, {} warning{}",
            indexes.len(),
            plural(indexes.len()),
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
    /// `host:port` of the node (never includes credentials); for one
    /// master of a cluster node, `cluster:{seed} master {host:port}`.
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

    /// An unreachable node with nothing learned yet; the judge fills it in.
    pub(crate) fn empty(index: usize, addr: &str) -> Self {
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

    pub(crate) fn push(&mut self, finding: Finding) {
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

    pub(crate) fn info(check: Check, message: impl Into<String>) -> Self {
        Self::new(Severity::Info, check, message)
    }

    pub(crate) fn warning(check: Check, message: impl Into<String>) -> Self {
        Self::new(Severity::Warning, check, message)
    }

    pub(crate) fn error(check: Check, message: impl Into<String>) -> Self {
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
    /// A Sentinel node: the Sentinels' view of the group, and what a
    /// failover costs (`min-replicas-to-write`, the restart guard).
    Sentinel,
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
            Check::Sentinel => "sentinel",
        })
    }
}

// ---------------------------------------------------------------------------
// What the probe heard: the raw answers, before any judgement.

/// What the Sentinels of a Sentinel node said, one answer each:
/// `Ok(None)` from one that knows no master of that name.
#[derive(Debug, Default, Clone)]
pub(crate) struct SentinelSeen {
    pub(crate) name: String,
    pub(crate) answers: Vec<Result<Option<crate::node::sentinel::Report>, String>>,
}

/// The raw answers of one node, before any judgement. Each `Option` is
/// `None` when the question was never asked (the probe stopped first).
#[derive(Debug, Default)]
pub(crate) struct Observed {
    /// A master of a cluster node (its replicas' failover is watched by the
    /// client: DESIGN.md section 3a).
    pub(crate) in_cluster: bool,
    /// Time from the start of the visit to the first batch of answers; set
    /// once the node has answered anything.
    pub(crate) first_reply: Option<Duration>,
    /// Why the visit ended early (connect failed, deadline passed).
    pub(crate) failure: Option<String>,
    /// The node answered, but refused the URL's credentials (or wants some):
    /// while connecting (the error is in `failure`) or on `ROLE` and `INFO`.
    pub(crate) auth_refused: bool,
    pub(crate) role: Option<Result<Value, String>>,
    pub(crate) info: Option<Result<String, String>>,
    /// `CONFIG GET` of each parameter; `Ok(None)` when the server does not
    /// know the parameter.
    pub(crate) policy: Option<Result<Option<String>, String>>,
    pub(crate) appendonly: Option<Result<Option<String>, String>>,
    pub(crate) appendfsync: Option<Result<Option<String>, String>>,
    pub(crate) save: Option<Result<Option<String>, String>>,
    /// `CONFIG GET min-replicas-to-write`.
    pub(crate) min_replicas: Option<Result<Option<String>, String>>,
    /// A Sentinel node's master: what each Sentinel said of the group.
    pub(crate) sentinel: Option<SentinelSeen>,
    pub(crate) samples: Vec<ClockSample>,
    /// Why clock sampling stopped before all its samples were taken.
    pub(crate) time_error: Option<String>,
}

/// One `TIME` round trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClockSample {
    /// The node's clock, microseconds since the Unix epoch.
    pub(crate) node_us: i128,
    /// This host's wall clock when the request was sent, same unit.
    pub(crate) sent_us: i128,
    /// Measured on the monotonic clock, so a step of this host's wall clock
    /// during the round trip cannot distort it.
    pub(crate) rtt: Duration,
}

impl ClockSample {
    /// `node − (t_send + t_recv) / 2`, with `t_recv = t_send + rtt`.
    pub(crate) fn offset_us(&self) -> i128 {
        let half_rtt = i128::try_from(self.rtt.as_micros() / 2).unwrap_or(i128::MAX);
        self.node_us
            .saturating_sub(self.sent_us.saturating_add(half_rtt))
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
pub(crate) fn fmt_offset(us: i64) -> String {
    let sign = if us < 0 { '-' } else { '+' };
    let abs = us.unsigned_abs();
    format!("{sign}{}.{:03} ms", abs / 1000, abs % 1000)
}

/// Milliseconds with microsecond precision: `0.283 ms`.
pub(crate) fn fmt_ms(d: Duration) -> String {
    let us = d.as_micros();
    format!("{}.{:03} ms", us / 1000, us % 1000)
}

/// `3d 4h 5m 6s`, leading zero units left out.
pub(crate) fn fmt_uptime(d: Duration) -> String {
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
