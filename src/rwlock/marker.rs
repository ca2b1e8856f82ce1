//! The waiting writer's marker: while a writer waits, each of its refused
//! attempts sets (or refreshes) the marker on the nodes that refused it,
//! and no node admits a new reader while the marker lives there. Its life
//! is bounded (a writer that dies stops blocking readers within it); the
//! writer removes it when granted or when it gives up, and the guard below
//! removes it too when the waiting future is dropped.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::admit::Mark;
use crate::logic::resource::lock_value;
use crate::logic::validity::later;
use crate::protocol::fanout::all_nodes;
use crate::protocol::release::release_in_background;
use crate::protocol::shared::{Held, Shared, Target};
use crate::settings::retry::Retry;

/// The marker's life: the writer's TTL, and at least two of the longest
/// pauses between its attempts plus a node timeout, so that it does not
/// lapse between two refreshes.
pub(crate) fn marker_life(ttl: Duration, retry: &Retry, node_timeout: Duration) -> Duration {
    let longest_pause = retry.pause(u32::MAX, |window| window);
    ttl.max(longest_pause.saturating_mul(2).saturating_add(node_timeout))
}

/// A waiting writer's marker, removed (compare-and-delete of its id, the
/// mutex's release script) on every node when dropped.
pub(crate) struct Marker {
    shared: Arc<Shared>,
    key: Arc<str>,
    mark: Mark,
    home: crate::waiting::pregrant::Home,
    /// Whether any attempt may have set it.
    used: bool,
}

impl Marker {
    pub(crate) fn new(
        shared: &Arc<Shared>,
        key: Arc<str>,
        target: &Target,
        life: Duration,
    ) -> Self {
        Self {
            shared: Arc::clone(shared),
            key,
            mark: Mark {
                id: lock_value(&shared.id_text),
                life_ms: u64::try_from(life.as_millis()).unwrap_or(u64::MAX).max(1),
            },
            home: target.home.clone(),
            used: false,
        }
    }

    /// The mark to send with an attempt (from then on it may be set).
    pub(crate) fn mark(&mut self) -> &Mark {
        self.used = true;
        &self.mark
    }
}

impl Drop for Marker {
    fn drop(&mut self) {
        if !self.used {
            return;
        }
        let held = Held {
            key: self.key.clone(),
            value: self.mark.id.clone(),
            notice: rand::random(),
            granted: false,
            sent: all_nodes(self.shared.nodes.len()),
            ours: Arc::default(),
            expires_at: later(Instant::now(), Duration::from_millis(self.mark.life_ms)),
            home: self.home.clone(),
            ticket: None,
        };
        release_in_background(&self.shared, &held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_outlives_the_pauses_between_attempts() {
        let retry = Retry::new()
            .with_delay(Duration::from_millis(200))
            .with_jitter(Duration::from_millis(50))
            .with_max_jitter(Duration::from_millis(400));
        let life = marker_life(
            Duration::from_millis(100),
            &retry,
            Duration::from_millis(50),
        );
        // 2 × (200 + 400) + 50.
        assert_eq!(life, Duration::from_millis(1250));
        let life = marker_life(Duration::from_secs(30), &retry, Duration::from_millis(50));
        assert_eq!(life, Duration::from_secs(30));
    }
}
