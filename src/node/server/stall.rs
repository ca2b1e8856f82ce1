//! A stalled server (paused, black-holed, overloaded): requests fail at
//! once but for one probe per node timeout, and a fresh connection is
//! tried beside the silent one.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use redis::Value;

use super::connect::{cut_off, reach};
use super::identity::Identity;
use super::link::Link;
use super::state::{Inner, Server, State};

impl Server {
    /// A request sent at `sent_at` got no answer by its deadline. If nothing
    /// else was answered since then either, the node is stalled (paused,
    /// black-holed, overloaded): further requests fail at once, except one
    /// probe per node timeout, until something is answered.
    pub(crate) fn note_timeout(&self, sent_at: Instant) {
        let mut inner = self.lock_inner();
        self.try_replacement(&mut inner);
        if self.last_reply.load(Ordering::Relaxed) >= self.since_epoch(sent_at) {
            return;
        }
        if inner.stalled.is_none() {
            tracing::debug!(node = %self.addr, "stalled");
            self.gauges.stalled(&self.addr, true);
            inner.stalled = Some(sent_at);
            self.stalled_hint.store(true, Ordering::Relaxed);
        }
        // Also after a failed probe: the next one waits a full interval from
        // now, so callers right after a probe timed out do not pay again.
        inner.next_probe = inner.next_probe.max(Instant::now() + self.timeouts.probe);
    }

    /// After a request to this node timed out (at most once per connect
    /// timeout), a fresh connection is tried beside the current one, and
    /// the current one is asked to echo a random token (`PING token`). If
    /// the fresh one completes the handshake while the current one does not
    /// echo the token in time, the current one is dead or out of step (a
    /// path that died without a reset, or a middlebox that lost bytes: its
    /// replies would then go to older requests forever), and the fresh one
    /// replaces it. A paused or unreachable server answers neither, and a
    /// slow one echoes eventually: both keep their connection, and the order
    /// of what is queued on it.
    pub(super) fn try_replacement(&self, inner: &mut Inner) {
        let now = Instant::now();
        if inner.replacing || now < inner.next_replacement {
            return;
        }
        let State::Ready(old) = &inner.state else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        inner.replacing = true;
        inner.next_replacement = now + self.timeouts.connect;
        let (old_generation, mut old_conn) = (old.generation, old.conn.clone());
        let old_identity = Arc::clone(&old.identity);
        let (client, timeout, me) = (self.client.clone(), self.timeouts.connect, self.me.clone());
        let (shard, sentinel, gather) = (self.shard, self.sentinel.clone(), self.gathers());
        runtime.spawn(async move {
            let token = format!("redfence-{:016x}", rand::random::<u64>());
            let mut ping = redis::cmd("PING");
            ping.arg(&token);
            let (fresh, echo) = futures::future::join(
                tokio::time::timeout(
                    timeout,
                    reach(&client, sentinel.as_deref(), timeout, shard, gather),
                ),
                tokio::time::timeout(timeout, ping.query_async::<Value>(&mut old_conn)),
            )
            .await;
            let in_step = matches!(
                echo,
                Ok(Ok(Value::BulkString(ref b))) if b.as_slice() == token.as_bytes()
            );
            let fresh = if in_step {
                None
            } else {
                fresh.ok().and_then(Result::ok)
            };
            if let Some((conn, identity)) = &fresh {
                // Cut off before the fresh one carries anything (see
                // `cut_off`), unless the old one was replaced meanwhile or
                // the server refused it before.
                let asked = me.upgrade().is_some_and(|node| {
                    node.is_current(old_generation) && !node.cut_off_refused.load(Ordering::Relaxed)
                });
                if asked {
                    let cut = cut_off(conn, identity, Some(&old_identity));
                    if let Ok(true) = tokio::time::timeout(timeout, cut).await {
                        if let Some(node) = me.upgrade() {
                            node.cut_off_refused.store(true, Ordering::Relaxed);
                        }
                    }
                }
            }
            let Some(node) = me.upgrade() else { return };
            node.finish_replacement(old_generation, fresh);
        });
    }

    /// Whether the connection of `generation` is still the node's.
    fn is_current(&self, generation: u64) -> bool {
        matches!(&self.lock_inner().state, State::Ready(c) if c.generation == generation)
    }

    pub(super) fn finish_replacement(&self, old_generation: u64, fresh: Option<(Link, Identity)>) {
        let mut inner = self.lock_inner();
        inner.replacing = false;
        let current = matches!(&inner.state, State::Ready(c) if c.generation == old_generation);
        let (Some((conn, identity)), true) = (fresh, current) else {
            return;
        };
        if self.registry.claim(self.index, &identity.run_id).is_err() {
            return;
        }
        tracing::warn!(node = %self.addr, "connection out of step while a fresh one answers: replaced");
        let generation = inner.next_generation;
        inner.next_generation += 1;
        let connected = self.connected(conn, generation, identity);
        inner.installed = Some(Arc::clone(&connected.identity));
        inner.state = State::Ready(connected);
        inner.stalled = None;
        self.stalled_hint.store(false, Ordering::Relaxed);
        self.gauges.stalled(&self.addr, false);
    }
}
