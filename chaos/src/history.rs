//! The fault suite's history: every lock event of a
//! fault-injection run as one JSON object per line, and [`check`], which
//! judges a whole run after the fact.
//!
//! The run is on one machine, so every event is stamped with nanoseconds
//! since the run's start on one monotonic clock ([`Writer::now_ns`]). The
//! stamps are then a true global order, and the checker may compare events
//! of different workers directly, which it could not do with the wall clocks
//! of several machines. Lines may be out of time order in the file (a worker
//! takes its stamp before it takes the writer's lock), so the checker never
//! relies on file order: it joins events by lease id and sorts by stamp.
//!
//! Two events are in *real-time order* only when the first ended strictly
//! before the second began. Equal stamps are treated as concurrent: which of
//! two stamps taken in the same nanosecond came first is unknown, and
//! claiming an order the run did not prove would invent violations.
//!
//! What [`check`] verifies:
//! - **mutual exclusion**: a holder's window is `[at_ns, end)`, from when it
//!   learned it holds the lock to the earliest of its last known deadline,
//!   its release and its lost signal. Half-open, so a release at the
//!   instant of the next grant is a clean hand-over. Two windows of one
//!   resource that overlap are the violation a lock exists to prevent.
//! - **no lost updates**: a counter incremented read-modify-write under the
//!   lock ends at its number of acknowledged increments (plus at most the
//!   unacknowledged ones, which may have landed), and no two acknowledged
//!   increments read the same value.
//! - **fencing tokens**: unique per resource, larger for every grant whose
//!   attempt began after an earlier grant was known (the guarantee of
//!   DESIGN.md, "Fencing tokens"), and a fenced store never accepts a token
//!   lower than one it accepted from a write that had already completed.
//! - **liveness**, measured rather than judged: availability of attempts,
//!   and how long after each fault ended the first lock was granted.
//!
//! Events it cannot join (an extend of a lease never granted) are reported
//! as [`Anomaly`]s: a broken recorder, not a broken lock.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// How many examples of each kind of violation a [`Report`] keeps; the
/// counts are always complete.
pub const MAX_LISTED: usize = 20;

/// One event of a run. Times are nanoseconds since the run's start on the
/// one monotonic clock of [`Writer`].
///
/// Optional fields are written as `null` and may be left out. Unknown
/// fields are rejected when parsing: a misspelt optional field (a
/// `tokn` for `token`) would otherwise read as "no token" and silently turn
/// the token checks off for that event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum Event {
    /// The outcome of one acquire attempt (or of a whole waiting acquire).
    Attempt {
        /// Which worker tried.
        worker: u32,
        /// The resource it tried to lock.
        resource: String,
        /// When the attempt began.
        start_ns: u64,
        /// When its outcome was known.
        end_ns: u64,
        /// Whether it got the lock.
        granted: bool,
        /// Why not, when it did not.
        reason: Option<String>,
    },
    /// A worker learned that it holds a lock.
    Grant {
        /// The holder.
        worker: u32,
        /// The resource locked.
        resource: String,
        /// An id unique to this grant, which later events refer to.
        lease: u64,
        /// When the attempt that got it began.
        start_ns: u64,
        /// When the worker learned it holds the lock.
        at_ns: u64,
        /// When its validity runs out, unless extended.
        valid_until_ns: u64,
        /// Its fencing token, `None` when fencing is off.
        token: Option<u64>,
    },
    /// A successful extension: the lease has a new deadline.
    Extend {
        /// The lease extended.
        lease: u64,
        /// When the extension was confirmed.
        at_ns: u64,
        /// The new end of validity.
        valid_until_ns: u64,
    },
    /// The holder stopped claiming the lock at this instant.
    Release {
        /// The lease released.
        lease: u64,
        /// When the holder stopped claiming it.
        at_ns: u64,
    },
    /// The holder observed a lost-lock signal.
    Lost {
        /// The lease lost.
        lease: u64,
        /// When the signal was observed.
        at_ns: u64,
        /// What signalled it.
        reason: String,
    },
    /// A write to the fenced store.
    Write {
        /// The writer.
        worker: u32,
        /// The lease it wrote under.
        lease: u64,
        /// The store key written.
        key: String,
        /// The token the write carried, `None` for an unfenced write.
        token: Option<u64>,
        /// When the write was sent.
        start_ns: u64,
        /// When its outcome was known.
        end_ns: u64,
        /// What the store answered.
        outcome: WriteOutcome,
    },
    /// A read-modify-write increment of a shared counter under the lock.
    Increment {
        /// The incrementing worker.
        worker: u32,
        /// The lease it incremented under.
        lease: u64,
        /// The counter's name.
        counter: String,
        /// The value it read (and wrote back plus one).
        read: i64,
        /// When the read was sent.
        start_ns: u64,
        /// When the write's outcome was known.
        end_ns: u64,
        /// Whether the worker saw its write succeed.
        acked: bool,
    },
    /// One single-flight request of the `once` workloads
    /// (`worker/once.rs`); its computation, when it ran one, is a grant
    /// (the lease the computation's id) and a release. Judged by
    /// `once_check.rs`, not by [`check`].
    Once {
        /// The requesting worker.
        worker: u32,
        /// The single-flight key (the computation's grant's resource).
        key: String,
        /// When the request began.
        start_ns: u64,
        /// When its outcome was known.
        end_ns: u64,
        /// The computation this request ran, if its closure ran.
        computed: Option<u64>,
        /// The computation whose value it returned.
        value: Option<u64>,
        /// Why it returned no value: the error's kind.
        error: Option<String>,
    },
    /// A counter's value, read once all workers had stopped. Of several
    /// for one counter, the last line counts.
    CounterFinal {
        /// The counter's name.
        counter: String,
        /// Its value.
        value: i64,
    },
    /// A fault injected or healed.
    Nemesis {
        /// When it started or stopped.
        at_ns: u64,
        /// The fault's name (`pause-node-2`, `partition`).
        name: String,
        /// Whether it started or stopped.
        phase: NemesisPhase,
        /// Anything else worth knowing.
        detail: Option<String>,
    },
}

/// What the fenced store answered to a [`Event::Write`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum WriteOutcome {
    /// Written.
    Accepted,
    /// Refused for a stale token.
    Rejected,
    /// Failed otherwise (timeout, connection); may or may not be applied.
    Error,
}

/// Whether a [`Event::Nemesis`] fault began or ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum NemesisPhase {
    /// The fault was injected.
    Start,
    /// The fault was healed.
    Stop,
}

/// Appends events to a history file, from any number of threads.
///
/// A std `Mutex`, not an async one: nothing awaits while it is held, and
/// the section is a copy into a buffer because each event is serialized
/// before the lock is taken. The buffer is flushed when the writer is
/// dropped, but errors are only seen through [`flush`](Self::flush).
#[derive(Debug)]
pub struct Writer {
    start: Instant,
    out: Mutex<BufWriter<File>>,
}

impl Writer {
    /// Creates (or truncates) the file at `path`; stamps count from `start`.
    pub fn create(path: impl AsRef<Path>, start: Instant) -> io::Result<Self> {
        let file = File::create(path)?;
        Ok(Self {
            start,
            out: Mutex::new(BufWriter::new(file)),
        })
    }

    /// Nanoseconds from the run's start to now.
    // The rig stamps events with its own clock (`clock`, shared with the
    // worker processes), so the binary itself calls neither of these two.
    #[allow(dead_code)]
    pub fn now_ns(&self) -> u64 {
        self.ns_at(Instant::now())
    }

    /// Nanoseconds from the run's start to `t`, for an instant taken
    /// earlier (an attempt's start). Zero before the start; saturates after
    /// 584 years.
    #[allow(dead_code)]
    pub fn ns_at(&self, t: Instant) -> u64 {
        let ns = t.saturating_duration_since(self.start).as_nanos();
        u64::try_from(ns).unwrap_or(u64::MAX)
    }

    /// Appends one event as one line.
    pub fn record(&self, event: &Event) -> io::Result<()> {
        let mut line = serde_json::to_vec(event)?;
        line.push(b'\n');
        // A panic elsewhere while holding the lock cannot have left half a
        // line behind (the only call under it is one `write_all` of a whole
        // line), so a poisoned lock is still a usable one.
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        out.write_all(&line)
    }

    /// Writes out everything recorded so far.
    pub fn flush(&self) -> io::Result<()> {
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        out.flush()
    }
}

/// A history that could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HistoryError {
    /// The file could not be read.
    #[error("cannot read history {path:?}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A line is not an event: bad JSON, an unknown `type`, a missing or
    /// unknown field.
    #[error("history line {line} is not an event")]
    Parse {
        /// The line, counting from 1.
        line: usize,
        /// What the parser said.
        #[source]
        source: serde_json::Error,
    },
}

/// Reads a history file. See [`parse`].
pub fn read(path: impl AsRef<Path>) -> Result<Vec<Event>, HistoryError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|source| HistoryError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse(&text)
}

/// Parses a history, one event per line; blank lines are skipped. A
/// truncated last line is an error, not skipped: a history with events
/// missing could pass checks that the whole run would fail.
pub fn parse(text: &str) -> Result<Vec<Event>, HistoryError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|source| HistoryError::Parse {
                line: i + 1,
                source,
            })
        })
        .collect()
}

/// A count, and the first [`MAX_LISTED`] examples found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Found<T> {
    /// How many were found.
    pub count: u64,
    /// The first of them, in name order (of resource, key or counter), then
    /// time order.
    pub first: Vec<T>,
}

impl<T> Found<T> {
    /// Whether none were found.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub(crate) fn push(&mut self, item: T) {
        self.count += 1;
        if self.first.len() < MAX_LISTED {
            self.first.push(item);
        }
    }
}

// By hand: the derive would demand `T: Default`.
impl<T> Default for Found<T> {
    fn default() -> Self {
        Self {
            count: 0,
            first: Vec::new(),
        }
    }
}

/// Who did something: a worker, under one of its leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The worker.
    pub worker: u32,
    /// The lease.
    pub lease: u64,
}

fn holder(worker: u32, lease: u64) -> Holder {
    Holder { worker, lease }
}

/// Two holders of one resource at once.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Overlap {
    /// The resource.
    pub resource: String,
    /// The holder whose window began first.
    pub first: Holder,
    /// The holder whose window began inside the first's.
    pub second: Holder,
    /// How long both held it.
    pub overlap_ns: u64,
}

/// Two acknowledged increments that read the same value: one overwrote
/// the other.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DuplicateRead {
    /// The counter.
    pub counter: String,
    /// The value both read.
    pub read: i64,
    /// The increment that began first.
    pub first: Holder,
    /// The other.
    pub second: Holder,
}

/// Two tokens in the wrong relation, for one resource (grants) or one store
/// key (accepted writes): the same token granted twice, a grant with a
/// lower token than one known before its attempt began, or a write
/// accepted with a lower token than a write that had completed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TokenPair {
    /// The resource or store key.
    pub subject: String,
    /// The grant or write that came first.
    pub earlier: Holder,
    /// Its token.
    pub earlier_token: u64,
    /// The one that came after it.
    pub later: Holder,
    /// Its token, not larger.
    pub later_token: u64,
}

/// One counter's totals.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CounterCheck {
    /// The counter.
    pub counter: String,
    /// Increments the workers saw succeed: the expected final value.
    pub acked: u64,
    /// Increments whose outcome the worker did not see (a timeout): each
    /// may or may not have been applied.
    pub unacked: u64,
    /// The final value, `None` when the history has none.
    pub final_value: Option<i64>,
}

impl CounterCheck {
    /// Whether the final value is possible: every acknowledged increment
    /// counted, and at most the unacknowledged ones on top. Exact equality
    /// when every increment was acknowledged; demanding it always would
    /// call a timed-out write that did land a lost update. No final value
    /// is inconsistent: a counter that cannot be checked must not pass.
    pub fn is_consistent(&self) -> bool {
        self.final_value.is_some_and(|v| {
            let (v, acked) = (i128::from(v), i128::from(self.acked));
            acked <= v && v <= acked + i128::from(self.unacked)
        })
    }
}

/// How long after a fault ended the first lock was granted.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Recovery {
    /// The fault's name.
    pub name: String,
    /// When it stopped.
    pub stop_ns: u64,
    /// From the stop to the first grant at or after it, on any resource;
    /// `None` when nothing was granted after it.
    pub recovery_ns: Option<u64>,
}

/// A mistake of the recorder rather than of the lock, and a sign that the
/// checks may be judging the wrong history.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Anomaly {
    /// Two grants with one lease id; the second is left out of the checks.
    DuplicateLease(u64),
    /// An `extend`, `release` or `lost` event for a lease never granted.
    UnknownLease {
        /// The lease.
        lease: u64,
        /// The event's type.
        event: &'static str,
    },
}

/// What [`check`] found.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Report {
    /// Events checked.
    pub events: usize,
    /// Acquire attempts.
    pub attempts: u64,
    /// Attempts that were granted.
    pub granted_attempts: u64,
    /// Grant events.
    pub grants: u64,
    /// Granted attempts over attempts; `None` without attempts.
    pub availability: Option<f64>,
    /// One per nemesis stop, in time order.
    pub recoveries: Vec<Recovery>,
    /// Mutual exclusion violations: each grant whose window began inside an
    /// earlier one, paired with the earlier window that reaches furthest
    /// (so `overlap_ns` is its largest overlap with any earlier window).
    /// Every overlapping pair makes at least one entry; counting pairs
    /// instead would make a pile-up quadratic.
    pub overlaps: Found<Overlap>,
    /// Every counter, in name order.
    pub counters: Vec<CounterCheck>,
    /// Acknowledged increments that read a value another one had read.
    pub duplicate_reads: Found<DuplicateRead>,
    /// Grant tokens already granted for the resource.
    pub duplicate_tokens: Found<TokenPair>,
    /// Grant tokens lower than the largest one known before their attempt
    /// began. Equal ones are counted once, as duplicates.
    pub token_inversions: Found<TokenPair>,
    /// Writes the store accepted.
    pub writes_accepted: u64,
    /// Writes the store refused for a stale token.
    pub writes_rejected: u64,
    /// Writes that failed otherwise.
    pub writes_failed: u64,
    /// Accepted writes with a token lower than the largest among accepted
    /// writes to the key that had completed before they began.
    pub stale_accepted: Found<TokenPair>,
    /// Recorder mistakes; see [`Anomaly`].
    pub anomalies: Found<Anomaly>,
}

impl Report {
    /// No overlapping holders, no lost update, no duplicate or decreasing
    /// token, and no stale write accepted. Anomalies do not count here;
    /// check [`anomalies`](Self::anomalies) too before trusting the verdict.
    pub fn is_safe(&self) -> bool {
        self.overlaps.is_empty()
            && self.counters.iter().all(CounterCheck::is_consistent)
            && self.duplicate_reads.is_empty()
            && self.duplicate_tokens.is_empty()
            && self.token_inversions.is_empty()
            && self.stale_accepted.is_empty()
    }
}

/// A grant, joined with the later events of its lease: the holder's
/// window is `[at_ns, end())`. The checker's rule, shared with the report
/// and the plot so that all three draw the same windows.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Hold<'a> {
    /// The holder.
    pub who: Holder,
    /// The resource held.
    pub resource: &'a str,
    /// When the attempt that got it began.
    pub start_ns: u64,
    /// When the holder learned it holds the lock.
    pub at_ns: u64,
    /// Its fencing token, `None` when fencing is off.
    pub token: Option<u64>,
    /// `(at_ns, valid_until_ns)` of the latest deadline the holder learned:
    /// the grant's, then each extension's. The latest learned, not the
    /// largest, because that is the one the holder acts on.
    pub deadline: (u64, u64),
    /// The first release or lost signal.
    pub gave_up: Option<u64>,
}

impl Hold<'_> {
    /// The end of the window: the earliest of the last deadline learned,
    /// the release and the lost signal.
    pub fn end(&self) -> u64 {
        self.gave_up
            .map_or(self.deadline.1, |g| g.min(self.deadline.1))
    }
}

/// Every grant of `events`, in file order, joined with the extensions,
/// releases and lost signals of its lease; what cannot be joined (a second
/// grant of one lease, an event of a lease never granted) is returned as
/// anomalies. The join runs after the pass over the grants, not during it:
/// file order is not time order, so an extend may come before its grant's
/// line.
pub fn holds(events: &[Event]) -> (Vec<Hold<'_>>, Found<Anomaly>) {
    let (mut holds, mut anomalies) = (Vec::new(), Found::default());
    let mut lease_index = HashMap::new();
    for e in events {
        if let Event::Grant {
            worker,
            resource,
            lease,
            start_ns,
            at_ns,
            valid_until_ns,
            token,
        } = e
        {
            // The first grant keeps the lease: `insert` would point it at
            // the next hold pushed, or past the end.
            if lease_index.contains_key(lease) {
                anomalies.push(Anomaly::DuplicateLease(*lease));
                continue;
            }
            lease_index.insert(*lease, holds.len());
            holds.push(Hold {
                who: holder(*worker, *lease),
                resource,
                start_ns: *start_ns,
                at_ns: *at_ns,
                token: *token,
                deadline: (*at_ns, *valid_until_ns),
                gave_up: None,
            });
        }
    }
    for e in events {
        let (lease, event, at_ns) = match *e {
            Event::Extend { lease, at_ns, .. } => (lease, "extend", at_ns),
            Event::Release { lease, at_ns } => (lease, "release", at_ns),
            Event::Lost { lease, at_ns, .. } => (lease, "lost", at_ns),
            _ => continue,
        };
        let Some(hold) = lease_index.get(&lease).map(|&i| &mut holds[i]) else {
            anomalies.push(Anomaly::UnknownLease { lease, event });
            continue;
        };
        match *e {
            Event::Extend { valid_until_ns, .. } => {
                hold.deadline = hold.deadline.max((at_ns, valid_until_ns));
            }
            _ => hold.gave_up = Some(hold.gave_up.map_or(at_ns, |g| g.min(at_ns))),
        }
    }
    (holds, anomalies)
}

/// The holds of each resource, in resource name order, each sorted by
/// window start (then end, then lease): the order every check of one
/// resource walks them in.
pub fn by_resource<'h, 'a>(holds: &'h [Hold<'a>]) -> BTreeMap<&'a str, Vec<&'h Hold<'a>>> {
    let mut by: BTreeMap<&str, Vec<&Hold<'_>>> = BTreeMap::new();
    for h in holds {
        by.entry(h.resource).or_default().push(h);
    }
    for hs in by.values_mut() {
        hs.sort_by_key(|h| (h.at_ns, h.end(), h.who.lease));
    }
    by
}

/// The token violations among one resource's holds (sorted as
/// [`by_resource`] sorts them), all of them: tokens granted twice (paired
/// with the first grant of the token), and tokens lower than the largest
/// one known before their attempt began. Holds without a token are left
/// out.
pub fn token_pairs(resource: &str, hs: &[&Hold<'_>]) -> (Vec<TokenPair>, Vec<TokenPair>) {
    // In the order the grants were known, so "earlier" is the first one.
    let timed: Vec<Timed> = hs
        .iter()
        .filter_map(|h| Some((h.start_ns, h.at_ns, h.token?, h.who)))
        .collect();
    let (mut seen, mut duplicates) = (HashMap::new(), Vec::new());
    for t in &timed {
        if let Some(&first) = seen.get(&t.2) {
            duplicates.push(token_pair(resource, first, t));
        } else {
            seen.insert(t.2, t);
        }
    }
    let inverted = inversions(&timed)
        .into_iter()
        .map(|(earlier, later)| token_pair(resource, &timed[earlier], &timed[later]))
        .collect();
    (duplicates, inverted)
}

/// `(start, end, token, who)`: a grant (from its attempt's start to when it
/// was known) or an accepted write, with its real-time interval.
type Timed = (u64, u64, u64, Holder);

/// Pairs `(earlier, later)` where `later`'s token is lower than the largest
/// token among the items that ended strictly before `later` began, and
/// `earlier` holds that largest token. O(n log n): walks the items by start
/// while a second cursor admits, by end, those finished by then.
fn inversions(items: &[Timed]) -> Vec<(usize, usize)> {
    let mut by_start: Vec<usize> = (0..items.len()).collect();
    by_start.sort_by_key(|&i| (items[i].0, items[i].1));
    let mut by_end = by_start.clone();
    by_end.sort_by_key(|&i| items[i].1);
    let (mut done, mut best, mut found) = (0, None::<usize>, Vec::new());
    for &i in &by_start {
        while let Some(&j) = by_end.get(done).filter(|&&j| items[j].1 < items[i].0) {
            if best.is_none_or(|b| items[j].2 > items[b].2) {
                best = Some(j);
            }
            done += 1;
        }
        if let Some(b) = best.filter(|&b| items[i].2 < items[b].2) {
            found.push((b, i));
        }
    }
    found
}

fn token_pair(subject: &str, earlier: &Timed, later: &Timed) -> TokenPair {
    TokenPair {
        subject: subject.to_owned(),
        earlier: earlier.3,
        earlier_token: earlier.2,
        later: later.3,
        later_token: later.2,
    }
}

#[derive(Default)]
struct CounterAcc {
    acked: u64,
    unacked: u64,
    /// `(start_ns, end_ns, read, who)` of each acknowledged increment.
    reads: Vec<(u64, u64, i64, Holder)>,
    final_value: Option<i64>,
}

/// Checks a whole history; the module docs say what is checked. O(n log n)
/// in the number of events. Never fails: what it cannot make sense of is
/// reported as an [`Anomaly`].
pub fn check(events: &[Event]) -> Report {
    let mut r = Report {
        events: events.len(),
        ..Report::default()
    };
    let (holds, anomalies) = holds(events);
    r.anomalies = anomalies;
    let (mut grant_times, mut stops) = (Vec::new(), Vec::new());
    let mut counters: BTreeMap<&str, CounterAcc> = BTreeMap::new();
    let mut writes: BTreeMap<&str, Vec<Timed>> = BTreeMap::new();

    for e in events {
        match e {
            Event::Attempt { granted, .. } => {
                r.attempts += 1;
                r.granted_attempts += u64::from(*granted);
            }
            Event::Grant { at_ns, .. } => {
                r.grants += 1;
                grant_times.push(*at_ns);
            }
            Event::Extend { .. } | Event::Release { .. } | Event::Lost { .. } => {}
            Event::Write {
                worker,
                lease,
                key,
                token,
                start_ns,
                end_ns,
                outcome,
            } => {
                match outcome {
                    WriteOutcome::Accepted => r.writes_accepted += 1,
                    WriteOutcome::Rejected => r.writes_rejected += 1,
                    WriteOutcome::Error => r.writes_failed += 1,
                }
                if let (WriteOutcome::Accepted, Some(token)) = (outcome, *token) {
                    let write = (*start_ns, *end_ns, token, holder(*worker, *lease));
                    writes.entry(key).or_default().push(write);
                }
            }
            Event::Increment {
                worker,
                lease,
                counter,
                read,
                start_ns,
                end_ns,
                acked,
            } => {
                let acc = counters.entry(counter).or_default();
                if *acked {
                    acc.acked += 1;
                    acc.reads
                        .push((*start_ns, *end_ns, *read, holder(*worker, *lease)));
                } else {
                    acc.unacked += 1;
                }
            }
            Event::CounterFinal { counter, value } => {
                counters.entry(counter).or_default().final_value = Some(*value);
            }
            Event::Once { .. } => {}
            Event::Nemesis {
                at_ns, name, phase, ..
            } => {
                if *phase == NemesisPhase::Stop {
                    stops.push((*at_ns, name));
                }
            }
        }
    }
    for (resource, hs) in by_resource(&holds) {
        // Sweep by window start, remembering the earlier window that reaches
        // furthest: a window that begins before that one ends overlaps it,
        // and one that begins after it overlaps none of the earlier ones.
        let mut reach: Option<&Hold<'_>> = None;
        for &h in &hs {
            let end = h.end();
            if end <= h.at_ns {
                continue; // known only once it was over: it held nothing
            }
            if let Some(prev) = reach.filter(|p| h.at_ns < p.end()) {
                r.overlaps.push(Overlap {
                    resource: resource.to_owned(),
                    first: prev.who,
                    second: h.who,
                    overlap_ns: end.min(prev.end()) - h.at_ns,
                });
            }
            if reach.is_none_or(|p| end > p.end()) {
                reach = Some(h);
            }
        }
        let (duplicates, inverted) = token_pairs(resource, &hs);
        for pair in duplicates {
            r.duplicate_tokens.push(pair);
        }
        for pair in inverted {
            r.token_inversions.push(pair);
        }
    }

    for (key, ws) in writes {
        for (earlier, later) in inversions(&ws) {
            r.stale_accepted
                .push(token_pair(key, &ws[earlier], &ws[later]));
        }
    }

    for (counter, mut acc) in counters {
        acc.reads
            .sort_by_key(|&(start, end, _, who)| (start, end, who.lease));
        let mut first_read = HashMap::new();
        for &(_, _, read, second) in &acc.reads {
            if let Some(&first) = first_read.get(&read) {
                let counter = counter.to_owned();
                r.duplicate_reads.push(DuplicateRead {
                    counter,
                    read,
                    first,
                    second,
                });
            } else {
                first_read.insert(read, second);
            }
        }
        let (acked, unacked, final_value) = (acc.acked, acc.unacked, acc.final_value);
        let counter = counter.to_owned();
        r.counters.push(CounterCheck {
            counter,
            acked,
            unacked,
            final_value,
        });
    }

    if r.attempts > 0 {
        r.availability = Some(r.granted_attempts as f64 / r.attempts as f64);
    }
    grant_times.sort_unstable();
    stops.sort();
    for (stop_ns, name) in stops {
        let next = grant_times.partition_point(|&at| at < stop_ns);
        let recovery_ns = grant_times.get(next).map(|&at| at - stop_ns);
        r.recoveries.push(Recovery {
            name: name.clone(),
            stop_ns,
            recovery_ns,
        });
    }
    r
}

/// A duration in nanoseconds, shown in the unit a reader can compare with
/// a TTL without counting digits.
struct Ns(u64);

impl fmt::Display for Ns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            ns @ 0..1_000_000 => write!(f, "{ns} ns"),
            ns => write!(f, "{:.3} ms", ns as f64 / 1e6),
        }
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lease {} (worker {})", self.lease, self.worker)
    }
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (r, a, b, ns) = (&self.resource, self.first, self.second, Ns(self.overlap_ns));
        write!(f, "{r:?}: {a} and {b} both held it for {ns}")
    }
}

impl fmt::Display for DuplicateRead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (c, v, a, b) = (&self.counter, self.read, self.first, self.second);
        write!(f, "{c:?}: {a} and {b} both read {v}")
    }
}

impl fmt::Display for TokenPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (s, a, b) = (&self.subject, self.earlier, self.later);
        let (ta, tb) = (self.earlier_token, self.later_token);
        write!(f, "{s:?}: token {tb} of {b} after token {ta} of {a}")
    }
}

impl fmt::Display for CounterCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (c, acked, unacked) = (&self.counter, self.acked, self.unacked);
        let expected = format!("expected {acked} (+ up to {unacked} unacked)");
        match self.final_value {
            Some(v) => write!(f, "{c:?}: final value {v}, {expected}"),
            None => write!(f, "{c:?}: no final value, {expected}"),
        }
    }
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DuplicateLease(lease) => write!(f, "lease {lease} granted twice"),
            Self::UnknownLease { lease, event } => write!(f, "{event} of unknown lease {lease}"),
        }
    }
}

/// Writes a count and its first few examples: a summary, not a dump (the
/// report's fields hold up to [`MAX_LISTED`]).
fn list<T: fmt::Display>(f: &mut fmt::Formatter<'_>, what: &str, found: &Found<T>) -> fmt::Result {
    const SHOWN: usize = 3;
    writeln!(f, "  {what}: {}", found.count)?;
    for item in found.first.iter().take(SHOWN) {
        writeln!(f, "    - {item}")?;
    }
    match found.count.checked_sub(SHOWN as u64) {
        Some(more @ 1..) => writeln!(f, "    - ... and {more} more"),
        _ => Ok(()),
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.is_safe() { "safe" } else { "UNSAFE" };
        writeln!(f, "history of {} events: {verdict}", self.events)?;
        list(f, "overlapping holders", &self.overlaps)?;
        let bad: Vec<_> = self
            .counters
            .iter()
            .filter(|c| !c.is_consistent())
            .collect();
        writeln!(
            f,
            "  counters: {}, inconsistent: {}",
            self.counters.len(),
            bad.len()
        )?;
        for c in bad {
            writeln!(f, "    - {c}")?;
        }
        list(f, "duplicate counter reads", &self.duplicate_reads)?;
        list(f, "duplicate tokens", &self.duplicate_tokens)?;
        list(f, "decreasing tokens", &self.token_inversions)?;
        let (a, rj, e) = (
            self.writes_accepted,
            self.writes_rejected,
            self.writes_failed,
        );
        writeln!(
            f,
            "  writes: {a} accepted, {rj} rejected as stale, {e} failed"
        )?;
        list(f, "stale writes accepted", &self.stale_accepted)?;
        let (g, n, pct) = (self.granted_attempts, self.attempts, self.availability);
        let pct = pct.map_or(0.0, |a| a * 100.0);
        writeln!(
            f,
            "  granted: {g} of {n} attempts ({pct:.1}%); grants: {}",
            self.grants
        )?;
        for rec in &self.recoveries {
            let (name, at) = (&rec.name, Ns(rec.stop_ns));
            match rec.recovery_ns.map(Ns) {
                Some(ns) => writeln!(f, "    - {name} stopped at {at}, granted {ns} later")?,
                None => writeln!(f, "    - {name} stopped at {at}, nothing granted after")?,
            }
        }
        list(f, "recorder anomalies", &self.anomalies)
    }
}

#[cfg(test)]
mod tests {
    use super::WriteOutcome::{Accepted, Error, Rejected};
    use super::*;
    use proptest::prelude::*;

    // Test workers have one lease at a time: worker `n` holds lease `n`, on
    // resource "r", writing key "k" and counter "c" unless moved by `on`.

    /// A grant whose attempt began 1 ns before it was known.
    fn grant(lease: u64, at_ns: u64, valid_until_ns: u64, token: u64) -> Event {
        let (worker, resource, start_ns, token) =
            (lease as u32, "r".into(), at_ns - 1, Some(token));
        Event::Grant {
            worker,
            resource,
            lease,
            start_ns,
            at_ns,
            valid_until_ns,
            token,
        }
    }

    fn release(lease: u64, at_ns: u64) -> Event {
        Event::Release { lease, at_ns }
    }

    fn lost(lease: u64, at_ns: u64) -> Event {
        Event::Lost {
            lease,
            at_ns,
            reason: "extend failed".into(),
        }
    }

    fn write(
        lease: u64,
        token: u64,
        (start_ns, end_ns): (u64, u64),
        outcome: WriteOutcome,
    ) -> Event {
        let (worker, key, token) = (lease as u32, "k".into(), Some(token));
        Event::Write {
            worker,
            lease,
            key,
            token,
            start_ns,
            end_ns,
            outcome,
        }
    }

    fn incr(lease: u64, read: i64, (start_ns, end_ns): (u64, u64), acked: bool) -> Event {
        let (worker, counter) = (lease as u32, "c".into());
        Event::Increment {
            worker,
            lease,
            counter,
            read,
            start_ns,
            end_ns,
            acked,
        }
    }

    fn fin(value: i64) -> Event {
        Event::CounterFinal {
            counter: "c".into(),
            value,
        }
    }

    /// The event, on another resource, key or counter.
    fn on(name: &str, mut event: Event) -> Event {
        match &mut event {
            Event::Grant { resource: n, .. }
            | Event::Write { key: n, .. }
            | Event::Increment { counter: n, .. }
            | Event::CounterFinal { counter: n, .. } => *n = name.into(),
            _ => {}
        }
        event
    }

    fn attempt(granted: bool) -> Event {
        let (resource, reason) = ("r".into(), (!granted).then(|| "no quorum".into()));
        Event::Attempt {
            worker: 1,
            resource,
            start_ns: 0,
            end_ns: 1,
            granted,
            reason,
        }
    }

    fn nemesis(at_ns: u64, phase: NemesisPhase, detail: Option<String>) -> Event {
        Event::Nemesis {
            at_ns,
            name: "pause".into(),
            phase,
            detail,
        }
    }

    fn who(lease: u64) -> Holder {
        holder(lease as u32, lease)
    }

    /// The kinds of trouble a report holds, so that each test can assert
    /// that it found the one planted and nothing else.
    fn kinds(r: &Report) -> Vec<&'static str> {
        let counters = r.counters.iter().all(CounterCheck::is_consistent);
        let flags = [
            (r.overlaps.is_empty(), "overlap"),
            (counters, "counter"),
            (r.duplicate_reads.is_empty(), "duplicate_read"),
            (r.duplicate_tokens.is_empty(), "duplicate_token"),
            (r.token_inversions.is_empty(), "inversion"),
            (r.stale_accepted.is_empty(), "stale"),
            (r.anomalies.is_empty(), "anomaly"),
        ];
        flags.into_iter().filter(|f| !f.0).map(|f| f.1).collect()
    }

    fn clean(events: &[Event]) -> bool {
        let r = check(events);
        kinds(&r).is_empty() && r.is_safe()
    }

    #[test]
    fn overlapping_grants_are_caught() {
        let r = check(&[grant(1, 10, 100, 1), grant(2, 50, 150, 2)]);
        assert_eq!(kinds(&r), ["overlap"]);
        let o = &r.overlaps.first[0];
        assert_eq!((o.first, o.second, o.overlap_ns), (who(1), who(2), 50));
        assert!(!r.is_safe());
        assert!(
            clean(&[grant(1, 10, 100, 1), on("s", grant(2, 50, 150, 2))]),
            "another lock"
        );
    }

    #[test]
    fn an_extend_can_make_windows_overlap() {
        let mut h = vec![grant(1, 10, 60, 1), grant(2, 70, 150, 2)];
        assert!(clean(&h));
        h.push(Event::Extend {
            lease: 1,
            at_ns: 50,
            valid_until_ns: 100,
        });
        let r = check(&h);
        assert_eq!(kinds(&r), ["overlap"]);
        assert_eq!(r.overlaps.first[0].overlap_ns, 30);
        h.push(release(1, 70)); // handed over in time after all
        assert!(clean(&h));
    }

    #[test]
    fn a_window_ending_at_the_next_grant_is_clean() {
        assert!(clean(&[
            grant(1, 10, 100, 1),
            release(1, 50),
            grant(2, 50, 150, 2)
        ]));
        assert!(clean(&[
            grant(1, 10, 100, 1),
            lost(1, 50),
            grant(2, 50, 150, 2)
        ]));
        assert!(
            clean(&[grant(1, 10, 50, 1), grant(2, 50, 150, 2)]),
            "expired"
        );
        let r = check(&[grant(1, 10, 100, 1), release(1, 51), grant(2, 50, 150, 2)]);
        assert_eq!(r.overlaps.first[0].overlap_ns, 1);
    }

    #[test]
    fn two_acked_increments_reading_one_value_are_a_lost_update() {
        let r = check(&[
            incr(1, 0, (10, 11), true),
            incr(2, 0, (20, 21), true),
            fin(1),
        ]);
        assert_eq!(kinds(&r), ["counter", "duplicate_read"]);
        let d = &r.duplicate_reads.first[0];
        assert_eq!((d.read, d.first, d.second), (0, who(1), who(2)));
        assert_eq!(
            (r.counters[0].acked, r.counters[0].final_value),
            (2, Some(1))
        );
        // An unacknowledged increment reading the same value proves nothing.
        assert!(clean(&[
            incr(1, 0, (10, 11), true),
            incr(2, 0, (20, 21), false),
            fin(1)
        ]));
    }

    #[test]
    fn a_final_counter_off_by_one_is_caught() {
        let acked = [
            incr(1, 0, (1, 2), true),
            incr(2, 1, (3, 4), true),
            incr(3, 2, (5, 6), true),
        ];
        let with = |extra: &[Event]| check(&[&acked[..], extra].concat());
        assert!(kinds(&with(&[fin(3)])).is_empty());
        assert_eq!(kinds(&with(&[fin(2)])), ["counter"]);
        assert_eq!(kinds(&with(&[fin(4)])), ["counter"]);
        assert_eq!(kinds(&with(&[])), ["counter"], "no final value cannot pass");
        let text = with(&[fin(2)]).to_string();
        assert!(
            text.contains("\"c\": final value 2, expected 3 (+ up to 0 unacked)"),
            "{text}"
        );
        // An unacknowledged increment may or may not have landed.
        let maybe = |v| kinds(&with(&[incr(4, 3, (7, 8), false), fin(v)]));
        assert!(maybe(3).is_empty() && maybe(4).is_empty());
        assert_eq!(maybe(5), ["counter"]);
    }

    #[test]
    fn duplicate_tokens_are_caught() {
        let r = check(&[grant(1, 10, 20, 7), grant(2, 30, 40, 7)]);
        assert_eq!(kinds(&r), ["duplicate_token"]);
        let d = &r.duplicate_tokens.first[0];
        assert_eq!((d.earlier, d.later, d.later_token), (who(1), who(2), 7));
    }

    #[test]
    fn a_decreasing_token_is_caught_only_when_ordered() {
        let r = check(&[grant(1, 10, 20, 10), grant(2, 30, 40, 9)]);
        assert_eq!(kinds(&r), ["inversion"]);
        let i = &r.token_inversions.first[0];
        let pair = (i.earlier, i.earlier_token, i.later, i.later_token);
        assert_eq!(pair, (who(1), 10, who(2), 9));
        // The second attempt began before the first grant was known: the
        // tokens are not ordered, though the windows are.
        let mut second = grant(2, 70, 100, 9);
        if let Event::Grant { start_ns, .. } = &mut second {
            *start_ns = 50;
        }
        assert!(clean(&[grant(1, 50, 60, 10), second]));
    }

    #[test]
    fn a_stale_accepted_write_is_caught() {
        let r = check(&[
            write(1, 5, (10, 20), Accepted),
            write(2, 4, (30, 40), Accepted),
        ]);
        assert_eq!(kinds(&r), ["stale"]);
        let s = &r.stale_accepted.first[0];
        let pair = (s.later, s.later_token, s.earlier, s.earlier_token);
        assert_eq!(pair, (who(2), 4, who(1), 5));
        assert_eq!(r.writes_accepted, 2);
        assert!(clean(&[
            write(1, 5, (10, 20), Accepted),
            on("j", write(2, 4, (30, 40), Accepted))
        ]));
    }

    #[test]
    fn a_rejected_stale_write_is_clean_and_counted() {
        let r = check(&[
            write(1, 5, (10, 20), Accepted),
            write(2, 4, (30, 40), Rejected),
            write(3, 3, (50, 60), Error),
            write(1, 5, (70, 80), Accepted), // the same holder again
        ]);
        assert!(kinds(&r).is_empty());
        assert_eq!(
            (r.writes_accepted, r.writes_rejected, r.writes_failed),
            (2, 1, 1)
        );
    }

    #[test]
    fn concurrent_writes_are_not_ordered() {
        let later = write(2, 4, (20, 30), Accepted);
        assert!(
            clean(&[write(1, 5, (10, 40), Accepted), later.clone()]),
            "nested"
        );
        assert!(clean(&[write(1, 5, (10, 20), Accepted), later]), "touching");
    }

    #[test]
    fn availability_and_recovery_time() {
        let r = check(&[
            attempt(true),
            attempt(false),
            attempt(true),
            attempt(true),
            nemesis(100, NemesisPhase::Start, None),
            grant(1, 150, 160, 1),
            nemesis(300, NemesisPhase::Stop, None),
            on("s", grant(3, 400, 410, 1)),
            grant(2, 360, 370, 2), // the first after the stop
            nemesis(500, NemesisPhase::Stop, None),
        ]);
        assert!(kinds(&r).is_empty());
        assert_eq!((r.attempts, r.granted_attempts, r.grants), (4, 3, 3));
        assert_eq!(r.availability, Some(0.75));
        let recoveries: Vec<_> = r
            .recoveries
            .iter()
            .map(|x| (x.stop_ns, x.recovery_ns))
            .collect();
        assert_eq!(recoveries, [(300, Some(60)), (500, None)]);
        assert_eq!(check(&[]).availability, None);
        let text = r.to_string();
        assert!(
            text.contains("granted: 3 of 4 attempts (75.0%); grants: 3"),
            "{text}"
        );
        assert!(
            text.contains("pause stopped at 300 ns, granted 60 ns later"),
            "{text}"
        );
    }

    #[test]
    fn display_summarizes_the_verdict() {
        let text = check(&[grant(1, 10, 2_000_050, 1), grant(2, 50, 3_000_000, 2)]).to_string();
        assert!(text.starts_with("history of 2 events: UNSAFE\n  overlapping holders: 1\n"));
        let overlap = "\"r\": lease 1 (worker 1) and lease 2 (worker 2) both held it for 2.000 ms";
        assert!(text.contains(overlap), "{text}");
        assert!(check(&[])
            .to_string()
            .starts_with("history of 0 events: safe"));
        // A pile-up: every window overlaps all the others; counted in full,
        // listed in part.
        let pile: Vec<_> = (1..=100).map(|l| grant(l, l, 1_000, l)).collect();
        let r = check(&pile);
        assert_eq!((r.overlaps.count, r.overlaps.first.len()), (99, MAX_LISTED));
        assert!(r.to_string().contains("    - ... and 96 more\n"));
    }

    #[test]
    fn recorder_mistakes_are_anomalies() {
        let r = check(&[grant(1, 10, 20, 1), grant(1, 30, 40, 2), release(9, 5)]);
        assert_eq!(kinds(&r), ["anomaly"]);
        let unknown = Anomaly::UnknownLease {
            lease: 9,
            event: "release",
        };
        assert_eq!(r.anomalies.first, [Anomaly::DuplicateLease(1), unknown]);
        assert!(r.is_safe(), "anomalies are reported apart from the verdict");
        // A release of a lease granted twice ends the first grant's window;
        // the index of the lease once pointed past the last hold.
        let twice = [grant(1, 10, 90, 1), grant(1, 30, 40, 2), release(1, 50)];
        let (hs, anomalies) = holds(&twice);
        assert_eq!(anomalies.count, 1);
        assert_eq!((hs.len(), hs[0].end(), hs[0].token), (1, 50, Some(1)));
    }

    #[test]
    fn token_pairs_lists_every_violation_beyond_the_report_s_examples() {
        let grants: Vec<Event> = (1..=30).map(|l| grant(l, l * 10, l * 10 + 5, 7)).collect();
        let (hs, _) = holds(&grants);
        let by = by_resource(&hs);
        let (duplicates, inverted) = token_pairs("r", &by["r"]);
        assert_eq!((duplicates.len(), inverted.len()), (29, 0));
        assert!(duplicates.iter().all(|d| d.earlier == who(1)));
        let r = check(&grants);
        assert_eq!(
            (r.duplicate_tokens.count, r.duplicate_tokens.first.len()),
            (29, MAX_LISTED)
        );
    }

    fn every_kind() -> Vec<Event> {
        let mut unfenced = grant(8, 3, 4, 0);
        if let Event::Grant { token, .. } = &mut unfenced {
            *token = None;
        }
        vec![
            attempt(false),
            attempt(true),
            grant(7, 3, 10, 42),
            unfenced,
            Event::Extend {
                lease: 7,
                at_ns: 5,
                valid_until_ns: 20,
            },
            release(7, 6),
            lost(7, 7),
            write(7, 42, (8, 9), Accepted),
            write(7, 42, (8, 9), Rejected),
            write(7, 42, (8, 9), Error),
            incr(7, -3, (10, 11), true),
            fin(i64::MIN),
            nemesis(11, NemesisPhase::Start, Some("node 2".into())),
            nemesis(12, NemesisPhase::Stop, None),
            Event::Once {
                worker: 3,
                key: "r0".into(),
                start_ns: 13,
                end_ns: 14,
                computed: Some(7),
                value: None,
                error: Some("stale".into()),
            },
        ]
    }

    #[test]
    fn every_event_kind_round_trips_through_json_lines() {
        let events = every_kind();
        let text: String = events
            .iter()
            .map(|e| serde_json::to_string(e).unwrap() + "\n")
            .collect();
        assert_eq!(parse(&text).unwrap(), events);
        assert!(
            text.contains(r#"{"type":"counter_final","counter":"c","value":-9223372036854775808}"#)
        );
        assert!(text.contains(r#""outcome":"rejected""#) && text.contains(r#""phase":"stop""#));
        let short = r#"{"type":"nemesis","at_ns":12,"name":"pause","phase":"stop"}"#;
        assert_eq!(
            parse(short).unwrap(),
            [nemesis(12, NemesisPhase::Stop, None)],
            "optional left out"
        );
    }

    #[test]
    fn the_writer_records_from_many_threads_and_read_gets_them_back() {
        let path =
            std::env::temp_dir().join(format!("redfence-history-{}.jsonl", std::process::id()));
        let writer = Writer::create(&path, Instant::now()).unwrap();
        let events = every_kind();
        std::thread::scope(|s| {
            for e in &events {
                s.spawn(|| writer.record(e).unwrap());
            }
        });
        writer.flush().unwrap();
        assert!(writer.now_ns() > 0 && writer.ns_at(writer.start) == 0);
        let back = read(&path);
        std::fs::remove_file(&path).unwrap();
        // Threads finish in any order.
        let sorted = |mut v: Vec<Event>| {
            v.sort_by_key(|e| serde_json::to_string(e).unwrap());
            v
        };
        assert_eq!(sorted(back.unwrap()), sorted(events));
        let missing = read(path.with_extension("missing")).unwrap_err();
        assert!(matches!(missing, HistoryError::Io { .. }), "{missing}");
    }

    #[test]
    fn parse_errors_say_which_line() {
        let good = serde_json::to_string(&release(1, 2)).unwrap();
        let error = |text: &str| match parse(text) {
            Err(HistoryError::Parse { line, source }) => (line, source.to_string()),
            other => panic!("expected a parse error, got {other:?}"),
        };
        assert_eq!(
            error(&format!(
                "{good}\n\n{{\"type\": \"release\", \"lease\": 1,\n"
            ))
            .0,
            3
        );
        let (line, why) = error(&format!("{good}\n{{\"type\":\"teleport\",\"at_ns\":1}}"));
        assert!(line == 2 && why.contains("unknown variant"), "{why}");
        let (_, why) = error(r#"{"type":"release","lease":1,"at_ns":2,"tokn":3}"#);
        assert!(why.contains("unknown field"), "{why}");
        let (_, why) = error(r#"{"type":"release","lease":-1,"at_ns":2}"#);
        assert!(why.contains("invalid value"), "{why}");
        assert_eq!(
            parse("[]").unwrap_err().to_string(),
            "history line 1 is not an event"
        );
        assert_eq!(parse("\n  \n").unwrap(), []);
    }

    /// One grant of a schedule: its resource, the pause before it, its
    /// validity, whether it extends, and how it ends (0 expires, 1 is
    /// released, 2 is lost) at what percentage of its validity.
    type Step = (usize, u64, u64, bool, u8, u64);

    /// Sequential holders per resource, each writing with its token and
    /// incrementing its resource's counter: clean by construction. Windows
    /// may touch (a pause of 0). Also returns each `(lease, at_ns, end)`.
    fn schedule(resources: usize, steps: &[Step]) -> (Vec<Event>, Vec<(u64, u64, u64)>) {
        let (mut cursor, mut count) = (vec![0; resources], vec![0; resources]);
        let (mut events, mut windows) = (Vec::new(), Vec::new());
        for (i, &(res, pause, valid, extend, ending, percent)) in steps.iter().enumerate() {
            let (lease, res) = (i as u64 + 1, res % resources);
            let (name, at) = (format!("r{res}"), cursor[res] + pause + 1);
            let mut until = at + valid;
            if extend {
                let valid_until_ns = until + valid;
                events.push(Event::Extend {
                    lease,
                    at_ns: at + valid / 2,
                    valid_until_ns,
                });
                until = valid_until_ns;
            }
            let end = match ending {
                0 => until,
                e => {
                    let end = at + (until - at) * percent / 100;
                    events.push(if e == 1 {
                        release(lease, end)
                    } else {
                        lost(lease, end)
                    });
                    end
                }
            };
            events.push(on(&name, grant(lease, at, until, lease)));
            events.push(on(&name, write(lease, lease, (at, end), Accepted)));
            events.push(on(&name, incr(lease, count[res], (at, end), true)));
            count[res] += 1;
            cursor[res] = end;
            windows.push((lease, at, end));
        }
        events.extend(
            count
                .iter()
                .enumerate()
                .map(|(res, &n)| on(&format!("r{res}"), fin(n))),
        );
        (events, windows)
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        let step = (
            0usize..3,
            0u64..50,
            1u64..200,
            any::<bool>(),
            0u8..3,
            0u64..=100,
        );
        prop::collection::vec(step, 1..40)
    }

    proptest! {
        #[test]
        fn sequential_schedules_are_clean(resources in 1usize..4, steps in steps(), reverse: bool) {
            let (mut events, _) = schedule(resources, &steps);
            if reverse {
                events.reverse(); // file order must not matter
            }
            let r = check(&events);
            prop_assert!(kinds(&r).is_empty(), "{}", r);
            prop_assert_eq!(r.grants, steps.len() as u64);
        }

        #[test]
        fn a_grant_moved_into_the_previous_window_is_caught(
            steps in steps(),
            pick: prop::sample::Index,
            into in 0u64..100,
        ) {
            // One resource, so that consecutive windows are one lock's. The
            // grant moved is one right after a window that held something.
            let (mut events, windows) = schedule(1, &steps);
            let held = |&i: &usize| windows[i - 1].2 > windows[i - 1].1;
            let movable: Vec<usize> = (1..windows.len()).filter(held).collect();
            prop_assume!(!movable.is_empty());
            let i = movable[pick.index(movable.len())];
            let ((_, at, end), moved) = (windows[i - 1], windows[i].0);
            let new_at = at + (end - at) * into / 100; // in [at, end)
            for e in &mut events {
                if let Event::Grant { lease, start_ns, at_ns, .. } = e {
                    if *lease == moved {
                        (*at_ns, *start_ns) = (new_at, new_at - 1);
                    }
                }
            }
            let r = check(&events);
            prop_assert_eq!(kinds(&r), ["overlap"], "{}", r);
            let o = &r.overlaps.first[0];
            prop_assert!(o.first.lease == moved || o.second.lease == moved, "{}", r);
        }
    }
}
