//! What the library reports about itself: the names of every metric (the
//! `metrics` feature; empty functions without it), the client's counters
//! ([`Stats`](stats::Stats)), and the summary of a resource's lock on every
//! node ([`Inspection`](inspect::Inspection)). Low in the stack because the
//! node connections and the wire report through it; it names only `error`
//! and `logic`. The deployment audit, which talks to the nodes, is `audit`.

pub(crate) mod inspect;
pub(crate) mod metrics;
pub(crate) mod span;
pub(crate) mod stats;
