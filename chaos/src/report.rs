//! From a checked history to a table row and a verdict.
//!
//! Most of the judging is `crate::history::check`'s; this module adds
//! two things the checker cannot know:
//!
//! - **Stale writes without tokens** (the `no-fencing` control). With
//!   fencing off a write carries no token, so the checker has nothing to
//!   order writes by. The report gives every such write its lease's *grant
//!   rank*: the position of the lease's grant among the resource's grants,
//!   in grant time. That is the token an oracle would have handed out (and
//!   what fencing approximates). A write accepted with a lower rank than a
//!   write that had already completed, i.e. a holder's write landing after
//!   a later holder's had, is then a stale write accepted, counted by the
//!   checker's own rule on the re-ranked history. The history file itself
//!   is left as recorded.
//! - **Late operations**: increments that finished, and store writes that
//!   began, after their lease's window had ended (by the same window rule
//!   as the checker: the latest deadline learned, cut by release or lost
//!   signal). They separate "the lock failed" from "the holder ran late",
//!   which is what a paused holder does.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use crate::bound::Bounded;
use crate::cli::show_duration;
use crate::history::{check, holds, Event, Hold, Report, WriteOutcome};
use crate::nemesis::{Expect, Nemesis};
use crate::once_check::{self, OnceReport};

/// Everything one nemesis run produced.
pub struct Outcome {
    pub nemesis: Nemesis,
    pub duration: Duration,
    pub clients: String,
    pub resources: u32,
    pub report: Report,
    /// The family's bound across resources (`bound.rs`): at most K
    /// holders of a semaphore, a writer alone on a read-write lock (and
    /// its tokens across modes); `None` for the one-holder workloads.
    pub bound: Option<Bounded>,
    /// The single-flight workloads' checks (`once_check.rs`).
    pub once: Option<OnceReport>,
    /// With fencing off: the check of the history with writes ranked by
    /// grant order.
    pub ranked: Option<Report>,
    pub late: Late,
    /// When the last lock of the run was granted.
    pub last_grant_ns: Option<u64>,
    /// The reason of every failed acquire.
    pub failures: Vec<String>,
    pub path: PathBuf,
    pub injected: u32,
    pub notes: Vec<String>,
    /// Anything that makes the run's verdict untrustworthy.
    pub errors: Vec<String>,
    pub wall: Duration,
}

/// Operations outside their lease's window.
#[derive(Debug, Default, Clone, Copy)]
pub struct Late {
    pub increments: u64,
    pub writes_accepted: u64,
    pub writes_rejected: u64,
}

/// Each lease's hold (the checker's join), by lease.
fn windows<'a>(holds: &'a [Hold<'a>]) -> HashMap<u64, &'a Hold<'a>> {
    holds.iter().map(|h| (h.who.lease, h)).collect()
}

pub fn failures(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Attempt {
                granted: false,
                reason,
                ..
            } => Some(reason.clone().unwrap_or_default()),
            _ => None,
        })
        .collect()
}

pub fn late(events: &[Event]) -> Late {
    let (holds, _) = holds(events);
    let w = windows(&holds);
    let end = |lease: &u64| w.get(lease).map(|h| h.end());
    let mut late = Late::default();
    for e in events {
        match e {
            Event::Increment {
                lease,
                end_ns,
                acked: true,
                ..
            } if end(lease).is_some_and(|x| *end_ns > x) => late.increments += 1,
            Event::Write {
                lease,
                start_ns,
                outcome,
                ..
            } if end(lease).is_some_and(|x| *start_ns >= x) => match outcome {
                WriteOutcome::Accepted => late.writes_accepted += 1,
                WriteOutcome::Rejected => late.writes_rejected += 1,
                _ => {}
            },
            _ => {}
        }
    }
    late
}

/// The history with every token-less write given its lease's grant rank;
/// see the module docs.
pub fn ranked(events: &[Event]) -> Vec<Event> {
    let (holds, _) = holds(events);
    let mut by_resource: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
    for h in &holds {
        by_resource
            .entry(h.resource)
            .or_default()
            .push((h.at_ns, h.who.lease));
    }
    let mut rank: HashMap<u64, u64> = HashMap::new();
    for grants in by_resource.values_mut() {
        grants.sort_unstable();
        for (i, (_, lease)) in grants.iter().enumerate() {
            rank.insert(*lease, i as u64 + 1);
        }
    }
    events
        .iter()
        .map(|e| match e {
            Event::Write {
                worker,
                lease,
                key,
                token: None,
                start_ns,
                end_ns,
                outcome,
            } => Event::Write {
                worker: *worker,
                lease: *lease,
                key: key.clone(),
                token: rank.get(lease).copied(),
                start_ns: *start_ns,
                end_ns: *end_ns,
                outcome: *outcome,
            },
            other => other.clone(),
        })
        .collect()
}

pub fn check_ranked(events: &[Event]) -> Report {
    check(&ranked(events))
}

/// Acknowledged increments missing from the final counters: each counter's
/// acknowledged increments minus its final value, when positive. A lower
/// bound: an unacknowledged increment that landed hides one.
pub fn lost_updates(r: &Report) -> u64 {
    r.counters
        .iter()
        .map(|c| {
            let final_value = c.final_value.unwrap_or(0);
            u64::try_from(i128::from(c.acked) - i128::from(final_value)).unwrap_or(0)
        })
        .sum()
}

fn counters_clean(r: &Report) -> bool {
    r.counters.iter().all(|c| c.is_consistent()) && r.duplicate_reads.is_empty()
}

fn tokens_clean(o: &Outcome) -> bool {
    let r = &o.report;
    r.duplicate_tokens.is_empty() && r.token_inversions.is_empty() && bound_tokens(o) == 0
}

/// A read-write lock's tokens out of order across modes (0 for the other
/// workloads).
fn bound_tokens(o: &Outcome) -> u64 {
    o.bound.as_ref().map_or(0, |b| b.tokens.count)
}

/// Stale writes accepted as the row counts them: by token, or by grant
/// rank when fencing was off.
pub fn stale_accepted(o: &Outcome) -> u64 {
    o.ranked.as_ref().unwrap_or(&o.report).stale_accepted.count
}

/// Whether the row is what its nemesis expects, and a word on why not.
pub fn judge(o: &Outcome) -> (bool, String) {
    if !o.errors.is_empty() {
        return (false, "ERROR (see above)".into());
    }
    let r = &o.report;
    if !r.anomalies.is_empty() {
        return (false, "FAIL: recorder anomalies".into());
    }
    if let Some(once) = &o.once {
        return once_check::judge(o.nemesis, r.overlaps.count, once);
    }
    if r.grants == 0 {
        return (false, "FAIL: nothing was granted".into());
    }
    if let Some(b) = o.bound.as_ref().filter(|b| b.control) {
        // The bound's control: clients given K + 1 permits, judged at K
        // (or writers that bypass the readers), whatever the nemesis does.
        return if b.excess.is_empty() {
            let what = match b.limit {
                crate::bound::Limit::Permits(_) => "holders above K",
                crate::bound::Limit::ReadWrite => "writer beside another holder",
            };
            (false, format!("FAIL: control showed no {what}"))
        } else {
            (true, "PASS (violation shown)".into())
        };
    }
    // Holders above a semaphore's K (or a writer beside a reader) break
    // its exclusion as two holders of a lock do: one count, one column.
    let overlaps = r.overlaps.count + excess(o);
    // A token granted twice, or below one known before, is as much a
    // broken lock as two holders: a fenced store would take the second
    // holder's writes (the failover control's violation).
    let broken = overlaps > 0 || !counters_clean(r) || !tokens_clean(o);
    let stale = stale_accepted(o);
    let mut why = Vec::new();
    let pass = match o.nemesis.expect() {
        Expect::Safe => {
            if overlaps > 0 {
                why.push("overlapping holders");
            }
            if !counters_clean(r) {
                why.push("lost updates");
            }
            if !tokens_clean(o) {
                why.push("token order");
            }
            if stale > 0 {
                why.push("stale write accepted");
            }
            why.is_empty()
        }
        Expect::Violation => {
            if !broken {
                why.push("control showed no violation");
            }
            if stale > 0 {
                why.push("stale write accepted despite fencing");
            }
            why.is_empty()
        }
        Expect::PauseFenced => {
            if overlaps > 0 {
                why.push("overlapping holders");
            }
            if !tokens_clean(o) {
                why.push("token order");
            }
            if stale > 0 {
                why.push("stale write accepted");
            }
            if r.writes_rejected == 0 {
                why.push("no stale write rejected: the pauses missed");
            }
            if counters_clean(r) {
                why.push("no lost update: the pauses missed");
            }
            why.is_empty()
        }
        Expect::PauseUnfenced => {
            if overlaps > 0 {
                why.push("overlapping holders");
            }
            if stale == 0 {
                why.push("control showed no stale write");
            }
            why.is_empty()
        }
        Expect::TokensOnly => {
            if !tokens_clean(o) {
                why.push("token order");
            }
            if stale > 0 {
                why.push("stale write accepted");
            }
            why.is_empty()
        }
    };
    if pass {
        let word = match o.nemesis.expect() {
            Expect::Violation | Expect::PauseUnfenced => "PASS (violation shown)",
            Expect::TokensOnly if broken => "PASS (tokens held; overlap seen)",
            _ => "PASS",
        };
        (true, word.into())
    } else {
        (false, format!("FAIL: {}", why.join(", ")))
    }
}

/// Grants above the family's bound (0 for the one-holder workloads).
fn excess(o: &Outcome) -> u64 {
    o.bound.as_ref().map_or(0, |b| b.excess.count)
}

fn ms(ns: u64) -> String {
    format!("{:.0} ms", ns as f64 / 1e6)
}

/// The Markdown table of all rows.
pub fn table(outcomes: &[Outcome]) -> String {
    if outcomes.iter().any(|o| o.once.is_some()) {
        return once_table(outcomes);
    }
    let mut t = String::new();
    t.push_str(
        "| nemesis | duration | clients (tasks + procs×tasks) | resources | granted | \
         mutual-exclusion violations | duplicate or decreasing tokens | lost updates | \
         stale writes accepted | stale writes rejected | availability | recovery (max) | \
         expected | verdict |\n",
    );
    t.push_str("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n");
    for o in outcomes {
        let r = &o.report;
        let availability = r
            .availability
            .map_or("-".into(), |a| format!("{:.1}%", a * 100.0));
        let heals = r.recoveries.len();
        let never = r
            .recoveries
            .iter()
            .filter(|x| x.recovery_ns.is_none())
            .count();
        let longest = r.recoveries.iter().filter_map(|x| x.recovery_ns).max();
        let recovery = match (never, longest) {
            (0, None) => "-".to_owned(),
            (0, Some(max)) => ms(max),
            (n, _) => format!("never after {n} of {heals} heals"),
        };
        let (_, verdict) = judge(o);
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            o.nemesis.name(),
            show_duration(o.duration),
            o.clients,
            o.resources,
            r.grants,
            r.overlaps.count + excess(o),
            r.duplicate_tokens.count + r.token_inversions.count + bound_tokens(o),
            lost_updates(r),
            stale_accepted(o),
            r.writes_rejected,
            availability,
            recovery,
            match &o.bound {
                Some(b) if b.control => b.limit.control_label(),
                _ => o.nemesis.expect().label(),
            },
            verdict,
        );
    }
    t
}

/// The single-flight workloads' table: the history checker's overlapping
/// computations and `once_check.rs`'s columns.
fn once_table(outcomes: &[Outcome]) -> String {
    let mut t = String::new();
    t.push_str(
        "| nemesis | duration | clients (tasks + procs×tasks) | keys | requests | values | \
         computations | overlapping computations | reads gone back | waiters late | \
         untyped outcomes | writes refused (stale) | computations per expiry | expected | verdict |\n",
    );
    t.push_str("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n");
    for o in outcomes {
        let Some(f) = &o.once else { continue };
        let (_, verdict) = judge(o);
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            o.nemesis.name(),
            show_duration(o.duration),
            o.clients,
            o.resources,
            f.requests,
            f.values,
            f.computations,
            o.report.overlaps.count,
            f.gone_back.count,
            f.late,
            f.untyped,
            f.outcomes.get("stale").copied().unwrap_or(0),
            f.per_expiry().map_or("-".into(), |x| format!("{x:.2}")),
            once_check::expected(o.nemesis, f),
            verdict,
        );
    }
    t
}

/// Rows where some heal was followed by no grant at all: not a safety
/// verdict (the exit code ignores it), but a lock that stopped working.
pub fn liveness_warnings(outcomes: &[Outcome]) -> Vec<String> {
    outcomes
        .iter()
        .filter_map(|o| {
            let r = &o.report;
            let never: Vec<_> = r
                .recoveries
                .iter()
                .filter(|x| x.recovery_ns.is_none())
                .collect();
            let first = never.first()?;
            let last_grant = o.last_grant_ns.map_or("never".into(), ms);
            Some(format!(
                "{}: nothing granted after {} of {} heals, the first at {}; last grant at {} (run of {})",
                o.nemesis.name(),
                never.len(),
                r.recoveries.len(),
                ms(first.stop_ns),
                last_grant,
                show_duration(o.duration),
            ))
        })
        .collect()
}

/// The per-run detail printed under its header.
pub fn details(o: &Outcome) -> String {
    let mut s = String::new();
    let r = &o.report;
    let _ = writeln!(s, "  faults injected: {}", o.injected);
    for line in r.to_string().lines() {
        let _ = writeln!(s, "  | {line}");
    }
    if let Some(b) = &o.bound {
        let _ = writeln!(
            s,
            "  bound ({}): {} grant(s) above it; most holders of one at once: {}",
            b.limit, b.excess.count, b.most
        );
        for e in b.excess.first.iter().take(3) {
            let _ = writeln!(s, "    - {e}");
        }
        if let Some(m) = b.modes {
            let _ = writeln!(
                s,
                "  holds by mode: {} reads (at most {} at once), {} writes",
                m.reads, m.most_readers, m.writes
            );
        }
        if b.limit == crate::bound::Limit::ReadWrite {
            let _ = writeln!(
                s,
                "  tokens across modes (a write above every earlier hold, a read at least every earlier write): {} out of order",
                b.tokens.count
            );
            for p in b.tokens.first.iter().take(3) {
                let _ = writeln!(
                    s,
                    "    - {:?}: lease {} (token {}) granted after lease {} (token {})",
                    p.subject, p.later.lease, p.later_token, p.earlier.lease, p.earlier_token
                );
            }
        }
    }
    if let Some(f) = &o.once {
        let _ = writeln!(s, "  single-flight requests: {}", f.outcome_line());
        let _ = writeln!(
            s,
            "  single-flight: {} computations, {} began inside another's window or while a value was fresh; \
             {} values of refused computations returned (not judged); longest waiter {}",
            f.computations,
            f.redundant,
            f.refused_values,
            ms(f.longest_wait_ns)
        );
        for g in f.gone_back.first.iter().take(3) {
            let _ = writeln!(s, "    - read went back: {g}");
        }
    }
    if let Some(ranked) = &o.ranked {
        let _ = writeln!(
            s,
            "  writes ranked by grant order (fencing off): {} stale accepted",
            ranked.stale_accepted.count
        );
        for p in ranked.stale_accepted.first.iter().take(3) {
            let _ = writeln!(
                s,
                "    - {:?}: lease {} (grant #{}) wrote after lease {} (grant #{}) had written",
                p.subject, p.later.lease, p.later_token, p.earlier.lease, p.earlier_token
            );
        }
    }
    let (mut contended, mut unavailable, mut other) = (0, 0, 0);
    for reason in &o.failures {
        if reason.contains("held by another owner") {
            contended += 1;
        } else if reason.contains("unavailable") {
            unavailable += 1;
        } else {
            other += 1;
        }
    }
    let _ = writeln!(
        s,
        "  failed acquires: {contended} contended (waited {:?} behind other holders), {unavailable} nodes unavailable, {other} other",
        crate::rig::MAX_WAIT
    );
    let l = o.late;
    let _ = writeln!(
        s,
        "  outside their lease's window: {} acked increments ended late; writes begun late: {} accepted, {} rejected",
        l.increments, l.writes_accepted, l.writes_rejected
    );
    for n in &o.notes {
        let _ = writeln!(s, "  note: {n}");
    }
    for e in &o.errors {
        let _ = writeln!(s, "  ERROR: {e}");
    }
    let _ = writeln!(s, "  history: {}", o.path.display());
    let _ = writeln!(s, "  wall time: {:.1} s", o.wall.as_secs_f64());
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(lease: u64, at_ns: u64, token: u64) -> Event {
        Event::Grant {
            worker: lease as u32,
            resource: "r".into(),
            lease,
            start_ns: at_ns - 1,
            at_ns,
            valid_until_ns: at_ns + 10,
            token: Some(token),
        }
    }

    fn outcome(nemesis: Nemesis, events: &[Event]) -> Outcome {
        Outcome {
            nemesis,
            duration: Duration::from_secs(4),
            clients: "4 + 2×2".into(),
            resources: 1,
            report: check(events),
            bound: None,
            once: None,
            ranked: None,
            late: late(events),
            last_grant_ns: None,
            failures: Vec::new(),
            path: PathBuf::from("h.jsonl"),
            injected: 1,
            notes: Vec::new(),
            errors: Vec::new(),
            wall: Duration::from_secs(5),
        }
    }

    /// Two holders in turn, the second with the first's token: the
    /// failover control's violation without an overlap.
    #[test]
    fn a_repeated_token_fails_a_safe_row_and_passes_a_control() {
        let repeated = [grant(1, 10, 7), grant(2, 30, 7)];
        let (pass, why) = judge(&outcome(Nemesis::Failover, &repeated));
        assert!(!pass && why == "FAIL: token order", "{why}");
        let (pass, why) = judge(&outcome(Nemesis::FailoverNoguard, &repeated));
        assert!(pass && why == "PASS (violation shown)", "{why}");
        let clean = [grant(1, 10, 7), grant(2, 30, 8)];
        let (pass, why) = judge(&outcome(Nemesis::FailoverNoguard, &clean));
        assert!(!pass && why == "FAIL: control showed no violation", "{why}");
        let row = table(&[outcome(Nemesis::FailoverNoguard, &repeated)]);
        assert!(
            row.contains("| failover-noguard | 4s | 4 + 2×2 | 1 | 2 | 0 | 1 | 0 |"),
            "{row}"
        );
    }

    /// Three permits of two slots' semaphore at once: each slot's own
    /// windows are clean, so only the bound makes the row fail (safe
    /// nemesis) or pass (the overcommit control, whatever the nemesis).
    #[test]
    fn holders_above_k_fail_a_safe_row_and_pass_the_overcommit_control() {
        let slot = |lease: u64, slot: u32, at_ns: u64| Event::Grant {
            worker: lease as u32,
            resource: format!("s:permit:{slot}"),
            lease,
            start_ns: at_ns - 1,
            at_ns,
            valid_until_ns: at_ns + 100,
            token: Some(1),
        };
        let three = [slot(1, 0, 10), slot(2, 1, 20), slot(3, 2, 30)];
        let two = &three[..2];
        let judged = |events: &[Event], nemesis, control| {
            let mut o = outcome(nemesis, events);
            o.bound = Some(crate::bound::check(
                events,
                crate::bound::Limit::Permits(2),
                control,
            ));
            o
        };
        let row = judged(&three, Nemesis::Pause, false);
        assert_eq!(row.report.overlaps.count, 0, "each slot alone is clean");
        let (pass, why) = judge(&row);
        assert!(!pass && why == "FAIL: overlapping holders", "{why}");
        assert!(
            table(&[row]).contains("| pause | 4s | 4 + 2×2 | 1 | 3 | 1 | 0 |"),
            "the column counts the grant above K"
        );
        assert!(judge(&judged(two, Nemesis::Pause, false)).0);
        let (pass, why) = judge(&judged(&three, Nemesis::Pause, true));
        assert!(pass && why == "PASS (violation shown)", "{why}");
        let control = judged(two, Nemesis::KillAof, true);
        let (pass, why) = judge(&control);
        assert!(
            !pass && why == "FAIL: control showed no holders above K",
            "{why}"
        );
        assert!(table(&[control]).contains("| above K (control) |"));
    }

    /// A read-write lock's rows: a writer beside a reader fails a safe
    /// row, a read below an earlier write fails it as token order (each
    /// resource alone is clean), and the bypass control passes only with
    /// a writer beside another holder.
    #[test]
    fn a_writer_beside_a_reader_and_tokens_across_modes_count_in_the_row() {
        use crate::bound::{check as bound, rw_resource, Limit};
        let rw = |lease: u64, write: bool, at_ns: u64, token: u64| Event::Grant {
            worker: lease as u32,
            resource: rw_resource("r0", write, lease),
            lease,
            start_ns: at_ns - 1,
            at_ns,
            valid_until_ns: at_ns + 100,
            token: Some(token),
        };
        let judged = |events: &[Event], nemesis, control| {
            let mut o = outcome(nemesis, events);
            o.bound = Some(bound(events, Limit::ReadWrite, control));
            o
        };
        let beside = [rw(1, false, 10, 5), rw(2, false, 20, 5), rw(3, true, 30, 6)];
        let row = judged(&beside, Nemesis::Pause, false);
        assert_eq!(row.report.overlaps.count, 0, "each resource alone is clean");
        let (pass, why) = judge(&row);
        assert!(!pass && why == "FAIL: overlapping holders", "{why}");
        assert!(table(&[row]).contains("| pause | 4s | 4 + 2×2 | 1 | 3 | 1 | 0 |"));
        let (pass, why) = judge(&judged(&beside, Nemesis::KillAof, true));
        assert!(pass && why == "PASS (violation shown)", "{why}");
        // Readers together, then a writer after them, then a read that
        // carries less than that write: token order, one in the column.
        let stale_read = [
            rw(1, false, 10, 5),
            rw(2, false, 20, 5),
            rw(3, true, 200, 6),
            rw(4, false, 400, 5),
        ];
        let row = judged(&stale_read, Nemesis::Pause, false);
        let (pass, why) = judge(&row);
        assert!(!pass && why == "FAIL: token order", "{why}");
        assert!(table(&[row]).contains("| pause | 4s | 4 + 2×2 | 1 | 4 | 0 | 1 |"));
        let clean = &stale_read[..3];
        assert!(judge(&judged(clean, Nemesis::Pause, false)).0);
        let control = judged(clean, Nemesis::Pause, true);
        let (pass, why) = judge(&control);
        assert!(
            !pass && why == "FAIL: control showed no writer beside another holder",
            "{why}"
        );
        assert!(table(&[control]).contains("| writer beside readers (control) |"));
    }
}
