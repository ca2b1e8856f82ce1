//! One node's subscription connection, driven by one task per node that
//! the client owns ([`super::Waits`] aborts them with its last clone): it
//! connects with back-off, keeps the channels its waiters want subscribed
//! across reconnects, and hands every notice to the shared waiting state.

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::Instant;

use tokio::sync::mpsc;

use super::{Command, Shared, LINGER, RESUBSCRIBE_MIN};
use crate::logic::resource::{fair_channels, notice_channel, notice_key};
use crate::node::Node;
use crate::observe::metrics;
use crate::waiting::subscription::Subscription;

/// One node's subscription connection: connects (with back-off), keeps the
/// wanted channels subscribed across reconnects, and reports releases.
/// Every wait is bounded by the node's connect timeout; a node that stops
/// answering costs only its own notifications (the waiters' fallback covers
/// them).
pub(super) async fn subscriber(
    node: Arc<Node>,
    shared: Weak<Shared>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    tag: Arc<str>,
) {
    let timeout = node.connect_timeout();
    // The queue names lock keys; the channels carry the database too.
    let db = node.db();
    let mut wanted = Wanted::default();
    // Every task reaps the lingering queues (any one would do; reaping is
    // idempotent), so subscriptions end even when no waiter comes again.
    let mut reaping = tokio::time::interval(LINGER);
    reaping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pause = RESUBSCRIBE_MIN;
    let mut connected_before = false;
    // Whether the last try failed (connect, or a subscribe refused: an ACL
    // user without SUBSCRIBE, say): the next waits `pause`, doubling, so a
    // refusal is not retried in a tight loop of new connections.
    let mut failed = false;
    loop {
        if failed {
            // Keep the wanted set current while down.
            let until = tokio::time::Instant::now() + pause;
            loop {
                tokio::select! {
                    command = commands.recv() => match command {
                        Some(command) => apply(&mut wanted, command),
                        None => return,
                    },
                    _ = reaping.tick() => {
                        let Some(shared) = shared.upgrade() else { return };
                        shared.reap(Instant::now());
                    }
                    () = tokio::time::sleep_until(until) => break,
                }
            }
            pause = (pause * 2).min(node.backoff_max());
        }
        failed = true;
        let connection = tokio::time::timeout(timeout, Subscription::connect(&node)).await;
        let Ok(Ok(mut subscription)) = connection else {
            tracing::debug!(node = %node.addr(), "subscription connect failed");
            continue;
        };
        // The server this connection talks to started before now.
        let connected_at = Instant::now();
        if !wanted.is_empty() {
            let channels = wanted.channels(db, &tag);
            match tokio::time::timeout(timeout, subscription.subscribe(channels)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(node = %node.addr(), error = %e, "SUBSCRIBE refused: waiters on this node wait by their retry policy");
                    continue;
                }
                Err(_) => continue,
            }
            let Some(shared) = shared.upgrade() else {
                return;
            };
            for key in wanted.keys() {
                shared.confirmed(key, connected_before);
            }
        }
        connected_before = true;
        pause = RESUBSCRIBE_MIN;
        failed = false;
        loop {
            tokio::select! {
                command = commands.recv() => {
                    let Some(command) = command else { return };
                    let (subscribe, unsubscribe) = wanted.change(&command, db, &tag);
                    let mut ok = true;
                    if !subscribe.is_empty() {
                        ok = matches!(tokio::time::timeout(timeout, subscription.subscribe(subscribe)).await, Ok(Ok(())));
                        if ok {
                            let Some(shared) = shared.upgrade() else { return };
                            if let Command::Subscribe(key) | Command::SubscribeFair(key) = &command {
                                shared.confirmed(key, false);
                            }
                        }
                    }
                    if ok && !unsubscribe.is_empty() {
                        ok = matches!(tokio::time::timeout(timeout, subscription.unsubscribe(unsubscribe)).await, Ok(Ok(())));
                    }
                    if !ok {
                        // Reconnect (after a pause): the new connection
                        // subscribes to what is wanted then.
                        failed = true;
                        break;
                    }
                }
                _ = reaping.tick() => {
                    let Some(shared) = shared.upgrade() else { return };
                    shared.reap(Instant::now());
                }
                message = subscription.next() => {
                    let Some((channel, payload)) = message else { break };
                    let Some(shared) = shared.upgrade() else { return };
                    let Some(key) = notice_key(&channel, db) else {
                        continue;
                    };
                    metrics::release_notice(node.addr());
                    let payload = String::from_utf8_lossy(&payload);
                    shared.heard_from(key, &payload, node.index(), connected_at);
                }
            }
        }
        tracing::debug!(node = %node.addr(), "subscription connection lost");
    }
}

/// The keys a subscription connection is subscribed for: classic keys
/// (their notice channel) and fair-queue keys (the marker and this
/// client's own channel).
#[derive(Debug, Default)]
struct Wanted {
    classic: HashSet<Arc<str>>,
    fair: HashSet<Arc<str>>,
}

impl Wanted {
    fn is_empty(&self) -> bool {
        self.classic.is_empty() && self.fair.is_empty()
    }

    fn keys(&self) -> impl Iterator<Item = &Arc<str>> {
        self.classic
            .iter()
            .chain(self.fair.difference(&self.classic))
    }

    /// Every channel, for a new connection.
    fn channels(&self, db: i64, tag: &str) -> Vec<String> {
        let classic = self.classic.iter().map(|k| notice_channel(k, db));
        let fair = self.fair.iter().flat_map(|k| fair_channels(k, db, tag));
        classic.chain(fair).collect()
    }

    /// Applies `command`; returns the channels to subscribe and to
    /// unsubscribe on the live connection.
    fn change(&mut self, command: &Command, db: i64, tag: &str) -> (Vec<String>, Vec<String>) {
        match command {
            Command::Subscribe(key) if self.classic.insert(key.clone()) => {
                (vec![notice_channel(key, db)], Vec::new())
            }
            Command::SubscribeFair(key) if self.fair.insert(key.clone()) => {
                (fair_channels(key, db, tag).to_vec(), Vec::new())
            }
            Command::Unsubscribe(key) => {
                let mut gone = Vec::new();
                if self.classic.remove(key) {
                    gone.push(notice_channel(key, db));
                }
                if self.fair.remove(key) {
                    gone.extend(fair_channels(key, db, tag));
                }
                (Vec::new(), gone)
            }
            _ => (Vec::new(), Vec::new()),
        }
    }
}

fn apply(wanted: &mut Wanted, command: Command) {
    // While disconnected: the next connection subscribes what is wanted.
    let _ = wanted.change(&command, 0, "");
}
