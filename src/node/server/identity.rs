//! Who a connection reached: the [`Identity`] a handshake learns, and the
//! [`Registry`] that catches two URLs reaching the same server.

use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What a node learned about the server at connect time. Later features (the
/// restart guard) compare `run_id` and `uptime` across reconnects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) run_id: String,
    pub(crate) version: String,
    pub(crate) uptime: Duration,
    /// The connection's own id on the server (`CLIENT ID`), when the
    /// server told it (an ACL user without `client|id` gets none): the
    /// connection that replaces this one cuts it off by this id
    /// ([`cut_off`](super::connect::cut_off)).
    pub(crate) client_id: Option<u64>,
}

/// Identity state shared by the nodes of one client: the `run_id` each node
/// reported, to catch two URLs that reach the same server. (What each
/// node's address reaches over time is its own [`restart::Lineage`].)
#[derive(Debug, Default)]
pub(crate) struct Registry {
    pub(super) run_ids: Mutex<Vec<Option<String>>>,
}

impl Registry {
    pub(crate) fn new(nodes: usize) -> Arc<Self> {
        Arc::new(Self {
            run_ids: Mutex::new(vec![None; nodes]),
        })
    }

    /// The client's nodes.
    pub(crate) fn nodes(&self) -> usize {
        self.run_ids.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Records `run_id` for node `index`, unless another node already
    /// claimed it (`Err` names that node). The first node to connect keeps
    /// the identity, so the outcome does not flap between the two URLs.
    pub(super) fn claim(&self, index: usize, run_id: &str) -> Result<(), usize> {
        // A std Mutex: held for a scan of N entries, never across an await.
        let mut ids = self.run_ids.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(other) = ids
            .iter()
            .enumerate()
            .position(|(i, id)| i != index && id.as_deref() == Some(run_id))
        {
            return Err(other);
        }
        if let Some(slot) = ids.get_mut(index) {
            *slot = Some(run_id.to_owned());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn registry_first_claim_wins() {
        let r = Registry::new(3);
        assert_eq!(r.claim(0, "a"), Ok(()));
        assert_eq!(r.claim(1, "b"), Ok(()));
        assert_eq!(r.claim(2, "a"), Err(0));
        // A node reconnecting to its own server is fine; a restart with a new
        // run_id replaces the old one.
        assert_eq!(r.claim(0, "a"), Ok(()));
        assert_eq!(r.claim(0, "c"), Ok(()));
        assert_eq!(r.claim(2, "a"), Ok(()));
        // Out-of-range index: no panic.
        assert_eq!(r.claim(9, "z"), Ok(()));
    }
}
