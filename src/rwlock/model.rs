//! The read-write lock's model checker: every schedule of a few readers
//! and writers on N nodes, each request delivered, lost, or applied with
//! its reply lost, as an adversary chooses, explored exhaustively (states
//! memoised), checking in every state
//! - exclusion: never a writer holding beside any other holder;
//! - token order: a write's token is larger than the token of every hold
//!   granted before it (reads and writes), and a read's token is at least
//!   every earlier write's.
//!
//! The nodes run what `wire/lua/rw_read.lua`, `rw_write.lua` and
//! `rw_downgrade.lua` run (the waiting writer's marker aside: it only
//! refuses readers, which cannot break either property); the clients run
//! `admit` (a round decided at a majority, the token settled as
//! `protocol::settle` does, a failed attempt cleaned up) and `convert`.
//! Pending requests stay deliverable after the decision, as late replies
//! do; a release or cleanup resolves each (applied first or lost), as the
//! release queued behind them on the same connection does.
//!
//! Negative controls, each of which the checker must catch:
//! - [`Design::NoReadWriteBack`]: a read takes the largest fence of its
//!   granting majority without writing it back. A writer granted on one
//!   node only (then cleaned up) moved that fence; a read over that node
//!   and another sees it; a later writer granted on the two others moves
//!   their fences to the same number: its token is not above the read's.
//! - [`Design::AnyNode`]: a hold needs one node's admission, not a
//!   majority: a reader on one node and a writer on another hold at once.
//!
//! Time is not modelled: under the mutex's assumptions a holder's keys
//! outlive its validity, so within it an entry is removed only by its own
//! release, which is what "entries never expire" models.

use std::collections::HashSet;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Design {
    /// This crate's.
    Majority,
    NoReadWriteBack,
    AnyNode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Mode {
    Read,
    Write,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Msg {
    Idle,
    Pending,
    Granted,
    No,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Phase {
    Idle,
    Acquiring,
    Settling,
    Holding,
    Downgrading,
    Done,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Client {
    phase: Phase,
    mode: Mode,
    rounds: u8,
    /// The admission requests, then the downgrade's.
    msgs: Vec<Msg>,
    /// The fences the granting nodes replied.
    fences: Vec<u8>,
    /// The token's write-back requests.
    wb: Vec<Msg>,
    token: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Node {
    writer: Option<u8>,
    readers: u8,
    fence: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    nodes: Vec<Node>,
    clients: Vec<Client>,
    /// The largest token of any hold granted so far, and of any write.
    max_token: u8,
    max_write: u8,
}

struct Model {
    design: Design,
    nodes: usize,
    /// Each client's mode, and whether a writer may downgrade.
    roles: Vec<Mode>,
    downgrade: bool,
}

/// What the checker found.
#[derive(Debug, PartialEq, Eq)]
enum Violation {
    Exclusion,
    WriteToken,
    ReadToken,
}

impl Model {
    fn quorum(&self) -> usize {
        match self.design {
            Design::AnyNode => 1,
            _ => self.nodes / 2 + 1,
        }
    }

    fn initial(&self, rounds: u8) -> State {
        State {
            nodes: vec![
                Node {
                    writer: None,
                    readers: 0,
                    fence: 0,
                };
                self.nodes
            ],
            clients: self
                .roles
                .iter()
                .map(|&mode| Client {
                    phase: Phase::Idle,
                    mode,
                    rounds,
                    msgs: vec![Msg::Idle; self.nodes],
                    fences: vec![0; self.nodes],
                    wb: vec![Msg::Idle; self.nodes],
                    token: 0,
                })
                .collect(),
            max_token: 0,
            max_write: 0,
        }
    }

    /// The admission script of `mode` for client `c` on `node`: the fence
    /// replied when granted.
    fn admit(node: &mut Node, c: usize, mode: Mode) -> Option<u8> {
        if node.writer.is_some() {
            return None;
        }
        match mode {
            Mode::Read => {
                node.readers |= 1 << c;
                Some(node.fence)
            }
            Mode::Write => {
                if node.readers != 0 {
                    return None;
                }
                node.writer = Some(c as u8);
                node.fence += 1;
                Some(node.fence)
            }
        }
    }

    fn holds(node: &Node, c: usize) -> bool {
        node.writer == Some(c as u8) || node.readers & (1 << c) != 0
    }

    fn exclusion(state: &State) -> bool {
        let holding = |m| {
            state
                .clients
                .iter()
                .filter(|k| k.phase == Phase::Holding && k.mode == m)
                .count()
        };
        let (writers, readers) = (holding(Mode::Write), holding(Mode::Read));
        writers == 0 || writers + readers == 1
    }

    /// Client `c` becomes a holder: the token checks.
    fn hold(state: &mut State, c: usize) -> Result<(), Violation> {
        let client = &mut state.clients[c];
        client.phase = Phase::Holding;
        let token = client.token;
        match client.mode {
            Mode::Write if token <= state.max_token => return Err(Violation::WriteToken),
            Mode::Read if token < state.max_write => return Err(Violation::ReadToken),
            Mode::Write => state.max_write = state.max_write.max(token),
            Mode::Read => {}
        }
        state.max_token = state.max_token.max(token);
        Ok(())
    }

    /// Every resolution of client `c`'s pending requests (each applied or
    /// lost), then its entries removed everywhere.
    fn leave(&self, state: &State, c: usize) -> Vec<State> {
        let mut out = vec![state.clone()];
        for n in 0..self.nodes {
            let mut next = Vec::new();
            for s in out {
                let client = &s.clients[c];
                let (acq, wb) = (client.msgs[n], client.wb[n]);
                let mut lost = s.clone();
                lost.clients[c].msgs[n] = Msg::Idle;
                lost.clients[c].wb[n] = Msg::Idle;
                if acq == Msg::Pending || wb == Msg::Pending {
                    let mut applied = lost.clone();
                    if acq == Msg::Pending {
                        let mode = if s.clients[c].phase == Phase::Downgrading {
                            None
                        } else {
                            Some(s.clients[c].mode)
                        };
                        match mode {
                            Some(mode) => {
                                Self::admit(&mut applied.nodes[n], c, mode);
                            }
                            None => {
                                Self::convert(&mut applied.nodes[n], c);
                            }
                        }
                    }
                    if wb == Msg::Pending && Self::holds(&applied.nodes[n], c) {
                        let token = s.clients[c].token;
                        let fence = &mut applied.nodes[n].fence;
                        *fence = (*fence).max(token);
                    }
                    next.push(applied);
                }
                next.push(lost);
            }
            out = next;
        }
        for s in &mut out {
            for node in &mut s.nodes {
                if node.writer == Some(c as u8) {
                    node.writer = None;
                }
                node.readers &= !(1 << c);
            }
            let client = &mut s.clients[c];
            client.rounds -= 1;
            client.phase = if client.rounds == 0 {
                Phase::Done
            } else {
                Phase::Idle
            };
            client.mode = self.roles[c];
        }
        out
    }

    fn convert(node: &mut Node, c: usize) -> bool {
        if node.writer == Some(c as u8) {
            node.writer = None;
            node.readers |= 1 << c;
            true
        } else {
            false
        }
    }

    fn count(msgs: &[Msg], m: Msg) -> usize {
        msgs.iter().filter(|&&x| x == m).count()
    }

    /// Every state reachable in one step.
    fn steps(&self, state: &State) -> Result<Vec<State>, Violation> {
        let mut out = Vec::new();
        let q = self.quorum();
        for c in 0..state.clients.len() {
            let client = &state.clients[c];
            match client.phase {
                Phase::Idle => {
                    let mut s = state.clone();
                    let k = &mut s.clients[c];
                    k.phase = Phase::Acquiring;
                    k.msgs = vec![Msg::Pending; self.nodes];
                    k.wb = vec![Msg::Idle; self.nodes];
                    k.fences = vec![0; self.nodes];
                    out.push(s);
                    continue;
                }
                Phase::Done => continue,
                _ => {}
            }
            // Deliver a pending request: applied with its reply heard,
            // applied with its reply lost, or lost.
            for n in 0..self.nodes {
                if client.msgs[n] == Msg::Pending {
                    let mut s = state.clone();
                    let granted = if client.phase == Phase::Downgrading {
                        Self::convert(&mut s.nodes[n], c).then_some(client.token)
                    } else {
                        Self::admit(&mut s.nodes[n], c, client.mode)
                    };
                    let heard = matches!(client.phase, Phase::Acquiring | Phase::Downgrading);
                    let mut unheard = s.clone();
                    unheard.clients[c].msgs[n] = Msg::No;
                    let k = &mut s.clients[c];
                    match granted {
                        Some(fence) if heard => {
                            k.msgs[n] = Msg::Granted;
                            k.fences[n] = fence;
                        }
                        _ => k.msgs[n] = Msg::No,
                    }
                    out.push(s);
                    out.push(unheard);
                    let mut lost = state.clone();
                    lost.clients[c].msgs[n] = Msg::No;
                    out.push(lost);
                }
                if client.wb[n] == Msg::Pending {
                    let mut s = state.clone();
                    let ok = Self::holds(&s.nodes[n], c);
                    if ok {
                        let fence = &mut s.nodes[n].fence;
                        *fence = (*fence).max(client.token);
                    }
                    s.clients[c].wb[n] = if ok { Msg::Granted } else { Msg::No };
                    out.push(s);
                    let mut lost = state.clone();
                    lost.clients[c].wb[n] = Msg::No;
                    out.push(lost);
                }
            }
            let (granted, pending) = (
                Self::count(&client.msgs, Msg::Granted),
                Self::count(&client.msgs, Msg::Pending),
            );
            match client.phase {
                Phase::Acquiring if granted >= q => {
                    let mut s = state.clone();
                    let k = &mut s.clients[c];
                    let fences: Vec<u8> = (0..self.nodes)
                        .filter(|&n| k.msgs[n] == Msg::Granted)
                        .map(|n| k.fences[n])
                        .collect();
                    let token = fences.iter().copied().max().unwrap_or(0);
                    k.token = token;
                    let stored = fences.iter().filter(|&&f| f == token).count();
                    let skip = self.design == Design::NoReadWriteBack && k.mode == Mode::Read;
                    if stored >= q || skip {
                        Self::hold(&mut s, c)?;
                    } else {
                        for n in 0..self.nodes {
                            if k.msgs[n] == Msg::Granted && k.fences[n] < token {
                                k.wb[n] = Msg::Pending;
                            }
                        }
                        k.phase = Phase::Settling;
                    }
                    out.push(s);
                }
                Phase::Acquiring | Phase::Downgrading if granted + pending < q => {
                    out.extend(self.leave(state, c));
                }
                Phase::Settling => {
                    let stored = (0..self.nodes)
                        .filter(|&n| {
                            client.msgs[n] == Msg::Granted && client.fences[n] == client.token
                        })
                        .count();
                    let acked = Self::count(&client.wb, Msg::Granted);
                    let open = Self::count(&client.wb, Msg::Pending);
                    if stored + acked >= q {
                        let mut s = state.clone();
                        Self::hold(&mut s, c)?;
                        out.push(s);
                    } else if stored + acked + open < q {
                        out.extend(self.leave(state, c));
                    }
                }
                Phase::Holding => {
                    out.extend(self.leave(state, c));
                    if self.downgrade && client.mode == Mode::Write {
                        let mut s = state.clone();
                        let k = &mut s.clients[c];
                        k.phase = Phase::Downgrading;
                        k.msgs = vec![Msg::Pending; self.nodes];
                        k.wb = vec![Msg::Idle; self.nodes];
                        out.push(s);
                    }
                }
                Phase::Downgrading if granted >= q => {
                    let mut s = state.clone();
                    s.clients[c].mode = Mode::Read;
                    Self::hold(&mut s, c)?;
                    out.push(s);
                }
                _ => {}
            }
        }
        for s in &out {
            if !Self::exclusion(s) {
                return Err(Violation::Exclusion);
            }
        }
        Ok(out)
    }

    /// Explores every reachable state: the first violation, or the number
    /// of states.
    fn check(&self, rounds: u8) -> Result<usize, Violation> {
        let started = std::time::Instant::now();
        let result = self.explore(rounds);
        eprintln!(
            "{:?} {:?}: {result:?} in {:?}",
            self.design,
            self.roles,
            started.elapsed()
        );
        result
    }

    fn explore(&self, rounds: u8) -> Result<usize, Violation> {
        let mut seen = HashSet::new();
        let mut stack = vec![self.initial(rounds)];
        while let Some(state) = stack.pop() {
            if !seen.insert(state.clone()) {
                continue;
            }
            for next in self.steps(&state)? {
                if !seen.contains(&next) {
                    stack.push(next);
                }
            }
        }
        Ok(seen.len())
    }
}

fn model(design: Design, roles: &[Mode], downgrade: bool) -> Model {
    Model {
        design,
        nodes: 3,
        roles: roles.to_vec(),
        downgrade,
    }
}

use Mode::{Read as R, Write as W};

/// The pitfall's shape (two writers, a reader between), every schedule.
#[test]
fn readers_and_writers_exclude_and_tokens_order() {
    let states = model(Design::Majority, &[W, R, W], false).check(1);
    assert!(matches!(states, Ok(n) if n > 1000), "{states:?}");
}

#[test]
fn downgrade_keeps_exclusion_and_token_order() {
    let states = model(Design::Majority, &[W, R], true).check(1);
    assert!(matches!(states, Ok(n) if n > 100), "{states:?}");
}

/// The larger configurations: minutes in a debug build
/// (`cargo test --release --lib rwlock::model -- --ignored`).
#[test]
#[ignore = "minutes in a debug build"]
fn larger_configurations() {
    for roles in [&[W, W, R][..], &[R, R, W], &[W, R, R]] {
        let states = model(Design::Majority, roles, false).check(1);
        assert!(matches!(states, Ok(n) if n > 1000), "{roles:?}: {states:?}");
    }
    for roles in [&[W, R, W][..], &[W, W, R]] {
        let states = model(Design::Majority, roles, true).check(1);
        assert!(matches!(states, Ok(n) if n > 1000), "{roles:?}: {states:?}");
    }
    let states = model(Design::Majority, &[W, R], true).check(2);
    assert!(matches!(states, Ok(n) if n > 1000), "{states:?}");
}

#[test]
fn a_read_without_the_write_back_of_its_generation_is_caught() {
    // The schedule of the module's docs: a writer granted on one node,
    // a read over it and another, a later writer on the other two.
    assert_eq!(
        model(Design::NoReadWriteBack, &[W, R, W], false).check(1),
        Err(Violation::WriteToken)
    );
}

#[test]
fn admission_without_a_majority_is_caught() {
    assert_eq!(
        model(Design::AnyNode, &[W, R], false).check(1),
        Err(Violation::Exclusion)
    );
}
