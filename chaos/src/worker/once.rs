//! The single-flight workload (`--workload once`): each worker loops: pick
//! one of the keys `r0`… (`--resources`) and ask for its value with
//! `client.once(key).get_or_compute(..)`. The value expires fast (a
//! quarter of the lease), so expiries, and computations, happen all the
//! time. The computation records its start as a *grant* of the key (its
//! id the lease) and its end as a *release*, so the history checker's
//! overlap check is the single-flight's "one computation at a time"
//! (`once_check.rs` has the rest), and returns its id as the value, so a
//! request's value names the computation it came from.
//!
//! A computation never sees its lock's guard, so the grant's deadline is
//! a lower bound of the lease's end: the request's start + TTL − a drift
//! allowance at least the client's (the attempt that got the lock began
//! after the request did). A computation that began after that bound
//! (a waiter granted late) has an empty window and is not judged by the
//! overlap check; nothing is claimed for it.
//!
//! The `RunOut` workers (a quarter) make 30% of their computations slow,
//! 1.2–1.6 × the lease: they are overtaken, and their fenced writes are
//! refused (`OnceError::Stale`). Under the worker-pause nemeses the worker
//! processes announce each computation, and the parent stops the process
//! there.
//!
//! `--workload once-unlocked` is the negative control: the same loop as
//! naive cache-aside on the data node, without the helper (read the entry;
//! on a miss compute and write it, unfenced, with the value's TTL), so the
//! checker must see computations of one key overlap.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::RngExt;
use redfence::{Client, FailureReason, OnceError};
use redis::AsyncCommands;

use super::{Setup, Style, Worker, Workload, DATA_TIMEOUT};
use crate::clock::nanos;
use crate::history::Event;

/// The share of a `RunOut` worker's computations that outlive the lease.
const SLOW_SHARE: f64 = 0.3;

/// The workload's single-flight settings, from the run's lease.
#[derive(Debug, Clone, Copy)]
pub struct OnceSettings {
    /// The computation's lease (`SingleFlight::ttl`): the run's TTL.
    pub ttl: Duration,
    /// How long a value is fresh: a quarter of the lease.
    pub value_ttl: Duration,
    /// A waiter's deadline: two leases, so a waiter outlives one
    /// computer that vanished.
    pub wait: Duration,
    /// Taken off the lease for the computation's protected window: at
    /// least the client's drift (1% of the TTL + 2 ms by default).
    pub drift: Duration,
}

impl OnceSettings {
    pub fn of(ttl: Duration) -> Self {
        Self {
            ttl,
            value_ttl: ttl / 4,
            wait: ttl * 2,
            drift: ttl / 50 + Duration::from_millis(5),
        }
    }
}

impl Workload {
    /// Whether this is one of the single-flight workloads.
    pub fn is_once(self) -> bool {
        matches!(self, Workload::Once | Workload::OnceUnlocked)
    }
}

/// One computation: records itself and returns its id as the value.
struct Computation {
    setup: Arc<Setup>,
    worker: u32,
    key: String,
    id: u64,
    request_ns: u64,
    valid_until_ns: u64,
    work: Duration,
    /// Set to `id` when the computation starts.
    ran: Arc<AtomicU64>,
}

impl Computation {
    async fn run(self) -> Result<Vec<u8>, std::io::Error> {
        let s = &self.setup;
        self.ran.store(self.id, Ordering::Relaxed);
        s.sink.record(&Event::Grant {
            worker: self.worker,
            resource: self.key.clone(),
            lease: self.id,
            start_ns: self.request_ns,
            at_ns: s.clock.now_ns(),
            valid_until_ns: self.valid_until_ns,
            token: None,
        });
        if s.lock.announce {
            // The parent stops this process here (worker-pause).
            s.sink.announce(self.id);
        }
        tokio::time::sleep(self.work).await;
        s.sink.record(&Event::Release {
            lease: self.id,
            at_ns: s.clock.now_ns(),
        });
        Ok(self.id.to_string().into_bytes())
    }
}

impl Worker {
    /// One single-flight request for key `r{resource}`, recorded with its
    /// outcome; `id` names the computation if it runs one. Returns
    /// `false`: the worker pauses briefly after every request, so that
    /// requests spread over the value's expiries.
    pub(super) async fn once_round(&mut self, resource: u32, id: u64, client: &Client) -> bool {
        let key = format!("r{resource}");
        let lock = &self.setup.lock;
        let settings = OnceSettings::of(lock.ttl);
        let slow = self.style == Style::RunOut && self.rng.random_bool(SLOW_SHARE);
        let work = if slow {
            settings.ttl.mul_f64(self.rng.random_range(1.2..1.6))
        } else if lock.announce {
            lock.dwell(&mut self.rng)
        } else {
            Duration::from_millis(self.rng.random_range(2..=20))
        };
        let start_ns = self.now();
        let ran = Arc::new(AtomicU64::new(0));
        let computation = Computation {
            setup: Arc::clone(&self.setup),
            worker: self.id,
            key: key.clone(),
            id,
            request_ns: start_ns,
            valid_until_ns: start_ns + nanos(settings.ttl.saturating_sub(settings.drift)),
            work,
            ran: Arc::clone(&ran),
        };
        // The library bounds every step; the outer bound only guards the
        // rig against a bug there.
        let bound = settings.wait + settings.ttl * 4 + Duration::from_secs(2);
        let got = if lock.workload == Workload::OnceUnlocked {
            let asked = self.cache_aside(&key, settings, computation);
            tokio::time::timeout(bound, asked).await
        } else {
            let flight = client
                .once(&key)
                .ttl(settings.ttl)
                .value_ttl(settings.value_ttl)
                .wait(settings.wait);
            let asked = flight.get_or_compute(|| computation.run());
            tokio::time::timeout(bound, async { asked.await.map_err(|e| kind(&e)) }).await
        };
        let (value, error) = match got {
            Ok(Ok(bytes)) => match std::str::from_utf8(&bytes)
                .ok()
                .and_then(|v| v.parse().ok())
            {
                Some(v) => (Some(v), None),
                None => (None, Some("bad value".to_owned())),
            },
            Ok(Err(kind)) => (None, Some(kind)),
            Err(_) => (None, Some("rig timeout".to_owned())),
        };
        let computed = Some(ran.load(Ordering::Relaxed)).filter(|&c| c != 0);
        self.record(Event::Once {
            worker: self.id,
            key,
            start_ns,
            end_ns: self.now(),
            computed,
            value,
            error,
        });
        false
    }

    /// The control: read the entry from the data node; on a miss compute
    /// and write it unfenced, with the value's TTL.
    async fn cache_aside(
        &mut self,
        key: &str,
        settings: OnceSettings,
        computation: Computation,
    ) -> Result<Vec<u8>, String> {
        let entry = format!("cache-aside:{key}");
        let read: Result<redis::RedisResult<Option<Vec<u8>>>, _> =
            tokio::time::timeout(DATA_TIMEOUT, self.conn.get(&entry)).await;
        match read {
            Ok(Ok(Some(value))) => return Ok(value),
            Ok(Ok(None)) => {}
            _ => return Err("unavailable".to_owned()),
        }
        let value = computation.run().await.map_err(|_| "compute".to_owned())?;
        let ms = u64::try_from(settings.value_ttl.as_millis()).unwrap_or(u64::MAX);
        let set: Result<redis::RedisResult<()>, _> = tokio::time::timeout(
            DATA_TIMEOUT,
            self.conn.pset_ex(&entry, value.as_slice(), ms),
        )
        .await;
        match set {
            Ok(Ok(())) => Ok(value),
            _ => Err("unavailable".to_owned()),
        }
    }
}

/// The outcome's kind, as the results count them.
fn kind<E: std::error::Error + 'static>(e: &OnceError<E>) -> String {
    match e {
        OnceError::FencingOff => "fencing off",
        OnceError::Deadline { .. } => "deadline",
        OnceError::Compute { .. } => "compute",
        OnceError::Failed { .. } => "failed",
        // Which lock failure: a `try_acquire` that reached no majority
        // either way comes back at once as this error.
        OnceError::Lock { source, .. } => match source.as_ref() {
            redfence::Error::NotAcquired(f) => match f.reason {
                FailureReason::Contended => "lock: contended",
                FailureReason::Unavailable => "lock: unavailable",
                FailureReason::ValidityExhausted => "lock: validity exhausted",
                _ => "lock: other",
            },
            _ => "lock: other",
        },
        OnceError::Stale { .. } => "stale",
        OnceError::Unavailable { .. } => "unavailable",
        OnceError::Store { .. } => "store",
        _ => "other",
    }
    .to_owned()
}
