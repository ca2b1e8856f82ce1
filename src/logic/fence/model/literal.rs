//! The literal model: the protocol as described in the module docs, with
//! none of the reductions but dropping answers the client will ignore
//! (explicit key expiry, refusals, `NotHeld` answers, full attempt
//! identities, no symmetry), and the same fence expiries, restarts,
//! re-seeds, bucket-mates, pre-grants and leases; and the handover as a
//! transition of its own (the named waiter's acquire replaces the released
//! holder's key, known by its identity, and nobody else's). Far larger; it
//! exists to check that the reduced model reaches exactly the same
//! hand-outs.

use std::collections::{BTreeSet, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use super::super::{merge, next_fence};
use super::reduced::{fence_u8, mate_write_backs};
use super::search::Visited;
use super::*;
use crate::logic::quorum::{quorum, Decision, Tally};

/// A FIFO channel of at most `K` messages, oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Fifo<T, const K: usize>([Option<T>; K]);

impl<T: Copy, const K: usize> Fifo<T, K> {
    const EMPTY: Self = Self([None; K]);

    fn len(&self) -> usize {
        self.0.iter().take_while(|m| m.is_some()).count()
    }

    fn push(&mut self, msg: T) {
        let Some(slot) = self.0.iter_mut().find(|m| m.is_none()) else {
            panic!("more than {K} messages in a literal channel: raise its capacity");
        };
        *slot = Some(msg);
    }

    /// Delivers the `k`-th message; the ones before it were lost.
    fn take(&mut self, k: usize) -> Option<T> {
        let msg = self.0[k];
        self.0.copy_within(k + 1.., 0);
        self.0[K - (k + 1)..].fill(None);
        msg
    }

    fn retain(&mut self, keep: impl Fn(&T) -> bool) {
        let mut kept = Self::EMPTY;
        for msg in self.0.iter().flatten().filter(|m| keep(m)) {
            kept.push(*msg);
        }
        *self = kept;
    }

    fn any(&self, pred: impl Fn(&T) -> bool) -> bool {
        self.0.iter().flatten().any(pred)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum LitRequest {
    Acquire { attempt: u8 },
    WriteBack { attempt: u8, token: u8 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum LitAnswer {
    Granted { attempt: u8, fence: u8 },
    Refused { attempt: u8 },
    WriteBackOk { attempt: u8 },
    NotHeld { attempt: u8 },
}

/// A write-back's view of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum LitVote {
    Yes,
    No,
    Pending,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum LitPhase<const N: usize> {
    Idle,
    /// Per node: no answer yet, refused (`Some(None)`), granted a fence.
    Acquiring([Option<Option<u8>>; N]),
    WritingBack {
        token: u8,
        votes: [LitVote; N],
    },
    /// Leases: handed out, holding the lock; the nodes it counted (the
    /// restart guard's window outlasts the lease there).
    Holding([bool; N]),
}

/// (client, attempt): whose value a key holds.
type Attempt = (usize, u8);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct LitState<const N: usize> {
    /// (client, attempt) holding each node's key.
    holder: [Option<(usize, u8)>; N],
    /// `None`: absent.
    fence: [Option<u8>; N],
    /// `UP`, `DOWN` or `WAITING`.
    status: [u8; N],
    /// `[client][node]`. Two attempts of a client send at most four
    /// requests to a node; one answer at a time is awaited.
    requests: [[Fifo<LitRequest, 4>; N]; C],
    answers: [[Fifo<LitAnswer, 2>; N]; C],
    /// (attempt, phase, floor) per client.
    clients: [(u8, LitPhase<N>, u8); C],
    handed: u32,
    expiries: u8,
    restarts: u8,
    mates: u8,
    /// The largest fence any node has held, while a bucket-mate step is
    /// left.
    high: u8,
    pregrants: u8,
    /// Per client: its current attempt's pre-grant notice in flight, (home,
    /// fence).
    notices: [Option<(usize, u8)>; C],
    /// Per client: its current attempt was handed the lock over by the
    /// release of the inner attempt (`None` inside: the key was free, under
    /// [`Handover::AnyKey`] only), whose keys it may replace.
    handed_over: [Option<Option<Attempt>>; C],
}

impl<const N: usize> LitState<N> {
    fn max_handed(&self) -> u8 {
        self.handed.checked_ilog2().unwrap_or(0) as u8
    }

    /// As `State::touched`: an attempt in progress counts node `i` (it was
    /// granted there, or its write-back there succeeded or is awaited).
    fn touched(&self, i: usize) -> bool {
        self.clients
            .iter()
            .enumerate()
            .any(|(c, &(current, phase, _))| match phase {
                LitPhase::Idle => false,
                LitPhase::Acquiring(got) => matches!(got[i], Some(Some(_)))
                    || self.answers[c][i].any(
                        |a| matches!(a, LitAnswer::Granted { attempt, .. } if *attempt == current),
                    ),
                LitPhase::WritingBack { votes, .. } => votes[i] != LitVote::No,
                LitPhase::Holding(counted) => counted[i],
            })
            || self
                .notices
                .iter()
                .any(|notice| matches!(notice, Some((home, _)) if *home == i))
    }

    /// With leases, whether the key of `holder` must stay: its attempt is
    /// in progress or holding (as `Model::protected`).
    fn protected(&self, leases: bool, holder: Option<Attempt>) -> bool {
        leases
            && holder.is_some_and(|(c, a)| {
                let (current, phase, _) = self.clients[c];
                current == a && phase != LitPhase::Idle
            })
    }
}

/// What a literal run found.
pub(super) struct Literal {
    pub(super) events: BTreeSet<Event>,
    pub(super) states: usize,
    /// Acquires that replaced a released holder's key by a handover.
    pub(super) handovers: u64,
}

/// The seed client `c` puts into an absent fence.
fn lit_seed<const N: usize>(config: &Config<'_>, s: &LitState<N>, c: usize) -> u8 {
    match config.clock {
        Clock::Behind if c == 0 => 0,
        _ => s.max_handed(),
    }
}

/// Every reachable state of the literal model (FIFO channels with loss);
/// returns the hand-outs seen and the state count. Takes the variant,
/// attempts, clock, budgets and rules from `config`.
pub(super) fn literal<const N: usize>(config: &Config<'_>) -> Literal {
    let (variant, attempts) = (config.variant, config.attempts);
    let leases = config.leases;
    let mut handovers = 0;
    let q = quorum(N);
    let max_down = match config.max_down {
        0 => (N - q).max(1),
        m => usize::from(m),
    };
    let threshold = if config.reseed.needs_quorum {
        q
    } else {
        N - q + 1
    };
    let init = LitState::<N> {
        holder: [None; N],
        fence: [Some(0); N],
        status: [UP; N],
        requests: [[Fifo::EMPTY; N]; C],
        answers: [[Fifo::EMPTY; N]; C],
        clients: [(0, LitPhase::Idle, 0); C],
        handed: 0,
        expiries: config.expiries,
        restarts: config.restarts,
        mates: config.bucket_mates,
        high: 0,
        pregrants: config.pregrants,
        notices: [None; C],
        handed_over: [None; C],
    };
    let mut events = BTreeSet::new();
    // Fingerprints, not states: [2, 1] has millions of states of about
    // two hundred bytes each.
    let mut seen: Visited = HashSet::default();
    seen.insert(lit_fingerprint(&init));
    let mut stack = vec![init];
    while let Some(s) = stack.pop() {
        let mut next = Vec::new();
        for (c, &budget) in attempts.iter().enumerate() {
            let (attempt, phase, _) = s.clients[c];
            if phase == LitPhase::Idle && attempt < budget {
                let mut t = s;
                let floor = t.max_handed();
                let mut got = [None; N];
                for ((g, &status), q) in got.iter_mut().zip(&t.status).zip(&mut t.requests[c]) {
                    if status == UP {
                        q.push(LitRequest::Acquire {
                            attempt: attempt + 1,
                        });
                    } else {
                        // Refused locally: the node does not vote.
                        *g = Some(None);
                    }
                }
                t.clients[c] = (attempt + 1, LitPhase::Acquiring(got), floor);
                lit_decide(&mut t, c);
                next.push(t);
            } else if phase != LitPhase::Idle {
                let mut t = s;
                t.clients[c].1 = LitPhase::Idle;
                next.push(t);
            }
        }
        for i in 0..N {
            // A key vanishes (expiry, a release, a clock jump); with leases
            // only a key that may.
            if s.holder[i].is_some() && !s.protected(leases, s.holder[i]) {
                let mut t = s;
                t.holder[i] = None;
                next.push(t);
            }
            for c in 0..attempts.len() {
                for k in 0..s.requests[c][i].len() {
                    let mut t = s;
                    let msg = t.requests[c][i].take(k);
                    let seed = lit_seed(config, &t, c);
                    let moved = |f: Option<u8>| fence_u8(next_fence(u64::from(f.unwrap_or(seed))));
                    // A key holding the attempt's own value (a pre-grant's)
                    // grants again (`SET XX`); a handed-over attempt replaces
                    // the released holder's key (`SET XX` after matching its
                    // value's SHA1), or any key under the control.
                    let grants = |attempt: u8| {
                        let holder = t.holder[i];
                        let current = attempt == t.clients[c].0;
                        let handover = current
                            && match (config.handover, t.handed_over[c]) {
                                (Handover::AnyKey, Some(_)) => true,
                                (_, Some(Some(released))) => holder == Some(released),
                                _ => false,
                            };
                        holder.is_none() || holder == Some((c, attempt)) || handover
                    };
                    let answer = match msg {
                        Some(LitRequest::Acquire { attempt }) if grants(attempt) => {
                            if t.holder[i].is_some_and(|h| h != (c, attempt)) {
                                handovers += 1;
                            }
                            t.holder[i] = Some((c, attempt));
                            t.fence[i] = Some(moved(t.fence[i]));
                            LitAnswer::Granted {
                                attempt,
                                fence: moved(s.fence[i]),
                            }
                        }
                        Some(LitRequest::Acquire { attempt }) => {
                            // Refused, with the fence moved (the `INCR` of
                            // the implementation) or not (a script that
                            // moves it only on grants).
                            let mut m = t;
                            m.fence[i] = Some(moved(m.fence[i]));
                            m.answers[c][i].push(LitAnswer::Refused { attempt });
                            next.push(m);
                            LitAnswer::Refused { attempt }
                        }
                        Some(LitRequest::WriteBack { attempt, token }) => {
                            if variant != Variant::WriteBack || t.holder[i] == Some((c, attempt)) {
                                t.fence[i] = Some(t.fence[i].map_or(token, |f| f.max(token)));
                                LitAnswer::WriteBackOk { attempt }
                            } else {
                                LitAnswer::NotHeld { attempt }
                            }
                        }
                        None => unreachable!("k < len"),
                    };
                    t.answers[c][i].push(answer);
                    next.push(t);
                }
                for k in 0..s.answers[c][i].len() {
                    let mut t = s;
                    let Some(answer) = t.answers[c][i].take(k) else {
                        unreachable!("k < len")
                    };
                    if let Some(event) = lit_answer(config, &mut t, c, i, answer) {
                        events.insert(event);
                    }
                    next.push(t);
                }
            }
            if s.expiries > 0
                && s.status[i] == UP
                && s.fence[i].is_some()
                && !s.touched(i)
                && !s.protected(leases, s.holder[i])
            {
                let mut t = s;
                t.fence[i] = None;
                t.expiries -= 1;
                // Write-backs do not stay in flight for a retention.
                for c in 0..C {
                    t.requests[c][i].retain(|r| matches!(r, LitRequest::Acquire { .. }));
                }
                next.push(t);
            }
            let down = s.status.iter().filter(|&&st| st == DOWN).count();
            if s.restarts > 0 && down < max_down && s.status[i] != DOWN {
                let mut t = s;
                t.holder[i] = None;
                t.fence[i] = None;
                t.status[i] = DOWN;
                t.restarts -= 1;
                for c in 0..C {
                    t.requests[c][i] = Fifo::EMPTY;
                    // What was awaited from the node and not yet answered
                    // fails with the connection.
                    let current = t.clients[c].0;
                    let answered = t.answers[c][i].any(|a| match *a {
                        LitAnswer::Granted { attempt, .. }
                        | LitAnswer::Refused { attempt }
                        | LitAnswer::WriteBackOk { attempt }
                        | LitAnswer::NotHeld { attempt } => attempt == current,
                    });
                    // A pre-grant whose notice is in flight sent nothing yet.
                    let sent = t.notices[c].is_none();
                    match &mut t.clients[c].1 {
                        LitPhase::Acquiring(got) if got[i].is_none() && !answered && sent => {
                            got[i] = Some(None);
                        }
                        LitPhase::WritingBack { votes, .. }
                            if votes[i] == LitVote::Pending && !answered =>
                        {
                            votes[i] = LitVote::No;
                        }
                        _ => {}
                    }
                    lit_decide(&mut t, c);
                }
                next.push(t);
            }
            // Bucket-mates: at a node that votes, an acquire (seeded from
            // an agreeing clock if absent, then `INCR`) or a write-back.
            if s.mates > 0 && s.status[i] == UP {
                let mut t = s;
                let seed = t.max_handed();
                t.fence[i] = Some(fence_u8(next_fence(u64::from(s.fence[i].unwrap_or(seed)))));
                t.mates -= 1;
                next.push(t);
                for x in mate_write_backs(config.mate_write_back, s.fence[i], s.high) {
                    let mut t = s;
                    t.fence[i] = Some(match config.mate_write_back {
                        MateWriteBack::Set => x,
                        _ => s.fence[i].map_or(x, |f| f.max(x)),
                    });
                    t.mates -= 1;
                    next.push(t);
                }
            }
            if config.late_clients && s.status[i] == DOWN && !s.touched(i) {
                let mut t = s;
                t.status[i] = UP;
                next.push(t);
            }
            let rule = config.reseed;
            if s.status[i] == DOWN && (rule.in_parallel || !s.touched(i)) {
                for sources in 1..(1u8 << N) {
                    let eligible = (0..N).all(|j| {
                        sources & (1 << j) == 0
                            || (j != i
                                && (s.status[j] == UP
                                    || (rule.unseeded_are_sources && s.status[j] == DOWN)))
                    });
                    if !eligible || (sources.count_ones() as usize) < threshold {
                        continue;
                    }
                    let mut t = s;
                    let read: Vec<Option<u8>> = (0..N)
                        .filter(|j| sources & (1 << j) != 0)
                        .map(|j| s.fence[j])
                        .collect();
                    let max = read.iter().flatten().max().copied();
                    let lacks = read.iter().any(Option::is_none);
                    let copy = match max {
                        Some(m) if lacks && rule.clock_floor => Some(m.max(s.max_handed())),
                        other => other,
                    };
                    // Raise-only (`reseed.lua`).
                    t.fence[i] = t.fence[i].max(copy);
                    t.status[i] = WAITING;
                    next.push(t);
                }
            }
        }
        lit_queue(config, &s, &mut next);
        for mut t in next {
            lit_forget_ignored(&mut t);
            // `high` is read only while a bucket-mate step is left.
            t.high = if t.mates > 0 {
                t.fence.iter().flatten().fold(t.high, |h, &f| h.max(f))
            } else {
                0
            };
            for i in 0..N {
                if t.status[i] == WAITING && !t.touched(i) {
                    t.status[i] = UP;
                }
            }
            if seen.insert(lit_fingerprint(&t)) {
                stack.push(t);
            }
        }
    }
    Literal {
        events,
        states: seen.len(),
        handovers,
    }
}

/// The fair queue's transitions from `s`: pre-grants (a release on a home
/// names an idle client; with a handover when the key there was a released
/// holder's), and notices landing, counted without asking the home or not.
fn lit_queue<const N: usize>(config: &Config<'_>, s: &LitState<N>, next: &mut Vec<LitState<N>>) {
    if s.pregrants > 0 {
        for (c, &budget) in config.attempts.iter().enumerate() {
            let (attempt, phase, _) = s.clients[c];
            if phase != LitPhase::Idle || attempt >= budget {
                continue;
            }
            for h in 0..N {
                let votes = s.status[h] == UP;
                if !votes && config.pregrant_from == PregrantFrom::VotingHome {
                    continue;
                }
                // The release deletes its holder's key; `SET NX` then
                // finds the key free, unless it must stay.
                if s.protected(config.leases, s.holder[h]) {
                    continue;
                }
                let mut handovers = vec![None];
                match config.handover {
                    Handover::Off => {}
                    Handover::ReleasedHolder if s.holder[h].is_none() => {}
                    _ => handovers.push(Some(s.holder[h])),
                }
                for handed in handovers {
                    let mut t = *s;
                    let seed = t.max_handed();
                    let fence = fence_u8(next_fence(u64::from(t.fence[h].unwrap_or(seed))));
                    t.fence[h] = Some(fence);
                    t.holder[h] = Some((c, attempt + 1));
                    t.clients[c] = (attempt + 1, LitPhase::Acquiring([None; N]), t.max_handed());
                    t.notices[c] = Some((h, fence));
                    t.handed_over[c] = handed;
                    t.pregrants -= 1;
                    next.push(t);
                }
            }
        }
    }
    for c in 0..config.attempts.len() {
        let Some((h, fence)) = s.notices[c] else {
            continue;
        };
        let (attempt, _, _) = s.clients[c];
        let counts = match config.pregrant_from {
            PregrantFrom::AnyHomeCheckedByWaiter => s.status[h] == UP,
            _ => true,
        };
        for counted in [true, false] {
            if counted && !counts {
                continue;
            }
            let mut t = *s;
            t.notices[c] = None;
            let mut got = [None; N];
            for (j, g) in got.iter_mut().enumerate() {
                if counted && j == h {
                    *g = Some(Some(fence));
                } else if t.status[j] == UP {
                    t.requests[c][j].push(LitRequest::Acquire { attempt });
                } else {
                    // Refused locally: the node does not vote.
                    *g = Some(None);
                }
            }
            t.clients[c].1 = LitPhase::Acquiring(got);
            lit_decide(&mut t, c);
            next.push(t);
        }
    }
}

/// 128 bits of SipHash: two hashes of the state under different prefixes.
fn lit_fingerprint<const N: usize>(s: &LitState<N>) -> u128 {
    let lane = |prefix: u8| {
        let mut h = DefaultHasher::new();
        prefix.hash(&mut h);
        s.hash(&mut h);
        h.finish()
    };
    (u128::from(lane(0)) << 64) | u128::from(lane(1))
}

/// Drops the answers their client will ignore: of an earlier attempt, or
/// of a phase it has left, or for a node it already heard from. (Delivering
/// and ignoring them changes nothing, so this is the one reduction the
/// literal model makes: without it, [1, 1] alone has 628,159 states.) Also
/// the notice and the handover of an attempt that is over.
fn lit_forget_ignored<const N: usize>(s: &mut LitState<N>) {
    for (c, &(current, phase, _)) in s.clients.iter().enumerate() {
        if phase == LitPhase::Idle {
            s.notices[c] = None;
            s.handed_over[c] = None;
        }
        for (i, q) in s.answers[c].iter_mut().enumerate() {
            q.retain(|a| match (phase, *a) {
                (
                    LitPhase::Acquiring(got),
                    LitAnswer::Granted { attempt, .. } | LitAnswer::Refused { attempt },
                ) => attempt == current && got[i].is_none(),
                (
                    LitPhase::WritingBack { votes, .. },
                    LitAnswer::WriteBackOk { attempt } | LitAnswer::NotHeld { attempt },
                ) => attempt == current && votes[i] == LitVote::Pending,
                _ => false,
            });
        }
    }
}

/// An attempt whose votes make its quorum impossible fails now (as a
/// refused answer would make it).
fn lit_decide<const N: usize>(s: &mut LitState<N>, c: usize) {
    let mut tally = Tally::new(N);
    match s.clients[c].1 {
        LitPhase::Acquiring(got) => {
            for g in got.iter().flatten() {
                tally.record(g.is_some());
            }
        }
        LitPhase::WritingBack { votes, .. } => {
            for v in votes.iter().filter(|&&v| v != LitVote::Pending) {
                tally.record(*v == LitVote::Yes);
            }
        }
        LitPhase::Idle | LitPhase::Holding(_) => return,
    }
    if tally.decision() == Decision::Impossible {
        s.clients[c].1 = LitPhase::Idle;
    }
}

/// The client's handling of one answer, as `Client::attempt` and
/// `settle_token` do it. Returns the hand-out, if it makes one.
fn lit_answer<const N: usize>(
    config: &Config<'_>,
    s: &mut LitState<N>,
    c: usize,
    i: usize,
    answer: LitAnswer,
) -> Option<Event> {
    let (current, phase, floor) = s.clients[c];
    let token = match (phase, answer) {
        (
            LitPhase::Acquiring(mut got),
            LitAnswer::Granted { attempt, .. } | LitAnswer::Refused { attempt },
        ) if attempt == current => {
            got[i] = Some(match answer {
                LitAnswer::Granted { fence, .. } => Some(fence),
                _ => None,
            });
            let mut tally = Tally::new(N);
            for g in got.iter().flatten() {
                tally.record(g.is_some());
            }
            s.clients[c].1 = LitPhase::Acquiring(got);
            match tally.decision() {
                Decision::Pending => return None,
                Decision::Impossible => {
                    s.clients[c].1 = LitPhase::Idle;
                    return None;
                }
                Decision::Reached => {}
            }
            let fences: Vec<u64> = got
                .iter()
                .flatten()
                .flatten()
                .map(|&f| u64::from(f))
                .collect();
            let m = merge(&fences)?;
            let token = fence_u8(m.token);
            if config.variant != Variant::Naive && m.needs_write_back(quorum(N)) {
                let mut votes = [LitVote::No; N];
                for j in 0..N {
                    match got[j] {
                        Some(Some(f)) if f == token => votes[j] = LitVote::Yes,
                        // Restarted since it granted: refused locally.
                        Some(Some(_)) if s.status[j] != UP => {}
                        Some(Some(_)) => {
                            votes[j] = LitVote::Pending;
                            s.requests[c][j].push(LitRequest::WriteBack {
                                attempt: current,
                                token,
                            });
                        }
                        _ => {}
                    }
                }
                s.clients[c].1 = LitPhase::WritingBack { token, votes };
                lit_decide(s, c);
                return None;
            }
            token
        }
        (
            LitPhase::WritingBack { token, mut votes },
            LitAnswer::WriteBackOk { attempt } | LitAnswer::NotHeld { attempt },
        ) if attempt == current && votes[i] == LitVote::Pending => {
            votes[i] = if matches!(answer, LitAnswer::WriteBackOk { .. }) {
                LitVote::Yes
            } else {
                LitVote::No
            };
            let mut tally = Tally::new(N);
            for v in votes.iter().filter(|&&v| v != LitVote::Pending) {
                tally.record(*v == LitVote::Yes);
            }
            s.clients[c].1 = LitPhase::WritingBack { token, votes };
            match tally.decision() {
                Decision::Pending => return None,
                Decision::Impossible => {
                    s.clients[c].1 = LitPhase::Idle;
                    return None;
                }
                Decision::Reached => token,
            }
        }
        // An answer of an earlier attempt, or of the other phase: ignored.
        _ => return None,
    };
    let event = Event {
        client: c,
        attempt: current,
        token,
        not_monotonic: token <= floor,
        duplicate: s.handed & (1 << token) != 0,
        overlaps: config.leases
            && (0..C).any(|o| o != c && matches!(s.clients[o].1, LitPhase::Holding(_))),
    };
    s.handed |= 1 << token;
    s.clients[c].1 = if config.leases {
        // The nodes that granted, counted for the restart guard's window
        // until the lease ends (none under the short-window control).
        let mut counted = [false; N];
        if !config.short_window {
            for (j, k) in counted.iter_mut().enumerate() {
                *k = match s.clients[c].1 {
                    LitPhase::Acquiring(got) => matches!(got[j], Some(Some(_))),
                    LitPhase::WritingBack { votes, .. } => votes[j] != LitVote::No,
                    _ => false,
                };
            }
        }
        LitPhase::Holding(counted)
    } else {
        LitPhase::Idle
    };
    Some(event)
}
