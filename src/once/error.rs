//! What a single-flight read fails with: [`OnceError`], which says which
//! phase failed (waiting, computing, writing, reading) and carries the
//! computation's own error, the lock's error, or the per-node detail.

use std::time::Duration;

use crate::error::failure::NodeFailure;
use crate::error::Error;
use crate::logic::fence::FencingToken;
use crate::store::StoreError;

/// Why [`SingleFlight::get_or_compute`](crate::SingleFlight::get_or_compute)
/// returned no value. `E` is the computation's error type.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OnceError<E>
where
    E: std::error::Error + 'static,
{
    /// The client was built with
    /// [`fencing(false)`](crate::Builder::fencing): without tokens a
    /// computer whose lease ran out could overwrite a newer value. Nothing
    /// was sent.
    #[error("single-flight needs fencing tokens, and this client was built with fencing(false)")]
    FencingOff,
    /// The caller's deadline
    /// ([`SingleFlight::wait`](crate::SingleFlight::wait)) passed while
    /// another caller computed, and no fresh value appeared.
    #[error("no value for {key:?} within {wait:?}")]
    Deadline {
        /// The single-flight key.
        key: String,
        /// The deadline given.
        wait: Duration,
    },
    /// This caller computed, and the computation failed. The error marker
    /// was written for the callers waiting on it.
    #[error("computation of {key:?} failed")]
    Compute {
        /// The single-flight key.
        key: String,
        /// The computation's error.
        #[source]
        source: E,
    },
    /// This caller waited for another caller's computation, which failed
    /// with this message (its error, as text).
    #[error("computation of {key:?} by another caller failed: {message}")]
    Failed {
        /// The single-flight key.
        key: String,
        /// The computer's error, as its `Display` wrote it.
        message: String,
    },
    /// The lock refused the request: an invalid key, or a configuration
    /// problem retrying cannot fix (wrong password, a replica), or the
    /// nodes failed.
    #[error("single-flight lock on {key:?} failed")]
    Lock {
        /// The single-flight key.
        key: String,
        /// The lock's error.
        #[source]
        source: Box<Error>,
    },
    /// The entry holds a value written with a higher token: this caller's
    /// lease ran out during the computation and a later computer wrote.
    /// Nothing was written; the newer value stands.
    #[error("stale computation of {key:?}: token {presented} refused, the entry holds {current}")]
    Stale {
        /// The single-flight key.
        key: String,
        /// This computer's token.
        presented: FencingToken,
        /// The newer token the entry holds.
        current: FencingToken,
    },
    /// Fewer than a majority of the nodes answered the entry's read
    /// (`phase` "read") or stored the computed value ("write"). A write
    /// may have landed on the nodes that did not answer in time.
    #[error(
        "single-flight {key:?}: {phase} answered by {answered} of the {quorum} nodes it needs"
    )]
    Unavailable {
        /// The single-flight key.
        key: String,
        /// `"read"` or `"write"`.
        phase: &'static str,
        /// Nodes that answered.
        answered: usize,
        /// Nodes needed: ⌊N/2⌋ + 1.
        quorum: usize,
        /// What the others did.
        failures: Vec<NodeFailure>,
    },
    /// The user's store
    /// ([`get_or_compute_in`](crate::SingleFlight::get_or_compute_in))
    /// failed to read (`phase` "read") or to write ("write") the value.
    #[error("single-flight {key:?}: the store failed to {phase}")]
    Store {
        /// The single-flight key.
        key: String,
        /// `"read"` or `"write"`.
        phase: &'static str,
        /// The store's error.
        #[source]
        source: StoreError,
    },
}

impl<E: std::error::Error + 'static> OnceError<E> {
    /// Whether the caller's deadline passed.
    pub fn is_deadline(&self) -> bool {
        matches!(self, Self::Deadline { .. })
    }

    /// Whether a newer value refused this computer's write.
    pub fn is_stale(&self) -> bool {
        matches!(self, Self::Stale { .. })
    }

    /// The computation's error, when this caller computed and it failed.
    pub fn compute_error(&self) -> Option<&E> {
        match self {
            Self::Compute { source, .. } => Some(source),
            _ => None,
        }
    }
}
