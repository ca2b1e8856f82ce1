//! The protocol operations, one file each, as functions over the client's
//! [`Shared`](shared::Shared) state: an acquire attempt, the token's settle
//! and write-back, extend, release (and a multi-resource set's release,
//! `release_all`), the restart guard's re-seed, and the
//! inspection and forced release of a resource, and the fair queue's requests
//! to a resource's home node; the family's fenced records written on a
//! majority (`majority_write`). Each
//! is one or two quorum rounds over the fan-out (`fanout`); the layers above
//! (requests, guards, the watchdog) decide when to run them. Waiting in the
//! fair queue (`fair`), which runs attempts, looks and releases, is here
//! too: the waits it uses are the shared state's, one floor down.
//!
//! Files here import downward only: `fair` uses `attempt`, `queue` and
//! `release`; `attempt` uses `settle`, `release` and `reseed`; `release_all` uses
//! `release`; all use
//! `round` and `shared`, which use `fanout`.

pub(crate) mod attempt;
pub(crate) mod extend;
pub(crate) mod fair;
pub(crate) mod fanout;
pub(crate) mod inspect;
pub(crate) mod majority_write;
pub(crate) mod queue;
pub(crate) mod release;
pub(crate) mod release_all;
pub(crate) mod reseed;
pub(crate) mod round;
pub(crate) mod settle;
pub(crate) mod shared;
