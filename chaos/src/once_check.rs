//! The single-flight workloads' checks (`--workload once`, `once-unlocked`),
//! beyond the history checker's overlap check, which judges "one
//! computation at a time per key while its lease is valid" from the
//! computations' grants (`worker/once.rs`). From the `once` events:
//!
//! - **reads do not go back** (DESIGN.md, "Single-flight": a read sees
//!   every write a majority accepted before it began, or a newer one): a
//!   request that began after a computation's own request returned its
//!   value (the write acknowledged by a majority) returns that
//!   computation's value or a later one's, computations ordered by their
//!   start (the lock's grant order while computations do not overlap).
//!   This also covers "a stale computer's value never wins": a refused
//!   computer is older than the one whose value refused it. Promised only
//!   while the nodes keep their data.
//! - **values of refused computations returned**, at any time: a figure,
//!   not judged. A refused write may still land on a majority of nodes
//!   the newer computer has not reached yet, and be read until the newer
//!   write lands; a newer write that never reaches a majority leaves it
//!   there (DESIGN.md: a minority write may or may not be seen).
//! - **waiters' deadlines**: a request that computed nothing ends by its
//!   `wait` plus a slack.
//! - **typed outcomes**: each request returns a value naming a computation
//!   of its key, or a typed error; the rig's own timeout and a value that
//!   names no computation are untyped.
//! - **computations per expiry**, a figure: computations ÷ those that
//!   started neither inside another computation's protected window nor
//!   while an acknowledged value was surely fresh (after its request
//!   returned, before its computation's end + the value's TTL).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::time::Duration;

use crate::clock::nanos;
use crate::history::{Event, Found};
use crate::nemesis::{Expect, Nemesis};

/// The columns, as printed under the table.
pub const LEGEND: &str = "overlapping computations: computations of one key whose protected windows \
(start to the earlier of the end and request start + TTL - drift) overlap; reads gone back: values \
older than one acknowledged before the request began (judged only where nodes keep their data); \
waiters late: requests that computed nothing and ended past their wait + slack; untyped outcomes: \
rig timeouts and values naming no computation; writes refused: computers overtaken past their lease \
(OnceError::Stale); computations per expiry: computations over those that began neither inside \
another's window nor while an acknowledged value was fresh (a figure, not judged).";

/// What the checks need to know of the run.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A waiter's deadline.
    pub wait: Duration,
    /// How late past it a waiter may still end.
    pub slack: Duration,
    /// How long a value is fresh.
    pub value_ttl: Duration,
    /// Whether this is the unlocked control.
    pub control: bool,
}

/// A request that returned an older computation's value than one already
/// acknowledged when it began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoneBack {
    pub key: String,
    pub worker: u32,
    pub start_ns: u64,
    /// The computation whose value it returned.
    pub returned: u64,
    /// The newer computation acknowledged before the request began.
    pub acknowledged: u64,
}

impl fmt::Display for GoneBack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?}: worker {} at {:.3} ms returned computation {} after computation {} was acknowledged",
            self.key,
            self.worker,
            self.start_ns as f64 / 1e6,
            self.returned,
            self.acknowledged
        )
    }
}

/// The single-flight checks of one run.
#[derive(Debug, Clone, Default)]
pub struct OnceReport {
    pub requests: u64,
    pub values: u64,
    pub computations: u64,
    /// Requests by outcome: `value`, or the error's kind.
    pub outcomes: BTreeMap<String, u64>,
    pub gone_back: Found<GoneBack>,
    /// Values returned of computations whose write was refused (`stale`).
    pub refused_values: u64,
    /// Waiters that ended past their deadline plus the slack, and the
    /// most any waiter took.
    pub late: u64,
    pub longest_wait_ns: u64,
    /// The rig's timeout, or a value that names no computation of the key.
    pub untyped: u64,
    /// Computations that started inside another's protected window or
    /// while an acknowledged value was fresh.
    pub redundant: u64,
    pub control: bool,
}

impl OnceReport {
    /// Computations per expiry: all of them over those that began a new
    /// one; `None` with nothing computed.
    pub fn per_expiry(&self) -> Option<f64> {
        let rounds = self.computations.saturating_sub(self.redundant);
        (rounds > 0).then(|| self.computations as f64 / rounds as f64)
    }

    /// The outcome counts as one line: `value 812, deadline 3, stale 2`.
    pub fn outcome_line(&self) -> String {
        let parts: Vec<String> = self
            .outcomes
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        parts.join(", ")
    }
}

/// One computation, from its grant and release.
#[derive(Debug, Clone, Copy)]
struct Computation {
    start: u64,
    /// The end of its protected window: its end, or the lower bound of
    /// its lease's end if earlier.
    protected: u64,
    end: Option<u64>,
}

/// One request.
struct Request<'a> {
    worker: u32,
    key: &'a str,
    start: u64,
    end: u64,
    computed: Option<u64>,
    value: Option<u64>,
    error: Option<&'a str>,
}

pub fn check(events: &[Event], limits: Limits) -> OnceReport {
    let mut r = OnceReport {
        control: limits.control,
        ..OnceReport::default()
    };
    let mut comps: HashMap<u64, (&str, Computation)> = HashMap::new();
    let mut releases: HashMap<u64, u64> = HashMap::new();
    let mut requests = Vec::new();
    for e in events {
        match e {
            Event::Grant {
                resource,
                lease,
                at_ns,
                valid_until_ns,
                ..
            } => {
                let c = Computation {
                    start: *at_ns,
                    protected: *valid_until_ns,
                    end: None,
                };
                comps.insert(*lease, (resource.as_str(), c));
            }
            Event::Release { lease, at_ns } => {
                releases.insert(*lease, *at_ns);
            }
            Event::Once {
                worker,
                key,
                start_ns,
                end_ns,
                computed,
                value,
                error,
            } => requests.push(Request {
                worker: *worker,
                key,
                start: *start_ns,
                end: *end_ns,
                computed: *computed,
                value: *value,
                error: error.as_deref(),
            }),
            _ => {}
        }
    }
    for (id, end) in releases {
        if let Some((_, c)) = comps.get_mut(&id) {
            c.end = Some(end);
            c.protected = c.protected.min(end);
        }
    }
    r.computations = comps.len() as u64;
    // Each key's computations in start order: their rank is their order.
    let mut by_key: BTreeMap<&str, Vec<(u64, Computation)>> = BTreeMap::new();
    for (&id, &(key, c)) in &comps {
        by_key.entry(key).or_default().push((id, c));
    }
    let mut rank: HashMap<u64, usize> = HashMap::new();
    for list in by_key.values_mut() {
        list.sort_by_key(|&(id, c)| (c.start, id));
        for (i, &(id, _)) in list.iter().enumerate() {
            rank.insert(id, i);
        }
    }
    // Acknowledged: the computation's own request returned its value.
    let mut acked: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    let mut refused: HashSet<u64> = HashSet::new();
    for q in &requests {
        match (q.computed, q.value, q.error) {
            (Some(c), Some(v), _) if c == v => acked.entry(q.key).or_default().push((q.end, c)),
            (Some(c), _, Some("stale")) => {
                refused.insert(c);
            }
            _ => {}
        }
    }
    // For each key, acknowledgements by time with the highest rank so far.
    let floors: BTreeMap<&str, Vec<(u64, u64)>> = acked
        .into_iter()
        .map(|(key, mut list)| {
            list.sort_unstable();
            let mut best: Option<u64> = None;
            let prefix = list
                .iter()
                .map(|&(end, c)| {
                    if best.is_none_or(|b| rank[&c] > rank[&b]) {
                        best = Some(c);
                    }
                    (end, best.unwrap_or(c))
                })
                .collect();
            (key, prefix)
        })
        .collect();
    let too_long = nanos(limits.wait + limits.slack);
    for q in &requests {
        r.requests += 1;
        let outcome = match (q.value, q.error) {
            (Some(_), _) => "value",
            (None, Some(kind)) => kind,
            (None, None) => "none",
        };
        *r.outcomes.entry(outcome.to_owned()).or_default() += 1;
        if matches!(outcome, "rig timeout" | "bad value" | "none") {
            r.untyped += 1;
        }
        if q.computed.is_none() {
            let took = q.end.saturating_sub(q.start);
            r.longest_wait_ns = r.longest_wait_ns.max(took);
            r.late += u64::from(took > too_long);
        }
        let Some(v) = q.value else { continue };
        r.values += 1;
        // A value must name a computation of this key.
        let Some(&returned) = comps
            .get(&v)
            .filter(|(key, _)| *key == q.key)
            .and(rank.get(&v))
        else {
            r.untyped += 1;
            continue;
        };
        r.refused_values += u64::from(refused.contains(&v));
        let floor = floors.get(q.key).and_then(|list| {
            let before = list.partition_point(|&(end, _)| end < q.start);
            before.checked_sub(1).map(|i| list[i].1)
        });
        if let Some(newer) = floor.filter(|c| rank[c] > returned) {
            r.gone_back.push(GoneBack {
                key: q.key.to_owned(),
                worker: q.worker,
                start_ns: q.start,
                returned: v,
                acknowledged: newer,
            });
        }
    }
    // Redundant computations: inside another's protected window, or while
    // an acknowledged value was surely fresh.
    let fresh_for = nanos(limits.value_ttl);
    let mut fresh: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    for q in &requests {
        if let (Some(c), Some(v)) = (q.computed, q.value) {
            if let (true, Some((_, Computation { end: Some(end), .. }))) = (c == v, comps.get(&c)) {
                fresh
                    .entry(q.key)
                    .or_default()
                    .push((q.end, end + fresh_for));
            }
        }
    }
    for (key, list) in &by_key {
        let fresh = fresh.get(key).map_or(&[][..], Vec::as_slice);
        for (i, &(_, c)) in list.iter().enumerate() {
            let inside = list[..i]
                .iter()
                .any(|&(_, p)| p.start < c.start && c.start < p.protected);
            let while_fresh = fresh
                .iter()
                .any(|&(from, until)| from <= c.start && c.start < until);
            r.redundant += u64::from(inside || while_fresh);
        }
    }
    r
}

/// How late past its deadline a waiter may end: a second (reads, the
/// release, a loaded machine), plus the longest stop of a worker process
/// under the worker-pause nemeses (3 TTL), which stops its waiters too.
pub fn slack(n: Nemesis, ttl: Duration) -> Duration {
    let paused = if n.pauses_workers() {
        ttl * 3
    } else {
        Duration::ZERO
    };
    Duration::from_secs(1) + paused
}

/// Whether the nemesis leaves every node its data, which the reader's
/// guarantee assumes (DESIGN.md, "Single-flight": nodes restarted without
/// their data break it as they break the fence; a failover to a replica
/// that missed writes and an eviction lose data too, guard or not).
pub fn reads_promised(n: Nemesis) -> bool {
    matches!(
        n,
        Nemesis::KillAof
            | Nemesis::Pause
            | Nemesis::ClientPause
            | Nemesis::WorkerPause
            | Nemesis::Partition
            | Nemesis::Delay
            | Nemesis::ClockJump
            | Nemesis::NoFencing
    )
}

/// Whether the lock's exclusion, which "one computation at a time" rests
/// on, is promised under the nemesis (not under the lock's own controls,
/// nor under clock jumps).
pub fn exclusion_promised(n: Nemesis) -> bool {
    !matches!(n.expect(), Expect::Violation | Expect::TokensOnly)
}

/// What the row expects.
pub fn expected(n: Nemesis, r: &OnceReport) -> &'static str {
    match (r.control, exclusion_promised(n), reads_promised(n)) {
        (true, _, _) => "overlap (control)",
        (false, true, true) => "one at a time, reads monotonic",
        (false, true, false) => "one at a time (data lost: reads not judged)",
        (false, false, true) => "reads monotonic (overlap possible)",
        (false, false, false) => "not promised (lock control)",
    }
}

/// The row's verdict: whether it is what its nemesis expects, and a word.
/// `overlaps` is the history checker's count of overlapping computations.
pub fn judge(n: Nemesis, overlaps: u64, r: &OnceReport) -> (bool, String) {
    if r.control {
        return if overlaps > 0 {
            (true, "PASS (violation shown)".into())
        } else {
            (
                false,
                "FAIL: control showed no overlapping computations".into(),
            )
        };
    }
    let mut why = Vec::new();
    if r.computations == 0 || r.values == 0 {
        why.push("nothing computed or returned");
    }
    if overlaps > 0 && exclusion_promised(n) {
        why.push("overlapping computations");
    }
    if !r.gone_back.is_empty() && reads_promised(n) {
        why.push("a read went back");
    }
    if r.late > 0 {
        why.push("waiters past their deadline");
    }
    if r.untyped > 0 {
        why.push("untyped outcomes");
    }
    if !why.is_empty() {
        return (false, format!("FAIL: {}", why.join(", ")));
    }
    let unjudged =
        (overlaps > 0 && !exclusion_promised(n)) || (!r.gone_back.is_empty() && !reads_promised(n));
    if unjudged {
        (true, "PASS (violation seen where not promised)".into())
    } else {
        (true, "PASS".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(id: u64, key: &str, start: u64, until: u64) -> Event {
        Event::Grant {
            worker: 1,
            resource: key.into(),
            lease: id,
            start_ns: start,
            at_ns: start,
            valid_until_ns: until,
            token: None,
        }
    }

    fn release(id: u64, at: u64) -> Event {
        Event::Release {
            lease: id,
            at_ns: at,
        }
    }

    fn request(span: (u64, u64), computed: Option<u64>, value: Option<u64>) -> Event {
        Event::Once {
            worker: 1,
            key: "k".into(),
            start_ns: span.0,
            end_ns: span.1,
            computed,
            value,
            error: value.is_none().then(|| "stale".to_owned()),
        }
    }

    fn limits() -> Limits {
        Limits {
            wait: Duration::from_nanos(100),
            slack: Duration::from_nanos(50),
            value_ttl: Duration::from_nanos(30),
            control: false,
        }
    }

    /// Computation 1 over [10, 20), acknowledged at 22; computation 2
    /// over [100, 110), acknowledged at 112.
    fn two_rounds() -> Vec<Event> {
        vec![
            grant(1, "k", 10, 60),
            release(1, 20),
            request((5, 22), Some(1), Some(1)),
            grant(2, "k", 100, 150),
            release(2, 110),
            request((95, 112), Some(2), Some(2)),
        ]
    }

    #[test]
    fn sequential_rounds_are_clean() {
        let mut events = two_rounds();
        events.push(request((25, 30), None, Some(1)));
        events.push(request((115, 120), None, Some(2)));
        let r = check(&events, limits());
        assert_eq!((r.requests, r.values, r.computations), (4, 4, 2));
        assert!(r.gone_back.is_empty() && r.late == 0 && r.untyped == 0);
        assert_eq!((r.redundant, r.per_expiry()), (0, Some(1.0)));
        assert_eq!(r.outcome_line(), "value 4");
        assert_eq!(judge(Nemesis::Pause, 0, &r), (true, "PASS".into()));
    }

    #[test]
    fn a_read_that_goes_back_is_caught_where_promised() {
        let mut events = two_rounds();
        // Began after computation 2 was acknowledged, returned 1's value.
        events.push(request((113, 118), None, Some(1)));
        // Began before the acknowledgement: either value is fine.
        events.push(request((111, 118), None, Some(1)));
        let r = check(&events, limits());
        assert_eq!(r.gone_back.count, 1);
        let g = &r.gone_back.first[0];
        assert_eq!((g.returned, g.acknowledged, g.start_ns), (1, 2, 113));
        let (pass, word) = judge(Nemesis::Pause, 0, &r);
        assert!(!pass && word.contains("a read went back"), "{word}");
        // Nodes restarted empty: not promised, reported only.
        let (pass, word) = judge(Nemesis::KillNopersistGuard, 0, &r);
        assert!(pass && word.contains("not promised"), "{word}");
    }

    #[test]
    fn a_refused_value_returned_is_counted_and_judged_only_when_it_goes_back() {
        let mut events = vec![
            grant(1, "k", 10, 20), // slow: its lease bound at 20
            release(1, 60),
            request((5, 65), Some(1), None), // refused: stale
            grant(2, "k", 30, 80),
            release(2, 40),
            request((25, 45), Some(2), Some(2)),
        ];
        events.push(request((42, 50), None, Some(1))); // before 2's ack: a figure
        let r = check(&events, limits());
        assert_eq!((r.refused_values, r.gone_back.count), (1, 0));
        events.push(request((46, 50), None, Some(1))); // after it: judged
        let r = check(&events, limits());
        assert_eq!((r.refused_values, r.gone_back.count), (2, 1));
        assert_eq!(r.outcomes["stale"], 1);
    }

    #[test]
    fn late_waiters_untyped_outcomes_and_redundant_computations() {
        let mut events = two_rounds();
        events.push(request((0, 151), None, None)); // waited 151 > 150
        events.push(request((0, 150), None, None)); // at the bound
        events.push(request((30, 31), None, Some(99))); // names nothing
        events.push(Event::Once {
            worker: 1,
            key: "k".into(),
            start_ns: 1,
            end_ns: 2,
            computed: None,
            value: None,
            error: Some("rig timeout".into()),
        });
        // Inside 1's window, and while 2's value was fresh (112..140).
        events.extend([grant(3, "k", 15, 70), grant(4, "k", 120, 170)]);
        let r = check(&events, limits());
        assert_eq!((r.late, r.longest_wait_ns), (1, 151));
        assert_eq!(r.untyped, 2);
        assert_eq!((r.computations, r.redundant), (4, 2));
        assert_eq!(r.per_expiry(), Some(2.0));
        let (pass, word) = judge(Nemesis::Pause, 0, &r);
        assert_eq!(
            (pass, word.as_str()),
            (false, "FAIL: waiters past their deadline, untyped outcomes")
        );
    }

    #[test]
    fn overlaps_fail_where_exclusion_is_promised_and_the_control_must_show_them() {
        let r = check(&two_rounds(), limits());
        assert!(!judge(Nemesis::Pause, 1, &r).0);
        assert!(judge(Nemesis::ClockJump, 1, &r).0);
        assert!(judge(Nemesis::KillNopersist, 1, &r).0);
        let control = check(
            &two_rounds(),
            Limits {
                control: true,
                ..limits()
            },
        );
        assert_eq!(
            judge(Nemesis::Pause, 3, &control).1,
            "PASS (violation shown)"
        );
        assert!(!judge(Nemesis::Pause, 0, &control).0);
    }
}
