//! Quorum size and the early-decision tally. Pure; no I/O.
//!
//! The quorum is always counted over **all N configured nodes**, never over
//! the nodes that happened to answer: a node that timed out or refused the
//! connection is a vote against, not an abstention. That is what makes any two
//! successful quorums share at least one node, the fact every safety argument
//! in DESIGN.md rests on.

/// Majority of `nodes`: ⌊N/2⌋ + 1. For N = 1 this is 1 (single-node mode).
pub(crate) const fn quorum(nodes: usize) -> usize {
    nodes / 2 + 1
}

/// What the votes so far allow us to conclude.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Neither outcome is certain yet.
    Pending,
    /// A majority said yes; later answers cannot change that.
    Reached,
    /// So many said no that a majority is out of reach.
    Impossible,
}

/// Counts yes/no votes from a fixed set of nodes and decides as early as the
/// arithmetic allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tally {
    nodes: usize,
    quorum: usize,
    yes: usize,
    no: usize,
}

impl Tally {
    pub(crate) const fn new(nodes: usize) -> Self {
        Self {
            nodes,
            quorum: quorum(nodes),
            yes: 0,
            no: 0,
        }
    }

    /// Records one node's vote and returns the decision after it. Votes past
    /// the node count are ignored (a caller bug, but never a panic).
    pub(crate) fn record(&mut self, yes: bool) -> Decision {
        if self.yes + self.no < self.nodes {
            if yes {
                self.yes += 1;
            } else {
                self.no += 1;
            }
        }
        self.decision()
    }

    pub(crate) const fn decision(&self) -> Decision {
        if self.yes >= self.quorum {
            Decision::Reached
        } else if self.no > self.nodes - self.quorum {
            Decision::Impossible
        } else {
            Decision::Pending
        }
    }

    pub(crate) const fn yes(&self) -> usize {
        self.yes
    }

    pub(crate) const fn quorum(&self) -> usize {
        self.quorum
    }

    pub(crate) const fn nodes(&self) -> usize {
        self.nodes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quorum_sizes() {
        let expected = [
            (1, 1),
            (2, 2),
            (3, 2),
            (4, 3),
            (5, 3),
            (6, 4),
            (7, 4),
            (8, 5),
            (9, 5),
        ];
        for (n, q) in expected {
            assert_eq!(quorum(n), q, "N = {n}");
        }
    }

    /// Any two majorities of the same N nodes share a node: 2q > N.
    #[test]
    fn any_two_quorums_intersect() {
        for n in 1..=9 {
            assert!(2 * quorum(n) > n, "N = {n}");
            // And q is the smallest size with that property.
            assert!(2 * (quorum(n) - 1) <= n, "N = {n}");
        }
    }

    /// Every order of every vote vector for N = 1..=9: the tally decides
    /// exactly when the outcome becomes certain, and never changes its mind.
    #[test]
    fn exhaustive_early_decision() {
        for n in 1..=9usize {
            let q = quorum(n);
            for votes in 0u32..(1 << n) {
                let mut tally = Tally::new(n);
                let mut first_decision = None;
                for i in 0..n {
                    let yes = votes & (1 << i) != 0;
                    let d = tally.record(yes);
                    let remaining = n - (i + 1);
                    let certain_yes = tally.yes() >= q;
                    let certain_no = tally.yes() + remaining < q;
                    match d {
                        Decision::Reached => assert!(certain_yes),
                        Decision::Impossible => assert!(certain_no),
                        Decision::Pending => assert!(!certain_yes && !certain_no),
                    }
                    if let Some(first) = first_decision {
                        assert_eq!(d, first, "decision changed: N = {n}, votes = {votes:b}");
                    } else if d != Decision::Pending {
                        first_decision = Some(d);
                    }
                }
                let total_yes = votes.count_ones() as usize;
                let expected = if total_yes >= q {
                    Decision::Reached
                } else {
                    Decision::Impossible
                };
                assert_eq!(first_decision, Some(expected), "N = {n}, votes = {votes:b}");
            }
        }
    }

    #[test]
    fn extra_votes_are_ignored() {
        let mut t = Tally::new(1);
        assert_eq!(t.record(false), Decision::Impossible);
        assert_eq!(t.record(true), Decision::Impossible);
        assert_eq!(t.yes(), 0);
        assert_eq!((t.quorum(), t.nodes()), (1, 1));
    }
}
