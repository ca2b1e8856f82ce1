//! Exploring the reduced model: depth-first through every state, or
//! breadth-first to a shortest counterexample; judging every hand-out,
//! checking the re-seed's liveness in every state, auditing the bounds
//! behind forgetting; and `check`, which runs a configuration and prints
//! its report.

use std::collections::{HashSet, VecDeque};
use std::hash::BuildHasherDefault;
use std::time::Instant;

use super::reduced::{Model, State};
use super::symmetry::Prehashed;
use super::*;

pub(super) type Visited = HashSet<u128, BuildHasherDefault<Prehashed>>;

/// A depth-first frame: a state and the transitions left to try from it.
struct Frame<const N: usize> {
    state: State<N>,
    steps: Vec<Step>,
    next: usize,
}

impl<const N: usize> Model<'_, N> {
    pub(super) fn run(&self) -> Report {
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
            (Broken::Exclusion, h.overlaps),
        ] {
            let slot = match broken {
                Broken::Monotonicity => &mut report.monotonicity,
                Broken::Exclusion => &mut report.exclusion,
                _ => &mut report.uniqueness,
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

    /// The re-seed's liveness in `s`: every node down whose window is over,
    /// while every other node kept its fences (none is down or waiting),
    /// can complete its re-seed from the others that answer, with up to
    /// q − 2 of them not answering (as many as N − q + 1 sources leave
    /// out), and then votes. Checked with the model's own transitions.
    /// Returns the failure, described; `None` when it holds or does not
    /// apply. Counts the states where it applied.
    fn reseed_stuck(&self, s: &State<N>, report: &mut Report) -> Option<String> {
        if self.config.restarts == 0 {
            return None;
        }
        for r in 0..N {
            let others_up = (0..N).all(|j| j == r || s.nodes[j].status == UP);
            if s.nodes[r].status != DOWN || s.touched(r) || !others_up {
                continue;
            }
            report.liveness_checked += 1;
            let others: Vec<usize> = (0..N).filter(|&j| j != r).collect();
            for silent in 0..=self.quorum.saturating_sub(2) {
                let sources = others[silent..]
                    .iter()
                    .fold(0u8, |mask, &j| mask | (1 << j));
                let step = Step::Reseed { node: r, sources };
                let votes = self.reseed_enabled(s, r, sources)
                    && self.apply(s, step, None).0.nodes[r].status == UP;
                if !votes {
                    return Some(format!(
                        "n{r} restarted empty, its window over; {} other node(s) answer, \
                         all keeping their fences, yet the re-seed cannot complete: n{r} \
                         never votes again  <-- RE-SEED STUCK",
                        others.len() - silent
                    ));
                }
            }
        }
        None
    }

    /// Every reachable state, depth first; records the first violation of
    /// each property.
    fn depth_first(&self) -> Report {
        let mut report = Report::default();
        let mut seen = Visited::default();
        let init = State::initial(&self.config);
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
            let trace = || -> Vec<String> {
                stack
                    .iter()
                    .map(|f| self.describe(&f.state, f.steps[f.next - 1]))
                    .collect()
            };
            if let Some(h) = &effects.hand_out {
                self.judge(&mut report, h, trace);
            }
            if seen.insert(self.fingerprint(&next)) {
                if let Some(stuck) = self.reseed_stuck(&next, &mut report) {
                    if report.liveness.is_none() {
                        let mut trace = trace();
                        trace.push(stuck);
                        report.liveness = Some(Violation {
                            broken: Broken::Liveness,
                            trace,
                        });
                    }
                }
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
        let mut states: Vec<(State<N>, usize, Option<Step>, usize)> =
            vec![(State::initial(&self.config), 0, None, 0)];
        seen.insert(self.fingerprint(&states[0].0));
        let mut queue = VecDeque::from([0usize]);
        let mut steps = Vec::new();
        'search: while let Some(at) = queue.pop_front() {
            let (current, _, _, depth) = states[at];
            self.steps(&current, &mut steps);
            for &step in &steps {
                let (next, effects) = self.apply(&current, step, None);
                report.record(&effects);
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
                if let Some(h) = &effects.hand_out {
                    let sought = match self.config.seek {
                        None => true,
                        Some(Broken::Monotonicity) => h.not_monotonic(),
                        Some(Broken::Uniqueness) => h.duplicate,
                        Some(Broken::Exclusion) => h.overlaps,
                        Some(Broken::Liveness) => false,
                    };
                    if self.judge(&mut report, h, path) && sought {
                        report.depth = depth + 1;
                        break 'search;
                    }
                }
                if seen.insert(self.fingerprint(&next)) {
                    if let Some(stuck) = self.reseed_stuck(&next, &mut report) {
                        let mut trace = path();
                        trace.push(stuck);
                        report.liveness.get_or_insert(Violation {
                            broken: Broken::Liveness,
                            trace,
                        });
                        if self.config.seek.is_none_or(|b| b == Broken::Liveness) {
                            report.depth = depth + 1;
                            break 'search;
                        }
                    }
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
    fn audit(&self, before: &State<N>, after: &State<N>, effects: &Effects) {
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

    fn describe(&self, s: &State<N>, step: Step) -> String {
        let mut line = String::new();
        self.apply(s, step, Some(&mut line));
        line
    }
}

/// Runs one configuration on `N` nodes, prints its summary and any
/// counterexample, and checks that hand-outs are reachable at all (unless
/// a violation was found first).
pub(super) fn check<const N: usize>(config: Config<'_>) -> Report {
    let report = Model::<N>::new(config).run();
    eprintln!("{}", report.summary(&config, N));
    for v in [
        &report.monotonicity,
        &report.uniqueness,
        &report.liveness,
        &report.exclusion,
    ]
    .into_iter()
    .flatten()
    {
        eprintln!(
            "  counterexample ({:?}), {} steps (keys vanish lazily: an acquire that \
             lands is granted, whatever key was there having vanished{}):",
            v.broken,
            v.trace.len(),
            if config.leases {
                "; with leases, only a key whose attempt is over"
            } else {
                ""
            }
        );
        for (k, line) in v.trace.iter().enumerate() {
            eprintln!("  {:>3}. {line}", k + 1);
        }
    }
    let violated = [
        &report.monotonicity,
        &report.uniqueness,
        &report.liveness,
        &report.exclusion,
    ]
    .iter()
    .any(|v| v.is_some());
    assert!(
        report.hand_outs > 0 || violated,
        "no hand-out is reachable: the model is vacuous"
    );
    report
}
