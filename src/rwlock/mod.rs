//! Read-write locks: many readers or one writer, each hold decided at a
//! majority of all N nodes (two majorities intersect, and no node admits
//! a reader beside a writer or a writer beside a reader, so a read and a
//! write never hold at once). Each hold is a string key with its owner's
//! value and a TTL, as a mutex's lock key: the guard is the mutex's
//! [`LockGuard`](crate::LockGuard), with its whole lifecycle, and the
//! token is settled by the mutex's engine. DESIGN.md, section 6b, has the
//! protocol, the token proof and the writer rule.
//!
//! - `keys`: the lock's Redis keys (pure);
//! - `target`: [`RwMode`] and a hold's request as the engine takes it;
//! - `scripts`: the parsers of the admissions' and the inspection's
//!   replies (the scripts are `wire::scripts`' `RW_*`, from
//!   `wire/lua/rw_*.lua`, loaded by every connection's handshake);
//! - `admit`: one attempt of either mode (round, settle, cleanup);
//! - `marker`: the waiting writer's marker;
//! - `convert`: the downgrade;
//! - `request`: [`RwRequest`]: waiting, `try_`, scoped;
//! - `view` (pure) and `inspect`: [`RwLock::inspect`], the operators'
//!   read of every node;
//! - `guard`: [`RwGuard`], and [`UpgradeError`], which hands it back;
//! - `model` (tests): the model checker of exclusion and token order,
//!   with its negative controls.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::lease::Lease;
use crate::logic::resource::validate;
use crate::protocol::shared::Shared;

mod admit;
mod convert;
mod guard;
mod inspect;
mod keys;
mod marker;
#[cfg(test)]
mod model;
mod request;
mod scripts;
mod target;
mod view;

pub use guard::{RwGuard, UpgradeError};
pub use request::RwRequest;
pub use target::RwMode;
pub use view::{RwEntry, RwHold, RwInspection, RwNodeInspection};

/// A read-write lock, made by [`Client::rw_lock`](crate::Client::rw_lock):
/// a cheap handle (the client's `Arc` and the lock's key names),
/// validated when made.
///
/// Its keys are of their own kind under the client's prefix
/// (`{prefix}rw:…`): a mutex of the same name is another lock.
#[derive(Clone)]
pub struct RwLock {
    shared: Arc<Shared>,
    keys: Arc<keys::RwKeys>,
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("name", &self.keys.name)
            .finish()
    }
}

impl RwLock {
    pub(crate) fn new(shared: Arc<Shared>, name: &str) -> Result<Self, Error> {
        validate(name).map_err(Error::InvalidResource)?;
        let config = &shared.config;
        let keys = keys::RwKeys::new(&config.key_prefix, name, config.layout);
        Ok(Self {
            shared,
            keys: Arc::new(keys),
        })
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.keys.name
    }

    /// Starts a read request with lease `ttl`, to configure before
    /// acquiring.
    pub fn read(&self, ttl: Duration) -> RwRequest {
        self.request(RwMode::Read, ttl)
    }

    /// Starts a write request with lease `ttl`, to configure before
    /// acquiring.
    pub fn write(&self, ttl: Duration) -> RwRequest {
        self.request(RwMode::Write, ttl)
    }

    /// Starts a request of `mode`.
    pub fn request(&self, mode: RwMode, ttl: Duration) -> RwRequest {
        RwRequest::new(Arc::clone(&self.shared), Arc::clone(&self.keys), mode, ttl)
    }

    /// Every node's view of the lock, read at once: the writer key, the
    /// live reader entries and the waiting writer's marker (each with its
    /// holder's client tag and TTL), and the fence; and which write and
    /// reads are held on a majority. Read-only (the readers' index is not
    /// pruned), one script per node, bounded by the node timeout: a node
    /// that does not answer in time is reported with its error. A
    /// snapshot for operators, not a lock.
    pub async fn inspect(&self) -> RwInspection {
        inspect::inspect(&self.shared, &self.keys).await
    }

    /// Acquires the read lock, waiting under the client's retry policy;
    /// see [`RwRequest::acquire`].
    pub async fn acquire_read(&self, ttl: Duration) -> Result<RwGuard, Error> {
        self.read(ttl).acquire().await
    }

    /// Acquires the write lock, waiting under the client's retry policy
    /// (and stopping new readers meanwhile); see [`RwRequest::acquire`].
    pub async fn acquire_write(&self, ttl: Duration) -> Result<RwGuard, Error> {
        self.write(ttl).acquire().await
    }

    /// One attempt at the read lock: `Ok(None)` when a writer holds or
    /// waits; see [`RwRequest::try_acquire`].
    pub async fn try_read(&self, ttl: Duration) -> Result<Option<RwGuard>, Error> {
        self.read(ttl).try_acquire().await
    }

    /// One attempt at the write lock: `Ok(None)` when held; see
    /// [`RwRequest::try_acquire`].
    pub async fn try_write(&self, ttl: Duration) -> Result<Option<RwGuard>, Error> {
        self.write(ttl).try_acquire().await
    }

    /// Acquires the read lock, runs `f` holding it, releases; see
    /// [`RwRequest::run`].
    pub async fn with_read<F, Fut, T>(&self, ttl: Duration, f: F) -> Result<T, Error>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = T>,
    {
        self.read(ttl).run(f).await
    }

    /// Acquires the write lock, runs `f` holding it, releases; see
    /// [`RwRequest::run`].
    pub async fn with_write<F, Fut, T>(&self, ttl: Duration, f: F) -> Result<T, Error>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = T>,
    {
        self.write(ttl).run(f).await
    }
}
