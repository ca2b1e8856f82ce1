//! The bound's model checker: every schedule of a few clients acquiring
//! permits from N nodes, with each request delivered or lost as an
//! adversary chooses, explored exhaustively (states memoised), checking
//! that never more than K hold at once.
//!
//! Two designs are modelled:
//! - [`Design::Slots`], this crate's: slot `s` is a mutex; a node grants a
//!   request for slot `s` when it holds no value for `s`; a client holds
//!   when a majority granted, else (optionally) cleans up and tries another
//!   slot it has not tried, in any order.
//! - [`Design::Counter`], the negative control: each node admits a client
//!   while it has admitted fewer than K; a client holds when a majority
//!   admitted it. With N = 3 and K = 2, three clients each missing a
//!   different node are admitted by AB, BC and AC: three holders. The
//!   checker must find that schedule, or it proves nothing.
//!
//! Time is not modelled: under the mutex's assumptions a holder's keys
//! outlive its validity, so within it a key is removed only by its own
//! release, which is what "keys never expire" models.

use std::collections::HashSet;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Design {
    Slots,
    Counter,
    /// Slots whose nodes grant whatever they hold: a broken control.
    Overwrite,
}

/// A node's answer to one request of an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Msg {
    Pending,
    Granted,
    /// Refused, or lost on the way: the same to the client and the node.
    No,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Phase {
    /// Between attempts: picks a slot (or gives up once all were tried).
    Idle,
    Attempting {
        slot: usize,
        msgs: Vec<Msg>,
    },
    /// A failed attempt's grants, still on the nodes unless cleaned up.
    Failed {
        slot: usize,
    },
    Holding {
        slot: usize,
    },
    Done,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Client {
    phase: Phase,
    /// Slots tried in the current acquisition (bit set).
    tried: u32,
    /// Acquisitions left (a holder that releases may acquire again).
    rounds: u8,
    /// Value generation: each attempt writes a fresh value.
    generation: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    /// `values[node][slot]`: the (client, generation) holding that slot's
    /// key on that node (Counter: slot 0..C is "client c admitted").
    values: Vec<Vec<Option<(usize, u8)>>>,
    clients: Vec<Client>,
}

struct Model {
    design: Design,
    /// Slot order: any untried slot (`false`), or the pass order from
    /// slot `client % K` round the ring, as a pass with that start tries
    /// them (`true`: far fewer states).
    ring: bool,
    nodes: usize,
    permits: usize,
    clients: usize,
}

impl Model {
    fn quorum(&self) -> usize {
        self.nodes / 2 + 1
    }

    fn initial(&self, rounds: u8) -> State {
        let width = match self.design {
            Design::Slots | Design::Overwrite => self.permits,
            Design::Counter => self.clients,
        };
        State {
            values: vec![vec![None; width]; self.nodes],
            clients: vec![
                Client {
                    phase: Phase::Idle,
                    tried: 0,
                    rounds,
                    generation: 0,
                };
                self.clients
            ],
        }
    }

    fn holders(&self, state: &State) -> usize {
        state
            .clients
            .iter()
            .filter(|c| matches!(c.phase, Phase::Holding { .. }))
            .count()
    }

    /// Every state reachable in one step, with a label for the trace.
    fn successors(&self, state: &State) -> Vec<(String, State)> {
        let mut next = Vec::new();
        for (c, client) in state.clients.iter().enumerate() {
            match &client.phase {
                Phase::Idle => {
                    let slots: Vec<usize> = match self.design {
                        Design::Slots | Design::Overwrite if self.ring => (0..self.permits)
                            .map(|i| (c + i) % self.permits)
                            .find(|s| client.tried & (1 << s) == 0)
                            .into_iter()
                            .collect(),
                        Design::Slots | Design::Overwrite => (0..self.permits)
                            .filter(|s| client.tried & (1 << s) == 0)
                            .collect(),
                        // One attempt on the counter, in the client's column.
                        Design::Counter => {
                            if client.tried == 0 {
                                vec![c]
                            } else {
                                vec![]
                            }
                        }
                    };
                    if slots.is_empty() {
                        let mut s = state.clone();
                        s.clients[c].phase = Phase::Done;
                        next.push((format!("c{c} gives up"), s));
                    }
                    for slot in slots {
                        let mut s = state.clone();
                        let cl = &mut s.clients[c];
                        cl.tried |= 1 << slot;
                        cl.generation = cl.generation.wrapping_add(1);
                        cl.phase = Phase::Attempting {
                            slot,
                            msgs: vec![Msg::Pending; self.nodes],
                        };
                        next.push((format!("c{c} tries slot {slot}"), s));
                    }
                }
                Phase::Attempting { slot, msgs } => {
                    let slot = *slot;
                    if msgs.iter().all(|m| *m != Msg::Pending) {
                        let granted = msgs.iter().filter(|m| **m == Msg::Granted).count();
                        let mut s = state.clone();
                        s.clients[c].phase = if granted >= self.quorum() {
                            Phase::Holding { slot }
                        } else {
                            Phase::Failed { slot }
                        };
                        next.push((format!("c{c} decides ({granted} granted)"), s));
                        continue;
                    }
                    for (n, m) in msgs.iter().enumerate() {
                        if *m != Msg::Pending {
                            continue;
                        }
                        let value = (c, client.generation);
                        // Delivered: the node decides.
                        let mut s = state.clone();
                        let grant = match self.design {
                            Design::Slots => s.values[n][slot].is_none(),
                            Design::Overwrite => true,
                            Design::Counter => {
                                s.values[n].iter().filter(|v| v.is_some()).count() < self.permits
                            }
                        };
                        if grant {
                            s.values[n][slot] = Some(value);
                        }
                        if let Phase::Attempting { msgs, .. } = &mut s.clients[c].phase {
                            msgs[n] = if grant { Msg::Granted } else { Msg::No };
                        }
                        let label = if grant { "yes" } else { "no" };
                        next.push((format!("c{c} -> n{n}: {label}"), s));
                        // Lost on the way (a refusal without the node's
                        // knowledge): only distinct when it would grant.
                        if grant {
                            let mut s = state.clone();
                            if let Phase::Attempting { msgs, .. } = &mut s.clients[c].phase {
                                msgs[n] = Msg::No;
                            }
                            next.push((format!("c{c} -> n{n}: lost"), s));
                        }
                    }
                }
                Phase::Failed { slot } => {
                    // Cleans up its own value everywhere (compare-and-delete),
                    // or leaves it (the cleanup lost): both explored.
                    for clean in [true, false] {
                        let mut s = state.clone();
                        if clean {
                            delete_own(&mut s, c, client.generation, *slot);
                        }
                        s.clients[c].phase = Phase::Idle;
                        next.push((format!("c{c} fails, cleanup {clean}"), s));
                    }
                }
                Phase::Holding { slot } => {
                    let mut s = state.clone();
                    delete_own(&mut s, c, client.generation, *slot);
                    let cl = &mut s.clients[c];
                    cl.rounds = cl.rounds.saturating_sub(1);
                    cl.tried = 0;
                    cl.phase = if cl.rounds == 0 {
                        Phase::Done
                    } else {
                        Phase::Idle
                    };
                    next.push((format!("c{c} releases slot {slot}"), s));
                }
                Phase::Done => {}
            }
        }
        next
    }

    /// Explores every schedule; returns the first one that reaches more
    /// than K holders, and the number of states seen.
    fn check(&self, rounds: u8) -> (Option<Vec<String>>, usize) {
        let mut seen = HashSet::new();
        let mut trace = Vec::new();
        let start = self.initial(rounds);
        let found = self.dfs(start, &mut seen, &mut trace);
        (found.then_some(trace), seen.len())
    }

    fn dfs(&self, state: State, seen: &mut HashSet<State>, trace: &mut Vec<String>) -> bool {
        if self.holders(&state) > self.permits {
            return true;
        }
        if !seen.insert(state.clone()) {
            return false;
        }
        for (label, next) in self.successors(&state) {
            trace.push(label);
            if self.dfs(next, seen, trace) {
                return true;
            }
            trace.pop();
        }
        false
    }
}

fn delete_own(s: &mut State, client: usize, generation: u8, slot: usize) {
    for node in &mut s.values {
        if node[slot] == Some((client, generation)) {
            node[slot] = None;
        }
    }
}

#[test]
fn the_per_node_counter_admits_k_plus_one() {
    let model = Model {
        design: Design::Counter,
        ring: true,
        nodes: 3,
        permits: 2,
        clients: 3,
    };
    let (found, states) = model.check(1);
    let trace = found.expect("the checker must catch the per-node counter");
    // The AB / BC / AC schedule: three clients, each admitted by exactly
    // two nodes (K per node, 2K = 4 < 3 × 2 would be needed otherwise).
    let decided = trace
        .iter()
        .filter(|l| l.ends_with("decides (2 granted)"))
        .count();
    assert_eq!(decided, 3, "{trace:#?}");
    assert!(states > 0);
}

fn check_slots(configs: &[(usize, usize, usize, u8, bool)]) {
    for &(nodes, permits, clients, rounds, ring) in configs {
        let model = Model {
            design: Design::Slots,
            ring,
            nodes,
            permits,
            clients,
        };
        let started = std::time::Instant::now();
        let (found, states) = model.check(rounds);
        eprintln!(
            "N={nodes} K={permits} C={clients} rounds={rounds} ring={ring}: {states} states, {:?}",
            started.elapsed()
        );
        assert!(
            found.is_none(),
            "N={nodes} K={permits} C={clients}: {found:#?}"
        );
        assert!(states > 100, "explored only {states} states");
    }
}

#[test]
fn slots_never_admit_more_than_k() {
    check_slots(&[
        (3, 1, 3, 1, false),
        (3, 1, 2, 2, false),
        (1, 2, 3, 1, false),
        (2, 1, 2, 2, false),
    ]);
}

/// K + 1 clients against K = 2 on 3 nodes, the negative control's
/// configuration: in pass order 2.8 million states (2 minutes in debug),
/// in every slot order 20.4 million (3.5 minutes in release); no
/// violation in either (2026-12-05).
/// `cargo test --release --lib semaphore::model -- --ignored`.
#[test]
#[ignore = "minutes: run with --release --ignored"]
fn k_plus_one_clients_never_exceed_k_on_slots() {
    check_slots(&[(3, 2, 3, 1, true), (3, 2, 3, 1, false)]);
}

#[test]
fn the_checker_catches_slots_that_do_not_exclude() {
    // A second negative control: the slot design with nodes that grant a
    // slot already held (the compare in `SET NX` broken).
    let model = Model {
        design: Design::Overwrite,
        ring: true,
        nodes: 3,
        permits: 2,
        clients: 3,
    };
    let (found, _) = model.check(1);
    assert!(
        found.is_some(),
        "the checker must catch a slot without exclusion"
    );
}
