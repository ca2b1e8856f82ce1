//! The client handle and the three quorum operations: acquire, extend,
//! release. The algorithm is described step by step in DESIGN.md; the
//! comments here point at the decisions.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;
use tracing::Instrument;

use crate::config::{Builder, Config};
use crate::error::{Error, FailureReason, NodeErrorKind, NodeFailure, Phase, QuorumFailure};
use crate::fanout::{all_nodes, FanOut, NodeSet, Settled};
use crate::fence::{merge, FencingToken};
use crate::guard::{Lease, LockGuard};
use crate::node::{Node, Vote};
use crate::notify::{Place, Waits};
use crate::quorum::{quorum, Decision, Tally};
use crate::request::LockRequest;
use crate::resource::{fence_key, lock_key, lock_value, validate};
use crate::scripts::{EXTEND, RELEASE, RESEED, WRITE_BACK};
use crate::stats::{Counters, Event, Stats};
use crate::validity::{node_budget, validity, Ttl, TtlProblem};
use crate::watchdog::{AutoExtend, Schedule, Watchdog};

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
    counters: Counters,
    /// The longest TTL requested so far, in ms: the restart guard's
    /// default window.
    longest_ttl_ms: AtomicU64,
    /// Waiting by notification: queues and subscription connections.
    waits: Waits,
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
    pub(crate) held: Held,
    pub(crate) valid_until: Instant,
    pub(crate) token: Option<FencingToken>,
}

/// A validated lock request.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) resource: Arc<str>,
    pub(crate) key: Arc<str>,
    pub(crate) ttl: Ttl,
    pub(crate) drift: Duration,
    /// The fence key and its retention (≥ TTL), when fencing is on.
    pub(crate) fence: Option<(Arc<str>, Arc<str>)>,
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
        let id = uuid::Uuid::new_v4();
        let waits = Waits::new(&id, config.max_local_handoffs);
        Self {
            inner: Arc::new(Inner {
                nodes,
                config,
                id,
                counters: Counters::default(),
                longest_ttl_ms: AtomicU64::new(0),
                waits,
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

    /// Whether acquisitions hand out fencing tokens; see
    /// [`Builder::fencing`].
    pub fn fencing(&self) -> bool {
        self.inner.config.fencing.is_some()
    }

    /// This client's counters (shared by its clones): attempts, grants, and
    /// how often a token had to be written back.
    pub fn stats(&self) -> Stats {
        Stats {
            waiting: self.inner.waits.waiting(),
            ..self.inner.counters.snapshot()
        }
    }

    /// Checks every node's deployment against what Redlock assumes of it:
    /// reachable, a master, a distinct server (`run_id`), no eviction of
    /// lock keys, persistence, version, clock offset. Nodes are visited
    /// concurrently over fresh connections (not the lock connections), each
    /// visit bounded by the connect timeout, so a dead or paused node yields
    /// an "unreachable" finding instead of a hang. Read-only; run it at
    /// startup or from a health endpoint. See [`Audit`](crate::Audit).
    pub async fn audit(&self) -> crate::audit::Audit {
        crate::audit::run(&self.inner.nodes).await
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
        let drift = self.inner.config.drift_factor.drift(checked);
        self.inner
            .longest_ttl_ms
            .fetch_max(checked.millis(), Ordering::Relaxed);
        // A TTL that drift alone (or drift plus the minimum validity) uses
        // up can never be granted: say so now instead of failing every
        // attempt until the deadline.
        if checked.duration().saturating_sub(drift) <= self.inner.config.min_validity {
            return Err(Error::InvalidTtl {
                ttl,
                reason: "leaves no validity above min_validity once clock drift is deducted",
            });
        }
        let prefix = &self.inner.config.key_prefix;
        // The fence must outlive every lock on it; the retention is the
        // longer of the two.
        let fence = self.inner.config.fencing.map(|retention| {
            let keep = retention.max(checked.duration()).as_millis().max(1);
            (fence_key(prefix, resource), keep.to_string().into())
        });
        Ok(Target {
            resource: resource.into(),
            key: lock_key(prefix, resource),
            ttl: checked,
            drift,
            fence,
        })
    }

    /// One Redlock attempt: a fresh value, `SET NX PX` on all N nodes at
    /// once, decide at the first certain outcome, compute validity. With
    /// `probe`, each node also reports the key's remaining TTL (`PTTL` in
    /// the same round trip), so a refused waiter knows when the holder's
    /// keys run out.
    pub(crate) async fn attempt(
        &self,
        target: &Target,
        probe: bool,
    ) -> Result<Grant, QuorumFailure> {
        let mut held = Held {
            key: target.key.clone(),
            value: lock_value(&self.inner.id),
            notice: rand::random(),
            granted: false,
            sent: all_nodes(self.nodes()),
            expires_at: Instant::now() + target.ttl.duration(),
        };
        // Armed until the attempt succeeds: a failed attempt, or this future
        // being dropped mid-flight, releases in the background wherever the
        // SET may have gone.
        let mut cleanup = ReleaseOnDrop::new(self, &held);
        self.inner.counters.count(Event::Attempt);
        let vote = self.vote(true);
        let round = match &target.fence {
            // Without fencing, a plain SET: a Lua script costs the server
            // ~5× the CPU of the command it wraps.
            None if !probe => {
                let mut set = redis::cmd("SET");
                set.arg(&*held.key)
                    .arg(&*held.value)
                    .arg("NX")
                    .arg("PX")
                    .arg(target.ttl.millis());
                let set = Arc::new(set);
                self.round(Phase::Acquire, target, false, |node, settled| {
                    let set = Arc::clone(&set);
                    async move {
                        parse_set(node.run_command(&set, &settled, vote).await?).map(|()| 0)
                    }
                })
                .await
            }
            // A waiter's retry: the same SET and a PTTL, pipelined (not a
            // transaction: the PTTL only informs the next wait).
            None => {
                let mut pipe = redis::pipe();
                pipe.cmd("SET")
                    .arg(&*held.key)
                    .arg(&*held.value)
                    .arg("NX")
                    .arg("PX")
                    .arg(target.ttl.millis())
                    .cmd("PTTL")
                    .arg(&*held.key);
                let pipe = Arc::new(pipe);
                self.round(Phase::Acquire, target, false, |node, settled| {
                    let pipe = Arc::clone(&pipe);
                    async move { parse_probed_set(node.run_pipeline(&pipe, &settled, vote).await?) }
                })
                .await
            }
            // With fencing, the same SET NX and the fence's move in one
            // MULTI/EXEC transaction: still one round trip, and about half
            // the server CPU of the same steps as a Lua script.
            Some((fence_key, retention)) => {
                let pipe = Arc::new(fenced_acquire(
                    &held,
                    target.ttl.millis(),
                    fence_key,
                    retention,
                    fence_seed(),
                    probe,
                ));
                self.round(Phase::Acquire, target, false, |node, settled| {
                    let pipe = Arc::clone(&pipe);
                    async move { parse_fenced(node.run_pipeline(&pipe, &settled, vote).await?) }
                })
                .await
            }
        };
        held.sent = round.sent;
        cleanup.update(&held);
        self.reseed_if_wanted();
        let start = round.outcome?;
        let token = match &target.fence {
            None => None,
            Some(_) => Some(
                self.settle_token(target, &held, start, &round.values)
                    .await?,
            ),
        };
        cleanup.disarm();
        self.inner.counters.count(Event::Acquired);
        held.granted = true;
        Ok(Grant {
            valid_until: start + target.ttl.duration() - target.drift,
            held,
            token,
        })
    }

    /// Turns the fences the granting nodes reported into the token to hand
    /// out: their maximum, written back first to the granting nodes that
    /// reported less when fewer than a quorum reported it (DESIGN.md,
    /// "Fencing tokens", has the proof). The write-back runs within the
    /// attempt's validity, and the validity is checked again after it.
    async fn settle_token(
        &self,
        target: &Target,
        held: &Held,
        start: Instant,
        fences: &[(usize, u64)],
    ) -> Result<FencingToken, QuorumFailure> {
        let config = &self.inner.config;
        let nodes = &self.inner.nodes;
        let values: Vec<u64> = fences.iter().map(|&(_, f)| f).collect();
        let quorum = quorum(nodes.len());
        let Some(merged) = merge(&values) else {
            // A granted round has grants; never reached.
            return Err(self.failure(
                Phase::WriteBack,
                target,
                FailureReason::Unavailable,
                Tally::new(nodes.len()),
                start.elapsed(),
                Vec::new(),
            ));
        };
        let token = FencingToken::new(merged.token);
        if !merged.needs_write_back(quorum) {
            return Ok(token);
        }
        self.inner.counters.count(Event::WriteBack);
        let (mut credited, mut targets): (NodeSet, NodeSet) = (0, 0);
        for &(i, f) in fences {
            if f == merged.token {
                credited |= 1 << i;
            } else {
                targets |= 1 << i;
            }
        }
        // Past this instant a stored token could not make a valid lock.
        let useful_end = start + target.ttl.duration() - target.drift - config.min_validity;
        let deadline = (Instant::now() + config.node_timeout).min(useful_end);
        let (fence_key, retention) = target.fence.clone().unwrap_or_default();
        let token_arg: Arc<str> = merged.token.to_string().into();
        let vote = self.vote(true);
        let mut fan =
            FanOut::start_credited(nodes, targets, credited, deadline, |node, settled| {
                let (key, value, fence_key, token_arg, retention) = (
                    held.key.clone(),
                    held.value.clone(),
                    fence_key.clone(),
                    token_arg.clone(),
                    retention.clone(),
                );
                async move {
                    let args: [&[u8]; 3] =
                        [value.as_bytes(), token_arg.as_bytes(), retention.as_bytes()];
                    parse_flag(
                        node.run_script(
                            &WRITE_BACK,
                            &[&key, &fence_key],
                            &args,
                            &settled,
                            false,
                            vote,
                        )
                        .await?,
                    )
                }
            });
        let decision = fan.decide(Result::is_ok, deadline).await;
        let elapsed = start.elapsed();
        let (tally, failures) = (fan.tally(), fan.failures());
        fan.finish_in_background();
        let reason = match decision {
            Decision::Reached => {
                match validity(target.ttl, elapsed, target.drift, config.min_validity) {
                    Some(_) => return Ok(token),
                    None => FailureReason::ValidityExhausted,
                }
            }
            _ => classify_failure(Phase::WriteBack, tally.nodes(), tally.quorum(), &failures),
        };
        self.inner.counters.count(Event::WriteBackFailed);
        Err(self.failure(Phase::WriteBack, target, reason, tally, elapsed, failures))
    }

    fn failure(
        &self,
        phase: Phase,
        target: &Target,
        reason: FailureReason,
        tally: Tally,
        elapsed: Duration,
        failures: Vec<NodeFailure>,
    ) -> QuorumFailure {
        QuorumFailure {
            phase,
            resource: target.resource.to_string(),
            reason,
            granted: tally.yes(),
            quorum: tally.quorum(),
            nodes: tally.nodes(),
            attempts: 1,
            elapsed,
            failures,
        }
    }

    /// Resets the TTL on a majority of all N nodes; validity is recomputed
    /// from this extend's own start. Never deletes anything on failure.
    /// Returns the new `valid_until` and the keys' new expiry.
    ///
    /// `hear_all`: wait (within the round's deadline) for every node's
    /// answer after the decision, so that a node reporting another owner is
    /// seen even when a majority extended first (the watchdog; a caller's
    /// own extend returns at the decision).
    pub(crate) async fn extend(
        &self,
        resource: &str,
        held: &Held,
        ttl: Duration,
        hear_all: bool,
    ) -> Result<Extended, Error> {
        let target = self.target(resource, ttl)?;
        let ttl_arg: Arc<str> = target.ttl.millis().to_string().into();
        let vote = self.vote(false);
        let round = self
            .round(Phase::Extend, &target, hear_all, |node, settled| {
                let (key, value, ttl_arg) = (held.key.clone(), held.value.clone(), ttl_arg.clone());
                async move {
                    let args: [&[u8]; 2] = [value.as_bytes(), ttl_arg.as_bytes()];
                    parse_extend(
                        node.run_script(&EXTEND, &[&key], &args, &settled, false, vote)
                            .await?,
                    )
                }
            })
            .await;
        let start = round
            .outcome
            .map_err(|failure| Error::ExtendFailed(Box::new(failure)))?;
        Ok(Extended {
            valid_until: start + target.ttl.duration() - target.drift,
            expires_at: start + target.ttl.duration(),
            failures: round.failures,
        })
    }

    /// One quorum round of acquire or extend on all N nodes: start the
    /// clock, fan out with one deadline (the node budget), decide at the
    /// first certain outcome, and check the validity left. On success the
    /// outcome is the round's start, from which validity is computed.
    async fn round<T, F, Fut>(
        &self,
        phase: Phase,
        target: &Target,
        hear_all: bool,
        op: F,
    ) -> Round<T>
    where
        T: Clone + Default + Send + 'static,
        F: Fn(Arc<Node>, Settled) -> Fut,
        Fut: Future<Output = Result<T, NodeErrorKind>> + Send + 'static,
    {
        let config = &self.inner.config;
        let budget = node_budget(
            config.node_timeout,
            target.ttl,
            target.drift,
            config.min_validity,
        );
        // The clock starts before the first request is sent: elapsed then
        // over-approximates every key's age, which keeps validity safe.
        let start = Instant::now();
        let nodes = &self.inner.nodes;
        let mut fan = FanOut::start(nodes, all_nodes(nodes.len()), start + budget, op);
        let decision = fan.decide(Result::is_ok, start + budget).await;
        let elapsed = start.elapsed();
        if hear_all && decision == Decision::Reached {
            fan.hear_rest().await;
        }
        let (tally, failures, sent) = (fan.tally(), fan.failures(), fan.maybe_sent());
        let values = fan.values();
        // Stragglers finish in the background: what they queued before the
        // decision is sent (so the lock lands on every healthy node) and is
        // ordered before any release on each connection; the rest give up.
        fan.finish_in_background();
        let reason = match decision {
            Decision::Reached => {
                match validity(target.ttl, elapsed, target.drift, config.min_validity) {
                    Some(_) => {
                        return Round {
                            outcome: Ok(start),
                            sent,
                            values,
                            failures,
                        }
                    }
                    None => FailureReason::ValidityExhausted,
                }
            }
            _ => classify_failure(phase, tally.nodes(), tally.quorum(), &failures),
        };
        Round {
            outcome: Err(self.failure(phase, target, reason, tally, elapsed, failures)),
            sent,
            values,
            failures: Vec::new(),
        }
    }

    /// Compare-and-delete on the nodes the lock may have reached. Returns
    /// once the outcome is certain (a majority confirmed, so the lock is free
    /// for others, or a majority can no longer confirm) or after one node
    /// timeout; the rest finish in the background.
    pub(crate) async fn release(&self, held: &Held) -> Released {
        // If this future is dropped before the fan-out is handed off, resend
        // the release in the background (compare-and-delete is idempotent).
        let mut cleanup = ReleaseOnDrop::new(self, held);
        let mut fan = self.send_release(held);
        let wait = Instant::now() + self.inner.config.node_timeout;
        fan.decide(release_confirmed, wait).await;
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

    /// Starts the release and queues it on every connection before
    /// returning. Then this client's own next waiter may send its attempt
    /// at once: on each node it runs after our delete, which saves it the
    /// notice's trip through Redis.
    fn send_release(&self, held: &Held) -> FanOut<()> {
        let releasing = held
            .granted
            .then(|| self.inner.waits.releasing(&held.key, notice_id(held)));
        let mut fan = self.start_release(held);
        fan.send_now(release_confirmed);
        if let Some(releasing) = releasing {
            releasing.queued();
        }
        fan
    }

    fn start_release(&self, held: &Held) -> FanOut<()> {
        // The requests live until the keys would have expired anyway (at
        // least one node timeout): a release that gives up earlier, say
        // queued behind a paused node's backlog, would leave its key to block
        // others for the rest of the TTL. Nobody waits on them that long.
        let deadline = held
            .expires_at
            .max(Instant::now() + self.inner.config.node_timeout);
        // A failed attempt's cleanup is announced too (to other clients the
        // lock may now be free: a split vote), marked with this client's
        // tag so that its own waiters, who know better, ignore it.
        let notice: Arc<str> = if held.granted {
            notice_id(held).into()
        } else {
            format!("{}{}", self.inner.waits.tag(), notice_id(held)).into()
        };
        // Releases ignore the settled flag and go through to stalled nodes:
        // the acquire they follow may be queued there.
        FanOut::start(&self.inner.nodes, held.sent, deadline, |node, _settled| {
            let (key, value) = (held.key.clone(), held.value.clone());
            let notice = notice.clone();
            async move {
                let args: [&[u8]; 2] = [value.as_bytes(), notice.as_bytes()];
                parse_flag(
                    node.run_script(&RELEASE, &[&key], &args, &Settled::NEVER, true, None)
                        .await?,
                )
            }
        })
    }

    /// Fire-and-forget release, for paths that cannot await (drop) or should
    /// not (a failed attempt). Without a tokio runtime it does nothing and
    /// the TTL frees the lock.
    pub(crate) fn release_in_background(&self, held: &Held) {
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let span = tracing::debug_span!("background_release", key = %held.key);
            // Queued here, not in the task: a release dropped just before
            // the next acquire of the same resource runs before it.
            handle.spawn(self.send_release(held).drain().instrument(span));
        }
    }

    /// Builds a guard from a grant, with its watchdog when auto-extended.
    pub(crate) fn guard(
        &self,
        target: &Target,
        grant: Grant,
        watchdog: Option<Schedule>,
    ) -> LockGuard {
        let lease = Lease::new(target, grant, watchdog.is_some());
        let watchdog = watchdog.map(|s| Watchdog::spawn(self.clone(), lease.clone(), s));
        LockGuard::new(self.clone(), lease, watchdog)
    }

    /// The watchdog schedule for `target` under `auto`, checked.
    pub(crate) fn schedule(&self, target: &Target, auto: &AutoExtend) -> Result<Schedule, Error> {
        auto.schedule(target, self.node_timeout())
    }

    /// What the restart guard asks of a vote now (`None`: guard off).
    /// `fenced`: the request moves fences (acquire, write-back), so a young
    /// server's fences must have been re-seeded first.
    fn vote(&self, fenced: bool) -> Option<Vote> {
        let longest = Duration::from_millis(self.inner.longest_ttl_ms.load(Ordering::Relaxed));
        let window = self.inner.config.restart_guard.window(longest)?;
        Some(Vote {
            window,
            fenced: fenced && self.inner.config.fencing.is_some(),
        })
    }

    /// Starts the re-seed of every node whose server a fenced vote found
    /// young and not re-seeded (see `Node::ready`).
    fn reseed_if_wanted(&self) {
        for (index, node) in self.inner.nodes.iter().enumerate() {
            if !node.take_reseed_wanted() {
                continue;
            }
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                node.reseed_done(None);
                continue;
            };
            // A Weak: the re-seed must not keep a dropped client alive; it
            // ends within a few node round trips anyway.
            let inner = Arc::downgrade(&self.inner);
            let span = tracing::info_span!("reseed", node = %node.addr());
            runtime.spawn(
                async move {
                    let Some(inner) = inner.upgrade() else { return };
                    let client = Client { inner };
                    let node = Arc::clone(&client.inner.nodes[index]);
                    match client.reseed(index).await {
                        Ok((run_id, keys)) => {
                            tracing::info!(keys, "fences re-seeded from a majority");
                            node.reseed_done(Some(run_id));
                        }
                        Err(reason) => {
                            tracing::warn!(%reason, "fence re-seed failed; retried on the next vote");
                            node.reseed_done(None);
                        }
                    }
                }
                .instrument(span),
            );
        }
    }

    /// Re-seeds node `index`'s fences from a majority of the other nodes:
    /// every fence key any of them holds, raised on `index` to the largest
    /// value among them. Any token handed out was written to a majority;
    /// at most N − quorum nodes can have lost their fences at once (the
    /// model), so the holders of a token that kept their data and any
    /// quorum of nodes that kept theirs intersect. Afterwards the node's
    /// fences are at least every token issued before, as if it had never
    /// lost them (DESIGN.md, "The restart guard").
    ///
    /// Only nodes that may vote in a fenced request count as sources: a
    /// node itself restarted within the window and not yet re-seeded may
    /// have lost the largest token, and copying from it wrote stale fences
    /// (decreasing tokens, found by the fault suite's 8-minute run). When
    /// fewer than a quorum of the nodes that answered are such sources
    /// (more than N − quorum restarted empty at once, outside the model),
    /// the values are raised to at least the clock seed a lost fence gets
    /// anyway, so tokens keep increasing as long as clocks agree, and the
    /// node is not locked out for good. Returns the re-seeded server's
    /// `run_id` and the number of keys.
    async fn reseed(&self, index: usize) -> Result<(String, usize), String> {
        let nodes = &self.inner.nodes;
        let target = nodes.get(index).ok_or("no such node")?;
        let run_id = target.run_id().ok_or("not connected")?;
        let retention = self.inner.config.fencing.ok_or("fencing is off")?;
        let retention_ms = retention.as_millis().max(1).to_string();
        let pattern = format!(
            "{}*",
            glob_escape(&fence_key(&self.inner.config.key_prefix, ""))
        );
        let bound = self.inner.config.node_timeout.max(Duration::from_secs(1));
        let mut fences: std::collections::HashMap<String, u64> = Default::default();
        // Other nodes that answered, and those among them whose fences can
        // be trusted (not restarted and still unseeded themselves).
        let (mut answered, mut sources) = (0, 0);
        let vote = self.vote(true);
        for (i, node) in nodes.iter().enumerate() {
            if i == index {
                continue;
            }
            match read_fences(node, &pattern, bound, vote).await {
                Ok(read) => {
                    answered += 1;
                    sources += 1;
                    for (key, value) in read {
                        let max = fences.entry(key).or_default();
                        *max = (*max).max(value);
                    }
                }
                Err(NodeErrorKind::Restarted { .. } | NodeErrorKind::Reseeding) => answered += 1,
                Err(_) => {}
            }
        }
        let quorum = quorum(nodes.len());
        if nodes.len() > 1 && answered < quorum {
            return Err(format!(
                "only {answered} other nodes answered, a majority is needed"
            ));
        }
        let keys: Vec<(String, u64)> = if sources >= quorum || nodes.len() == 1 {
            fences.into_iter().collect()
        } else {
            let floor = fence_seed();
            tracing::warn!(
                sources,
                answered,
                "fewer than a majority of nodes kept their fences: re-seeding with the clock as a floor"
            );
            fences.into_iter().map(|(k, v)| (k, v.max(floor))).collect()
        };
        for chunk in keys.chunks(RESEED_CHUNK) {
            let names: Vec<&str> = chunk.iter().map(|(k, _)| k.as_str()).collect();
            let values: Vec<String> = chunk.iter().map(|(_, v)| v.to_string()).collect();
            let mut args: Vec<&[u8]> = values.iter().map(|v| v.as_bytes()).collect();
            args.push(retention_ms.as_bytes());
            let call = target.run_script(&RESEED, &names, &args, &Settled::NEVER, true, None);
            match tokio::time::timeout(bound, call).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(format!("writing fences: {e}")),
                Err(_) => return Err("writing fences timed out".into()),
            }
        }
        // The server must still be the one we re-seeded.
        if target.run_id().as_deref() != Some(run_id.as_str()) {
            return Err("the server changed during the re-seed".into());
        }
        Ok((run_id, keys.len()))
    }

    /// Whether waiting acquires wait for release notifications.
    pub(crate) fn wake_on_release(&self) -> bool {
        self.inner.config.wake_on_release
    }

    /// Whether `target`'s lock looks held, from one `PTTL` on one node
    /// picked at random, bounded by the node timeout: `Some` with the
    /// remaining TTL (`None` inside for a key without expiry) when held
    /// there, `None` when free there or unknown (an error, a timeout). One
    /// node's view can be wrong either way; it only decides whether a
    /// waiter sends a full attempt now or waits for the next release.
    pub(crate) async fn probe(&self, target: &Target) -> Option<Option<Duration>> {
        let nodes = &self.inner.nodes;
        let node = nodes.get(rand::random_range(0..nodes.len()))?;
        let mut pttl = redis::cmd("PTTL");
        pttl.arg(&*target.key);
        let reply = tokio::time::timeout(
            self.inner.config.node_timeout,
            node.run_command(&pttl, &Settled::NEVER, None),
        )
        .await;
        match reply {
            Ok(Ok(Value::Int(ms))) if ms > 0 => {
                Some(Some(Duration::from_millis(ms.unsigned_abs())))
            }
            Ok(Ok(Value::Int(-1))) => Some(None),
            _ => None,
        }
    }

    /// Joins the client's wait queue for `target`'s resource.
    pub(crate) fn wait_place(&self, target: &Target) -> Place {
        self.inner.waits.join(&self.inner.nodes, &target.key)
    }

    /// A place in `target`'s queue if other tasks of this client wait in it.
    pub(crate) fn wait_place_behind_others(&self, target: &Target) -> Option<Place> {
        self.inner
            .waits
            .join_if_waiting(&self.inner.nodes, &target.key)
    }

    pub(crate) fn node_timeout(&self) -> Duration {
        self.inner.config.node_timeout
    }

    /// The auto-extension requests get unless they say otherwise.
    pub(crate) fn default_auto_extend(&self) -> Option<AutoExtend> {
        self.inner.config.auto_extend
    }
}

/// What a lock needs to be extended or released: its key, its secret value,
/// the nodes the acquire may have reached, and when the keys expire.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) key: Arc<str>,
    pub(crate) value: Arc<str>,
    /// Public id of this acquisition, published with its release (the value
    /// is secret: it authorises release).
    pub(crate) notice: u64,
    /// Whether the lock was granted (a guard's release) or this is the
    /// cleanup of a failed attempt.
    pub(crate) granted: bool,
    pub(crate) sent: NodeSet,
    pub(crate) expires_at: Instant,
}

/// The result of [`Client::round`]: its start on success, the nodes the
/// requests may have reached either way, and the values of the nodes that
/// said yes before the decision.
struct Round<T> {
    outcome: Result<Instant, QuorumFailure>,
    sent: NodeSet,
    values: Vec<(usize, T)>,
    /// On success, the nodes that did not say yes (as far as heard).
    failures: Vec<NodeFailure>,
}

/// A successful extend: the new deadline and expiry, and the nodes that
/// did not extend (as far as heard).
pub(crate) struct Extended {
    pub(crate) valid_until: Instant,
    pub(crate) expires_at: Instant,
    pub(crate) failures: Vec<NodeFailure>,
}

/// Fence keys written per re-seed script call.
const RESEED_CHUNK: usize = 256;

/// Every fence key matching `pattern` on `node` with its value (`SCAN` and
/// `MGET`), each call bounded by `bound`.
async fn read_fences(
    node: &Node,
    pattern: &str,
    bound: Duration,
    vote: Option<Vote>,
) -> Result<Vec<(String, u64)>, NodeErrorKind> {
    let mut out = Vec::new();
    let mut cursor = String::from("0");
    loop {
        let mut scan = redis::cmd("SCAN");
        scan.arg(&cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000);
        let reply = tokio::time::timeout(bound, node.run_command(&scan, &Settled::NEVER, vote))
            .await
            .map_err(|_| NodeErrorKind::Timeout(bound))??;
        let Value::Array(parts) = reply else {
            return Err(unexpected(reply));
        };
        let (next, keys) = match parts.as_slice() {
            [Value::BulkString(next), Value::Array(keys)] => (
                String::from_utf8_lossy(next).into_owned(),
                keys.iter()
                    .filter_map(|k| match k {
                        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
            ),
            _ => return Err(unexpected(Value::Array(parts))),
        };
        if !keys.is_empty() {
            let mut mget = redis::cmd("MGET");
            for key in &keys {
                mget.arg(key);
            }
            let reply = tokio::time::timeout(bound, node.run_command(&mget, &Settled::NEVER, vote))
                .await
                .map_err(|_| NodeErrorKind::Timeout(bound))??;
            if let Value::Array(values) = reply {
                for (key, value) in keys.into_iter().zip(values) {
                    let parsed = match value {
                        Value::BulkString(b) => {
                            std::str::from_utf8(&b).ok().and_then(|s| s.parse().ok())
                        }
                        _ => None,
                    };
                    if let Some(v) = parsed {
                        out.push((key, v));
                    }
                }
            }
        }
        if next == "0" {
            return Ok(out);
        }
        cursor = next;
    }
}

/// Escapes the glob characters of a key prefix for `SCAN MATCH`.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The public id of an acquisition, published with its release.
/// A release's answer that counts: the node deleted our key.
fn release_confirmed(r: &Result<(), NodeErrorKind>) -> bool {
    matches!(r, Ok(()))
}

fn notice_id(held: &Held) -> String {
    format!("{:016x}", held.notice)
}

/// Sends a release everywhere when dropped while armed.
struct ReleaseOnDrop<'a> {
    client: &'a Client,
    held: Held,
    armed: bool,
}

impl<'a> ReleaseOnDrop<'a> {
    fn new(client: &'a Client, held: &Held) -> Self {
        Self {
            client,
            held: held.clone(),
            armed: true,
        }
    }

    fn update(&mut self, held: &Held) {
        self.held = held.clone();
    }

    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.client.release_in_background(&self.held);
        }
    }
}

/// Names a failed round: `Contended` (acquire) or `NotHeld` (extend) when
/// those answers alone make a majority impossible (another owner has it, or
/// it is gone), otherwise the failing nodes are to blame.
fn classify_failure(
    phase: Phase,
    nodes: usize,
    quorum: usize,
    failures: &[NodeFailure],
) -> FailureReason {
    if phase == Phase::WriteBack {
        // Only the granting nodes that lacked the token were asked (the
        // others are `Skipped`): the lock was lost if they all said so.
        let mut asked = failures
            .iter()
            .filter(|f| !matches!(f.kind, NodeErrorKind::Skipped))
            .peekable();
        let lost =
            asked.peek().is_some() && asked.all(|f| matches!(f.kind, NodeErrorKind::NotHeld));
        return if lost {
            FailureReason::NotHeld
        } else {
            FailureReason::Unavailable
        };
    }
    let (is_specific, specific): (fn(&NodeErrorKind) -> bool, _) = match phase {
        Phase::Acquire => (
            |k| matches!(k, NodeErrorKind::HeldByOther { .. }),
            FailureReason::Contended,
        ),
        Phase::Extend | Phase::WriteBack => (
            |k| {
                matches!(
                    k,
                    NodeErrorKind::NotHeld | NodeErrorKind::HeldByOther { .. }
                )
            },
            FailureReason::NotHeld,
        ),
    };
    let count = failures.iter().filter(|f| is_specific(&f.kind)).count();
    if count > nodes - quorum {
        specific
    } else {
        FailureReason::Unavailable
    }
}

/// `OK` granted; nil held by another owner.
fn parse_set(reply: Value) -> Result<(), NodeErrorKind> {
    match reply {
        Value::Okay => Ok(()),
        Value::SimpleString(ref s) if s == "OK" => Ok(()),
        Value::Nil => Err(NodeErrorKind::HeldByOther { expires_in: None }),
        other => Err(unexpected(other)),
    }
}

/// The fenced acquire, as one transaction (DESIGN.md, section 6):
///
/// ```text
/// MULTI
/// SET lock value NX PX ttl           -- the grant
/// SET fence seed NX PX retention     -- a fence for a resource that has none
/// INCR fence                         -- every attempt moves it, granted or not
/// PEXPIRE fence retention            -- kept for the retention after last use
/// [PTTL lock]                        -- a waiter's retry: the holder's TTL
/// EXEC
/// ```
///
/// The fence moves on refused attempts too: harmless (fences only have to
/// grow), and it keeps nodes level under contention, where moving only on
/// grants would leave the nodes that refused behind. `INCR` is exact over
/// the whole `i64` range.
fn fenced_acquire(
    held: &Held,
    ttl_ms: u64,
    fence_key: &str,
    retention_ms: &str,
    seed: u64,
    probe: bool,
) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("SET")
        .arg(&*held.key)
        .arg(&*held.value)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms)
        .cmd("SET")
        .arg(fence_key)
        .arg(seed)
        .arg("NX")
        .arg("PX")
        .arg(retention_ms)
        .ignore()
        .cmd("INCR")
        .arg(fence_key)
        .cmd("PEXPIRE")
        .arg(fence_key)
        .arg(retention_ms)
        .ignore();
    if probe {
        pipe.cmd("PTTL").arg(&*held.key);
    }
    pipe
}

/// The first fence of a resource (and the one after its fence state
/// expired): this machine's wall clock in microseconds since the Unix
/// epoch. The only use of the wall clock in the crate, and not a timing
/// decision: it only makes a fresh fence start above the tokens of fences
/// that expired, because no resource is acquired a million times a second
/// (DESIGN.md, "Fence state"). Safety within the retention does not depend
/// on it. A clock before 1970 seeds 1.
const MAX_SEED: u64 = 1 << 62;

fn fence_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_micros()).unwrap_or(MAX_SEED))
        .clamp(1, MAX_SEED)
}

/// The fenced acquire's replies (the two not ignored): the lock `SET` and
/// the `INCR`. The node's new fence when granted; `HeldByOther` when the
/// `SET NX` found another owner.
fn parse_fenced(reply: Value) -> Result<u64, NodeErrorKind> {
    let Value::Array(items) = reply else {
        return Err(unexpected(reply));
    };
    match items.as_slice() {
        [set, Value::Int(fence), rest @ ..] if *fence > 0 && rest.len() <= 1 => {
            match (parse_set(set.clone()), rest.first()) {
                (Ok(()), _) => Ok(fence.unsigned_abs()),
                (Err(NodeErrorKind::HeldByOther { .. }), Some(pttl)) => Err(held_for(pttl)?),
                (Err(e), _) => Err(e),
            }
        }
        _ => Err(unexpected(Value::Array(items))),
    }
}

/// The plain acquire with a `PTTL`: `[SET reply, PTTL reply]`.
fn parse_probed_set(reply: Value) -> Result<u64, NodeErrorKind> {
    let Value::Array(items) = reply else {
        return Err(unexpected(reply));
    };
    match items.as_slice() {
        [set, pttl] => match parse_set(set.clone()) {
            Ok(()) => Ok(0),
            Err(NodeErrorKind::HeldByOther { .. }) => Err(held_for(pttl)?),
            Err(e) => Err(e),
        },
        _ => Err(unexpected(Value::Array(items))),
    }
}

/// `HeldByOther` with the holder's remaining TTL from a `PTTL` reply: -1 is
/// a key without expiry (never frees), -2 a key gone since the `SET` (free
/// now).
fn held_for(pttl: &Value) -> Result<NodeErrorKind, NodeErrorKind> {
    let expires_in = match pttl {
        Value::Int(-2) => Some(Duration::ZERO),
        Value::Int(ms) if *ms >= 0 => Some(Duration::from_millis(ms.unsigned_abs())),
        Value::Int(_) => None,
        other => return Err(unexpected(other.clone())),
    };
    Ok(NodeErrorKind::HeldByOther { expires_in })
}

/// The extend script: 1 extended, 0 absent, -1 another owner's value.
fn parse_extend(reply: Value) -> Result<(), NodeErrorKind> {
    match reply {
        Value::Int(-1) => Err(NodeErrorKind::HeldByOther { expires_in: None }),
        other => parse_flag(other),
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
    fn set_replies() {
        assert!(parse_set(Value::Okay).is_ok());
        assert!(parse_set(Value::SimpleString("OK".into())).is_ok());
        assert!(matches!(
            parse_set(Value::Nil),
            Err(NodeErrorKind::HeldByOther { expires_in: None })
        ));
        assert!(matches!(
            parse_set(Value::Int(1)),
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
        // 5 nodes, quorum 3: two holds are not enough to blame contention.
        let c = |f: &[NodeFailure]| classify_failure(Phase::Acquire, 5, 3, f);
        assert_eq!(c(&[held(), held(), held()]), FailureReason::Contended);
        assert_eq!(c(&[held(), held(), timeout()]), FailureReason::Unavailable);
        assert_eq!(
            c(&[timeout(), timeout(), timeout()]),
            FailureReason::Unavailable
        );
        // Extend: "not held" answers, not holds, decide it.
        let gone = || failure(NodeErrorKind::NotHeld);
        let e = |f: &[NodeFailure]| classify_failure(Phase::Extend, 3, 2, f);
        assert_eq!(e(&[gone(), gone()]), FailureReason::NotHeld);
        // Another owner's key counts as not ours.
        assert_eq!(e(&[held(), held()]), FailureReason::NotHeld);
        assert_eq!(e(&[held(), gone()]), FailureReason::NotHeld);
        assert_eq!(e(&[gone(), timeout()]), FailureReason::Unavailable);
        // Write-back: only the nodes asked count; any other failure among
        // them makes it an availability problem.
        let skipped = || failure(NodeErrorKind::Skipped);
        let w = |f: &[NodeFailure]| classify_failure(Phase::WriteBack, 3, 2, f);
        assert_eq!(w(&[skipped(), gone()]), FailureReason::NotHeld);
        assert_eq!(w(&[skipped(), timeout()]), FailureReason::Unavailable);
        assert_eq!(w(&[gone(), timeout()]), FailureReason::Unavailable);
        assert_eq!(w(&[skipped()]), FailureReason::Unavailable);
    }

    #[test]
    fn fenced_replies() {
        let reply = |set: Value, fence: i64| Value::Array(vec![set, Value::Int(fence)]);
        assert_eq!(parse_fenced(reply(Value::Okay, 7)).unwrap(), 7);
        assert_eq!(
            parse_fenced(reply(Value::Okay, i64::MAX)).unwrap(),
            i64::MAX.unsigned_abs()
        );
        assert!(matches!(
            parse_fenced(reply(Value::Nil, 8)),
            Err(NodeErrorKind::HeldByOther { expires_in: None })
        ));
        for bad in [
            reply(Value::Okay, 0),
            reply(Value::Okay, -1),
            reply(Value::Int(1), 3),
            Value::Array(vec![Value::Okay]),
            Value::Okay,
            Value::Nil,
        ] {
            assert!(
                matches!(parse_fenced(bad.clone()), Err(NodeErrorKind::Redis(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn fenced_acquire_is_one_transaction() {
        let held = Held {
            key: "redfence:lock:r".into(),
            value: "v".into(),
            notice: 7,
            granted: false,
            sent: 1,
            expires_at: Instant::now(),
        };
        let pipe = fenced_acquire(&held, 5000, "redfence:fence:r", "86400000", 42, false);
        let packed = String::from_utf8(pipe.get_packed_pipeline()).unwrap();
        let words: Vec<&str> = packed
            .split("\r\n")
            .filter(|w| !w.starts_with(['*', '$']) && !w.is_empty())
            .collect();
        assert_eq!(
            words,
            [
                "MULTI",
                "SET",
                "redfence:lock:r",
                "v",
                "NX",
                "PX",
                "5000",
                "SET",
                "redfence:fence:r",
                "42",
                "NX",
                "PX",
                "86400000",
                "INCR",
                "redfence:fence:r",
                "PEXPIRE",
                "redfence:fence:r",
                "86400000",
                "EXEC"
            ]
        );
    }

    #[test]
    fn scan_patterns_escape_the_prefix() {
        assert_eq!(glob_escape("redfence:fence:"), "redfence:fence:");
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }

    #[test]
    fn seeds_are_clock_microseconds() {
        let seed = fence_seed();
        // After 2020, and far from the i64 limit.
        assert!(seed > 1_577_836_800_000_000, "{seed}");
        assert!(seed <= MAX_SEED);
    }
}
