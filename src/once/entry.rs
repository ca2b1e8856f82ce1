//! A single-flight entry as one node returns it, and the pure rules over
//! it: which node's answer is the newest, whether it is fresh, whether it
//! is due for early recomputation (XFetch), whether it carries the error
//! of a computation a waiter waited for. No I/O: tested here without Redis.

use std::time::Duration;

/// One node's entry.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    /// The token of the entry's last accepted write (value or error).
    pub(crate) fence: u64,
    /// The cached value, if one was ever written.
    pub(crate) value: Option<Vec<u8>>,
    /// Milliseconds of freshness left on the node's clock (≤ 0: expired).
    pub(crate) left_ms: i64,
    /// How long the value's computation took (XFetch's δ).
    pub(crate) delta: Duration,
    /// The last computation's error and its milliseconds left, when the
    /// last write was a failed computation's.
    pub(crate) error: Option<(String, i64)>,
}

impl Entry {
    /// The value, while it is fresh.
    pub(crate) fn fresh(&self) -> Option<&[u8]> {
        self.value.as_deref().filter(|_| self.left_ms > 0)
    }

    /// XFetch (Vattani, Chierichetti, Lowenstein, VLDB 2015): a fresh value
    /// is recomputed early when `δ·β·(−ln u) ≥ time left`, `u` uniform in
    /// (0, 1]; the closer the expiry and the longer the computation, the
    /// likelier. `beta` 0 turns it off.
    pub(crate) fn due_early(&self, beta: f64, u: f64) -> bool {
        if self.fresh().is_none() || beta <= 0.0 || !beta.is_finite() {
            return false;
        }
        let u = u.clamp(f64::MIN_POSITIVE, 1.0);
        let ahead_ms = self.delta.as_secs_f64() * 1000.0 * beta * -u.ln();
        ahead_ms >= self.left_ms as f64
    }

    /// The error of a computation that failed after the waiter read the
    /// entry at `seen` (its fence then): a marker already there when the
    /// waiter started waiting is an earlier computation's, not the one it
    /// waited for.
    pub(crate) fn failed_since(&self, seen: u64) -> Option<&str> {
        match &self.error {
            Some((message, left)) if *left > 0 && self.fence > seen => Some(message),
            _ => None,
        }
    }
}

/// The entry with the highest fence among the nodes' answers: the last
/// accepted write, since every write carries a larger token than the ones
/// before it (DESIGN.md, "Fencing tokens").
pub(crate) fn newest(entries: impl IntoIterator<Item = Entry>) -> Option<Entry> {
    entries.into_iter().max_by_key(|e| e.fence)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(fence: u64, left_ms: i64, delta_ms: u64) -> Entry {
        Entry {
            fence,
            value: Some(b"v".to_vec()),
            left_ms,
            delta: Duration::from_millis(delta_ms),
            error: None,
        }
    }

    #[test]
    fn fresh_until_the_time_left_runs_out() {
        assert_eq!(entry(1, 1, 0).fresh(), Some(&b"v"[..]));
        assert_eq!(entry(1, 0, 0).fresh(), None);
        assert_eq!(entry(1, -5, 0).fresh(), None);
        let no_value = Entry {
            value: None,
            ..entry(1, 100, 0)
        };
        assert_eq!(no_value.fresh(), None);
    }

    #[test]
    fn xfetch_is_due_nearer_the_expiry_and_never_when_off() {
        // δ = 100 ms, β = 1, u = 1/e: 100 ms ahead.
        let u = (-1.0f64).exp();
        assert!(entry(1, 100, 100).due_early(1.0, u));
        assert!(!entry(1, 101, 100).due_early(1.0, u));
        // u = 1: never ahead; u → 0: always.
        assert!(!entry(1, 1, 100).due_early(1.0, 1.0));
        assert!(entry(1, 50_000, 100).due_early(1.0, 0.0));
        // Off, or not fresh: not due.
        assert!(!entry(1, 1, 100).due_early(0.0, 0.0));
        assert!(!entry(1, 1, 100).due_early(f64::NAN, 0.0));
        assert!(!entry(1, 0, 100).due_early(1.0, 0.0));
    }

    #[test]
    fn the_newest_entry_has_the_highest_fence() {
        let got = newest([entry(3, 1, 0), entry(9, -1, 0), entry(5, 1, 0)]);
        assert_eq!(got.map(|e| e.fence), Some(9));
        assert_eq!(newest(Vec::new()), None);
    }

    #[test]
    fn an_error_counts_only_when_written_after_the_wait_began() {
        let failed = Entry {
            error: Some(("db down".into(), 500)),
            ..entry(7, -1, 0)
        };
        assert_eq!(failed.failed_since(6), Some("db down"));
        assert_eq!(failed.failed_since(7), None);
        let old = Entry {
            error: Some(("db down".into(), 0)),
            ..entry(7, -1, 0)
        };
        assert_eq!(old.failed_since(1), None);
    }
}
