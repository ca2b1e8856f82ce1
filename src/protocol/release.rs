//! Release: compare-and-delete on every node the lock may have reached,
//! returning at the majority; the rest finishes in the background. Also
//! the release of a failed attempt, and of a guard dropped without one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::error::failure::{NodeErrorKind, NodeFailure};
use crate::logic::fence::clock_seed;
use crate::logic::resource::{arc_built, notice_channel, pregrant_value, push_notice_channel};
use crate::logic::validity::later;
use crate::node::Settled;
use crate::protocol::fanout::{all_nodes, node_set, FanOut, NodeSet};
use crate::protocol::shared::{Held, Shared};
use crate::waiting::pregrant::{HandedOver, Home as QueueHome, Orphan};
use crate::wire::commands::parse_flag;
use crate::wire::outgoing::PackedOnce;
use crate::wire::scripts::{RELEASE, RELEASE_LEAN};

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
    /// Nodes whose key this release left to the fair queue's next waiter,
    /// whose acquire replaces it (a *handover*: the home node deleted our
    /// key and named that waiter, and it is the only one that can take
    /// those keys; if it never does, they expire with our TTL). 0 when the
    /// release deleted everywhere. DESIGN.md, section 2, fair queue,
    /// step 3, "Handover".
    pub handed_over: usize,
}

/// Compare-and-delete on the nodes the lock may have reached. Returns once
/// the outcome is certain (a majority confirmed, so the lock is free for
/// others, or a majority can no longer confirm) or after one node timeout;
/// the rest finish in the background. On a contended fair queue
/// ([`Waits::hands_over`](crate::waiting::notify::Waits::hands_over)) the home node
/// is asked first to hand the lock over to the next waiter; the other
/// nodes are released only if it did not.
pub(crate) async fn release(shared: &Shared, held: &Held) -> Released {
    // If this future is dropped before the fan-out is handed off, resend
    // the release in the background (compare-and-delete is idempotent).
    let mut cleanup = ReleaseOnDrop::new(shared, held);
    let notice_id = held.notice_id();
    let home = node_set([held.home.index]);
    let mut credited = 0;
    // The home's failure in the first step, if it was asked first.
    let mut first = None;
    // Handed over only where our acquire has answered everywhere but the
    // home: a request of ours still in flight to another node could land
    // after the next waiter's acquire there (another client, another
    // connection) and leave our key for its TTL. Our own release, queued
    // behind it on the same connection, cannot.
    let others = held.sent & !home;
    if held.granted
        && shared.config.handover
        && held.home.pregrant_fence.is_some()
        && held.ours_on(others)
        && shared.waits.hands_over(&held.key)
    {
        let handed = Arc::new(AtomicBool::new(false));
        // The home's request lives as long as the key it deletes, like any
        // release's (a paused or backlogged home runs it late, and
        // redis-rs skips a request whose caller gave up before it was
        // written: the key stayed its TTL and nobody was named); the
        // caller waits for its answer one node timeout at most.
        let step = Step {
            targets: home,
            credited: 0,
            handover: Some(&handed),
            deadline: release_deadline(shared, held),
            by_hash: false,
        };
        let mut fan = send_release(shared, held, notice_id.clone(), &step);
        fan.hear_until(Instant::now() + shared.config.node_timeout)
            .await;
        if handed.load(Ordering::Acquire) {
            cleanup.disarm();
            let others = others.count_ones() as usize;
            return Released {
                confirmed: 1,
                nodes: shared.nodes.len(),
                failures: Vec::new(),
                pending: 0,
                handed_over: others,
            };
        }
        if fan.tally().yes() == 1 {
            credited = home;
        }
        first = Some(
            fan.failures()
                .into_iter()
                .filter(|f| f.index == held.home.index)
                .collect::<Vec<_>>(),
        );
        // Not answered yet: it goes on in the background. If it hands over
        // later, the named waiter's acquire finds the other nodes freed by
        // the release below, which is as good.
        fan.finish_in_background();
    }
    let targets = if first.is_none() {
        // A granted lock's release always goes to the home node, even
        // when the acquire never reached it (stalled, young under the
        // restart guard, or decided before its turn): the queue's next
        // waiter is named there.
        held.sent | if held.granted { home } else { 0 }
    } else {
        held.sent & !home
    };
    let deadline = release_deadline(shared, held);
    let step = Step {
        targets,
        credited,
        handover: None,
        deadline,
        by_hash: false,
    };
    let mut fan = send_release(shared, held, notice_id, &step);
    let wait = Instant::now() + shared.config.node_timeout;
    fan.decide(release_confirmed, wait).await;
    let mut failures = fan.failures();
    if let Some(first) = first {
        // The home's answer to the first step, not "skipped".
        failures.retain(|f| f.index != held.home.index);
        failures.extend(first);
        failures.sort_by_key(|f| f.index);
    }
    let released = Released {
        confirmed: fan.tally().yes(),
        nodes: fan.tally().nodes(),
        failures,
        pending: fan.pending(),
        handed_over: 0,
    };
    fan.finish_in_background();
    cleanup.disarm();
    released
}

/// Fire-and-forget release, for paths that cannot await (drop) or should
/// not (a failed attempt). Without a tokio runtime it does nothing and the
/// TTL frees the lock.
pub(crate) fn release_in_background(shared: &Shared, held: &Held) {
    background(shared, held, false);
}

/// [`release_in_background`]; `by_hash`: `held.value` is the SHA1 of the
/// value to delete (the keys a handover left, known by their hash).
fn background(shared: &Shared, held: &Held, by_hash: bool) {
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        let span = tracing::debug_span!("background_release", key = %held.key);
        // Queued here, not in the task: a release dropped just before the
        // next acquire of the same resource runs before it.
        let targets = held.sent
            | if held.granted {
                node_set([held.home.index])
            } else {
                0
            };
        let deadline = release_deadline(shared, held);
        let step = Step {
            targets,
            credited: 0,
            handover: None,
            deadline,
            by_hash,
        };
        let fan = send_release(shared, held, held.notice_id(), &step);
        handle.spawn(fan.drain().instrument(span));
    }
}

/// Releases, in the background, a home's vote pre-granted to a ticket of
/// this client that no waiter will use ([`Orphan`]): a granted lock's
/// release on the home alone, so that the script takes the ticket out and
/// names the next one. When the naming release handed the lock over, the
/// released holder's keys on the other nodes, left for the waiter, are
/// released too.
pub(crate) fn release_orphan(shared: &Shared, orphan: Orphan) {
    if let Some(handed) = orphan.handed.clone() {
        release_handed(shared, &orphan.key, &orphan.home, handed);
    }
    // The pre-granted key was set with the ticket's TTL before now: the
    // release lives until it would have expired.
    let ttl = ticket_ttl(&orphan.ticket).unwrap_or(shared.config.node_timeout);
    let held = Held {
        key: orphan.key,
        value: pregrant_value(&orphan.ticket, &orphan.notice),
        notice: rand::random(),
        granted: true,
        sent: node_set([orphan.home.index]),
        ours: Arc::default(),
        expires_at: later(Instant::now(), ttl),
        home: orphan.home,
        ticket: Some(orphan.ticket),
    };
    release_in_background(shared, &held);
}

/// The TTL a fair ticket carries (`…-{ms}`): what the home's pre-grant sets.
fn ticket_ttl(ticket: &str) -> Option<Duration> {
    let (_, ms) = ticket.rsplit_once('-')?;
    ms.parse().ok().map(Duration::from_millis)
}

/// Releases, in the background, the keys a handover left for a fair waiter
/// that will not take them (it left, its attempt failed): the released
/// holder's keys on every node but the home, known by the SHA1 of its
/// value (compare-and-delete: a key the waiter replaced already holds its
/// own value), until they would have expired.
pub(crate) fn release_handed(
    shared: &Shared,
    key: &Arc<str>,
    home: &QueueHome,
    handed: HandedOver,
) {
    let others = all_nodes(shared.nodes.len()) & !node_set([home.index]);
    let held = Held {
        key: key.clone(),
        value: handed.hash,
        notice: rand::random(),
        granted: false,
        sent: others,
        ours: Arc::default(),
        expires_at: handed.until,
        home: home.clone(),
        ticket: None,
    };
    background(shared, &held, true);
}

/// How long a release's requests live: until the keys would have expired
/// anyway (at least one node timeout). A release that gives up earlier,
/// say queued behind a paused node's backlog, would leave its key to block
/// others for the rest of the TTL. Nobody waits on them that long.
pub(crate) fn release_deadline(shared: &Shared, held: &Held) -> Instant {
    held.expires_at
        .max(Instant::now() + shared.config.node_timeout)
}

/// Where and how one release fan-out goes.
pub(crate) struct Step<'a> {
    /// The nodes asked.
    pub(crate) targets: NodeSet,
    /// Nodes that already confirmed (the home, asked first).
    pub(crate) credited: NodeSet,
    /// Ask the home to hand the lock over, and set the flag when it did.
    pub(crate) handover: Option<&'a Arc<AtomicBool>>,
    /// How long the requests live.
    pub(crate) deadline: Instant,
    /// `held.value` is the SHA1 of the value to delete.
    pub(crate) by_hash: bool,
}

/// Starts the release `step` and queues it on every connection before
/// returning. Then this client's own next waiter may send its attempt at
/// once: on each node it runs after our delete, which saves it the
/// notice's trip through Redis.
fn send_release(shared: &Shared, held: &Held, notice_id: Arc<str>, step: &Step<'_>) -> FanOut<()> {
    let releasing = held
        .granted
        .then(|| shared.waits.releasing(&held.key, notice_id.clone()));
    let mut fan = start_release(shared, held, notice_id, step);
    fan.send_now(release_confirmed);
    if let Some(releasing) = releasing {
        releasing.queued();
    }
    fan
}

/// `notice_id` is `held.notice_id()`, made once by the caller; see
/// [`send_release`].
pub(crate) fn start_release(
    shared: &Shared,
    held: &Held,
    notice_id: Arc<str>,
    step: &Step<'_>,
) -> FanOut<()> {
    let handover = step.handover;
    // A failed attempt's cleanup is announced too (to other clients the
    // lock may now be free: a split vote), marked with this client's tag so
    // that its own waiters, who know better, ignore it.
    let notice: Arc<str> = if held.granted {
        notice_id
    } else {
        format!("{}{notice_id}", shared.waits.tag()).into()
    };
    // When this client knows of nothing to tend for the resource (no
    // ticket, no handover, none of its tasks waits for it, its last
    // release on the home named nobody: `Waits::quiet`), every node gets
    // the lean script first, packed once for all of them, and a node
    // answers -1 (the resource is waited for there) before its full
    // release is sent. Elsewhere, the full script at once. Issue 32: the
    // full script's four arguments cost Redis about half a microsecond a
    // call more than the lean one's one, on every node but the home.
    let lean = (step.handover.is_none()
        && held.ticket.is_none()
        && !step.by_hash
        && shared.waits.quiet(&held.key))
    .then(|| {
        let evalsha =
            RELEASE_LEAN.evalsha(&[&held.key, &held.home.marker], &[held.value.as_bytes()]);
        Arc::new(PackedOnce::new(evalsha, step.targets.count_ones() as usize))
    });
    // Not at all when the home is the only node asked (one node), nor
    // when the lean script goes first (a node that answers -1 names its
    // channel then).
    let home_only = held.granted && step.targets & !node_set([held.home.index]) == 0;
    // Nodes usually share a database index: name that channel, and build
    // the EVALSHA that carries it, once.
    let db0 = shared.nodes.first().map_or(0, |n| n.db());
    let channel0: Option<Arc<str>> = (!home_only && lean.is_none())
        .then(|| arc_built(|c| push_notice_channel(c, &held.key, db0)));
    let by_hash: &[u8] = if step.by_hash { b"sha1" } else { b"" };
    // Packed once for the nodes that share it (all but a granted lock's
    // home).
    let sharing = if held.granted {
        step.targets & !node_set([held.home.index])
    } else {
        step.targets
    };
    let evalsha0 = channel0.as_ref().map(|channel0| {
        let evalsha = RELEASE.evalsha(
            &[&held.key, &held.home.marker],
            &[
                held.value.as_bytes(),
                notice.as_bytes(),
                channel0.as_bytes(),
                by_hash,
            ],
        );
        Arc::new(PackedOnce::new(evalsha, sharing.count_ones() as usize))
    });
    // The home node's release also tends the fair queue: it takes out this
    // holder's ticket if it is still there and names the next waiter's
    // (the new head, left in place until that holder's release). Only a
    // granted lock's release does: a failed attempt's cleanup frees
    // nothing that waiters are owed.
    let home = held.granted.then(|| {
        let db = shared.nodes.get(held.home.index).map_or(db0, |n| n.db());
        HomeRelease {
            held: held.clone(),
            notice: notice.clone(),
            // Named by `full` when not here.
            channel: if db == db0 { channel0.clone() } else { None },
            db,
            tag: shared.id_text.clone(),
            hand_over: handover.is_some(),
        }
    });
    let home = home.map(Arc::new);
    let vouch = shared.vote(true);
    // Releases ignore the settled flag and go through to stalled nodes: the
    // acquire they follow may be queued there.
    let busy = (home.is_some() || lean.is_some()).then(|| Arc::new(shared.waits.busy(&held.key)));
    FanOut::start_settled(
        &shared.nodes,
        step.targets,
        step.credited,
        step.deadline,
        Settled::NEVER,
        |node, _settled| {
            let (key, value) = (held.key.clone(), held.value.clone());
            let marker = held.home.marker.clone();
            let expires_at = held.expires_at;
            let notice = notice.clone();
            let handed = handover.cloned();
            let mut busy_here = None;
            let mut at_home = None;
            let (channel, evalsha) = match &home {
                Some(home) if node.index() == held.home.index => {
                    busy_here = busy.clone();
                    at_home = Some(Arc::clone(home));
                    (None, None)
                }
                _ if node.db() == db0 => (channel0.clone(), evalsha0.clone()),
                _ => (None, None),
            };
            let lean = lean.clone();
            let marks = lean.as_ref().and(busy.clone());
            let by_hash = step.by_hash;
            let deadline = step.deadline;
            async move {
                let send = || async {
                    if let Some(lean) = &lean {
                        match node
                            .run_script_prepared(
                                &RELEASE_LEAN,
                                &**lean,
                                &Settled::NEVER,
                                true,
                                None,
                            )
                            .await
                        {
                            // Waited for: the full release, and at once
                            // for a while (`Busy::marked`).
                            Ok(redis::Value::Int(-1)) => {
                                if let Some(marks) = &marks {
                                    marks.marked();
                                }
                            }
                            other => return other,
                        }
                    }
                    match (&at_home, &evalsha) {
                        (Some(home), _) => {
                            let full = home.full();
                            match &full.vouched {
                                Some(vouched) => {
                                    node.run_script_vouched(&RELEASE, vouched, &full.plain, vouch)
                                        .await
                                }
                                None => {
                                    node.run_script_prepared(
                                        &RELEASE,
                                        &full.plain,
                                        &Settled::NEVER,
                                        true,
                                        None,
                                    )
                                    .await
                                }
                            }
                        }
                        (None, Some(evalsha)) => {
                            node.run_script_prepared(&RELEASE, evalsha, &Settled::NEVER, true, None)
                                .await
                        }
                        (None, None) => {
                            let hashed: &[u8] = if by_hash { b"sha1" } else { b"" };
                            // This node's channel, unless named once for all.
                            let named;
                            let channel = match &channel {
                                Some(channel) => &**channel,
                                None => {
                                    named = notice_channel(&key, node.db());
                                    &*named
                                }
                            };
                            let args: [&[u8]; 4] = [
                                value.as_bytes(),
                                notice.as_bytes(),
                                channel.as_bytes(),
                                hashed,
                            ];
                            node.run_script(
                                &RELEASE,
                                &[&key, &marker],
                                &args,
                                &Settled::NEVER,
                                true,
                                None,
                            )
                            .await
                        }
                    }
                };
                let reply = resend_until(deadline, send).await?;
                if let Some(busy) = busy_here {
                    // The home's release says whether it named a waiter (2):
                    // this client's next waiter joins the queue if so.
                    // 1 deleted, 2 deleted and named the next ticket, 4 the
                    // same and handed it the lock (asked only), 3 named
                    // it without our key there (the acquire never reached the
                    // home node), 0 neither. A ticket of this client comes
                    // back with the code, with the pre-granted fence if any:
                    // `{code, ticket, fence or ""}`.
                    let reply = match reply {
                        redis::Value::Array(items) => {
                            let text = |v: Option<&redis::Value>| match v {
                                Some(redis::Value::BulkString(b)) => {
                                    String::from_utf8_lossy(b).into_owned()
                                }
                                _ => String::new(),
                            };
                            let (ticket, fence) = (text(items.get(1)), text(items.get(2)));
                            // The server that set the key is at least as old
                            // as the connection's (a younger one, after a
                            // reconnect, only makes the vote count less).
                            let since = node.started().unwrap_or_else(Instant::now);
                            let handed_value = matches!(items.first(), Some(redis::Value::Int(4)))
                                .then(|| HandedOver::of(&value, expires_at));
                            busy.named_here(&ticket, &notice, &fence, since, handed_value);
                            items.into_iter().next().unwrap_or(redis::Value::Nil)
                        }
                        other => other,
                    };
                    match reply {
                        redis::Value::Int(4) => {
                            // Deleted here, named the next waiter and handed it
                            // the other nodes: the release ends here.
                            busy.set(true);
                            if let Some(handed) = handed {
                                handed.store(true, Ordering::Release);
                            }
                            return Ok(());
                        }
                        redis::Value::Int(2) => {
                            busy.set(true);
                            return Ok(());
                        }
                        redis::Value::Int(3) => {
                            busy.set(true);
                            return Err(NodeErrorKind::NotHeld);
                        }
                        redis::Value::Int(5) => {
                            // Deleted, and the home's vote reserved for a
                            // client outside the queue that claimed the
                            // turn: the queue is still busy.
                            busy.set(true);
                            return Ok(());
                        }
                        redis::Value::Int(1) => busy.set(false),
                        _ => {}
                    }
                    return parse_flag(reply);
                }
                parse_flag(reply)
            }
        },
    )
}

/// The first pause before a release is sent again over a new connection;
/// it doubles up to [`RESEND_MAX`].
const RESEND_FIRST: Duration = Duration::from_millis(50);
/// The longest pause between two sends of one release.
const RESEND_MAX: Duration = Duration::from_secs(1);

/// Sends a release (`send`) until it is answered, again over a new
/// connection while the node's connection is lost or cannot be made
/// (dropped by a load balancer, `CLIENT KILL`, a restart that kept its
/// data), until `deadline`: the keys' expiry. Without it a release that
/// met a dropped connection left the key for its whole TTL, and on the
/// home node the queue's next waiter was never named (issue 31; "Releases
/// outlive the key", DESIGN.md section 2). A release may run twice: it
/// deletes only our value and names the head again with the same notice
/// id, which a waiter hears once; a pre-grant's `SET NX` does not repeat.
pub(crate) async fn resend_until<F, Fut>(
    deadline: Instant,
    send: F,
) -> Result<redis::Value, NodeErrorKind>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<redis::Value, NodeErrorKind>>,
{
    let mut pause = RESEND_FIRST;
    loop {
        let (wait, error) = match send().await {
            Err(
                e @ (NodeErrorKind::ConnectionLost(_)
                | NodeErrorKind::Connect(_)
                | NodeErrorKind::Timeout(_)),
            ) => (pause, e),
            Err(NodeErrorKind::Backoff { retry_in, last }) if !last.is_permanent() => (
                retry_in.max(pause),
                NodeErrorKind::Backoff { retry_in, last },
            ),
            reply => return reply,
        };
        let again = Instant::now() + wait;
        if again >= deadline {
            return Err(error);
        }
        tokio::time::sleep_until(again.into()).await;
        pause = (pause * 2).min(RESEND_MAX);
    }
}

/// The home node's release, in the forms it may take: `vouched` lets the
/// script pre-grant the named waiter the home's vote (only on a plain
/// server with fencing on), `plain` never does.
struct Home {
    vouched: Option<redis::Cmd>,
    plain: redis::Cmd,
}

/// What the home node's full release needs, built into commands only when
/// sent (in the common case, never: the lean script, when it goes first,
/// is shared by every node).
struct HomeRelease {
    held: Held,
    notice: Arc<str>,
    /// The notice channel on the home's database; `None` when only the
    /// home was asked (named by [`full`](Self::full), if it runs).
    channel: Option<Arc<str>>,
    db: i64,
    tag: Arc<str>,
    hand_over: bool,
}

impl HomeRelease {
    /// The full release (`release.lua`) for the home node.
    fn full(&self) -> Home {
        let held = &self.held;
        let ticket = held.ticket.as_deref().unwrap_or("");
        // The named waiter's pre-grant moves the fence from the clock seed
        // when the fence key is absent, as an acquire would; a ticket of
        // this client (its tag) is named in the reply, not published.
        let hand_over: &[u8] = if self.hand_over { b"1" } else { b"" };
        // How long the holder's keys live at most, for a handover's
        // notice: the named waiter releases them until then if it does
        // not take them.
        let life = held
            .expires_at
            .saturating_duration_since(Instant::now())
            .as_millis()
            .to_string();
        let seed = clock_seed().to_string();
        let named;
        let channel = match &self.channel {
            Some(channel) => &**channel,
            None => {
                named = notice_channel(&held.key, self.db);
                &*named
            }
        };
        let args = |vouched: &'static [u8]| -> [&[u8]; 9] {
            [
                held.value.as_bytes(),
                self.notice.as_bytes(),
                channel.as_bytes(),
                ticket.as_bytes(),
                seed.as_bytes(),
                self.tag.as_bytes(),
                hand_over,
                vouched,
                life.as_bytes(),
            ]
        };
        let queue = held.home.queue();
        match &held.home.pregrant_fence {
            // Two forms: the home pre-grants only where the releasing
            // connection's server would vote in a fenced request now
            // (`Server::run_script_vouched`).
            Some(fence) => {
                let claim = held.home.claim();
                let claim = claim.as_deref().unwrap_or_default();
                let keys: [&str; 5] = [&held.key, &held.home.marker, &queue, fence, claim];
                Home {
                    vouched: Some(RELEASE.evalsha(&keys, &args(b"1"))),
                    plain: RELEASE.evalsha(&keys, &args(b"")),
                }
            }
            None => Home {
                vouched: None,
                plain: RELEASE.evalsha(&[&held.key, &held.home.marker, &queue], &args(b"")),
            },
        }
    }
}

/// A release's answer that counts: the node deleted our key.
pub(crate) fn release_confirmed(r: &Result<(), NodeErrorKind>) -> bool {
    matches!(r, Ok(()))
}

/// Sends a release everywhere when dropped while armed: an attempt that
/// failed, or whose future was dropped mid-flight, leaves nothing behind.
pub(crate) struct ReleaseOnDrop<'a> {
    shared: &'a Shared,
    held: Held,
    armed: bool,
}

impl<'a> ReleaseOnDrop<'a> {
    pub(crate) fn new(shared: &'a Shared, held: &Held) -> Self {
        Self {
            shared,
            held: held.clone(),
            armed: true,
        }
    }

    pub(crate) fn update(&mut self, held: &Held) {
        self.held = held.clone();
    }

    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            release_in_background(self.shared, &self.held);
        }
    }
}
