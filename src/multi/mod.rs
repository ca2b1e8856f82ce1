//! Multi-resource locks: several resources held at once, all or nothing,
//! each with its own fencing token (DESIGN.md, section 6c). Each resource
//! is held as the mutex holds it (its lock key, its fence bucket, its
//! value format), so a resource locked in a set and the same resource
//! locked alone exclude each other and share one token order; what is new
//! is that the acquire, the extend and the release are each one script per
//! node carrying every key.
//!
//! - `set`: the checks on a set (empty, too many, repeated) and the hash
//!   slot check for a Redis Cluster node (pure);
//! - `attempt`: one all-or-nothing attempt over the mutex's quorum round,
//!   tokens settled per resource;
//! - `request`: [`MultiRequest`]: waiting for a release of any resource;
//! - `guard`: [`MultiGuard`], one mutex guard per resource, extended
//!   (`EXTEND_ALL`) and released (`protocol::release_all`) as one set,
//!   with one watchdog for the set;
//! - `model` (tests): the all-or-nothing and deadlock model check, with
//!   one-by-one locking as its negative control.

mod attempt;
mod guard;
#[cfg(test)]
mod model;
mod request;
mod set;

pub use guard::MultiGuard;
pub use request::MultiRequest;
