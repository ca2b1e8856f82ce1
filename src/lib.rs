//! # redfence
//!
//! A distributed lock over N independent Redis masters (the Redlock
//! algorithm) that survives the loss of a minority of them, with
//! clock-drift-adjusted validity, bounded waits everywhere, and typed errors
//! that say what each node answered. Every guard carries a fencing token
//! that is strictly larger for every later holder of the resource; storage
//! that checks it ([`FencedStore`], or `postgres::PgFencedStore` with the
//! `postgres` feature) rejects the writes of a holder whose lease ran out.
//! With one node it runs in single-node mode through the same API.
//!
//! ```no_run
//! # async fn demo() -> Result<(), redfence::Error> {
//! use std::time::Duration;
//!
//! let client = redfence::Client::new([
//!     "redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003",
//! ])?;
//! let guard = client.acquire("invoice:42", Duration::from_secs(10)).await?;
//! let token = guard.token(); // pass it with every write to fenced storage
//! // ... work while guard.validity() > 0 ...
//! guard.release().await;
//! # Ok(()) }
//! ```
//!
//! Bad input is a typed error at build or call time, never a panic:
//!
//! ```
//! use redfence::{Client, ConfigError};
//!
//! let none: [&str; 0] = [];
//! assert!(matches!(Client::new(none), Err(ConfigError::NoNodes)));
//! let twice = Client::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7001"]);
//! assert!(matches!(twice, Err(ConfigError::DuplicateNode { .. })));
//! let bad = Client::builder(["redis://:secret@127.0.0.1:7001"]).drift_factor(1.5).build();
//! assert_eq!(bad.unwrap_err().to_string(), "drift factor 1.5 is outside [0, 1)");
//! ```
//!
//! ## The algorithm
//!
//! An attempt draws a fresh unguessable value, sends `SET key value NX PX
//! ttl` (in one script with the move of the fence of the resource's
//! bucket, unless fencing is off) to **all N nodes at once**, and decides
//! at the first certain outcome: granted when ⌊N/2⌋ + 1 nodes said yes, failed when
//! that became impossible. Every node call is bounded by a per-node timeout,
//! so a dead or paused node costs the caller nothing when a majority answers
//! first. The lock is valid for `TTL − elapsed − drift` (drift = TTL ×
//! factor + 2 ms), measured on the monotonic clock from before the first
//! request; a lock with no validity left is not granted. A failed attempt
//! releases wherever its `SET` may have landed and, for a waiting acquire,
//! takes a ticket in the resource's fair queue on one node and retries when
//! the holder's release names it (or the holder's keys expire, or after a
//! jittered pause) until a deadline: waiters of every process get the lock
//! in arrival order, and one release costs one attempt however many wait.
//! The queue orders who tries; the quorum decides who holds. A node that stopped
//! answering is skipped (one probe per node timeout) instead of collecting
//! a backlog. Release and extend are compare-and-delete
//! and compare-and-pexpire scripts, so only the owner's value is touched.
//!
//! ## Long critical sections
//!
//! With [`AutoExtend`] a watchdog task owned by the guard extends the lock
//! every third of its validity and, when it cannot, resolves
//! [`Lease::lost`] with a [`LostLock`] that says why, before the validity
//! the client computed runs out; [`LockRequest::run`] then cancels the work
//! and returns [`Error::LockLost`].
//!
//! ```no_run
//! # async fn demo(client: redfence::Client) -> Result<(), redfence::Error> {
//! use std::time::Duration;
//! use redfence::AutoExtend;
//!
//! let rows = client
//!     .lock("report:nightly", Duration::from_secs(10))
//!     .auto_extend(AutoExtend::new().with_max_hold(Duration::from_secs(3600)))
//!     .run(|lease| async move {
//!         // ... hours of work; pass lease.token() with every write ...
//!         42
//!     })
//!     .await?; // Err(Error::LockLost(_)) if the lock was lost meanwhile
//! # let _ = rows; Ok(()) }
//! ```
//!
//! ## What it assumes
//!
//! The safety of any lease-based lock rests on timing: nodes' clocks advance
//! at about the same rate (within the drift factor), a holder is not paused
//! longer than its remaining validity, nodes are independent masters that
//! do not evict lock keys, and a node that restarts without its data stays
//! out of quorums for at least one TTL. DESIGN.md lists each assumption and
//! what breaks when it fails. Where they cannot be guaranteed (a GC pause can
//! outlast any lease), the protection is the fencing token checked by the
//! storage: the largest fence among the granting nodes, written back to a
//! majority when fewer held it, so by quorum intersection it exceeds every
//! token handed out before the attempt began, whatever the clocks did
//! (DESIGN.md, section 6, has the proof).
//!
//! ## Map
//!
//! The modules form a one-way stack of folders, one floor each: each names
//! only its own folder and the ones below it (DESIGN.md, "How the code maps
//! to the design", draws it with what each floor may import).
//!
//! 1. `client`: the handle ([`Client`]) and how one is made (`builder`:
//!    [`Builder`], `Client::new`).
//! 2. `mutex`: the lock family's floor, today the mutex: its request
//!    ([`LockRequest`]: acquire, try once, run a closure, wait) and guard
//!    ([`LockGuard`]). The family (semaphore, rwlock, multi, election, once)
//!    goes in sibling folders here, each thin over the floors below:
//!    `election` ([`Election`], [`Leadership`]: leader election over the
//!    lock, its term the fencing token); `multi` ([`MultiRequest`],
//!    [`MultiGuard`]: several resources at once, all or nothing, one
//!    token each).
//! 3. `lease`: what a request hands out ([`Lease`], the lost-lock signal)
//!    and the auto-extension task (`watchdog`).
//! 4. `protocol`: the operations over the shared state, one file each
//!    (`shared, round, attempt, settle, extend, release, reseed, inspect,
//!    queue`), waiting in the fair queue (`fair`) and the fan-out (`fanout`:
//!    all N at once, decide at the quorum, hear the rest); beside it the
//!    deployment audit (`audit`: observe, judge, report).
//! 5. `settings`: the validated `config` and the policies in it
//!    (`autoextend`: [`AutoExtend`]; `retry`: [`Retry`]).
//! 6. `waiting`: waiting by notification (`notify`), the fair queue's
//!    pre-granted vote (`pregrant`), one node's pub/sub connection
//!    (`subscription`).
//! 7. `node`: one vote (`Node`): a server (`server`: handshake, deadlines,
//!    health) or a cluster (`cluster`, `slot`), a Sentinel-managed master
//!    (`sentinel`), TLS ([`Tls`]), the restart guard ([`RestartGuard`] and
//!    what it knows per server).
//! 8. `wire`: commands, the `.lua` scripts, reply parsers, the plain-text
//!    probe of a silent `rediss://` server.
//! 9. `observe`: what the library reports: `metrics` (feature `metrics`;
//!    empty functions without it), `stats` ([`Stats`]), `inspect`
//!    ([`Inspection`]: a resource's lock on every node, summarised).
//! 10. `error`: data shared by all: [`Error`], [`ConfigError`], `failure`
//!     ([`QuorumFailure`] and the per-node detail), `lost` ([`LostLock`]).
//! 11. `logic`: pure, tested without Redis: `quorum`, `validity`, `fence`
//!     ([`FencingToken`], the token merge, model-checked), `resource`,
//!     [`limits`].
//!
//! Beside the stack, `store`: the fenced stores ([`FencedStore`] on Redis,
//! and `postgres`, `sqlx` with their features), which use only the wire and
//! the pure logic.
//!
//! ## Cargo features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `postgres` | off | `postgres::PgFencedStore`: fenced writes checked by PostgreSQL (tokio-postgres) |
//! | `sqlx-postgres`, `sqlx-mysql`, `sqlx-sqlite` (`sqlx`: all three) | off | `sqlx::{postgres, mysql, sqlite}`: fenced writes through sqlx on each backend |
//! | `metrics` | off | counters, gauges and histograms (`redfence_*`) through the `metrics` facade, for any exporter (docs/operations.md, "Observability") |
//! | `tls` | off | `rediss://` nodes and [`Tls`] (a private CA, mutual TLS): rustls through the `redis` crate's `tokio-rustls-comp`, with `ring` |
//!
//! The default build has no optional dependency. The fault suite, with its
//! event history and checker, is the `chaos` workspace member, and the
//! `redfence` command (`exec` a program under a lock, `status`, `doctor`)
//! is the `redfence-cli` member: neither is part of this library.

#![forbid(unsafe_code)]
#![deny(missing_docs, missing_debug_implementations)]
#![warn(rust_2018_idioms, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod audit;
mod client;
mod election;
mod error;
mod lease;
mod logic;
mod multi;
mod mutex;
mod node;
mod observe;
mod once;
mod protocol;
mod rwlock;
mod semaphore;
mod settings;
mod store;
mod waiting;
mod wire;

pub use logic::limits;

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use store::postgres;

#[cfg(any(
    feature = "sqlx-postgres",
    feature = "sqlx-mysql",
    feature = "sqlx-sqlite"
))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(
        feature = "sqlx-postgres",
        feature = "sqlx-mysql",
        feature = "sqlx-sqlite"
    )))
)]
pub use store::sqlx;

pub use audit::{Audit, Check, Finding, NodeAudit, Severity};
pub use client::builder::Builder;
pub use client::Client;
pub use election::{Election, ElectionError, Leader, Leadership, Observer};
pub use error::failure::{FailureReason, NodeErrorKind, NodeFailure, Phase, QuorumFailure};
pub use error::lost::{LossReason, LostLock};
pub use error::set::ResourceSetError;
pub use error::{ConfigError, Error};
pub use lease::Lease;
pub use logic::fence::FencingToken;
pub use multi::{MultiGuard, MultiRequest};
pub use mutex::guard::LockGuard;
pub use mutex::request::LockRequest;
pub use node::restart::RestartGuard;
pub use node::tls::Tls;
pub use observe::inspect::{Holder, Inspection, NodeInspection};
pub use observe::stats::Stats;
pub use once::{OnceError, OnceRecord, OnceStore, SingleFlight};
pub use protocol::inspect::{ForceOutcome, ForceReleased, NodeForceRelease};
pub use protocol::release::Released;
pub use rwlock::{
    RwEntry, RwGuard, RwHold, RwInspection, RwLock, RwMode, RwNodeInspection, RwRequest,
    UpgradeError,
};
pub use semaphore::{Permit, Semaphore, SemaphoreRequest};
pub use settings::autoextend::AutoExtend;
pub use settings::config::NodeSpec;
pub use settings::retry::Retry;
pub use store::{Fenced, FencedStore, StaleToken, StoreError};

/// The `redis` crate this one is built on (its errors, in an `Arc`, are the
/// `source()` of node failures), so that users name the same version.
pub use redis;
/// The `tokio-postgres` crate the PostgreSQL store is built on.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use tokio_postgres;

// The README's code blocks, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

// The operator's guide's code blocks (Cluster, Sentinel and TLS nodes).
#[cfg(doctest)]
#[doc = include_str!("../docs/operations.md")]
struct OperationsDoctests;

#[cfg(test)]
mod tests {
    /// The handles are meant to be shared across tasks.
    #[test]
    fn handles_are_send_and_sync() {
        fn check<T: Send + Sync + 'static>() {}
        check::<super::Client>();
        check::<super::LockGuard>();
        check::<super::Lease>();
        check::<super::LockRequest>();
        check::<super::Semaphore>();
        check::<super::Permit>();
        check::<super::MultiGuard>();
        check::<super::MultiRequest>();
        check::<super::SemaphoreRequest>();
        check::<super::RwLock>();
        check::<super::RwGuard>();
        check::<super::RwRequest>();
        check::<super::UpgradeError>();
        check::<super::Error>();
        check::<super::Election>();
        check::<super::Leadership>();
        check::<super::ElectionError>();
        check::<super::SingleFlight>();
        check::<super::OnceError<std::io::Error>>();
        // Polled by one task at a time: `Send`, not `Sync`.
        fn send<T: Send + 'static>() {}
        send::<super::Observer>();
    }
}
