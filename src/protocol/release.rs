//! Release: compare-and-delete on every node the lock may have reached,
//! returning at the majority; the rest finishes in the background. Also
//! the release of a failed attempt, and of a guard dropped without one.

use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument;

use crate::failure::{NodeErrorKind, NodeFailure};
use crate::fanout::{node_set, FanOut};
use crate::fence::clock_seed;
use crate::node::Settled;
use crate::pregrant::Orphan;
use crate::protocol::shared::{Held, Shared};
use crate::resource::{notice_channel, pregrant_value};
use crate::wire::commands::parse_flag;
use crate::wire::scripts::RELEASE;

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

/// Compare-and-delete on the nodes the lock may have reached. Returns once
/// the outcome is certain (a majority confirmed, so the lock is free for
/// others, or a majority can no longer confirm) or after one node timeout;
/// the rest finish in the background.
pub(crate) async fn release(shared: &Shared, held: &Held) -> Released {
    // If this future is dropped before the fan-out is handed off, resend
    // the release in the background (compare-and-delete is idempotent).
    let mut cleanup = ReleaseOnDrop::new(shared, held);
    let mut fan = send_release(shared, held);
    let wait = Instant::now() + shared.config.node_timeout;
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

/// Fire-and-forget release, for paths that cannot await (drop) or should
/// not (a failed attempt). Without a tokio runtime it does nothing and the
/// TTL frees the lock.
pub(crate) fn release_in_background(shared: &Shared, held: &Held) {
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        let span = tracing::debug_span!("background_release", key = %held.key);
        // Queued here, not in the task: a release dropped just before the
        // next acquire of the same resource runs before it.
        handle.spawn(send_release(shared, held).drain().instrument(span));
    }
}

/// Releases, in the background, a home's vote pre-granted to a ticket of
/// this client that no waiter will use ([`Orphan`]): a granted lock's
/// release on the home alone, so that the script takes the ticket out and
/// names the next one.
pub(crate) fn release_orphan(shared: &Shared, orphan: Orphan) {
    let held = Held {
        key: orphan.key,
        value: pregrant_value(&orphan.ticket, &orphan.notice),
        notice: rand::random(),
        granted: true,
        sent: node_set([orphan.home.index]),
        ours: Arc::default(),
        expires_at: Instant::now(),
        home: orphan.home,
        ticket: Some(orphan.ticket),
    };
    release_in_background(shared, &held);
}

/// Starts the release and queues it on every connection before returning.
/// Then this client's own next waiter may send its attempt at once: on each
/// node it runs after our delete, which saves it the notice's trip through
/// Redis.
fn send_release(shared: &Shared, held: &Held) -> FanOut<()> {
    let notice_id = held.notice_id();
    let releasing = held
        .granted
        .then(|| shared.waits.releasing(&held.key, notice_id.clone()));
    let mut fan = start_release(shared, held, notice_id);
    fan.send_now(release_confirmed);
    if let Some(releasing) = releasing {
        releasing.queued();
    }
    fan
}

/// `notice_id` is `held.notice_id()`, made once by the caller.
fn start_release(shared: &Shared, held: &Held, notice_id: String) -> FanOut<()> {
    // The requests live until the keys would have expired anyway (at least
    // one node timeout): a release that gives up earlier, say queued behind
    // a paused node's backlog, would leave its key to block others for the
    // rest of the TTL. Nobody waits on them that long.
    let deadline = held
        .expires_at
        .max(Instant::now() + shared.config.node_timeout);
    // A failed attempt's cleanup is announced too (to other clients the
    // lock may now be free: a split vote), marked with this client's tag so
    // that its own waiters, who know better, ignore it.
    let notice: Arc<str> = if held.granted {
        notice_id.into()
    } else {
        format!("{}{notice_id}", shared.waits.tag()).into()
    };
    // Nodes usually share a database index: name that channel, and build
    // the EVALSHA that carries it, once.
    let db0 = shared.nodes.first().map_or(0, |n| n.db());
    let channel0: Arc<str> = notice_channel(&held.key, db0).into();
    let evalsha0 = Arc::new(RELEASE.evalsha(
        &[&held.key],
        &[
            held.value.as_bytes(),
            notice.as_bytes(),
            channel0.as_bytes(),
        ],
    ));
    // The home node's release also tends the fair queue: it takes out this
    // holder's ticket if it is still there and names the next waiter's
    // (the new head, left in place until that holder's release). Only a
    // granted lock's release does: a failed attempt's cleanup frees
    // nothing that waiters are owed.
    let home = held.granted.then(|| {
        let ticket = held.ticket.as_deref().unwrap_or("");
        let db = shared.nodes.get(held.home.index).map_or(db0, |n| n.db());
        let channel = notice_channel(&held.key, db);
        // The named waiter's pre-grant moves the fence from the clock seed
        // when the fence key is absent, as an acquire would; a ticket of
        // this client (its tag) is named in the reply, not published.
        let tag = shared.id_text.as_bytes();
        match &held.home.pregrant_fence {
            Some(fence) => Arc::new(RELEASE.evalsha(
                &[&held.key, &held.home.queue, fence],
                &[
                    held.value.as_bytes(),
                    notice.as_bytes(),
                    channel.as_bytes(),
                    ticket.as_bytes(),
                    clock_seed().to_string().as_bytes(),
                    tag,
                ],
            )),
            None => Arc::new(RELEASE.evalsha(
                &[&held.key, &held.home.queue],
                &[
                    held.value.as_bytes(),
                    notice.as_bytes(),
                    channel.as_bytes(),
                    ticket.as_bytes(),
                    b"",
                    tag,
                ],
            )),
        }
    });
    // Releases ignore the settled flag and go through to stalled nodes: the
    // acquire they follow may be queued there.
    let busy = home
        .as_ref()
        .map(|_| Arc::new(shared.waits.busy(&held.key)));
    // A granted lock's release always goes to the home node, even when
    // the acquire never reached it (stalled, young under the restart
    // guard, or decided before its turn): the queue's next waiter is named
    // there.
    let sent = if home.is_some() {
        held.sent | node_set([held.home.index])
    } else {
        held.sent
    };
    FanOut::start(&shared.nodes, sent, deadline, |node, _settled| {
        let (key, value) = (held.key.clone(), held.value.clone());
        let notice = notice.clone();
        let mut busy_here = None;
        let (channel, evalsha) = match &home {
            Some(home) if node.index() == held.home.index => {
                busy_here = busy.clone();
                (channel0.clone(), Some(Arc::clone(home)))
            }
            _ if node.db() == db0 => (channel0.clone(), Some(Arc::clone(&evalsha0))),
            _ => (notice_channel(&key, node.db()).into(), None),
        };
        async move {
            let reply = match evalsha {
                Some(evalsha) => {
                    node.run_script_prepared(&RELEASE, &evalsha, &Settled::NEVER, true, None)
                        .await?
                }
                None => {
                    let args: [&[u8]; 3] =
                        [value.as_bytes(), notice.as_bytes(), channel.as_bytes()];
                    node.run_script(&RELEASE, &[&key], &args, &Settled::NEVER, true, None)
                        .await?
                }
            };
            if let Some(busy) = busy_here {
                // The home's release says whether it named a waiter (2):
                // this client's next waiter joins the queue if so.
                // 1 deleted, 2 deleted and named the next ticket, 3 named
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
                        busy.named_here(&ticket, &notice, &fence, since);
                        items.into_iter().next().unwrap_or(redis::Value::Nil)
                    }
                    other => other,
                };
                match reply {
                    redis::Value::Int(2) => {
                        busy.set(true);
                        return Ok(());
                    }
                    redis::Value::Int(3) => {
                        busy.set(true);
                        return Err(NodeErrorKind::NotHeld);
                    }
                    redis::Value::Int(1) => busy.set(false),
                    _ => {}
                }
                return parse_flag(reply);
            }
            parse_flag(reply)
        }
    })
}

/// A release's answer that counts: the node deleted our key.
fn release_confirmed(r: &Result<(), NodeErrorKind>) -> bool {
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
