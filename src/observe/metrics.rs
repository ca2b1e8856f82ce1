//! Metrics through the `metrics` facade (feature `metrics`): every counter,
//! gauge and histogram the crate records, named and labelled here and
//! nowhere else. The rest of the crate calls these functions without any
//! `#[cfg]`; without the feature each one is empty and inlined away, and
//! the crate does not depend on `metrics` at all.
//!
//! With the feature, each call builds its metric's key (a static name and
//! static label values, in a small label list the `metrics` macros
//! allocate) and hands it to the installed recorder, or to the facade's
//! no-op one; nothing is formatted. Label values are `&'static str`
//! (variant names) except the node address, which is only copied on paths
//! that are rare by nature (a node error, a change of a node's health),
//! never per lock operation.
//!
//! The names, types and labels are the table of docs/operations.md ("Observability");
//! `tests/it/metrics.rs` reads each one back after real operations.

use std::time::Duration;

use crate::error::failure::NodeErrorKind;
use crate::error::lost::LossReason;
use crate::error::Error;

/// Who asked for an extend: the caller ([`LockGuard::extend`](crate::LockGuard::extend))
/// or the watchdog.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ExtendBy {
    Caller,
    Watchdog,
}

/// How an extend ended.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ExtendOutcome {
    Extended,
    /// No majority extended (or the request was refused before a round
    /// trip).
    Failed,
    /// The lease was already lost, or ran out while the extend was on its
    /// way.
    Lost,
}

/// An acquisition (waiting or a single try) produced a guard.
#[inline]
pub(crate) fn acquired(elapsed: Duration, attempts: u32) {
    #[cfg(feature = "metrics")]
    imp::acquire("acquired", elapsed, attempts);
    #[cfg(not(feature = "metrics"))]
    let _ = (elapsed, attempts);
}

/// An acquisition ended without a guard, with `error` (a try that found
/// the lock held passes the contended failure it got).
#[inline]
pub(crate) fn acquire_failed(elapsed: Duration, attempts: u32, error: &Error) {
    #[cfg(feature = "metrics")]
    {
        imp::acquire("failed", elapsed, attempts);
        ::metrics::counter!("redfence_acquire_failures_total", "reason" => imp::error_reason(error))
            .increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (elapsed, attempts, error);
}

/// An extend ended.
#[inline]
pub(crate) fn extend(by: ExtendBy, outcome: ExtendOutcome) {
    #[cfg(feature = "metrics")]
    {
        let by = match by {
            ExtendBy::Caller => "caller",
            ExtendBy::Watchdog => "watchdog",
        };
        let outcome = match outcome {
            ExtendOutcome::Extended => "extended",
            ExtendOutcome::Failed => "failed",
            ExtendOutcome::Lost => "lost",
        };
        ::metrics::counter!("redfence_extends_total", "outcome" => outcome, "by" => by)
            .increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (by, outcome);
}

/// A lease was recorded lost (not released by its owner).
#[inline]
pub(crate) fn lease_lost(reason: LossReason) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("redfence_leases_lost_total", "reason" => imp::loss_reason(reason))
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = reason;
}

/// A request to the node at `addr` failed with `kind`. Answers about the
/// lock itself (held by another owner, not held) are not node errors, and
/// a request skipped before it was sent is no error at all.
#[inline]
pub(crate) fn node_error(addr: &str, kind: &NodeErrorKind) {
    #[cfg(feature = "metrics")]
    if let Some(kind) = imp::node_error_kind(kind) {
        ::metrics::counter!("redfence_node_errors_total", "node" => addr.to_owned(), "kind" => kind)
            .increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (addr, kind);
}

/// A release notice arrived on the subscription connection to `addr`
/// (each node publishes its own copy of one release).
#[inline]
pub(crate) fn release_notice(addr: &str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("redfence_release_notices_total", "node" => addr.to_owned()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = addr;
}

/// One node's health gauges: up (connected), stalled (skipped until a
/// probe answers) and quarantined (kept out of quorums by the restart
/// guard). Each is set when its state changes, not on every request: the
/// node remembers what it last reported (a byte per gauge, and nothing
/// without the feature).
#[derive(Debug, Default)]
pub(crate) struct NodeGauges {
    #[cfg(feature = "metrics")]
    up: imp::Flag,
    #[cfg(feature = "metrics")]
    stalled: imp::Flag,
    #[cfg(feature = "metrics")]
    quarantined: imp::Flag,
}

impl NodeGauges {
    /// The node at `addr` connected (`true`) or lost its connection or
    /// failed to connect (`false`).
    #[inline]
    pub(crate) fn up(&self, addr: &str, up: bool) {
        #[cfg(feature = "metrics")]
        self.up.set(
            up,
            || ::metrics::gauge!("redfence_node_up", "node" => addr.to_owned()),
        );
        #[cfg(not(feature = "metrics"))]
        let _ = (addr, up);
    }

    /// The node at `addr` became stalled (`true`) or answered again.
    #[inline]
    pub(crate) fn stalled(&self, addr: &str, stalled: bool) {
        #[cfg(feature = "metrics")]
        self.stalled.set(
            stalled,
            || ::metrics::gauge!("redfence_node_stalled", "node" => addr.to_owned()),
        );
        #[cfg(not(feature = "metrics"))]
        let _ = (addr, stalled);
    }

    /// The restart guard keeps the node at `addr` out of quorums (`true`:
    /// its server started less than the window ago, or its fences are being
    /// re-seeded) or lets it vote.
    #[inline]
    pub(crate) fn quarantined(&self, addr: &str, quarantined: bool) {
        #[cfg(feature = "metrics")]
        self.quarantined.set(
            quarantined,
            || ::metrics::gauge!("redfence_node_quarantined", "node" => addr.to_owned()),
        );
        #[cfg(not(feature = "metrics"))]
        let _ = (addr, quarantined);
    }
}

#[cfg(feature = "metrics")]
mod imp {
    use std::sync::atomic::{AtomicU8, Ordering};
    use std::time::Duration;

    use crate::error::failure::{FailureReason, NodeErrorKind};
    use crate::error::lost::LossReason;
    use crate::error::Error;

    pub(super) fn acquire(outcome: &'static str, elapsed: Duration, attempts: u32) {
        ::metrics::histogram!("redfence_acquire_seconds", "outcome" => outcome).record(elapsed);
        ::metrics::histogram!("redfence_acquire_attempts", "outcome" => outcome)
            .record(f64::from(attempts));
    }

    /// A gauge's last reported state: unknown (nothing reported yet), 0 or 1.
    #[derive(Debug)]
    pub(super) struct Flag(AtomicU8);

    const UNKNOWN: u8 = 2;

    impl Default for Flag {
        fn default() -> Self {
            Self(AtomicU8::new(UNKNOWN))
        }
    }

    impl Flag {
        /// Sets the gauge made by `gauge` to `on` when that differs from
        /// what was last reported. A plain load on the common path (no
        /// change); two racing changes both report, in some order, and the
        /// next change corrects a stale one.
        pub(super) fn set(&self, on: bool, gauge: impl FnOnce() -> ::metrics::Gauge) {
            let value = u8::from(on);
            if self.0.load(Ordering::Relaxed) == value {
                return;
            }
            if self.0.swap(value, Ordering::Relaxed) != value {
                gauge().set(f64::from(value));
            }
        }
    }

    /// The `reason` label of a failed acquisition: the [`FailureReason`]
    /// variant behind [`Error::NotAcquired`], otherwise the [`Error`]
    /// variant itself (a request refused before any round trip).
    pub(super) fn error_reason(error: &Error) -> &'static str {
        match error {
            Error::NotAcquired(failure) => failure_reason(failure.reason),
            Error::Config(_) => "Config",
            Error::InvalidResource(_) => "InvalidResource",
            Error::InvalidTtl { .. } => "InvalidTtl",
            Error::ExtendFailed(_) => "ExtendFailed",
            Error::LockLost(_) => "LockLost",
            Error::InvalidAutoExtend { .. } => "InvalidAutoExtend",
            Error::InvalidPermits { .. } => "InvalidPermits",
            Error::InvalidResourceSet(_) => "InvalidResourceSet",
        }
    }

    pub(super) fn failure_reason(reason: FailureReason) -> &'static str {
        match reason {
            FailureReason::Contended => "Contended",
            FailureReason::Unavailable => "Unavailable",
            FailureReason::ValidityExhausted => "ValidityExhausted",
            FailureReason::NotHeld => "NotHeld",
        }
    }

    pub(super) fn loss_reason(reason: LossReason) -> &'static str {
        match reason {
            LossReason::NotHeld => "NotHeld",
            LossReason::TakenOver => "TakenOver",
            LossReason::Unreachable => "Unreachable",
            LossReason::Expired => "Expired",
            LossReason::HoldLimit => "HoldLimit",
            LossReason::Released => "Released",
        }
    }

    /// The `kind` label of a node error; `None` for answers that are not
    /// node errors.
    pub(super) fn node_error_kind(kind: &NodeErrorKind) -> Option<&'static str> {
        Some(match kind {
            NodeErrorKind::HeldByOther { .. } | NodeErrorKind::NotHeld | NodeErrorKind::Skipped => {
                return None
            }
            NodeErrorKind::Timeout(_) => "Timeout",
            NodeErrorKind::Connect(_) => "Connect",
            NodeErrorKind::ConnectionLost(_) => "ConnectionLost",
            NodeErrorKind::Tls { .. } => "Tls",
            NodeErrorKind::Auth(_) => "Auth",
            NodeErrorKind::NoPermission { .. } => "NoPermission",
            NodeErrorKind::NotMaster { .. } => "NotMaster",
            NodeErrorKind::ClusterMode => "ClusterMode",
            NodeErrorKind::NotCluster => "NotCluster",
            NodeErrorKind::ClusterTopology { .. } => "ClusterTopology",
            NodeErrorKind::SameServer { .. } => "SameServer",
            NodeErrorKind::Backoff { .. } => "Backoff",
            NodeErrorKind::Stalled { .. } => "Stalled",
            NodeErrorKind::Restarted { .. } => "Restarted",
            NodeErrorKind::Reseeding => "Reseeding",
            NodeErrorKind::NoSentinel { .. } => "NoSentinel",
            NodeErrorKind::UnknownMaster { .. } => "UnknownMaster",
            NodeErrorKind::Demoted { .. } => "Demoted",
            NodeErrorKind::Redis(_) => "Redis",
        })
    }

    #[cfg(test)]
    mod tests {
        use std::sync::Arc;
        use std::time::Instant;

        use super::*;
        use crate::error::failure::{Phase, QuorumFailure};
        use crate::error::lost::LostLock;

        /// The variant name as `Debug` prints it: the label must be it.
        fn variant(debug: String) -> String {
            debug
                .split(|c: char| !c.is_alphanumeric())
                .next()
                .unwrap_or_default()
                .to_owned()
        }

        #[test]
        fn labels_are_the_variant_names() {
            use FailureReason::*;
            for reason in [Contended, Unavailable, ValidityExhausted, NotHeld] {
                assert_eq!(failure_reason(reason), variant(format!("{reason:?}")));
            }
            use LossReason as L;
            for reason in [
                L::NotHeld,
                L::TakenOver,
                L::Unreachable,
                L::Expired,
                L::HoldLimit,
                L::Released,
            ] {
                assert_eq!(loss_reason(reason), variant(format!("{reason:?}")));
            }
            let redis = || Arc::new(redis::RedisError::from(std::io::Error::other("x")));
            let ms = Duration::from_millis(1);
            for kind in [
                NodeErrorKind::Timeout(ms),
                NodeErrorKind::Connect(redis()),
                NodeErrorKind::ConnectionLost(redis()),
                NodeErrorKind::Tls {
                    reason: "expired".into(),
                },
                NodeErrorKind::Auth(redis()),
                NodeErrorKind::NoPermission {
                    denied: "run GET".into(),
                    source: redis(),
                },
                NodeErrorKind::NotMaster {
                    role: "slave".into(),
                },
                NodeErrorKind::ClusterMode,
                NodeErrorKind::NotCluster,
                NodeErrorKind::ClusterTopology { reason: "x".into() },
                NodeErrorKind::SameServer {
                    other: 0,
                    run_id: "r".into(),
                },
                NodeErrorKind::Backoff {
                    retry_in: ms,
                    last: Box::new(NodeErrorKind::Timeout(ms)),
                },
                NodeErrorKind::Stalled { silent_for: ms },
                NodeErrorKind::Restarted {
                    uptime: ms,
                    votes_in: ms,
                },
                NodeErrorKind::Reseeding,
                NodeErrorKind::Redis(redis()),
            ] {
                assert_eq!(
                    node_error_kind(&kind),
                    Some(variant(format!("{kind:?}")).as_str())
                );
            }
            for answer in [
                NodeErrorKind::HeldByOther { expires_in: None },
                NodeErrorKind::NotHeld,
                NodeErrorKind::Skipped,
            ] {
                assert_eq!(node_error_kind(&answer), None, "{answer:?}");
            }
            let failure = QuorumFailure {
                phase: Phase::Acquire,
                resource: "r".into(),
                reason: ValidityExhausted,
                granted: 2,
                quorum: 2,
                nodes: 3,
                attempts: 1,
                elapsed: ms,
                failures: Vec::new(),
            };
            let lost = LostLock {
                resource: "r".into(),
                token: None,
                reason: L::Expired,
                at: Instant::now(),
                validity_left: Duration::ZERO,
                failure: None,
            };
            for error in [
                Error::NotAcquired(Box::new(failure.clone())),
                Error::Config(crate::error::ConfigError::NoNodes),
                Error::InvalidResource("empty"),
                Error::InvalidTtl {
                    ttl: ms,
                    reason: "r",
                },
                Error::ExtendFailed(Box::new(failure)),
                Error::LockLost(Box::new(lost)),
                Error::InvalidAutoExtend { reason: "r" },
            ] {
                let expected = match &error {
                    Error::NotAcquired(_) => "ValidityExhausted".to_owned(),
                    other => variant(format!("{other:?}")),
                };
                assert_eq!(error_reason(&error), expected);
            }
        }

        #[test]
        fn a_gauge_is_reported_on_changes_only() {
            let flag = Flag::default();
            let mut reported = Vec::new();
            for on in [false, false, true, true, false] {
                flag.set(on, || {
                    reported.push(on);
                    ::metrics::gauge!("unused")
                });
            }
            assert_eq!(reported, [false, true, false]);
        }
    }
}

/// Without the feature a node's gauges take no space (run `cargo test
/// --lib` without features).
#[cfg(all(test, not(feature = "metrics")))]
mod off {
    #[test]
    fn node_gauges_are_zero_sized() {
        assert_eq!(std::mem::size_of::<super::NodeGauges>(), 0);
    }
}
