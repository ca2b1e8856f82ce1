//! The mutex, today the one primitive of the lock family: its request
//! ([`LockRequest`](request::LockRequest): acquire, try once, run a closure,
//! wait) and its guard ([`LockGuard`](guard::LockGuard)). Thin over the
//! shared machinery below: the lease and its watchdog (`lease`), the
//! protocol operations and the fair queue (`protocol`). The rest of the
//! family (semaphore, rwlock, multi, election, once) gets sibling folders on
//! this floor, each over the same protocol.

pub(crate) mod guard;
pub(crate) mod request;
