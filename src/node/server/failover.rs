//! On a Sentinel node: watching the Sentinels for a failover, off the lock
//! path, and dropping a master they replaced.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::state::{Server, State};

impl Server {
    /// On a Sentinel node, from its first connection on: every
    /// [`SENTINEL_WATCH`] (at least, or every node timeout when longer) the
    /// Sentinels are asked for the master, off the lock path; a failover
    /// since the connection's master was admitted (a higher config epoch)
    /// drops that connection and demotes its server, so a master that a
    /// failover replaced while it kept answering (paused, partitioned from
    /// the Sentinels) is not asked again. The task ends with the node.
    pub(super) fn watch_sentinels(&self) {
        let Some(sentinel) = self.sentinel.clone() else {
            return;
        };
        if self.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.watching.store(false, Ordering::Release);
            return;
        };
        let me = self.me.clone();
        let timeout = self.timeouts.connect;
        let every = self.timeouts.probe.max(SENTINEL_WATCH);
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if me.strong_count() == 0 {
                    return;
                }
                let Ok(located) = sentinel.locate(timeout).await else {
                    continue;
                };
                if located.report.epoch <= sentinel.epoch() {
                    continue;
                }
                let Some(node) = me.upgrade() else { return };
                node.master_replaced();
            }
        });
    }

    /// The Sentinels replaced the master of the current connection.
    pub(super) fn master_replaced(&self) {
        let mut inner = self.lock_inner();
        if let (State::Ready(c), Some(sentinel)) = (&inner.state, &self.sentinel) {
            sentinel.demote(&c.identity.run_id);
            tracing::warn!(node = %self.addr, "the sentinels switched masters: reconnecting");
            inner.state = State::Idle;
            self.gauges.up(&self.addr, false);
        }
    }
}
/// The shortest interval of a Sentinel node's watch for failovers.
pub(super) const SENTINEL_WATCH: Duration = Duration::from_millis(500);
