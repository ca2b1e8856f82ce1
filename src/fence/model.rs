//! Exhaustive model check of the fencing-token protocol, over N = 3 nodes
//! and a handful of clients, driven by the real pure logic: [`merge`],
//! [`Merge::needs_write_back`](super::Merge::needs_write_back) and
//! [`next_fence`] from the parent module, [`quorum`] and [`Tally`] from
//! `quorum.rs`.
//!
//! Test-only and one concept: the model, its exploration and its negative
//! controls belong together, hence the length.
//!
//! # What is modelled
//!
//! * **Nodes** hold the lock key (free, or held by one attempt) and the
//!   fence. An acquire is one atomic step: if the key is free, take it,
//!   move the fence to `fence + 1` and answer `Granted(fence)`, else refuse.
//!   A refusal may move the fence too, or not: the implementation's
//!   `MULTI … INCR … EXEC` moves it on every attempt, a script that moves
//!   it only on grants does not, and the model allows either at each
//!   refusal, so it covers both. A write-back is one atomic step: if this
//!   attempt still holds the key there, `fence = max(fence, T)` and answer
//!   `Ok`, else answer `NotHeld`. Nodes never lose their fence (no restart
//!   without data): the assumption the proof needs, so an assumption of the
//!   model. All fences start equal (0); unequal starting fences are reached
//!   anyway through acquires of abandoned attempts and refusals.
//! * **A lock key may vanish at any moment**: TTL expiry, a node's clock
//!   jumping, eviction, and every compare-and-delete release. Releases are
//!   therefore not messages here: whatever a release can do, a key
//!   vanishing at the same moment does too. (How this is explored without
//!   a transition of its own: "keys vanish lazily", below.)
//! * **Clients** run their attempts one after the other, each under a fresh
//!   identity. An attempt sends an acquire to every node and decides at the
//!   first certain outcome, like `Client::attempt` and `settle_token`: at a
//!   quorum of grants it merges their fences; if the maximum `T` was
//!   reported by a quorum it hands `T` out, otherwise it sends
//!   `WriteBack(T)` to the granting nodes that reported less and hands `T`
//!   out once the nodes that reported `T` plus the `Ok` write-backs make a
//!   quorum (nodes that did not grant count no, as in
//!   `FanOut::start_credited`). A client may give up on an attempt at any
//!   moment (its timeout); it then ignores every answer of that attempt and
//!   may start its next one. A handed-out token plays no further part in
//!   the protocol, so the client may start its next attempt at once.
//!   Concurrent acquires of one process are separate clients here, with
//!   separate channels, which allows more interleavings than one shared
//!   connection per node does.
//! * **The network**: one channel each way per (client, node) pair. A
//!   channel is FIFO, as one TCP connection is: messages arrive in the
//!   order sent, any of them may be lost, delays are arbitrary, and
//!   channels of different pairs interleave in every order. Loss is the
//!   transition "deliver the k-th message in flight; the ones before it
//!   were lost" (a message never delivered needs no transition). Messages
//!   of an attempt the client gave up on stay in flight and may land after
//!   its next attempt started. FIFO holds within one connection; after a
//!   reconnect, a segment of the old connection could in principle reach
//!   the server after the new one's, so [`Network::Unordered`] (any request
//!   in flight may land next) is checked too, in an ignored test.
//!
//! # What is checked, on every transition
//!
//! * **Strict monotonicity**: a token handed out is larger than every token
//!   handed out, by anyone, before its attempt began.
//! * **Uniqueness**: no two hand-outs carry the same token, also while two
//!   attempts hold the lock at once because keys vanished early.
//! * Sanity, so that the above are not vacuous: hand-outs happen, some of
//!   them after a write-back, and some write-backs lose their key.
//!
//! The negative controls show that the checker can fail: [`Variant::Naive`]
//! (no write-back: hand out the maximum at once) breaks both properties;
//! [`Variant::NoOwnerCheck`] (the write-back raises the fence even where the
//! attempt no longer holds the key) hands out duplicates while staying
//! monotonic.
//!
//! # Keeping the state space small
//!
//! Every reduction below merges states whose futures are the same as far as
//! hand-outs are concerned; none removes a behaviour.
//!
//! * **Keys vanish lazily.** Whether a key is still there is observed only
//!   when a request lands on its node, so instead of a "vanish" transition
//!   between any two steps, each landing may find the key gone. An acquire
//!   that lands is granted (whatever key was there having vanished), or,
//!   where some acquire was granted before, refused with the fence moved;
//!   a refusal that leaves the fence alone has the same effect as the
//!   acquire being lost, and a write-back finding its key gone has the
//!   same effect as being lost too (see the next point). The holder of a key is thus the attempt whose acquire
//!   was last granted there, and the model never relies on mutual
//!   exclusion, only on what the fences give.
//! * **Answers that can only hasten a give-up are not sent**: `Refused`
//!   (the refusal's move of the fence is modelled) and `NotHeld`. Their
//!   only effect on the client is to make a quorum impossible sooner, and the client may give up at any
//!   moment anyway. Likewise an attempt that can no longer reach a quorum
//!   (too few grants still possible, or too few write-backs that can still
//!   succeed) gives up at once: waiting, then timing out, changes nothing
//!   but when its next attempt may start, which is free anyway.
//! * **What can no longer matter is forgotten** ([`Model::prune`]): answers
//!   the client will ignore, write-backs that can neither raise a fence nor
//!   be waited for, the identity of a key holder or an acquire that no
//!   write-back can ask about (it becomes anonymous), the floor of an
//!   attempt whose token is certainly above it, and handed-out tokens below
//!   every token that can still be handed out. Deleting a message whose
//!   delivery would change nothing is the same as losing it.
//! * **Compact state**: after pruning at most one answer per channel can
//!   matter and a request channel holds a few messages, so a state is a few
//!   fixed arrays of small integers (76 bytes).
//! * **Symmetry**: nodes are interchangeable, and so are clients with the
//!   same number of attempts. The visited set holds a fingerprint of the
//!   class: nodes sorted together with their channels and with what each
//!   client knows about them, clients renamed everywhere (key holders
//!   included). The search continues from the state as reached, so names
//!   in a trace stay stable.
//! * **Hash compaction**: the visited set stores 128-bit fingerprints. Two
//!   different classes collide with probability about s²/2¹²⁹ for s states
//!   (below 10⁻²² for 10⁸); a collision could hide states, never invent a
//!   violation.
//!
//! # Checking the reductions
//!
//! * A literal model ([`literal`]) has none of the above but dropping
//!   answers the client will ignore: an explicit "vanish" transition,
//!   refusals (moving the fence or not) and `NotHeld` answers, full attempt
//!   identities, no symmetry. The reduced model must reach exactly the
//!   same hand-outs (who, which token, which verdicts), checked for [1, 1]
//!   and [2, 1] (tens of millions of literal states) in ignored tests.
//! * Forgetting tokens rests on lower bounds ([`Model::bounds`]); an audit
//!   checks on every transition that they never shrink and that every
//!   hand-out respects them. Runs with and without forgetting and symmetry
//!   must reach the same hand-outs.
//! * Symmetry must keep the length of the shortest counterexample.
//!
//! # Not modelled
//!
//! A fence key that expires (its retention) and is seeded again from a
//! client's clock, a node restarting without its data, more than three nodes,
//! and the clients' validity arithmetic (a client may give up at any moment,
//! which covers every timeout).
//!
//! The default `cargo test` runs the small configurations; the larger ones
//! are ignored: `cargo test --release --lib -- --ignored model`.

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::fmt::Write as _;
use std::hash::{BuildHasherDefault, DefaultHasher, Hash, Hasher};
use std::time::{Duration, Instant};

use super::{merge, next_fence};
use crate::quorum::{quorum, Decision, Tally};

/// Appends to a trace line; formats only when a trace is being written.
macro_rules! note {
    ($log:expr, $($arg:tt)*) => {
        if let Some(line) = $log.as_mut() {
            let _ = write!(line, $($arg)*);
        }
    };
}

/// Nodes in the model.
const N: usize = 3;
/// Room for clients; a configuration uses the first few.
const C: usize = 3;
/// Room in one client → node channel: the current attempt's message, a
/// write-back of an older attempt that still holds the key there, and
/// acquires of given-up attempts. Running out is reported, never truncated.
const QCAP: usize = 4;
/// Fences are 4-bit fields; a fence grows by one per grant, so
/// N × (all attempts) ≤ 15 bounds the configurations.
const MAX_FENCE: u8 = 15;
/// Attempt numbers are 3-bit fields.
const MAX_ATTEMPTS: u8 = 7;
/// "No bound": larger than every token.
const UNBOUNDED: u8 = u8::MAX;

// The holder of a node's lock key: the attempt whose acquire was granted
// there last (see "keys vanish lazily" in the module docs).
/// No acquire was ever granted here, so none can be refused.
const FREE: u8 = 0;
/// An attempt no write-back can ask about any more.
const ANON: u8 = 1;
/// `attempt` (≥ 1) of `client`, which a write-back may still ask about.
const fn live(client: usize, attempt: u8) -> u8 {
    2 + (client as u8) * 8 + attempt
}
const fn live_parts(holder: u8) -> Option<(usize, u8)> {
    if holder < 2 {
        None
    } else {
        Some((((holder - 2) / 8) as usize, (holder - 2) % 8))
    }
}

// Client → node requests; 0 is an empty slot.
/// An acquire nobody awaits: its attempt is over or past acquiring.
const ACQ_ANON: u8 = 1;
/// An acquire of the client's current attempt, which is still acquiring.
const ACQ_LIVE: u8 = 2;
/// `WriteBack(token)` of `attempt`.
const fn write_back(attempt: u8, token: u8) -> u8 {
    0x80 | (attempt << 4) | token
}
const fn write_back_parts(msg: u8) -> Option<(u8, u8)> {
    if msg & 0x80 == 0 {
        None
    } else {
        Some(((msg >> 4) & 0x7, msg & 0xF))
    }
}

// Node → client answers; 0 is none.
const R_WB_OK: u8 = 1;
/// `Granted(fence)` is `R_GRANTED | fence`.
const R_GRANTED: u8 = 0x10;
const fn granted_fence(msg: u8) -> Option<u8> {
    if msg & 0xF0 == R_GRANTED {
        Some(msg & 0xF)
    } else {
        None
    }
}

// Client phases.
const IDLE: u8 = 0;
const ACQUIRING: u8 = 1;
const WRITING_BACK: u8 = 2;

// What the current attempt knows about a node (`Link::seen`). Acquiring:
// 0 nothing yet, or `R_GRANTED | fence`. Writing back: 0 not asked (it did
// not grant, or the write-back lost its key), or one of these.
const S_STORED: u8 = 1;
const S_PENDING: u8 = 2;

/// The protocol variant under check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// The protocol as implemented.
    WriteBack,
    /// Negative control: hand out the maximum of the granted fences at
    /// once, never writing back.
    Naive,
    /// Negative control: the write-back raises the fence, and answers `Ok`,
    /// whether or not the attempt still holds the key there.
    NoOwnerCheck,
}

/// Ordering of the client → node channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Network {
    /// One TCP connection per pair: in order, with loss.
    Fifo,
    /// Any request in flight may land next.
    Unordered,
}

/// One client ↔ one node: both channels, and the client's knowledge of the
/// node. Kept inside the node so that permuting nodes carries it along.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
struct Link {
    /// Requests in flight, oldest first, empty slots (0) at the end.
    req: [u8; QCAP],
    /// The answer in flight that still matters, or 0.
    reply: u8,
    /// What the client's current attempt knows about this node.
    seen: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
struct Node {
    holder: u8,
    fence: u8,
    links: [Link; C],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
struct ClientState {
    /// Attempts started so far: the current one's number.
    attempt: u8,
    phase: u8,
    /// The largest token handed out before the current attempt began; 0
    /// once the attempt's token is certainly larger.
    floor: u8,
    /// The token being written back.
    token: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct State {
    nodes: [Node; N],
    clients: [ClientState; C],
    /// Bit `t`: token `t` was handed out (pruned to the bits that matter).
    handed: u32,
}

impl State {
    /// The largest token handed out so far (0: none; tokens start at 1).
    fn max_handed(&self) -> u8 {
        (32 - self.handed.leading_zeros()).saturating_sub(1) as u8
    }
}

/// One transition; indices are positions in the state it applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// The client starts its next attempt.
    Start(usize),
    /// The client's current attempt times out.
    GiveUp(usize),
    /// The request at `index` of the client → node channel lands; on a FIFO
    /// channel the ones before it were lost. An acquire is granted, or with
    /// `refused` finds the key still held and only moves the fence.
    Request {
        client: usize,
        node: usize,
        index: usize,
        refused: bool,
    },
    /// The node → client answer lands.
    Reply { client: usize, node: usize },
}

/// A hand-out, with what the checker judges it by.
#[derive(Debug, Clone, Copy)]
struct HandOut {
    client: usize,
    attempt: u8,
    token: u8,
    floor: u8,
    duplicate: bool,
    written_back: bool,
}

impl HandOut {
    fn not_monotonic(&self) -> bool {
        self.token <= self.floor
    }
}

/// What a transition did that the report counts.
#[derive(Debug, Clone, Copy, Default)]
struct Effects {
    hand_out: Option<HandOut>,
    /// Awaited write-backs cancelled because their key passed to another
    /// attempt (they could only have answered `NotHeld`).
    lost_write_backs: u32,
}

/// What to check, and how.
#[derive(Debug, Clone, Copy)]
struct Config<'a> {
    variant: Variant,
    network: Network,
    /// Attempts per client.
    attempts: &'a [u8],
    /// Breadth-first up to the first violation (whose trace is then the
    /// shortest), instead of depth-first through every state.
    first_violation: bool,
    /// Reduce by node and client symmetry.
    symmetry: bool,
    /// Forget floors and handed-out tokens that can no longer matter.
    forget_tokens: bool,
    /// Check on every transition that the bounds behind `forget_tokens`
    /// hold (see [`Model::audit`]).
    audit: bool,
}

impl<'a> Config<'a> {
    const fn new(variant: Variant, attempts: &'a [u8]) -> Self {
        Self {
            variant,
            network: Network::Fifo,
            attempts,
            first_violation: false,
            symmetry: true,
            forget_tokens: true,
            audit: false,
        }
    }
}

/// Which property a hand-out broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Broken {
    Monotonicity,
    Uniqueness,
}

#[derive(Debug)]
struct Violation {
    broken: Broken,
    /// The transitions from the initial state, one line each.
    trace: Vec<String>,
}

/// The outcome of one exploration.
#[derive(Debug, Default)]
struct Report {
    states: usize,
    transitions: u64,
    hand_outs: u64,
    /// Hand-outs that needed a write-back.
    written_back: u64,
    /// Awaited write-backs cancelled by their key passing to another attempt.
    lost_write_backs: u64,
    /// Longest path (depth-first) or counterexample length (breadth-first).
    depth: usize,
    elapsed: Duration,
    /// The first violation found of each property.
    monotonicity: Option<Violation>,
    uniqueness: Option<Violation>,
    /// Every kind of hand-out seen.
    events: BTreeSet<Event>,
}

/// A hand-out as the cross-check with the literal model compares them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Event {
    client: usize,
    attempt: u8,
    token: u8,
    not_monotonic: bool,
    duplicate: bool,
}

impl Report {
    fn record(&mut self, effects: &Effects) {
        self.transitions += 1;
        self.lost_write_backs += u64::from(effects.lost_write_backs);
        if let Some(h) = effects.hand_out {
            self.hand_outs += 1;
            self.written_back += u64::from(h.written_back);
            self.events.insert(Event {
                client: h.client,
                attempt: h.attempt,
                token: h.token,
                not_monotonic: h.not_monotonic(),
                duplicate: h.duplicate,
            });
        }
    }

    fn summary(&self, config: &Config<'_>) -> String {
        format!(
            "{:?}/{:?} attempts {:?}{}: {} states, {} transitions, depth {}, {} hand-outs \
             ({} after a write-back), {} write-backs lost their key, {:.2?}{}{}",
            config.variant,
            config.network,
            config.attempts,
            if config.symmetry {
                ""
            } else {
                " (no symmetry)"
            },
            self.states,
            self.transitions,
            self.depth,
            self.hand_outs,
            self.written_back,
            self.lost_write_backs,
            self.elapsed,
            if self.monotonicity.is_some() {
                ", NOT MONOTONIC"
            } else {
                ""
            },
            if self.uniqueness.is_some() {
                ", DUPLICATE TOKEN"
            } else {
                ""
            },
        )
    }
}

struct Model<'a> {
    config: Config<'a>,
    quorum: usize,
    /// Client renamings that map every client to one with as many attempts
    /// (the identity first).
    renamings: Vec<[usize; C]>,
}

type Visited = HashSet<u128, BuildHasherDefault<Prehashed>>;

/// A depth-first frame: a state and the transitions left to try from it.
struct Frame {
    state: State,
    steps: Vec<Step>,
    next: usize,
}

impl<'a> Model<'a> {
    fn new(config: Config<'a>) -> Self {
        assert!((1..=C).contains(&config.attempts.len()), "1 to {C} clients");
        assert!(
            config.attempts.iter().all(|&a| a <= MAX_ATTEMPTS),
            "at most {MAX_ATTEMPTS} attempts per client"
        );
        let total: usize = config.attempts.iter().map(|&a| usize::from(a)).sum();
        assert!(
            total * N <= usize::from(MAX_FENCE),
            "fences must fit in 4 bits"
        );
        let mut model = Self {
            config,
            quorum: quorum(N),
            renamings: Vec::new(),
        };
        model.renamings = permutations()
            .into_iter()
            .filter(|p| config.symmetry || *p == [0, 1, 2])
            .filter(|p| (0..C).all(|c| model.budget(p[c]) == model.budget(c)))
            .collect();
        model
    }

    fn budget(&self, client: usize) -> u8 {
        self.config.attempts.get(client).copied().unwrap_or(0)
    }

    fn checks_owner(&self) -> bool {
        self.config.variant == Variant::WriteBack
    }

    /// Every transition enabled in `s`.
    fn steps(&self, s: &State, out: &mut Vec<Step>) {
        out.clear();
        let clients = self.config.attempts.len();
        for c in 0..clients {
            match s.clients[c].phase {
                IDLE if s.clients[c].attempt < self.budget(c) => out.push(Step::Start(c)),
                IDLE => {}
                _ => out.push(Step::GiveUp(c)),
            }
        }
        for (n, node) in s.nodes.iter().enumerate() {
            for (c, link) in node.links[..clients].iter().enumerate() {
                for (index, &msg) in link.req.iter().take_while(|&&m| m != 0).enumerate() {
                    let step = |refused| Step::Request {
                        client: c,
                        node: n,
                        index,
                        refused,
                    };
                    out.push(step(false));
                    // A refusal needs a key there, and differs from a grant
                    // unless both leave an anonymous holder.
                    if node.holder != FREE && (msg == ACQ_LIVE || node.holder != ANON) {
                        out.push(step(true));
                    }
                }
                if link.reply != 0 {
                    out.push(Step::Reply { client: c, node: n });
                }
            }
        }
    }

    /// Applies `step` to `s`, then prunes. With `log`, also describes the
    /// step in one line (formatting only then: this is the hot path).
    fn apply(&self, s: &State, step: Step, mut log: Option<&mut String>) -> (State, Effects) {
        let mut n = *s;
        let mut effects = Effects::default();
        match step {
            Step::Start(c) => {
                let floor = n.max_handed();
                let cl = &mut n.clients[c];
                cl.attempt += 1;
                cl.phase = ACQUIRING;
                cl.floor = floor;
                let attempt = cl.attempt;
                for node in &mut n.nodes {
                    push(&mut node.links[c].req, ACQ_LIVE);
                }
                note!(
                    log,
                    "{} starts (largest token so far {floor})",
                    who(c, attempt)
                );
            }
            Step::GiveUp(c) => {
                n.clients[c].phase = IDLE;
                note!(log, "{} gives up", who(c, s.clients[c].attempt));
            }
            Step::Request {
                client: c,
                node: i,
                index,
                refused,
            } => {
                let req = &mut n.nodes[i].links[c].req;
                let msg = req[index];
                // FIFO: the ones before it were lost. Unordered: only it
                // leaves the channel.
                let from = match self.config.network {
                    Network::Fifo => 0,
                    Network::Unordered => index,
                };
                let removed = index + 1 - from;
                req.copy_within(index + 1.., from);
                req[QCAP - removed..].fill(0);
                if removed > 1 {
                    note!(log, "({} lost) ", removed - 1);
                }
                self.deliver_request(&mut n, c, i, msg, refused, reborrow(&mut log));
            }
            Step::Reply { client: c, node: i } => {
                let reply = std::mem::take(&mut n.nodes[i].links[c].reply);
                effects.hand_out = self.deliver_reply(&mut n, c, i, reply, reborrow(&mut log));
            }
        }
        effects.lost_write_backs = self.prune(&mut n);
        if let (Some(log), true) = (log, effects.lost_write_backs > 0) {
            let _ = write!(
                log,
                " [{} write-back(s) can no longer succeed]",
                effects.lost_write_backs
            );
        }
        (n, effects)
    }

    fn deliver_request(
        &self,
        s: &mut State,
        c: usize,
        i: usize,
        msg: u8,
        refused: bool,
        mut log: Option<&mut String>,
    ) {
        let attempt = s.clients[c].attempt;
        let node = &mut s.nodes[i];
        let mut reply = 0;
        if let Some((a, token)) = write_back_parts(msg) {
            let ok = !self.checks_owner() || node.holder == live(c, a);
            let before = node.fence;
            if ok {
                node.fence = node.fence.max(token);
                let cl = &s.clients[c];
                if a == cl.attempt && cl.phase == WRITING_BACK {
                    reply = R_WB_OK;
                }
                note!(
                    log,
                    "n{i} ← {} write-back {token}: ok, fence {before} → {}",
                    who(c, a),
                    node.fence
                );
            } else {
                // Pruning removes such a write-back as soon as the key is
                // not its attempt's: it never lands.
                unreachable!("a write-back that fails the ownership check was kept");
            }
        } else {
            // Either way the fence moves (see "refusals" in the module
            // docs). Granted: whatever key was there had vanished.
            let is_live = msg == ACQ_LIVE;
            node.fence = fence_u8(next_fence(u64::from(node.fence)));
            note!(
                log,
                "n{i} ← {} acquire: ",
                if is_live {
                    who(c, attempt)
                } else {
                    format!("c{c} (abandoned)")
                }
            );
            if refused {
                note!(log, "refused, fence {}", node.fence);
            } else {
                if let Some((h, a)) = live_parts(node.holder) {
                    note!(log, "key of {} vanished; ", who(h, a));
                }
                node.holder = if is_live { live(c, attempt) } else { ANON };
                if is_live {
                    reply = R_GRANTED | node.fence;
                }
                note!(log, "granted, fence {}", node.fence);
            }
        }
        if reply != 0 {
            let slot = &mut s.nodes[i].links[c].reply;
            // An attempt awaits one answer per node at a time and sends the
            // node its next request only after that answer landed.
            assert_eq!(*slot, 0, "two answers that matter on one channel");
            *slot = reply;
        }
    }

    fn deliver_reply(
        &self,
        s: &mut State,
        c: usize,
        i: usize,
        reply: u8,
        mut log: Option<&mut String>,
    ) -> Option<HandOut> {
        let attempt = s.clients[c].attempt;
        note!(log, "{} ← n{i} ", who(c, attempt));
        let mut hand_out = None;
        if let Some(fence) = granted_fence(reply) {
            note!(log, "granted {fence}");
            s.nodes[i].links[c].seen = reply;
            let mut tally = Tally::new(N);
            let mut fences = [0u64; N];
            let mut granted = 0;
            for node in &s.nodes {
                if let Some(f) = granted_fence(node.links[c].seen) {
                    tally.record(true);
                    fences[granted] = u64::from(f);
                    granted += 1;
                }
            }
            if tally.decision() == Decision::Reached {
                let Some(m) = merge(&fences[..granted]) else {
                    unreachable!("a quorum without grants")
                };
                let token = fence_u8(m.token);
                note!(log, " → token {token}, reported by {}", m.stored);
                if self.config.variant == Variant::Naive || !m.needs_write_back(self.quorum) {
                    hand_out = Some(self.hand_out(s, c, token, false));
                } else {
                    note!(log, "; write back to");
                    s.clients[c].phase = WRITING_BACK;
                    s.clients[c].token = token;
                    for (j, node) in s.nodes.iter_mut().enumerate() {
                        let link = &mut node.links[c];
                        link.seen = match granted_fence(link.seen) {
                            None => 0,
                            Some(f) if f == token => S_STORED,
                            Some(_) => {
                                push(&mut link.req, write_back(attempt, token));
                                note!(log, " n{j}");
                                S_PENDING
                            }
                        };
                    }
                }
            }
        } else {
            assert_eq!(reply, R_WB_OK, "unknown answer");
            note!(log, "write-back ok");
            s.nodes[i].links[c].seen = S_STORED;
            if self.write_back_tally(s, c) == Decision::Reached {
                let token = s.clients[c].token;
                note!(log, " → token {token}");
                hand_out = Some(self.hand_out(s, c, token, true));
            }
        }
        if let Some(h) = hand_out {
            note!(
                log,
                " HANDED OUT (floor {}){}{}",
                h.floor,
                if h.not_monotonic() {
                    "  <-- NOT ABOVE AN EARLIER TOKEN"
                } else {
                    ""
                },
                if h.duplicate { "  <-- DUPLICATE" } else { "" },
            );
        }
        hand_out
    }

    /// The write-back's decision, as `FanOut::start_credited` counts it:
    /// nodes that reported the token (or answered `Ok`) are yes, nodes not
    /// asked are no, the rest are pending.
    fn write_back_tally(&self, s: &State, c: usize) -> Decision {
        let mut tally = Tally::new(N);
        for node in &s.nodes {
            match node.links[c].seen {
                S_PENDING => {}
                seen => {
                    tally.record(seen == S_STORED);
                }
            }
        }
        tally.decision()
    }

    fn hand_out(&self, s: &mut State, c: usize, token: u8, written_back: bool) -> HandOut {
        let h = HandOut {
            client: c,
            attempt: s.clients[c].attempt,
            token,
            floor: s.clients[c].floor,
            duplicate: s.handed & (1 << token) != 0,
            written_back,
        };
        s.handed |= 1 << token;
        s.clients[c].phase = IDLE;
        h
    }

    /// Forgets whatever can no longer influence a hand-out, and gives up
    /// attempts that can no longer reach a quorum (see the module docs).
    /// Every rule tests a condition that cannot become false again, which
    /// is what makes forgetting safe. Returns the number of awaited
    /// write-backs cancelled because their key is no longer theirs.
    fn prune(&self, s: &mut State) -> u32 {
        let checks_owner = self.checks_owner();
        let mut lost = 0;

        // A write-back that fails the ownership check would change nothing
        // but the client's count: drop it, and un-await its node. (The
        // attempt's acquire landed before the write-back was sent, so once
        // the key is not the attempt's it never will be again.)
        if checks_owner {
            for node in &mut s.nodes {
                let holder = node.holder;
                for (c, link) in node.links.iter_mut().enumerate() {
                    let cl = &s.clients[c];
                    let before = link.req;
                    retain(&mut link.req, |m| {
                        write_back_parts(m).is_none_or(|(a, _)| holder == live(c, a))
                    });
                    if link.req != before && cl.phase == WRITING_BACK && link.seen == S_PENDING {
                        let still = link
                            .req
                            .iter()
                            .any(|&m| write_back_parts(m).is_some_and(|(a, _)| a == cl.attempt));
                        if !still && link.reply != R_WB_OK {
                            link.seen = 0;
                            lost += 1;
                        }
                    }
                }
            }
        }

        // Attempts that can no longer reach a quorum give up now.
        for c in 0..C {
            let giving_up = match s.clients[c].phase {
                ACQUIRING => self.acquire_bound(s, c) == UNBOUNDED,
                WRITING_BACK => self.write_back_tally(s, c) == Decision::Impossible,
                _ => false,
            };
            if giving_up {
                s.clients[c].phase = IDLE;
            }
        }

        // Per-attempt state of idle clients, answers nobody awaits,
        // acquires nobody awaits, write-backs that change nothing.
        let clients = s.clients;
        for (c, cl) in clients.iter().enumerate() {
            if cl.phase == IDLE {
                s.clients[c] = ClientState {
                    attempt: cl.attempt,
                    ..ClientState::default()
                };
            }
        }
        for node in &mut s.nodes {
            let (holder, fence) = (node.holder, node.fence);
            for (c, cl) in clients.iter().enumerate() {
                let link = &mut node.links[c];
                let awaited = match cl.phase {
                    ACQUIRING => granted_fence(link.reply).is_some() && link.seen == 0,
                    WRITING_BACK => link.reply == R_WB_OK && link.seen == S_PENDING,
                    _ => false,
                };
                if !awaited {
                    link.reply = 0;
                }
                if cl.phase == IDLE {
                    link.seen = 0;
                }
                let pending = cl.phase == WRITING_BACK && link.seen == S_PENDING;
                for m in &mut link.req {
                    if *m == ACQ_LIVE && cl.phase != ACQUIRING {
                        *m = ACQ_ANON;
                    }
                }
                retain(&mut link.req, |m| match write_back_parts(m) {
                    None => true,
                    Some((a, token)) => {
                        let waited_for = pending && a == cl.attempt;
                        let raises = fence < token && (!checks_owner || holder == live(c, a));
                        waited_for || raises
                    }
                });
            }
            // A holder's identity only matters to a write-back of its
            // attempt: one in flight, or one its attempt may still send.
            if let Some((c, a)) = live_parts(holder) {
                let cl = &clients[c];
                let in_flight = node.links[c]
                    .req
                    .iter()
                    .any(|&m| write_back_parts(m).is_some_and(|(w, _)| w == a));
                let may_send = cl.attempt == a && cl.phase == ACQUIRING;
                if !checks_owner || !(in_flight || may_send) {
                    node.holder = ANON;
                }
            }
        }

        if !self.config.forget_tokens {
            return lost;
        }
        // No token below `least` can be handed out any more: forget those
        // (but keep the largest, which later attempts' floors read), and
        // the floor of an attempt whose token is certainly above it.
        let (bounds, least) = self.bounds(s);
        for (cl, bound) in s.clients.iter_mut().zip(bounds) {
            if bound > cl.floor {
                cl.floor = 0;
            }
        }
        let more_attempts = (0..C).any(|c| s.clients[c].attempt < self.budget(c));
        let keep_max = if more_attempts {
            1u32 << s.max_handed()
        } else {
            0
        };
        let at_least = if least >= 32 { 0 } else { u32::MAX << least };
        s.handed &= at_least | (keep_max & s.handed);
        lost
    }

    /// Lower bounds on the tokens still to be handed out: per client, by
    /// its current attempt; and overall (`least`), by any attempt, current
    /// or future. Both only grow along every transition (the audit checks
    /// it), which is what makes forgetting below them safe.
    fn bounds(&self, s: &State) -> ([u8; C], u8) {
        let mut bounds = [UNBOUNDED; C];
        let mut least = UNBOUNDED;
        for (c, bound) in bounds.iter_mut().enumerate() {
            let cl = &s.clients[c];
            *bound = match cl.phase {
                ACQUIRING => self.acquire_bound(s, c),
                WRITING_BACK => cl.token,
                _ => UNBOUNDED,
            };
            least = least.min(*bound);
            if cl.attempt < self.budget(c) {
                least = least.min(self.fresh_bound(s));
            }
        }
        (bounds, least)
    }

    /// The smallest token the client's acquiring attempt can still hand
    /// out: the quorum-th smallest of what each node can still contribute
    /// (a grant seen or in flight, or at least its fence + 1 while the
    /// acquire is in flight). `UNBOUNDED` when a quorum is out of reach.
    fn acquire_bound(&self, s: &State, c: usize) -> u8 {
        let mut values = [UNBOUNDED; N];
        for (v, node) in values.iter_mut().zip(&s.nodes) {
            let link = &node.links[c];
            if let Some(f) = granted_fence(link.seen).or(granted_fence(link.reply)) {
                *v = f;
            } else if link.req.contains(&ACQ_LIVE) {
                *v = node.fence + 1;
            }
        }
        values.sort_unstable();
        values[self.quorum - 1]
    }

    /// The smallest token an attempt not yet started can hand out: a
    /// quorum of grants, each above its node's fence now.
    fn fresh_bound(&self, s: &State) -> u8 {
        let mut values = s.nodes.map(|n| n.fence + 1);
        values.sort_unstable();
        values[self.quorum - 1]
    }

    /// The fingerprint of `s`'s symmetry class. The class representative:
    /// among the client renamings, those giving the smallest client array;
    /// of those, the smallest fingerprint with nodes sorted. Both choices
    /// depend only on the class. Sorting whole nodes carries each node's
    /// channels and each client's knowledge of it along.
    fn fingerprint(&self, s: &State) -> u128 {
        if !self.config.symmetry {
            return hash_state(s);
        }
        let mut best_clients = [ClientState {
            attempt: u8::MAX,
            ..ClientState::default()
        }; C];
        let mut best = u128::MAX;
        for p in &self.renamings {
            let mut clients = [ClientState::default(); C];
            for c in 0..C {
                clients[p[c]] = s.clients[c];
            }
            if clients > best_clients {
                continue;
            }
            let mut r = rename(s, p);
            r.nodes.sort_unstable();
            let h = hash_state(&r);
            if clients < best_clients {
                best_clients = clients;
                best = h;
            } else {
                best = best.min(h);
            }
        }
        best
    }

    fn run(&self) -> Report {
        let started = Instant::now();
        let mut report = if self.config.first_violation {
            self.breadth_first()
        } else {
            self.depth_first()
        };
        report.elapsed = started.elapsed();
        report
    }

    /// Judges a hand-out; returns whether it broke a property.
    fn judge(&self, report: &mut Report, h: &HandOut, trace: impl Fn() -> Vec<String>) -> bool {
        let mut broke = false;
        for (broken, yes) in [
            (Broken::Monotonicity, h.not_monotonic()),
            (Broken::Uniqueness, h.duplicate),
        ] {
            let slot = match broken {
                Broken::Monotonicity => &mut report.monotonicity,
                Broken::Uniqueness => &mut report.uniqueness,
            };
            if yes && slot.is_none() {
                *slot = Some(Violation {
                    broken,
                    trace: trace(),
                });
            }
            broke |= yes;
        }
        broke
    }

    /// Every reachable state, depth first; records the first violation of
    /// each property.
    fn depth_first(&self) -> Report {
        let mut report = Report::default();
        let mut seen = Visited::default();
        let init = State::default();
        seen.insert(self.fingerprint(&init));
        let mut first = Vec::new();
        self.steps(&init, &mut first);
        let mut stack = vec![Frame {
            state: init,
            steps: first,
            next: 0,
        }];
        let mut spare: Vec<Vec<Step>> = Vec::new();
        while let Some(top) = stack.last_mut() {
            let Some(&step) = top.steps.get(top.next) else {
                if let Some(frame) = stack.pop() {
                    spare.push(frame.steps);
                }
                continue;
            };
            top.next += 1;
            let current = top.state;
            let (next, effects) = self.apply(&current, step, None);
            report.record(&effects);
            if self.config.audit {
                self.audit(&current, &next, &effects);
            }
            if let Some(h) = &effects.hand_out {
                self.judge(&mut report, h, || {
                    stack
                        .iter()
                        .map(|f| self.describe(&f.state, f.steps[f.next - 1]))
                        .collect()
                });
            }
            if seen.insert(self.fingerprint(&next)) {
                let mut steps = spare.pop().unwrap_or_default();
                self.steps(&next, &mut steps);
                stack.push(Frame {
                    state: next,
                    steps,
                    next: 0,
                });
                report.depth = report.depth.max(stack.len() - 1);
            }
        }
        report.states = seen.len();
        report
    }

    /// Breadth first, stopping at the first violation, whose trace is then
    /// a shortest one. Keeps every state (with its parent) in memory: for
    /// the negative controls, which stop early.
    fn breadth_first(&self) -> Report {
        let mut report = Report::default();
        let mut seen = Visited::default();
        // (state, parent index, step from the parent, depth)
        let mut states: Vec<(State, usize, Option<Step>, usize)> =
            vec![(State::default(), 0, None, 0)];
        seen.insert(self.fingerprint(&states[0].0));
        let mut queue = VecDeque::from([0usize]);
        let mut steps = Vec::new();
        'search: while let Some(at) = queue.pop_front() {
            let (current, _, _, depth) = states[at];
            self.steps(&current, &mut steps);
            for &step in &steps {
                let (next, effects) = self.apply(&current, step, None);
                report.record(&effects);
                if let Some(h) = &effects.hand_out {
                    let path = || {
                        let mut path = vec![self.describe(&current, step)];
                        let mut k = at;
                        while let (_, parent, Some(step), _) = states[k] {
                            path.push(self.describe(&states[parent].0, step));
                            k = parent;
                        }
                        path.reverse();
                        path
                    };
                    if self.judge(&mut report, h, path) {
                        report.depth = depth + 1;
                        break 'search;
                    }
                }
                if seen.insert(self.fingerprint(&next)) {
                    queue.push_back(states.len());
                    states.push((next, at, Some(step), depth + 1));
                    report.depth = report.depth.max(depth + 1);
                }
            }
        }
        report.states = seen.len();
        report
    }

    /// The bounds of [`bounds`](Self::bounds) are lower bounds for every
    /// later hand-out if they never shrink and every hand-out respects the
    /// ones of the state it leaves; checks both.
    fn audit(&self, before: &State, after: &State, effects: &Effects) {
        let (was, was_least) = self.bounds(before);
        let (now, now_least) = self.bounds(after);
        assert!(
            now_least >= was_least,
            "the overall bound shrank: {before:?} → {after:?}"
        );
        for c in 0..C {
            let (b, a) = (&before.clients[c], &after.clients[c]);
            if a.attempt == b.attempt && a.phase != IDLE {
                assert!(
                    now[c] >= was[c],
                    "c{c}'s bound shrank: {before:?} → {after:?}"
                );
            }
        }
        if let Some(h) = &effects.hand_out {
            assert!(
                h.token >= was[h.client] && h.token >= was_least,
                "a hand-out below its bound: {before:?}"
            );
        }
    }

    fn describe(&self, s: &State, step: Step) -> String {
        let mut line = String::new();
        self.apply(s, step, Some(&mut line));
        line
    }
}

/// Keeps the messages of a channel that pass `keep`, in order.
fn retain(req: &mut [u8; QCAP], keep: impl Fn(u8) -> bool) {
    let mut kept = [0; QCAP];
    let mut len = 0;
    for &m in req.iter().take_while(|&&m| m != 0) {
        if keep(m) {
            kept[len] = m;
            len += 1;
        }
    }
    *req = kept;
}

fn reborrow<'b>(log: &'b mut Option<&mut String>) -> Option<&'b mut String> {
    log.as_mut().map(|l| &mut **l)
}

/// Appends `msg` to a channel.
fn push(req: &mut [u8; QCAP], msg: u8) {
    let Some(slot) = req.iter_mut().find(|m| **m == 0) else {
        panic!("a channel holds more than {QCAP} messages that matter: raise QCAP");
    };
    *slot = msg;
}

fn fence_u8(fence: u64) -> u8 {
    match u8::try_from(fence) {
        Ok(f) if f <= MAX_FENCE => f,
        _ => panic!("fence {fence} outside the model's bound {MAX_FENCE}"),
    }
}

fn who(client: usize, attempt: u8) -> String {
    format!("c{client}#{attempt}")
}

/// All permutations of `0..C`, the identity first.
fn permutations() -> Vec<[usize; C]> {
    fn extend(p: &mut [usize; C], k: usize, used: u32, out: &mut Vec<[usize; C]>) {
        if k == C {
            out.push(*p);
            return;
        }
        for v in 0..C {
            if used & (1 << v) == 0 {
                p[k] = v;
                extend(p, k + 1, used | (1 << v), out);
            }
        }
    }
    let mut out = Vec::new();
    extend(&mut [0; C], 0, 0, &mut out);
    out
}

/// `s` with client `c` renamed `p[c]` everywhere: its state, its links, and
/// the key holders that name it.
fn rename(s: &State, p: &[usize; C]) -> State {
    let mut r = *s;
    for (&to, &client) in p.iter().zip(&s.clients) {
        r.clients[to] = client;
    }
    for (rn, sn) in r.nodes.iter_mut().zip(&s.nodes) {
        for (&to, &link) in p.iter().zip(&sn.links) {
            rn.links[to] = link;
        }
        if let Some((c, a)) = live_parts(sn.holder) {
            rn.holder = live(p[c], a);
        }
    }
    r
}

/// A 128-bit fingerprint of the state: its fields packed without loss
/// into twelve words, absorbed by two 64-bit lanes, each a chain of
/// bijective mixes (splitmix64's finaliser, with different constants per
/// lane).
fn hash_state(s: &State) -> u128 {
    let (mut a, mut b) = (0x243F_6A88_85A3_08D3u64, 0x1319_8A2E_0370_7344u64);
    let mut absorb = |w: u64| {
        a = mix(a ^ w, 0xBF58_476D_1CE4_E5B9, 0x94D0_49BB_1331_11EB);
        b = mix(b ^ w, 0xFF51_AFD7_ED55_8CCD, 0xC4CE_B9FE_1A85_EC53);
    };
    let mut heads = 0u64;
    for node in &s.nodes {
        heads = heads << 16 | u64::from(node.holder) << 8 | u64::from(node.fence);
        for link in &node.links {
            let req = link.req.iter().fold(0u64, |w, &m| w << 8 | u64::from(m));
            absorb(req | u64::from(link.reply) << 32 | u64::from(link.seen) << 40);
        }
    }
    absorb(heads);
    let client = |c: &ClientState| {
        u64::from(c.attempt) << 24
            | u64::from(c.phase) << 16
            | u64::from(c.floor) << 8
            | u64::from(c.token)
    };
    absorb(client(&s.clients[0]) << 32 | client(&s.clients[1]));
    absorb(client(&s.clients[2]) << 32 | u64::from(s.handed));
    (u128::from(a) << 64) | u128::from(b)
}

// Packing four request bytes, three clients and 32 handed bits as above.
const _: () = assert!(QCAP == 4 && C == 3 && N == 3);

fn mix(mut x: u64, k1: u64, k2: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(k1);
    x ^= x >> 27;
    x = x.wrapping_mul(k2);
    x ^ (x >> 31)
}

/// The visited set's keys are fingerprints already: use their low bits.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

/// Runs one configuration, prints its summary and any counterexample, and
/// checks that hand-outs are reachable at all.
fn check(config: Config<'_>) -> Report {
    let report = Model::new(config).run();
    eprintln!("{}", report.summary(&config));
    for v in [&report.monotonicity, &report.uniqueness]
        .into_iter()
        .flatten()
    {
        eprintln!(
            "  counterexample ({:?}), {} steps (keys vanish lazily: an acquire that \
             lands is granted, whatever key was there having vanished):",
            v.broken,
            v.trace.len()
        );
        for (k, line) in v.trace.iter().enumerate() {
            eprintln!("  {:>3}. {line}", k + 1);
        }
    }
    assert!(
        report.hand_outs > 0,
        "no hand-out is reachable: the model is vacuous"
    );
    report
}

/// The protocol keeps both properties, and the paths that matter (a
/// hand-out after a write-back, a write-back losing its key) are taken.
fn assert_safe(network: Network, attempts: &[u8]) {
    let r = check(Config {
        network,
        ..Config::new(Variant::WriteBack, attempts)
    });
    assert!(r.monotonicity.is_none(), "strict monotonicity violated");
    assert!(r.uniqueness.is_none(), "a token was handed out twice");
    assert!(
        r.written_back > 0,
        "no hand-out after a write-back: that path went unchecked"
    );
    assert!(
        r.lost_write_backs > 0,
        "no write-back lost its key: the ownership check went unchecked"
    );
}

// The tests. The default run (debug build) takes the small
// configurations; the ignored ones are meant for
// `cargo test --release --lib -- --ignored model`.

#[test]
fn write_back_is_safe_two_clients_2_1() {
    assert_safe(Network::Fifo, &[2, 1]);
}

#[test]
fn write_back_is_safe_three_clients_1_1_1() {
    assert_safe(Network::Fifo, &[1, 1, 1]);
}

#[test]
#[ignore = "about two minutes in release"]
fn write_back_is_safe_larger() {
    for attempts in [&[2, 2][..], &[2, 1, 1]] {
        assert_safe(Network::Fifo, attempts);
    }
}

/// Safety does not rest on FIFO channels.
#[test]
#[ignore = "slow in a debug build; run with --release"]
fn write_back_is_safe_unordered() {
    // [2, 1, 1] passes too, in about five minutes (39.5 million states).
    for attempts in [&[2, 1][..], &[1, 1, 1], &[2, 2]] {
        assert_safe(Network::Unordered, attempts);
    }
}

/// Negative control: taking the maximum of the grants and handing it out
/// without a write-back is caught, with a shortest counterexample.
#[test]
fn naive_max_is_caught() {
    let r = check(Config {
        first_violation: true,
        ..Config::new(Variant::Naive, &[2, 1])
    });
    assert!(
        r.monotonicity.is_some() || r.uniqueness.is_some(),
        "the checker missed the naive variant's violation"
    );
}

/// Negative control: without the ownership check, a write-back that lands
/// after its key passed to another attempt still counts the node as
/// storing the token, although the node's fence reached the token through
/// the other attempt's grant; both attempts hand out the same token.
/// Monotonicity survives (write-backs only raise fences, and a later
/// attempt's quorum still meets a node storing at least every earlier
/// token), so every state is explored to show both facts; then a shortest
/// counterexample is printed.
#[test]
fn write_back_without_owner_check_duplicates() {
    let r = check(Config::new(Variant::NoOwnerCheck, &[2, 1]));
    assert!(
        r.uniqueness.is_some(),
        "expected a duplicate token without the ownership check"
    );
    assert!(
        r.monotonicity.is_none(),
        "expected monotonicity to survive without the ownership check"
    );
    let r = check(Config {
        first_violation: true,
        ..Config::new(Variant::NoOwnerCheck, &[1, 1])
    });
    assert!(r.uniqueness.is_some());
}

/// The negative controls through every state, to show all they break.
#[test]
#[ignore = "slow in a debug build; run with --release"]
fn negative_controls_in_full() {
    // [2, 1, 1] shows the same, in about three and a half minutes.
    for attempts in [&[2, 1][..], &[1, 1, 1], &[2, 2]] {
        let r = check(Config::new(Variant::Naive, attempts));
        assert!(r.monotonicity.is_some() && r.uniqueness.is_some());
        let r = check(Config::new(Variant::NoOwnerCheck, attempts));
        assert!(r.uniqueness.is_some() && r.monotonicity.is_none());
    }
}

/// Forgetting floors and tokens, and the symmetry reduction, lose no
/// hand-out: the same hand-outs are reached without them, and the bounds
/// that justify forgetting hold on every transition.
fn assert_forgetting_and_symmetry_keep_hand_outs(attempts: &[u8]) {
    for variant in [Variant::WriteBack, Variant::Naive, Variant::NoOwnerCheck] {
        let all = check(Config {
            forget_tokens: false,
            symmetry: false,
            audit: true,
            ..Config::new(variant, attempts)
        });
        let reduced = check(Config::new(variant, attempts));
        assert_eq!(
            up_to_renaming(&reduced.events, attempts),
            up_to_renaming(&all.events, attempts),
            "{variant:?} {attempts:?}"
        );
    }
}

#[test]
fn forgetting_and_symmetry_keep_hand_outs_small() {
    assert_forgetting_and_symmetry_keep_hand_outs(&[1, 1]);
}

#[test]
#[ignore = "slow in a debug build; run with --release"]
fn forgetting_and_symmetry_keep_hand_outs() {
    for attempts in [&[2, 1][..], &[1, 1, 1]] {
        assert_forgetting_and_symmetry_keep_hand_outs(attempts);
    }
}

/// The bounds behind forgetting, audited where every client has a second
/// attempt: an earlier version forgot that a client busy with one attempt
/// may still start another, which only [2, 2] exposed.
#[test]
#[ignore = "slow in a debug build; run with --release"]
fn bounds_hold_with_two_attempts_each() {
    for variant in [Variant::WriteBack, Variant::Naive, Variant::NoOwnerCheck] {
        check(Config {
            audit: true,
            ..Config::new(variant, &[2, 2])
        });
    }
}

/// Symmetry reduction keeps distances: the shortest counterexamples are as
/// long with it as without it.
#[test]
fn symmetry_keeps_shortest_counterexamples() {
    for variant in [Variant::Naive, Variant::NoOwnerCheck] {
        let with = check(Config {
            first_violation: true,
            ..Config::new(variant, &[1, 1])
        });
        let without = check(Config {
            first_violation: true,
            symmetry: false,
            ..Config::new(variant, &[1, 1])
        });
        assert_eq!(with.depth, without.depth, "{variant:?}");
        assert!(
            with.states < without.states,
            "{variant:?}: symmetry reduced nothing"
        );
    }
}

// The literal model: the protocol as described in the module docs, with
// none of the reductions but dropping answers the client will ignore
// (explicit key expiry, refusals, `NotHeld` answers, full attempt
// identities, no symmetry). Far larger; it exists to check that the reduced
// model reaches exactly the same hand-outs.

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
enum LitPhase {
    Idle,
    /// Per node: no answer yet, refused (`Some(None)`), granted a fence.
    Acquiring([Option<Option<u8>>; N]),
    WritingBack {
        token: u8,
        votes: [LitVote; N],
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct LitState {
    /// (client, attempt) holding each node's key.
    holder: [Option<(usize, u8)>; N],
    fence: [u8; N],
    /// `[client][node]`. Two attempts of a client send at most four
    /// requests to a node; one answer at a time is awaited.
    requests: [[Fifo<LitRequest, 4>; N]; C],
    answers: [[Fifo<LitAnswer, 2>; N]; C],
    /// (attempt, phase, floor) per client.
    clients: [(u8, LitPhase, u8); C],
    handed: u32,
}

/// Every reachable state of the literal model (FIFO channels with loss);
/// returns the hand-outs seen and the state count.
fn literal(variant: Variant, attempts: &[u8]) -> (BTreeSet<Event>, usize) {
    let init = LitState {
        holder: [None; N],
        fence: [0; N],
        requests: [[Fifo::EMPTY; N]; C],
        answers: [[Fifo::EMPTY; N]; C],
        clients: [(0, LitPhase::Idle, 0); C],
        handed: 0,
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
                let floor = t.handed.checked_ilog2().unwrap_or(0) as u8;
                t.clients[c] = (attempt + 1, LitPhase::Acquiring([None; N]), floor);
                for q in &mut t.requests[c] {
                    q.push(LitRequest::Acquire {
                        attempt: attempt + 1,
                    });
                }
                next.push(t);
            } else if phase != LitPhase::Idle {
                let mut t = s;
                t.clients[c].1 = LitPhase::Idle;
                next.push(t);
            }
        }
        for i in 0..N {
            if s.holder[i].is_some() {
                let mut t = s;
                t.holder[i] = None;
                next.push(t);
            }
            for c in 0..attempts.len() {
                for k in 0..s.requests[c][i].len() {
                    let mut t = s;
                    let msg = t.requests[c][i].take(k);
                    let answer = match msg {
                        Some(LitRequest::Acquire { attempt }) if t.holder[i].is_none() => {
                            t.holder[i] = Some((c, attempt));
                            t.fence[i] = fence_u8(next_fence(u64::from(t.fence[i])));
                            LitAnswer::Granted {
                                attempt,
                                fence: t.fence[i],
                            }
                        }
                        Some(LitRequest::Acquire { attempt }) => {
                            // Refused, with the fence moved (the `INCR` of
                            // the implementation) or not (a script that
                            // moves it only on grants).
                            let mut moved = t;
                            moved.fence[i] = fence_u8(next_fence(u64::from(moved.fence[i])));
                            moved.answers[c][i].push(LitAnswer::Refused { attempt });
                            next.push(moved);
                            LitAnswer::Refused { attempt }
                        }
                        Some(LitRequest::WriteBack { attempt, token }) => {
                            if variant != Variant::WriteBack || t.holder[i] == Some((c, attempt)) {
                                t.fence[i] = t.fence[i].max(token);
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
                    if let Some(event) = lit_answer(variant, &mut t, c, i, answer) {
                        events.insert(event);
                    }
                    next.push(t);
                }
            }
        }
        for mut t in next {
            lit_forget_ignored(&mut t);
            if seen.insert(lit_fingerprint(&t)) {
                stack.push(t);
            }
        }
    }
    (events, seen.len())
}

/// 128 bits of SipHash: two hashes of the state under different prefixes.
fn lit_fingerprint(s: &LitState) -> u128 {
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
/// literal model makes: without it, [1, 1] alone has 628,159 states.)
fn lit_forget_ignored(s: &mut LitState) {
    for (c, &(current, phase, _)) in s.clients.iter().enumerate() {
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

/// The client's handling of one answer, as `Client::attempt` and
/// `settle_token` do it. Returns the hand-out, if it makes one.
fn lit_answer(
    variant: Variant,
    s: &mut LitState,
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
            if variant != Variant::Naive && m.needs_write_back(quorum(N)) {
                let mut votes = [LitVote::No; N];
                for j in 0..N {
                    match got[j] {
                        Some(Some(f)) if f == token => votes[j] = LitVote::Yes,
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
    };
    s.handed |= 1 << token;
    s.clients[c].1 = LitPhase::Idle;
    Some(event)
}

/// Hand-outs with each client named by the first client with as many
/// attempts: the reduced model explores one client of each such group.
fn up_to_renaming(events: &BTreeSet<Event>, attempts: &[u8]) -> BTreeSet<Event> {
    events
        .iter()
        .map(|e| {
            let first = attempts
                .iter()
                .position(|&a| a == attempts[e.client])
                .unwrap_or(e.client);
            Event {
                client: first,
                ..*e
            }
        })
        .collect()
}

/// The reductions lose no behaviour: the reduced and the literal model
/// reach exactly the same hand-outs (who, which token, which verdicts).
fn assert_same_hand_outs(variant: Variant, attempts: &[u8]) {
    let started = Instant::now();
    let (literal_events, literal_states) = literal(variant, attempts);
    eprintln!(
        "literal {variant:?} attempts {attempts:?}: {literal_states} states, {} kinds of hand-out, {:.2?}",
        literal_events.len(),
        started.elapsed()
    );
    let reduced = check(Config::new(variant, attempts));
    assert_eq!(
        up_to_renaming(&reduced.events, attempts),
        up_to_renaming(&literal_events, attempts),
        "{variant:?} {attempts:?}: the reduced model's hand-outs differ from the literal model's"
    );
}

/// The smallest configuration where a write-back can lose its key: the
/// literal model has about 280,000 states (45 s in debug, 4 s in release).
#[test]
#[ignore = "slow in a debug build; run with --release"]
fn reductions_keep_every_hand_out() {
    for variant in [Variant::Naive, Variant::NoOwnerCheck, Variant::WriteBack] {
        assert_same_hand_outs(variant, &[1, 1]);
    }
}

/// The literal model of [2, 1] has 16 to 28 million states per variant,
/// about 20 minutes in release for the three: too long for every run of
/// the ignored tests, so it asks for `REDFENCE_LITERAL_2_1=1` (and says so
/// loudly when skipped). Worth running after any change to the reductions.
#[test]
#[ignore = "about 20 minutes in release; needs REDFENCE_LITERAL_2_1=1"]
fn reductions_keep_every_hand_out_2_1() {
    if std::env::var_os("REDFENCE_LITERAL_2_1").is_none() {
        eprintln!(
            "SKIPPED: set REDFENCE_LITERAL_2_1=1 to compare with the literal model of [2, 1]"
        );
        return;
    }
    for variant in [Variant::Naive, Variant::NoOwnerCheck, Variant::WriteBack] {
        assert_same_hand_outs(variant, &[2, 1]);
    }
}

#[test]
fn encodings_round_trip() {
    for c in 0..C {
        for a in 1..=MAX_ATTEMPTS {
            assert_eq!(live_parts(live(c, a)), Some((c, a)));
            for t in 0..=MAX_FENCE {
                assert_eq!(write_back_parts(write_back(a, t)), Some((a, t)));
            }
        }
    }
    for f in 0..=MAX_FENCE {
        assert_eq!(granted_fence(R_GRANTED | f), Some(f));
    }
    assert_eq!(granted_fence(R_WB_OK), None);
    assert_eq!(live_parts(FREE), None);
    assert_eq!(live_parts(ANON), None);
    assert_eq!(write_back_parts(ACQ_LIVE), None);
    assert_eq!(permutations().len(), 6);
    assert_eq!(permutations()[0], [0, 1, 2]);
}
