//! One Redis server: its connection, its identity checks, and every command
//! sent to it, each bounded by a deadline. A plain node is one server; a
//! Redis Cluster node (`cluster.rs`) routes each key to the server of its
//! master shard, and each of those is one of these.
//!
//! The connection state machine, the identity checks and the stalled-node
//! logic all guard the same `Inner` under one mutex (`state.rs`); each
//! works on it from its own file: `connect.rs`, `send.rs`, `stall.rs`,
//! `failover.rs` (a Sentinel node's watch); `identity.rs` and `options.rs`
//! hold the small types a server is given and learns.
//!
//! Each node keeps **one** multiplexed connection, shared by every task of the
//! client and reused across calls: concurrent commands are pipelined on it,
//! so there is no pool and no connection per command (`link.rs`: our own
//! `wire::pipelined` for plain TCP and unix sockets, redis-rs's for TLS and
//! RESP3). Its lifecycle is our own small state machine rather than
//! redis-rs's `ConnectionManager` because a (re)connect must run the
//! identity checks (`INFO server`, `ROLE`) *before* the first lock command
//! travels over it; `ConnectionManager` reconnects silently underneath its
//! users.
//!
//! Commands on one connection are executed by Redis in the order they were
//! enqueued. The lock protocol relies on that: a release enqueued after an
//! acquire on the same node can never be overtaken by it, even when the node
//! is paused and both sit in its socket buffer.

mod classify;
mod connect;
mod failover;
mod identity;
mod link;
mod options;
mod send;
mod stall;
mod state;

pub(crate) use classify::classify;
pub(crate) use identity::Registry;
pub(crate) use options::{NodeTimeouts, Reach, Settled, Vote};
pub(crate) use state::Server;
