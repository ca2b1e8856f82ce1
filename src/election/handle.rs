//! The election handle: [`Election`], its settings, and the campaign: the
//! mutex's waiting acquire (auto-extended, woken by release notices) in
//! rounds bounded by the retry policy until elected, then the record.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::field::{self, Empty};
use tracing::Instrument;

use crate::error::Error;
use crate::logic::resource::{lock_key, validate};
use crate::logic::validity::later;
use crate::mutex::request::LockRequest;
use crate::protocol::fair::hopeless;
use crate::protocol::shared::Shared;
use crate::settings::autoextend::AutoExtend;
use crate::settings::retry::{jitter, Retry};

use super::error::ElectionError;
use super::leader::Leader;
use super::leadership::Leadership;
use super::observe::Observer;
use super::publish::publish;
use super::read::read_leader;
use super::record::{record_key, resource};

/// The leadership's lease unless set: a killed leader is replaced within
/// about this long.
pub(crate) const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// How often an [`Observer`] reads the leader unless set.
pub(crate) const DEFAULT_OBSERVE_INTERVAL: Duration = Duration::from_secs(1);

/// A leader election over the client's nodes, made by
/// [`Client::election`](crate::Client::election): cheap to clone, nothing
/// sent until used. The leadership is the crate's lock on the resource
/// `election:{name}` (what `redfence status election:{name}` shows), held
/// with auto-extension; its term is the lock's fencing token.
///
/// # Default
///
/// TTL 10 s, the client's retry policy per round, no
/// campaign deadline, observe interval 1 s.
#[derive(Clone)]
#[must_use = "an election does nothing until used"]
pub struct Election {
    shared: Arc<Shared>,
    name: Arc<str>,
    resource: Arc<str>,
    record_key: Arc<str>,
    ttl: Duration,
    retry: Retry,
    deadline: Option<Duration>,
    observe_interval: Duration,
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.name)
            .field("resource", &self.resource)
            .field("record_key", &self.record_key)
            .field("ttl", &self.ttl)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl Election {
    pub(crate) fn new(shared: Arc<Shared>, name: &str) -> Self {
        let resource = resource(name);
        let config = &shared.config;
        let lock = lock_key(&config.key_prefix, &resource, config.layout);
        let record_key = record_key(&config.key_prefix, &lock);
        Self {
            retry: config.retry,
            name: name.into(),
            resource: resource.into(),
            record_key: record_key.into(),
            ttl: DEFAULT_TTL,
            deadline: None,
            observe_interval: DEFAULT_OBSERVE_INTERVAL,
            shared,
        }
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lock resource that is the leadership: `election:{name}`.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The Redis key of the leader record on every node:
    /// `{prefix}leader:election:{name}` (with a cluster node among the
    /// nodes, the lock key's hash tag follows `leader:`).
    pub fn record_key(&self) -> &str {
        &self.record_key
    }

    /// The leadership's lease: how long a leader that vanished (killed,
    /// partitioned, paused) keeps the others out; its watchdog extends it
    /// every third of it. Defaults to 10 seconds.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The retry policy of each acquire round of a campaign; a campaign
    /// runs rounds until elected. Defaults to the client's (10 s rounds).
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// Give up a campaign not won within `deadline`
    /// ([`ElectionError::Deadline`]). Defaults to none: a campaign waits
    /// until elected or dropped.
    pub fn campaign_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// How often an [`Observer`] reads the leader. Defaults to 1 second.
    /// Zero is raised to 1 ms.
    pub fn observe_interval(mut self, interval: Duration) -> Self {
        self.observe_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// Waits to lead, then publishes `value` on every node and returns the
    /// [`Leadership`].
    ///
    /// Each round is the lock's waiting acquire under the retry policy
    /// (woken by the leader's release notice, by its keys' expiry, or
    /// after the policy's delay); rounds follow each other until elected,
    /// so the campaign waits as long as another candidate leads, until
    /// its future is dropped (cancel-safe: an attempt's keys are released
    /// in the background) or the [deadline](Self::campaign_deadline).
    /// Every request is bounded by the node timeout.
    ///
    /// Fails with [`ElectionError::FencingOff`] on a client built with
    /// `fencing(false)`, [`ElectionError::Lock`] on an invalid name or a
    /// configuration problem retrying cannot fix, and
    /// [`ElectionError::Deadline`]. A won lock whose record a later term
    /// refused is [`ElectionError::Superseded`] (only when fence state was
    /// lost: the token proof says a new lock's term is the largest); a
    /// record a majority did not store is released and campaigned for
    /// again.
    pub async fn campaign(&self, value: impl Into<Vec<u8>>) -> Result<Leadership, ElectionError> {
        let span = tracing::debug_span!(
            "campaign",
            election = %self.name,
            rounds = Empty,
            term = Empty,
            elapsed = Empty,
        );
        let started = Instant::now();
        let won = self
            .campaign_inner(value.into())
            .instrument(span.clone())
            .await;
        span.record("elapsed", field::debug(started.elapsed()));
        if let Ok(leadership) = &won {
            span.record("term", leadership.term().get());
        }
        won
    }

    async fn campaign_inner(&self, value: Vec<u8>) -> Result<Leadership, ElectionError> {
        if !self.shared.config.fencing {
            return Err(ElectionError::FencingOff);
        }
        if let Err(reason) = validate(&self.name) {
            return Err(self.refused(Error::InvalidResource(reason)));
        }
        let started = Instant::now();
        let deadline = self.deadline.map(|d| later(started, d));
        let mut rounds = 0u32;
        let mut last: Option<Error> = None;
        loop {
            let now = Instant::now();
            let left = deadline.map(|d| d.saturating_duration_since(now));
            if left.is_some_and(|l| l.is_zero()) {
                return Err(ElectionError::Deadline {
                    election: self.name.to_string(),
                    deadline: self.deadline.unwrap_or_default(),
                    rounds,
                    last: last.map(Box::new),
                });
            }
            let retry = match left {
                Some(left) => self.retry.with_max_wait(self.retry.max_wait().min(left)),
                None => self.retry,
            };
            rounds += 1;
            tracing::Span::current().record("rounds", rounds);
            let acquired = LockRequest::new(
                Arc::clone(&self.shared),
                self.resource.to_string(),
                self.ttl,
            )
            .auto_extend(AutoExtend::new())
            .retry(retry)
            .acquire()
            .await;
            let guard = match acquired {
                Ok(guard) => guard,
                Err(Error::NotAcquired(failure)) if !hopeless(&failure) => {
                    last = Some(Error::NotAcquired(failure));
                    self.pause_after(now, &retry, deadline).await;
                    continue;
                }
                Err(e) => return Err(self.refused(e)),
            };
            let Some(term) = guard.token() else {
                // Fencing is on: every grant carries a token.
                return Err(ElectionError::FencingOff);
            };
            match publish(&self.shared, &self.name, &self.record_key, term, &value).await {
                Ok(()) => {
                    return Ok(Leadership::new(
                        Arc::clone(&self.shared),
                        Arc::clone(&self.name),
                        Arc::clone(&self.record_key),
                        guard,
                        term,
                        value,
                    ))
                }
                Err(e @ ElectionError::Superseded { .. }) => {
                    guard.release().await;
                    return Err(e);
                }
                Err(e) => {
                    // Not published on a majority: a leader nobody can
                    // see. Resign and campaign again.
                    tracing::debug!(error = %e, "record not published; campaigning again");
                    guard.release().await;
                    self.pause_after(now, &retry, deadline).await;
                }
            }
        }
    }

    /// A round that ended early (an attempt limit in the policy, a publish
    /// that failed) is followed by the policy's pause, so that rounds never
    /// spin; never past the deadline.
    async fn pause_after(&self, round_start: Instant, retry: &Retry, deadline: Option<Instant>) {
        let until = later(round_start, retry.pause(1, jitter));
        let until = deadline.map_or(until, |d| d.min(until));
        tokio::time::sleep_until(until.into()).await;
    }

    fn refused(&self, source: Error) -> ElectionError {
        ElectionError::Lock {
            election: self.name.to_string(),
            source: Box::new(source),
        }
    }

    /// Who leads now: the election's lock held by one value on a majority
    /// of the nodes, and the newest record (highest term) among the nodes'
    /// answers, written by that holder's client. One round: the lock's
    /// inspection and the record's read go to every node at once, bounded
    /// by the node timeout.
    ///
    /// `Ok(None)`: nobody holds the lock on a majority, or its holder has
    /// not published its record yet (it won less than a round trip ago).
    /// A snapshot, not a lock: a leader that just lost its lease is still
    /// reported until its keys expire on the nodes (at most its TTL), and
    /// a leader of the same client that won a moment ago may be reported
    /// with its predecessor's term and value until its record is written.
    /// [`ElectionError::Unavailable`] when fewer than a majority answered.
    pub async fn leader(&self) -> Result<Option<Leader>, ElectionError> {
        let span = tracing::debug_span!("leader", election = %self.name);
        read_leader(&self.shared, &self.name, &self.resource, &self.record_key)
            .instrument(span)
            .await
    }

    /// The leaders, as they come: the current one (waiting for one if
    /// nobody leads), then each new leader once, terms strictly
    /// increasing. It polls: [`leader`](Self::leader) every
    /// [`observe_interval`](Self::observe_interval), so a change is seen
    /// within an interval and a round trip, and a leader that led for less
    /// than an interval may be skipped. Read errors (nodes down) are
    /// retried at the next interval. No task is spawned: the reads run
    /// when the [`Observer`] is polled, and stop with it.
    pub fn observe(&self) -> Observer {
        Observer::new(
            Arc::clone(&self.shared),
            Arc::clone(&self.name),
            Arc::clone(&self.resource),
            Arc::clone(&self.record_key),
            self.observe_interval,
        )
    }
}
