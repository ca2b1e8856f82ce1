//! Waiting by notification: what a client hears from the nodes while its
//! acquires wait. `notify` (the waits of one client and the subscriber task
//! that feeds them), `pregrant` (the fair queue's pre-granted vote as a
//! notice carries it, and where a queue lives) and `subscription` (one
//! node's pub/sub connection). The shared state owns the waits, so this sits
//! below `protocol`; the fair queue's waiting loop, which runs protocol
//! operations, is `protocol::fair`.

pub(crate) mod any;
pub(crate) mod notify;
pub(crate) mod pregrant;
pub(crate) mod subscription;
