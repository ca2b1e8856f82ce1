//! The client handle and the three quorum operations: acquire, extend,
//! release. The algorithm is described step by step in DESIGN.md; the
//! comments here point at the decisions.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;
use tracing::Instrument;

use crate::config::{Builder, Config};
use crate::error::{Error, FailureReason, NodeErrorKind, NodeFailure, Phase, QuorumFailure};
use crate::fanout::{FanOut, Settled};
use crate::guard::{Lease, LockGuard};
use crate::node::Node;
use crate::quorum::{quorum, Decision};
use crate::request::LockRequest;
use crate::resource::{lock_key, lock_value, validate};
use crate::scripts::{ACQUIRE, EXTEND, RELEASE};
use crate::validity::{node_budget, validity, Ttl, TtlProblem};

/// A handle to a set of independent Redis masters. Cheap to clone (one
/// `Arc`); clones share the node connections. Build it once at startup with
/// [`Client::new`] or [`Client::builder`] and pass clones to your tasks.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    nodes: Vec<Arc<Node>>,
    config: Config,
    /// Identifies this client in lock values (`{id}:{secret}`), so keys seen
    /// in Redis can be traced back to a process.
    id: uuid::Uuid,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.inner.id)
            .field("nodes", &self.inner.nodes)
            .field("config", &self.inner.config)
            .finish()
    }
}

/// Minimum lifetime of a release request; see `start_release`.
const RELEASE_BUDGET: Duration = Duration::from_secs(1);

/// What a successful release reports.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Released {
    /// Nodes that deleted our key.
    pub confirmed: usize,
    /// N, the number of configured nodes.
    pub nodes: usize,
    /// Nodes that answered without deleting (key already expired or never
    /// set there) or failed, in node order.
    pub failures: Vec<NodeFailure>,
    /// Nodes not yet answered when a majority had confirmed (or the node
    /// timeout ran out). Their release is still sent (it is queued behind
    /// our acquire on the same connection) and finishes in the background.
    pub pending: usize,
}

/// A lock grant from one attempt, before it becomes a guard.
pub(crate) struct Grant {
    pub(crate) value: Arc<str>,
    pub(crate) valid_until: Instant,
}

/// A validated lock request.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) resource: Arc<str>,
    pub(crate) key: Arc<str>,
    pub(crate) ttl: Ttl,
    pub(crate) drift: Duration,
}

impl Client {
    /// A builder with every setting at its default; see [`Builder`].
    pub fn builder<I, S>(urls: I) -> Builder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Builder::new(urls)
    }

    /// A client with default settings. One URL runs single-node mode; 3 or 5
    /// run Redlock. Connects to nothing until first use.
    ///
    /// URLs are `redis://[user][:password@]host[:port][/db]`.
    pub fn new<I, S>(urls: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Ok(Builder::new(urls).build()?)
    }

    pub(crate) fn from_parts(nodes: Vec<Arc<Node>>, config: Config) -> Self {
        Self {
            inner: Arc::new(Inner {
                nodes,
                config,
                id: uuid::Uuid::new_v4(),
            }),
        }
    }

    /// N, the number of configured nodes.
    pub fn nodes(&self) -> usize {
        self.inner.nodes.len()
    }

    /// Votes needed for a lock: ⌊N/2⌋ + 1.
    pub fn quorum(&self) -> usize {
        quorum(self.inner.nodes.len())
    }

    /// Starts a lock request on `resource` with lease `ttl`, to configure
    /// (retry policy) before acquiring. The shortcuts below cover the usual
    /// cases.
    pub fn lock(&self, resource: impl Into<String>, ttl: Duration) -> LockRequest {
        LockRequest::new(self.clone(), resource.into(), ttl, self.inner.config.retry)
    }

    /// Acquires `resource` for `ttl`, retrying under the client's retry
    /// policy (default: up to 10 s). Fails with [`Error::NotAcquired`].
    pub async fn acquire(&self, resource: &str, ttl: Duration) -> Result<LockGuard, Error> {
        self.lock(resource, ttl).acquire().await
    }

    /// One attempt, no waiting. `Ok(None)` when another owner holds the lock
    /// ("someone else is doing it: skip"); an error when nodes failed.
    pub async fn try_acquire(
        &self,
        resource: &str,
        ttl: Duration,
    ) -> Result<Option<LockGuard>, Error> {
        self.lock(resource, ttl).try_acquire().await
    }

    /// Acquires `resource`, runs `f` to completion under the lock, then
    /// releases. The release happens only after `f`'s future has finished,
    /// also when it returns an error or panics (the panic is resumed after
    /// the release), so work such as a database commit inside `f` completes
    /// while the lock is still held.
    pub async fn with_lock<F, Fut, T>(
        &self,
        resource: &str,
        ttl: Duration,
        f: F,
    ) -> Result<T, Error>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = T>,
    {
        self.lock(resource, ttl).run(f).await
    }

    /// Validates a resource name and TTL into a [`Target`].
    pub(crate) fn target(&self, resource: &str, ttl: Duration) -> Result<Target, Error> {
        validate(resource).map_err(Error::InvalidResource)?;
        let checked = Ttl::new(ttl).map_err(|problem| Error::InvalidTtl {
            ttl,
            reason: match problem {
                TtlProblem::TooShort => "must be at least 1 ms",
                TtlProblem::TooLong => "must be at most MAX_TTL (365 days)",
            },
        })?;
        Ok(Target {
            resource: resource.into(),
            key: lock_key(&self.inner.config.key_prefix, resource),
            ttl: checked,
            drift: self.inner.config.drift_factor.drift(checked),
        })
    }

    /// One Redlock attempt: a fresh value, `SET NX PX` (in a script) on all N
    /// nodes at once, decide at the first certain outcome, compute validity.
    pub(crate) async fn attempt(&self, target: &Target) -> Result<Grant, QuorumFailure> {
        let config = &self.inner.config;
        let value = lock_value(&self.inner.id);
        // Armed until the attempt succeeds: a failed attempt, or this future
        // being dropped mid-flight, releases on every node in the background.
        let mut cleanup = ReleaseOnDrop::new(self, &target.key, &value);
        let budget = node_budget(
            config.node_timeout,
            target.ttl,
            target.drift,
            config.min_validity,
        );
        let ttl_arg: Arc<str> = target.ttl.millis().to_string().into();
        // The clock starts before the first request is sent: elapsed then
        // over-approximates every key's age, which keeps validity safe.
        let start = Instant::now();
        let deadline = start + budget;
        let mut fan = FanOut::start(&self.inner.nodes, |node, settled| {
            let (key, value, ttl_arg) = (target.key.clone(), value.clone(), ttl_arg.clone());
            async move {
                let reply = node
                    .run_script(
                        &ACQUIRE,
                        &key,
                        &[value.as_bytes(), ttl_arg.as_bytes()],
                        deadline,
                        &settled,
                    )
                    .await?;
                parse_acquire(reply)
            }
        });
        let decision = fan.decide(Result::is_ok).await;
        let elapsed = start.elapsed();
        let tally = fan.tally();
        let failures = fan.failures();
        // Stragglers finish in the background: what they queued before the
        // decision is sent (so the lock lands on every healthy node) and is
        // ordered before any release on each connection; the rest give up.
        fan.finish_in_background();
        let reason = match decision {
            Decision::Reached => {
                match validity(target.ttl, elapsed, target.drift, config.min_validity) {
                    Some(_) => {
                        cleanup.disarm();
                        return Ok(Grant {
                            value: value.clone(),
                            valid_until: start + target.ttl.duration() - target.drift,
                        });
                    }
                    None => FailureReason::ValidityExhausted,
                }
            }
            _ => classify_failure(
                tally.nodes(),
                tally.quorum(),
                &failures,
                |k| matches!(k, NodeErrorKind::HeldByOther { .. }),
                FailureReason::Contended,
            ),
        };
        drop(cleanup);
        Err(QuorumFailure {
            phase: Phase::Acquire,
            resource: target.resource.to_string(),
            reason,
            granted: tally.yes(),
            quorum: tally.quorum(),
            nodes: tally.nodes(),
            attempts: 1,
            elapsed,
            failures,
        })
    }

    /// Resets the TTL on a majority of all N nodes; validity is recomputed
    /// from this extend's own start. Never deletes anything on failure.
    pub(crate) async fn extend(
        &self,
        resource: &str,
        key: &Arc<str>,
        value: &Arc<str>,
        ttl: Duration,
    ) -> Result<Instant, Error> {
        let target = self.target(resource, ttl)?;
        let config = &self.inner.config;
        let budget = node_budget(
            config.node_timeout,
            target.ttl,
            target.drift,
            config.min_validity,
        );
        let ttl_arg: Arc<str> = target.ttl.millis().to_string().into();
        let start = Instant::now();
        let deadline = start + budget;
        let mut fan = FanOut::start(&self.inner.nodes, |node, settled| {
            let (key, value, ttl_arg) = (key.clone(), value.clone(), ttl_arg.clone());
            async move {
                let reply = node
                    .run_script(
                        &EXTEND,
                        &key,
                        &[value.as_bytes(), ttl_arg.as_bytes()],
                        deadline,
                        &settled,
                    )
                    .await?;
                parse_flag(reply)
            }
        });
        let decision = fan.decide(Result::is_ok).await;
        let elapsed = start.elapsed();
        let tally = fan.tally();
        let failures = fan.failures();
        fan.finish_in_background();
        let reason = match decision {
            Decision::Reached => {
                match validity(target.ttl, elapsed, target.drift, config.min_validity) {
                    Some(_) => return Ok(start + target.ttl.duration() - target.drift),
                    None => FailureReason::ValidityExhausted,
                }
            }
            _ => classify_failure(
                tally.nodes(),
                tally.quorum(),
                &failures,
                |k| matches!(k, NodeErrorKind::NotHeld),
                FailureReason::NotHeld,
            ),
        };
        Err(Error::ExtendFailed(Box::new(QuorumFailure {
            phase: Phase::Extend,
            resource: resource.to_owned(),
            reason,
            granted: tally.yes(),
            quorum: tally.quorum(),
            nodes: tally.nodes(),
            attempts: 1,
            elapsed,
            failures,
        })))
    }

    /// Compare-and-delete on all N nodes. Returns once the outcome is certain
    /// (a majority confirmed, so the lock is free for others, or a majority
    /// can no longer confirm) or after one node timeout; the rest finish in
    /// the background.
    pub(crate) async fn release(&self, key: &Arc<str>, value: &Arc<str>) -> Released {
        // If this future is dropped before the fan-out is handed off, resend
        // the release in the background (compare-and-delete is idempotent).
        let mut cleanup = ReleaseOnDrop::new(self, key, value);
        let mut fan = self.start_release(key, value);
        // The caller waits at most one node timeout; the requests themselves
        // have the longer release budget and finish in the background.
        let wait = self.inner.config.node_timeout;
        let _ = tokio::time::timeout(wait, fan.decide(|r| matches!(r, Ok(())))).await;
        let released = Released {
            confirmed: fan.tally().yes(),
            nodes: fan.tally().nodes(),
            failures: fan.failures(),
            pending: fan.pending(),
        };
        fan.finish_in_background();
        cleanup.disarm();
        released
    }

    fn start_release(&self, key: &Arc<str>, value: &Arc<str>) -> FanOut<()> {
        // Releases get at least RELEASE_BUDGET: nobody waits on them past the
        // node timeout, and a release that gives up early (still waiting for
        // a reconnect, say) leaves the key to block others for the full TTL.
        let budget = self.inner.config.node_timeout.max(RELEASE_BUDGET);
        let deadline = Instant::now() + budget;
        // Releases ignore the settled flag (a fresh one nobody sets): every
        // node should get its release, however late it connects.
        FanOut::start(&self.inner.nodes, |node, _settled| {
            let (key, value) = (key.clone(), value.clone());
            async move {
                let reply = node
                    .run_script(
                        &RELEASE,
                        &key,
                        &[value.as_bytes()],
                        deadline,
                        &Settled::default(),
                    )
                    .await?;
                parse_flag(reply)
            }
        })
    }

    /// Fire-and-forget release on every node, for paths that cannot await
    /// (drop) or should not (a failed attempt). Bounded by the node timeout;
    /// without a tokio runtime it does nothing and the TTL frees the lock.
    pub(crate) fn release_in_background(&self, key: &Arc<str>, value: &Arc<str>) {
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let span = tracing::debug_span!("background_release", key = %key);
            handle.spawn(self.start_release(key, value).drain().instrument(span));
        }
    }

    /// Builds a guard from a grant.
    pub(crate) fn guard(&self, target: &Target, grant: Grant) -> LockGuard {
        LockGuard::new(self.clone(), Lease::new(target, grant))
    }
}

/// Sends a release everywhere when dropped while armed.
struct ReleaseOnDrop<'a> {
    client: &'a Client,
    key: &'a Arc<str>,
    value: &'a Arc<str>,
    armed: bool,
}

impl<'a> ReleaseOnDrop<'a> {
    fn new(client: &'a Client, key: &'a Arc<str>, value: &'a Arc<str>) -> Self {
        Self {
            client,
            key,
            value,
            armed: true,
        }
    }

    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.client.release_in_background(self.key, self.value);
        }
    }
}

/// Names the failure: `specific` when the `is_specific` answers alone make a
/// majority impossible (another owner has it, or it is gone), otherwise
/// the failing nodes are to blame.
fn classify_failure(
    nodes: usize,
    quorum: usize,
    failures: &[NodeFailure],
    is_specific: impl Fn(&NodeErrorKind) -> bool,
    specific: FailureReason,
) -> FailureReason {
    let count = failures.iter().filter(|f| is_specific(&f.kind)).count();
    if count > nodes - quorum {
        specific
    } else {
        FailureReason::Unavailable
    }
}

/// `{1}` granted; `{0, pttl}` held by another owner.
fn parse_acquire(reply: Value) -> Result<(), NodeErrorKind> {
    match reply {
        Value::Array(items) => match items.as_slice() {
            [Value::Int(1), ..] => Ok(()),
            [Value::Int(0), Value::Int(pttl)] => Err(NodeErrorKind::HeldByOther {
                expires_in: u64::try_from(*pttl).ok().map(Duration::from_millis),
            }),
            _ => Err(unexpected(Value::Array(items))),
        },
        other => Err(unexpected(other)),
    }
}

/// 1 done; 0 not held by us.
fn parse_flag(reply: Value) -> Result<(), NodeErrorKind> {
    match reply {
        Value::Int(1) => Ok(()),
        Value::Int(0) => Err(NodeErrorKind::NotHeld),
        other => Err(unexpected(other)),
    }
}

fn unexpected(reply: Value) -> NodeErrorKind {
    NodeErrorKind::Redis(Arc::new(redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected script reply",
        format!("{reply:?}"),
    ))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_replies() {
        assert!(parse_acquire(Value::Array(vec![Value::Int(1)])).is_ok());
        match parse_acquire(Value::Array(vec![Value::Int(0), Value::Int(1500)])) {
            Err(NodeErrorKind::HeldByOther { expires_in }) => {
                assert_eq!(expires_in, Some(Duration::from_millis(1500)))
            }
            other => panic!("{other:?}"),
        }
        match parse_acquire(Value::Array(vec![Value::Int(0), Value::Int(-1)])) {
            Err(NodeErrorKind::HeldByOther { expires_in: None }) => {}
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse_acquire(Value::Nil),
            Err(NodeErrorKind::Redis(_))
        ));
    }

    #[test]
    fn flag_replies() {
        assert!(parse_flag(Value::Int(1)).is_ok());
        assert!(matches!(
            parse_flag(Value::Int(0)),
            Err(NodeErrorKind::NotHeld)
        ));
        assert!(matches!(
            parse_flag(Value::Okay),
            Err(NodeErrorKind::Redis(_))
        ));
    }

    fn failure(kind: NodeErrorKind) -> NodeFailure {
        NodeFailure {
            index: 0,
            addr: String::from("x:1"),
            kind,
        }
    }

    #[test]
    fn failure_classification() {
        let held = || failure(NodeErrorKind::HeldByOther { expires_in: None });
        let timeout = || failure(NodeErrorKind::Timeout(Duration::from_millis(5)));
        let is_held = |k: &NodeErrorKind| matches!(k, NodeErrorKind::HeldByOther { .. });
        // 5 nodes, quorum 3: two holds are not enough to blame contention.
        let c = |f: &[NodeFailure]| classify_failure(5, 3, f, is_held, FailureReason::Contended);
        assert_eq!(c(&[held(), held(), held()]), FailureReason::Contended);
        assert_eq!(c(&[held(), held(), timeout()]), FailureReason::Unavailable);
        assert_eq!(
            c(&[timeout(), timeout(), timeout()]),
            FailureReason::Unavailable
        );
    }
}
