//! Leader election (etcd's `concurrency.Election`: campaign, proclaim,
//! resign, leader, observe), thin over the mutex: the leadership is the
//! lock on `election:{name}`, auto-extended; its term is the lock's
//! fencing token; the leader's value is a fenced record on every node.
//! DESIGN.md, "Leader election", has the protocol and its guarantees.
//!
//! Files: `handle` ([`Election`]: settings, the campaign, the read of the
//! leader), `leadership` ([`Leadership`]: the guard, proclaim, resign),
//! `publish` (the record's fenced write round), `read` (the lock's
//! inspection and the record's read, joined), `observe` ([`Observer`]),
//! `leader` ([`Leader`] and the pure rule that picks it), `record` (names
//! and the record's encoding, pure), `error` ([`ElectionError`]).

mod error;
mod handle;
mod leader;
mod leadership;
mod observe;
mod publish;
mod read;
mod record;

pub use error::ElectionError;
pub use handle::Election;
pub use leader::Leader;
pub use leadership::Leadership;
pub use observe::Observer;
