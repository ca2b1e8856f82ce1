//! The model check of multi-resource locks: every interleaving of the
//! per-node steps of a few clients locking overlapping sets in different
//! orders, on 1 or 3 nodes, with unlimited retries. Checked in every
//! reachable state:
//!
//! - **all or nothing**: a node holds either every key of a client's set
//!   or none of them;
//! - **exclusion**: two clients that both believe they hold (a majority
//!   granted) never share a resource;
//! - **no deadlock**: from every reachable state, the state where every
//!   client has held its set and released it is still reachable (no state
//!   is stuck, and no cycle of retries is inescapable: a livelock can go on
//!   only as long as the schedule keeps splitting the votes, which the
//!   real clients' jittered pauses and deadline bound).
//!
//! Time is not modelled (a key outlives its holder's validity under the
//! mutex's assumptions), nor lost messages: the script's atomicity per
//! node and the quorum are what is checked. Two negative controls show
//! the checker catches what it claims to: locking the keys one by one on
//! each node, waiting while holding (partial sets, and a deadlock with two
//! clients in opposite orders), and a broken script that looks at the
//! first key only (two holders of one resource).

use std::collections::{HashMap, HashSet, VecDeque};

/// How a client takes its set on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    /// `ACQUIRE_ALL`: every key free → set them all; otherwise nothing.
    AllOrNothing,
    /// Negative control: one key at a time in the client's order, waiting
    /// (holding the ones taken) while the next is held.
    OneByOne,
    /// Negative control: the script looks at the first key only and
    /// overwrites the others.
    FirstKeyOnly,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Phase {
    /// An attempt in flight: each node's answer once it ran there.
    Trying(Vec<Option<bool>>),
    /// One by one: how many of the set's keys each node has given.
    Locking(Vec<usize>),
    /// A majority granted: in the critical section.
    Holding,
    /// Releasing on each node (done or not); then done for good if it had
    /// held, or retrying.
    Releasing(Vec<bool>, bool),
    Done,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    /// `owner[node][resource]`: the client whose key it is.
    owner: Vec<Vec<Option<usize>>>,
    phases: Vec<Phase>,
}

struct Model {
    protocol: Protocol,
    nodes: usize,
    resources: usize,
    sets: Vec<Vec<usize>>,
}

/// What the checker found.
#[derive(Debug, Default)]
struct Report {
    states: usize,
    partial: usize,
    overlap: usize,
    /// Reachable states from which not every client can finish.
    stuck: usize,
}

impl Model {
    fn quorum(&self) -> usize {
        self.nodes / 2 + 1
    }

    fn start(&self) -> State {
        let first = |_: &Vec<usize>| match self.protocol {
            Protocol::OneByOne => Phase::Locking(vec![0; self.nodes]),
            _ => Phase::Trying(vec![None; self.nodes]),
        };
        State {
            owner: vec![vec![None; self.resources]; self.nodes],
            phases: self.sets.iter().map(first).collect(),
        }
    }

    /// Every state one step away: one client's step on one node.
    fn next(&self, s: &State) -> Vec<State> {
        let mut out = Vec::new();
        for c in 0..self.sets.len() {
            for node in 0..self.nodes {
                if let Some(t) = self.step(s, c, node) {
                    out.push(t);
                }
            }
            if s.phases[c] == Phase::Holding {
                let mut t = s.clone();
                t.phases[c] = Phase::Releasing(vec![false; self.nodes], true);
                out.push(t);
            }
        }
        out
    }

    fn step(&self, s: &State, c: usize, node: usize) -> Option<State> {
        let set = &self.sets[c];
        let mut t = s.clone();
        match &s.phases[c] {
            Phase::Trying(answers) if answers[node].is_none() => {
                let keys = &mut t.owner[node];
                let free = match self.protocol {
                    Protocol::FirstKeyOnly => keys[set[0]].is_none(),
                    _ => set.iter().all(|&r| keys[r].is_none()),
                };
                if free {
                    for &r in set {
                        keys[r] = Some(c);
                    }
                }
                let mut answers = answers.clone();
                answers[node] = Some(free);
                t.phases[c] = if answers.iter().all(Option::is_some) {
                    if answers.iter().filter(|a| **a == Some(true)).count() >= self.quorum() {
                        Phase::Holding
                    } else {
                        // Refused: release what was set, then retry.
                        Phase::Releasing(vec![false; self.nodes], false)
                    }
                } else {
                    Phase::Trying(answers)
                };
            }
            Phase::Locking(progress) if progress[node] < set.len() => {
                let r = set[progress[node]];
                if t.owner[node][r].is_some() {
                    // Waits, holding what it took.
                    return None;
                }
                t.owner[node][r] = Some(c);
                let mut progress = progress.clone();
                progress[node] += 1;
                let complete = progress.iter().filter(|&&p| p == set.len()).count();
                t.phases[c] = if complete >= self.quorum() {
                    Phase::Holding
                } else {
                    Phase::Locking(progress)
                };
            }
            Phase::Releasing(done, finished) if !done[node] => {
                for key in &mut t.owner[node] {
                    if *key == Some(c) {
                        *key = None;
                    }
                }
                let mut done = done.clone();
                done[node] = true;
                t.phases[c] = match (done.iter().all(|d| *d), *finished) {
                    (true, true) => Phase::Done,
                    (true, false) => Phase::Trying(vec![None; self.nodes]),
                    (false, _) => Phase::Releasing(done, *finished),
                };
            }
            _ => return None,
        }
        Some(t)
    }

    fn partial(&self, s: &State) -> bool {
        s.owner.iter().any(|keys| {
            self.sets.iter().enumerate().any(|(c, set)| {
                let mine = set.iter().filter(|&&r| keys[r] == Some(c)).count();
                mine != 0 && mine != set.len()
            })
        })
    }

    fn overlap(&self, s: &State) -> bool {
        let holding: Vec<usize> = (0..self.sets.len())
            .filter(|&c| s.phases[c] == Phase::Holding)
            .collect();
        holding.iter().enumerate().any(|(i, &a)| {
            holding[i + 1..]
                .iter()
                .any(|&b| self.sets[a].iter().any(|r| self.sets[b].contains(r)))
        })
    }

    /// Explores every reachable state; counts the violations of each
    /// property.
    fn check(&self) -> Report {
        let start = self.start();
        let mut index: HashMap<State, usize> = HashMap::new();
        let mut states: Vec<State> = Vec::new();
        let mut edges: Vec<Vec<usize>> = Vec::new();
        let mut queue = VecDeque::new();
        index.insert(start.clone(), 0);
        states.push(start);
        edges.push(Vec::new());
        queue.push_back(0);
        let mut report = Report::default();
        while let Some(i) = queue.pop_front() {
            let s = states[i].clone();
            report.partial += usize::from(self.partial(&s));
            report.overlap += usize::from(self.overlap(&s));
            for t in self.next(&s) {
                let j = *index.entry(t.clone()).or_insert_with(|| {
                    states.push(t);
                    edges.push(Vec::new());
                    queue.push_back(states.len() - 1);
                    states.len() - 1
                });
                edges[i].push(j);
            }
        }
        // Backwards from the states where every client is done.
        let mut back: Vec<Vec<usize>> = vec![Vec::new(); states.len()];
        for (i, out) in edges.iter().enumerate() {
            for &j in out {
                back[j].push(i);
            }
        }
        let mut can_finish: HashSet<usize> = HashSet::new();
        let mut todo: Vec<usize> = (0..states.len())
            .filter(|&i| states[i].phases.iter().all(|p| *p == Phase::Done))
            .collect();
        while let Some(j) = todo.pop() {
            if can_finish.insert(j) {
                todo.extend(back[j].iter().copied());
            }
        }
        report.states = states.len();
        report.stuck = states.len() - can_finish.len();
        report
    }
}

const X: usize = 0;
const Y: usize = 1;
const Z: usize = 2;

fn model(protocol: Protocol, nodes: usize, sets: &[&[usize]]) -> Model {
    Model {
        protocol,
        nodes,
        resources: 3,
        sets: sets.iter().map(|s| s.to_vec()).collect(),
    }
}

#[test]
fn all_or_nothing_locks_exclude_and_never_deadlock() {
    for nodes in [1, 3] {
        let opposite = model(Protocol::AllOrNothing, nodes, &[&[X, Y], &[Y, X]]).check();
        assert!(opposite.states > 10, "{opposite:?}");
        assert_eq!(
            (opposite.partial, opposite.overlap, opposite.stuck),
            (0, 0, 0),
            "{nodes} nodes: {opposite:?}"
        );
    }
    // Three clients, a ring of overlaps in every order, one node and three.
    let ring: &[&[usize]] = &[&[X, Y], &[Y, Z], &[Z, X]];
    let one = model(Protocol::AllOrNothing, 1, ring).check();
    assert_eq!((one.partial, one.overlap, one.stuck), (0, 0, 0), "{one:?}");
    let three = model(Protocol::AllOrNothing, 3, &[&[X, Y, Z], &[Z, Y], &[Y, X]]).check();
    assert_eq!(
        (three.partial, three.overlap, three.stuck),
        (0, 0, 0),
        "{three:?}"
    );
}

/// The negative control: taking the keys one by one, waiting while
/// holding, leaves partial sets on nodes and deadlocks two clients that
/// lock in opposite orders (states from which they can never finish).
#[test]
fn the_checker_catches_one_by_one_locking() {
    for nodes in [1, 3] {
        let report = model(Protocol::OneByOne, nodes, &[&[X, Y], &[Y, X]]).check();
        assert!(report.partial > 0, "{nodes} nodes: {report:?}");
        assert!(
            report.stuck > 0,
            "{nodes} nodes: no deadlock found: {report:?}"
        );
        assert_eq!(report.overlap, 0, "{report:?}");
    }
    // In one order, one by one is deadlock-free (lock ordering): the
    // checker does not cry wolf.
    let ordered = model(Protocol::OneByOne, 1, &[&[X, Y], &[X, Y]]).check();
    assert_eq!(ordered.stuck, 0, "{ordered:?}");
}

/// The negative control of exclusion: a script that looks at the first
/// key only hands one resource to two holders (their sets share the
/// second key only).
#[test]
fn the_checker_catches_a_script_that_checks_one_key() {
    let report = model(Protocol::FirstKeyOnly, 3, &[&[X, Y], &[Z, Y]]).check();
    assert!(report.overlap > 0, "{report:?}");
}
