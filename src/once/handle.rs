//! The single-flight handle: [`SingleFlight`], its settings, and
//! `get_or_compute`: read the entry; fresh → return it; else take the
//! mutex on `once:{key}` once, compute under it and write the value
//! fenced by the lock's token; not granted → wait for the computer's
//! release by the mutex's waiting acquire (woken by its release notice),
//! then read again before computing ("double-checked").

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::field::{self, Empty};
use tracing::Instrument;

use crate::error::Error;
use crate::logic::fence::FencingToken;
use crate::logic::resource::{lock_key, validate};
use crate::logic::validity::later;
use crate::mutex::guard::LockGuard;
use crate::mutex::request::LockRequest;
use crate::protocol::fair::hopeless;
use crate::protocol::shared::Shared;
use crate::settings::retry::{jitter, Retry};

use super::entries::{Entries, Failed, Nodes};
use super::entry::Entry;
use super::error::OnceError;
use super::local::{join, Flight, Role};
use super::store::{Short, Written};
use super::user::{OnceStore, User};

/// What a single-flight's lock resource starts with.
pub(crate) const RESOURCE_PREFIX: &str = "once:";

/// The computation's lease unless set.
pub(crate) const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// How long a computed value is fresh unless set.
pub(crate) const DEFAULT_VALUE_TTL: Duration = Duration::from_secs(60);
/// A waiter's deadline unless set.
pub(crate) const DEFAULT_WAIT: Duration = Duration::from_secs(10);
/// How long an entry stays on the nodes after it expires unless set.
pub(crate) const DEFAULT_KEEP: Duration = Duration::from_secs(3600);
/// How long a computation's error is shown to its waiters unless set.
pub(crate) const DEFAULT_ERROR_TTL: Duration = Duration::from_secs(10);

/// One computation per expiry of a cached value across every client of
/// the same nodes; made by [`Client::once`](crate::Client::once), cheap to
/// clone, nothing sent until used.
///
/// The value lives on the lock's nodes, in the hash
/// `{prefix}cache:once:{key}` (value, fence, expiry on the node's clock,
/// the last computation's time), written only through a fenced write with
/// the computer's token. The computation runs under the crate's lock on the
/// resource `once:{key}` (what `redfence status once:{key}` shows).
///
/// # Default
///
/// Computation lease 10 s (not auto-extended: a computer that outlives it
/// may be overtaken, and its write is then refused), value TTL 60 s, no
/// jitter, early recomputation off, no serve-stale, waiters' deadline
/// 10 s, the client's retry policy for the wait (bounded by the deadline),
/// entry kept 1 h after expiry, errors shown to waiters for 10 s.
#[derive(Clone)]
#[must_use = "a single-flight does nothing until used"]
pub struct SingleFlight {
    shared: Arc<Shared>,
    key: Arc<str>,
    resource: Arc<str>,
    entry_key: Arc<str>,
    ttl: Duration,
    value_ttl: Duration,
    jitter: Duration,
    early: f64,
    serve_stale: bool,
    wait: Duration,
    keep: Duration,
    error_ttl: Duration,
    retry: Retry,
}

impl fmt::Debug for SingleFlight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SingleFlight")
            .field("key", &self.key)
            .field("entry_key", &self.entry_key)
            .field("ttl", &self.ttl)
            .field("value_ttl", &self.value_ttl)
            .field("jitter", &self.jitter)
            .field("early", &self.early)
            .field("serve_stale", &self.serve_stale)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

/// Where a caller stands after the first look at the entry.
enum Look {
    /// A fresh value not due for early recomputation.
    Fresh(Vec<u8>),
    /// Compute, or wait for the one computing.
    Miss(Miss),
}

/// A miss: what the look saw, and what can be served meanwhile.
struct Miss {
    /// The entry's fence when read (0 when none).
    seen: u64,
    /// A fresh value due early: returned if someone else recomputes.
    fresh: Option<Vec<u8>>,
    /// The previous value, with serve-stale on.
    stale: Option<Vec<u8>>,
}

impl SingleFlight {
    pub(crate) fn new(shared: Arc<Shared>, key: &str) -> Self {
        let resource = format!("{RESOURCE_PREFIX}{key}");
        let config = &shared.config;
        let lock = lock_key(&config.key_prefix, &resource, config.layout);
        let entry_key = entry_key(&config.key_prefix, &lock);
        Self {
            retry: config.retry,
            key: key.into(),
            resource: resource.into(),
            entry_key: entry_key.into(),
            ttl: DEFAULT_TTL,
            value_ttl: DEFAULT_VALUE_TTL,
            jitter: Duration::ZERO,
            early: 0.0,
            serve_stale: false,
            wait: DEFAULT_WAIT,
            keep: DEFAULT_KEEP,
            error_ttl: DEFAULT_ERROR_TTL,
            shared,
        }
    }

    /// The single-flight key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The lock resource a computation holds: `once:{key}`.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The Redis key of the entry on every node.
    pub fn entry_key(&self) -> &str {
        &self.entry_key
    }

    /// The computation's lease: how long a computer that vanished (killed,
    /// paused) keeps the others waiting. Not extended: a computation that
    /// takes longer may be overtaken by the next caller, and its write is
    /// then refused ([`OnceError::Stale`]). Defaults to 10 seconds.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long a computed value is fresh. Defaults to 60 seconds.
    pub fn value_ttl(mut self, ttl: Duration) -> Self {
        self.value_ttl = ttl;
        self
    }

    /// Up to this much random time is added to each value's TTL, so that
    /// keys computed together do not expire together. Defaults to none.
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    /// XFetch's β: a fresh value is recomputed early, by one caller, when
    /// `δ·β·(−ln u) ≥ time left` (δ the last computation's time, `u`
    /// uniform in (0, 1]); the others keep getting the fresh value. 1 is
    /// the paper's choice, larger recomputes earlier. Defaults to 0: off.
    /// Negative or not finite means off.
    pub fn early(mut self, beta: f64) -> Self {
        self.early = if beta.is_finite() && beta > 0.0 {
            beta
        } else {
            0.0
        };
        self
    }

    /// Return the previous (expired) value at once while another caller
    /// recomputes, and instead of the computation's error when it fails.
    /// Defaults to off: callers wait for the new value.
    pub fn serve_stale(mut self, enabled: bool) -> Self {
        self.serve_stale = enabled;
        self
    }

    /// How long a caller waits for another caller's computation before
    /// [`OnceError::Deadline`]. Defaults to 10 seconds.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// How long an entry stays on the nodes after its value expires: the
    /// stale value served with [`serve_stale`](Self::serve_stale), and the
    /// fence that refuses a computer whose lease ran out. A computer
    /// overtaken longer than this ago could write again once the entry is
    /// gone. Defaults to 1 hour.
    pub fn keep(mut self, keep: Duration) -> Self {
        self.keep = keep;
        self
    }

    /// How long a failed computation's error is given to the callers that
    /// waited for it ([`OnceError::Failed`]). Defaults to 10 seconds.
    pub fn error_ttl(mut self, ttl: Duration) -> Self {
        self.error_ttl = ttl;
        self
    }

    /// The retry policy of the wait for a computer's release (its
    /// `max_wait` is capped by [`wait`](Self::wait)). Defaults to the
    /// client's.
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// The cached value if fresh; else one caller across every client
    /// runs `compute` and stores its result, and the others wait for it.
    ///
    /// - Fresh, and not due for early recomputation: returned after one
    ///   read (one script per node, decided at a majority).
    /// - Otherwise one attempt at the lock `once:{key}`. Granted: `compute`
    ///   runs, its value is written fenced by the lock's token on every
    ///   node, then the lock is released (its notice wakes the waiters).
    ///   Dropping this future during the computation drops the lock's
    ///   guard, which releases it at once in the background: the next
    ///   caller computes.
    /// - Not granted: a fresh value due early, or with serve-stale the
    ///   previous value, is returned at once. Otherwise the caller waits
    ///   for the computer's release with the mutex's waiting acquire,
    ///   reads again once granted, and returns the new value (releasing at
    ///   once), or the computer's error ([`OnceError::Failed`]), or — the
    ///   computer vanished — computes itself. Never past its
    ///   [deadline](Self::wait) ([`OnceError::Deadline`]). Dropping a
    ///   waiter does not affect the computation.
    ///
    /// The value read is the one with the highest fence among a majority
    /// of the nodes' answers: every write that a majority accepted before
    /// the read began is seen, or a later one.
    pub async fn get_or_compute<F, Fut, E>(&self, compute: F) -> Result<Vec<u8>, OnceError<E>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<u8>, E>>,
        E: std::error::Error + 'static,
    {
        let span = tracing::debug_span!(
            "once",
            key = %self.key,
            outcome = Empty,
            elapsed = Empty,
        );
        let started = Instant::now();
        let nodes = Nodes {
            shared: &self.shared,
            key: &self.entry_key,
        };
        let got = self
            .get_inner(&nodes, compute)
            .instrument(span.clone())
            .await;
        span.record("elapsed", field::debug(started.elapsed()));
        got
    }

    /// [`get_or_compute`](Self::get_or_compute) with the value in the
    /// user's `store` under this single-flight's key instead of on the
    /// lock's nodes: the lock, the waiting and the notices stay on the
    /// nodes; the value is read from the store and written to it with the
    /// computer's fencing token ([`OnceStore::write`] must refuse a lower
    /// token than the record's). A reader gets the store's consistency (see
    /// [`OnceStore`]). A failed computation is not written to the store: its
    /// error reaches the callers of the computer's client
    /// ([`OnceError::Failed`]); a caller of another client that waited for
    /// it finds no fresh value once granted and computes itself.
    pub async fn get_or_compute_in<S, F, Fut, E>(
        &self,
        store: &S,
        compute: F,
    ) -> Result<Vec<u8>, OnceError<E>>
    where
        S: OnceStore,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<u8>, E>>,
        E: std::error::Error + 'static,
    {
        let span = tracing::debug_span!(
            "once",
            key = %self.key,
            store = "user",
            outcome = Empty,
            elapsed = Empty,
        );
        let started = Instant::now();
        let user = User {
            store,
            key: &self.key,
        };
        let got = self
            .get_inner(&user, compute)
            .instrument(span.clone())
            .await;
        span.record("elapsed", field::debug(started.elapsed()));
        got
    }

    async fn get_inner<I, F, Fut, E>(&self, io: &I, compute: F) -> Result<Vec<u8>, OnceError<E>>
    where
        I: Entries,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<u8>, E>>,
        E: std::error::Error + 'static,
    {
        if !self.shared.config.fencing {
            return Err(OnceError::FencingOff);
        }
        if let Err(reason) = validate(&self.key) {
            return Err(self.lock_error(Error::InvalidResource(reason)));
        }
        let deadline = later(Instant::now(), self.wait);
        loop {
            let miss = match self.look(io).await? {
                Look::Fresh(value) => {
                    outcome("fresh");
                    return Ok(value);
                }
                Look::Miss(miss) => miss,
            };
            let name = format!("{}\0{}\0{}", self.shared.id_text, io.kind(), self.entry_key);
            let mut followed = match join(name) {
                Role::Leader(flight) => {
                    let led = self.lead(io, &flight, deadline, miss, compute).await;
                    match &led {
                        Ok(value) => flight.share(Ok(value.clone())),
                        Err(OnceError::Compute { source, .. }) => {
                            flight.share(Err(source.to_string()));
                        }
                        // Deadline, lock, stale write, unavailable: the
                        // followers start over, each on its own.
                        Err(_) => {}
                    }
                    return led;
                }
                Role::Follower(followed) => followed,
            };
            if let Some(value) = miss.fresh.or(miss.stale) {
                outcome("stale-or-early");
                return Ok(value);
            }
            let shared =
                tokio::time::timeout_at(deadline.into(), followed.wait_for(Option::is_some))
                    .await
                    .map(|got| got.ok().and_then(|shared| shared.clone()));
            match shared {
                Err(_elapsed) => return Err(self.deadline_error()),
                Ok(Some(Ok(value))) => {
                    outcome("followed");
                    return Ok(value);
                }
                Ok(Some(Err(message))) => {
                    outcome("failed");
                    return Err(OnceError::Failed {
                        key: self.key.to_string(),
                        message,
                    });
                }
                // The leader left without an outcome (cancelled, or its
                // own error): start over.
                Ok(None) => {}
            }
        }
    }

    /// The distributed protocol, for the process's flight of this key: one
    /// `try_acquire`; granted, compute; not granted, serve what can be
    /// served or wait for the computer's release, then read again.
    async fn lead<I, F, Fut, E>(
        &self,
        io: &I,
        flight: &Flight,
        deadline: Instant,
        miss: Miss,
        compute: F,
    ) -> Result<Vec<u8>, OnceError<E>>
    where
        I: Entries,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<u8>, E>>,
        E: std::error::Error + 'static,
    {
        let Miss {
            mut seen,
            mut fresh,
            mut stale,
        } = miss;
        loop {
            match self.request().try_acquire().await {
                Ok(Some(guard)) => {
                    return self
                        .under_lock(io, flight, guard, seen, compute, stale)
                        .await
                }
                Ok(None) => {}
                // No majority either way (a node silent, the key held on
                // the others): wait for the holder as when refused.
                Err(Error::NotAcquired(failure)) if !hopeless(&failure) => {}
                Err(e) => return Err(self.lock_error(e)),
            }
            // Someone else computes.
            if let Some(value) = fresh.or_else(|| stale.clone()) {
                outcome(if self.serve_stale {
                    "stale-or-early"
                } else {
                    "early"
                });
                return Ok(value);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.deadline_error());
            }
            let waited = self
                .request()
                .retry(self.retry.with_max_wait(self.retry.max_wait().min(left)))
                .acquire()
                .await;
            let guard = match waited {
                Ok(guard) => guard,
                Err(Error::NotAcquired(failure)) if !hopeless(&failure) => {
                    if Instant::now() >= deadline {
                        return Err(self.deadline_error());
                    }
                    // The policy's rounds ended early: look again.
                    match self.look(io).await? {
                        Look::Fresh(value) => {
                            outcome("fresh");
                            return Ok(value);
                        }
                        Look::Miss(again) => {
                            (seen, fresh, stale) = (again.seen, again.fresh, again.stale);
                        }
                    }
                    continue;
                }
                Err(e) => return Err(self.lock_error(e)),
            };
            return self
                .under_lock(io, flight, guard, seen, compute, stale)
                .await;
        }
    }

    /// The first read: fresh, or a miss with what can be served meanwhile.
    async fn look<I: Entries, E: std::error::Error + 'static>(
        &self,
        io: &I,
    ) -> Result<Look, OnceError<E>> {
        let entry = io
            .look()
            .await
            .map_err(|failed| self.io_error("read", failed))?;
        let Some(entry) = entry else {
            return Ok(Look::Miss(Miss {
                seen: 0,
                fresh: None,
                stale: None,
            }));
        };
        if let Some(value) = entry.fresh() {
            let due = self.early > 0.0 && entry.due_early(self.early, 1.0 - rand::random::<f64>());
            if !due {
                return Ok(Look::Fresh(value.to_vec()));
            }
            return Ok(Look::Miss(Miss {
                seen: entry.fence,
                fresh: Some(value.to_vec()),
                stale: None,
            }));
        }
        Ok(Look::Miss(Miss {
            seen: entry.fence,
            fresh: None,
            stale: entry.value.filter(|_| self.serve_stale),
        }))
    }

    /// Granted (at once or after waiting): reads the entry again under the
    /// lock, and takes a value or an error written since the first look
    /// (`seen`, the fence it saw) instead of computing: a caller whose look
    /// came before another computer's write and whose grant came after
    /// its release computes nothing (the fault suite measured 0–3 such
    /// second computations per 8 s row before this read). Otherwise
    /// computes under the guard.
    async fn under_lock<I, F, Fut, E>(
        &self,
        io: &I,
        flight: &Flight,
        guard: LockGuard,
        seen: u64,
        compute: F,
        stale: Option<Vec<u8>>,
    ) -> Result<Vec<u8>, OnceError<E>>
    where
        I: Entries,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<u8>, E>>,
        E: std::error::Error + 'static,
    {
        let entry = match io.read().await {
            Ok(entry) => entry,
            Err(failed) => {
                guard.release().await;
                return Err(self.io_error("read", failed));
            }
        };
        let newer = entry.as_ref().filter(|e| e.fence > seen);
        if let Some(value) = newer.and_then(Entry::fresh) {
            let value = value.to_vec();
            // The process's followers first, then the release.
            flight.share(Ok(value.clone()));
            guard.release().await;
            outcome("waited");
            return Ok(value);
        }
        if let Some(message) = entry.as_ref().and_then(|e| e.failed_since(seen)) {
            let message = message.to_owned();
            let stale = entry.and_then(|e| e.value).filter(|_| self.serve_stale);
            flight.share(Err(message.clone()));
            guard.release().await;
            if let Some(stale) = stale {
                outcome("stale-after-error");
                return Ok(stale);
            }
            outcome("failed");
            return Err(OnceError::Failed {
                key: self.key.to_string(),
                message,
            });
        }
        // Nothing newer (the computer we waited for vanished, or we are
        // the first): compute here.
        self.compute_under(io, flight, guard, compute, stale).await
    }

    /// Runs `compute` under `guard` and writes its outcome fenced by the
    /// guard's token; releases in every case (the release's notice wakes
    /// the waiters). Dropped mid-way, `guard` drops and releases.
    async fn compute_under<I, F, Fut, E>(
        &self,
        io: &I,
        flight: &Flight,
        guard: LockGuard,
        compute: F,
        stale: Option<Vec<u8>>,
    ) -> Result<Vec<u8>, OnceError<E>>
    where
        I: Entries,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<u8>, E>>,
        E: std::error::Error + 'static,
    {
        let Some(token) = guard.token() else {
            // Fencing is on: every grant carries a token.
            guard.release().await;
            return Err(OnceError::FencingOff);
        };
        let began = Instant::now();
        let computed = compute().await;
        let delta = began.elapsed();
        match computed {
            Ok(value) => {
                let fresh = self.value_ttl.saturating_add(jitter(self.jitter));
                let what = Written::Value {
                    value: &value,
                    fresh,
                    delta,
                };
                let written = io.write(token.get(), what, self.keep).await;
                if written.is_ok() {
                    // Stored at a majority: the process's followers get it
                    // before the release's round trip.
                    flight.share(Ok(value.clone()));
                }
                guard.release().await;
                match written {
                    Ok(()) => {
                        outcome("computed");
                        Ok(value)
                    }
                    Err(failed) => Err(self.write_error(token, failed)),
                }
            }
            Err(error) => {
                let message = error.to_string();
                let what = Written::Error {
                    message: &message,
                    fresh: self.error_ttl,
                };
                let keep = self.keep.max(self.error_ttl);
                if let Err(failed) = io.write(token.get(), what, keep).await {
                    tracing::debug!(?failed, "error marker not written");
                }
                flight.share(Err(message.clone()));
                guard.release().await;
                if let Some(stale) = stale {
                    outcome("stale-after-error");
                    return Ok(stale);
                }
                outcome("compute-failed");
                Err(OnceError::Compute {
                    key: self.key.to_string(),
                    source: error,
                })
            }
        }
    }

    /// A lock request on the computation's resource: the lease never
    /// auto-extended (a computer that outlives it is overtaken, and
    /// fenced), the wait by the release notice.
    fn request(&self) -> LockRequest {
        LockRequest::new(
            Arc::clone(&self.shared),
            self.resource.to_string(),
            self.ttl,
        )
        .manual_extend()
        .wake_on_release(true)
        .retry(Retry::once())
    }

    fn lock_error<E: std::error::Error + 'static>(&self, source: Error) -> OnceError<E> {
        OnceError::Lock {
            key: self.key.to_string(),
            source: Box::new(source),
        }
    }

    fn deadline_error<E: std::error::Error + 'static>(&self) -> OnceError<E> {
        outcome("deadline");
        OnceError::Deadline {
            key: self.key.to_string(),
            wait: self.wait,
        }
    }

    fn unavailable<E: std::error::Error + 'static>(
        &self,
        phase: &'static str,
        short: Short,
    ) -> OnceError<E> {
        OnceError::Unavailable {
            key: self.key.to_string(),
            phase,
            answered: short.answered,
            quorum: short.quorum,
            failures: short.failures,
        }
    }

    fn write_error<E: std::error::Error + 'static>(
        &self,
        presented: FencingToken,
        failed: Failed,
    ) -> OnceError<E> {
        match failed {
            Failed::Stale(current) => OnceError::Stale {
                key: self.key.to_string(),
                presented,
                current: FencingToken::new(current),
            },
            other => self.io_error("write", other),
        }
    }

    fn io_error<E: std::error::Error + 'static>(
        &self,
        phase: &'static str,
        failed: Failed,
    ) -> OnceError<E> {
        match failed {
            Failed::Short(short) => self.unavailable(phase, short),
            Failed::Store(source) => OnceError::Store {
                key: self.key.to_string(),
                phase,
                source,
            },
            // Only a write is refused for its token.
            Failed::Stale(current) => OnceError::Stale {
                key: self.key.to_string(),
                presented: FencingToken::new(0),
                current: FencingToken::new(current),
            },
        }
    }
}

fn outcome(what: &'static str) {
    tracing::Span::current().record("outcome", what);
}

/// The entry's key: the lock key with its kind `lock:` replaced by
/// `cache:` (`{prefix}cache:once:{key}`, or with the cluster layout's hash
/// tag, which then puts the entry in the lock key's slot).
pub(crate) fn entry_key(prefix: &str, lock_key: &str) -> String {
    match lock_key
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix("lock:"))
    {
        Some(rest) => format!("{prefix}cache:{rest}"),
        // Not reached: every lock key is `{prefix}lock:…`.
        None => format!("{prefix}cache:{lock_key}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(
            entry_key("redfence:", "redfence:lock:once:product:7"),
            "redfence:cache:once:product:7"
        );
        assert_eq!(
            entry_key("p:", "p:lock:{42}once:product:7"),
            "p:cache:{42}once:product:7"
        );
        assert_eq!(entry_key("p:", "odd"), "p:cache:odd");
    }
}
