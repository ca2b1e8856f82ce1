//! The audit's judgement: pure functions from a node's raw answers
//! ([`Observed`]) to its [`NodeAudit`], one rule per finding, and the
//! comparison of `run_id`s across nodes. No I/O, so every rule is tested
//! without Redis (in `judge/tests.rs`).

use std::time::Duration;

use super::report::{
    fmt_ms, fmt_offset, fmt_uptime, Check, ClockSample, Finding, NodeAudit, Observed, SentinelSeen,
};
use crate::wire::info::{info_field, parse_role, parse_version, role_from_info, uptime, Role};

/// An offset beyond this (after allowing for the measurement's own
/// uncertainty, half the round trip) is a warning. NTP keeps healthy hosts
/// within a few milliseconds of each other; 100 ms is far outside that and
/// far below any sensible lock TTL.
const CLOCK_OFFSET_LIMIT: Duration = Duration::from_millis(100);

/// Below this the crate cannot work: `ROLE`, which the connect handshake
/// sends, arrived in 2.8.12. Everything else it sends is older: `PUBSUB
/// NUMSUB` (2.8.0, in the release script), `SET … NX PX` (2.6.12),
/// `EVAL`/`EVALSHA`, `PTTL`, `PEXPIRE`, `INCRBY` (2.6.0 and older),
/// `PUBLISH` (2.0.0), `MGET` (1.0.0).
const MIN_VERSION: (u32, u32, u32) = (2, 8, 12);

/// Below this, a warning: 6.0 and older are out of maintenance (no security
/// or bug fixes since 7.0 became the current release), and a URL with an ACL
/// user name (`redis://user:pass@…`) needs 6.0's two-argument `AUTH`.
const RECOMMENDED_VERSION: (u32, u32, u32) = (6, 2, 0);

/// Fills one node's audit from its answers. Everything except the run_id
/// comparison, which needs all nodes.
pub(crate) fn assess(index: usize, addr: &str, seen: &Observed) -> NodeAudit {
    let mut audit = NodeAudit::empty(index, addr);
    if let Some(group) = &seen.sentinel {
        sentinel_group(&mut audit, group);
    }
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
    match (&seen.sentinel, role.as_ref()) {
        (Some(_), Some(role)) if role_error.is_none() && role.name == "master" => {
            audit.push(Finding::info(Check::Role, "master"));
            sentinel_master(&mut audit, role, config_value(&seen.min_replicas));
        }
        _ => {
            if let Some(finding) = role_finding(role.as_ref(), role_error, seen.in_cluster) {
                audit.push(finding);
            }
        }
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
        audit.uptime = info.and_then(uptime);
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

/// A Sentinel node's group as its Sentinels see it: who answers, the
/// quorum, the master they name.
pub(crate) fn sentinel_group(audit: &mut NodeAudit, group: &SentinelSeen) {
    let asked = group.answers.len();
    let reports: Vec<_> = group.answers.iter().flatten().flatten().collect();
    let unknown = group
        .answers
        .iter()
        .filter(|a| matches!(a, Ok(None)))
        .count();
    let Some(newest) = reports.iter().max_by_key(|r| r.epoch) else {
        audit.push(Finding::error(
            Check::Sentinel,
            if unknown > 0 {
                format!(
                    "{unknown} of {asked} sentinels know no master named {:?}: the client cannot find this node's master",
                    group.name
                )
            } else {
                format!(
                    "none of {asked} sentinels answers: the client cannot find this node's master, so it cannot vote"
                )
            },
        ));
        return;
    };
    audit.push(Finding::info(
        Check::Sentinel,
        format!(
            "group {:?}: master {}:{} (config epoch {}), {} of {asked} sentinels answer, quorum {}, each knows {} other{}",
            group.name,
            newest.host,
            newest.port,
            newest.epoch,
            reports.len(),
            newest.quorum,
            newest.other_sentinels,
            if newest.other_sentinels == 1 { "" } else { "s" },
        ),
    ));
    if (reports.len() as u64) < newest.quorum {
        audit.push(Finding::warning(
            Check::Sentinel,
            format!(
                "only {} of {asked} sentinels answer, fewer than the quorum {}: a failover of this master may not be agreed on",
                reports.len(),
                newest.quorum
            ),
        ));
    }
    if reports
        .iter()
        .any(|r| (r.host.as_str(), r.port) != (newest.host.as_str(), newest.port))
    {
        audit.push(Finding::warning(
            Check::Sentinel,
            "the sentinels name different masters (a failover under way, or a split): the client follows the newest config epoch",
        ));
    }
}

/// A Sentinel node's master: its replicas, `min-replicas-to-write`, and
/// what a failover costs.
pub(crate) fn sentinel_master(audit: &mut NodeAudit, role: &Role, min_replicas: Option<String>) {
    let replicas = if role.replicas.is_empty() {
        String::from("no connected replica (nothing to fail over to)")
    } else {
        format!("replicas {}", role.replicas.join(", "))
    };
    audit.push(Finding::warning(
        Check::Sentinel,
        format!(
            "{replicas}: replication is asynchronous, so a failover loses the locks the promoted replica had not received; the client counts the promoted master as started at its promotion and keeps it out of quorums for the restart guard's window (keep the guard on): one window without this node's vote, and in single-node mode without any lock"
        ),
    ));
    match min_replicas.as_deref().map(str::parse::<u64>) {
        Some(Ok(0)) => audit.push(Finding::warning(
            Check::Sentinel,
            "min-replicas-to-write 0: a master cut off from its replicas and the sentinels keeps granting locks after a failover elected another, and those grants are lost when it is demoted; set min-replicas-to-write 1 (and min-replicas-max-lag) so that it refuses them",
        )),
        Some(Ok(n)) => audit.push(Finding::info(
            Check::Sentinel,
            format!("min-replicas-to-write {n}: a master cut off from its replicas refuses writes"),
        )),
        _ => audit.push(Finding::info(
            Check::Sentinel,
            "min-replicas-to-write unknown (CONFIG refused)",
        )),
    }
}

fn role_finding(
    role: Option<&Role>,
    role_error: Option<&str>,
    in_cluster: bool,
) -> Option<Finding> {
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
        ("master", _) if !role.replicas.is_empty() => {
            let replicas = format!(
                "{} connected replica{} ({}): replication is asynchronous, so if a failover promotes one, locks this master granted but had not yet copied are gone",
                role.replicas.len(),
                if role.replicas.len() == 1 { "" } else { "s" },
                role.replicas.join(", ")
            );
            Finding::warning(
                Check::Role,
                if in_cluster {
                    format!("a cluster master with {replicas}; a client that read the slot map before the failover counts the promoted master as started now and keeps it out of quorums for the restart guard's window (keep the guard on), one that first connects after it trusts the promoted master at once")
                } else {
                    format!("a master with {replicas} and a second holder can be granted; Redlock wants independent masters with no failover, or a promoted node kept out of quorums for the longest lock TTL")
                },
            )
        }
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

/// Lock keys carry a TTL, so any policy but `noeviction` can remove them
/// under memory pressure (`volatile-*` ones only keys with a TTL; fences
/// have none, so only `allkeys-*` ones can evict a fence).
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
    const RESTART: &str = "a lock it forgot can then be granted to a second holder; the restart guard (on by default) keeps a restarted node out of quorums for one window; keep it on, with a window of at least the longest lock TTL any client uses";
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
pub(crate) fn compare_run_ids(audits: &mut [NodeAudit]) {
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

#[cfg(test)]
mod tests;
