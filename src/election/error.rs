//! What an election's operations fail with: [`ElectionError`], which says
//! which phase failed (campaign, publish, read) and carries the lock's
//! error or the per-node detail behind it.

use std::time::Duration;

use crate::error::failure::NodeFailure;
use crate::error::lost::LostLock;
use crate::error::Error;
use crate::logic::fence::FencingToken;

/// Why a campaign, a proclaim or a read of the leader failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ElectionError {
    /// The client was built with
    /// [`fencing(false)`](crate::Builder::fencing): a term is a fencing
    /// token, and without tokens a leader's writes could not be refused
    /// once a newer leader exists. Nothing was sent.
    #[error("leader election needs fencing tokens, and this client was built with fencing(false)")]
    FencingOff,
    /// The campaign's deadline
    /// ([`Election::campaign_deadline`](crate::Election::campaign_deadline))
    /// passed while another candidate led (or the nodes failed); the source
    /// is the last round's error.
    #[error("not elected leader of {election:?} within {deadline:?} ({rounds} rounds)")]
    Deadline {
        /// The election's name.
        election: String,
        /// The deadline given.
        deadline: Duration,
        /// Acquire rounds made.
        rounds: u32,
        /// The last round's failure, if a round was made.
        #[source]
        last: Option<Box<Error>>,
    },
    /// The lock refused the request for good: an invalid election name, or
    /// a configuration problem retrying cannot fix (wrong password, a
    /// replica) on enough nodes to make a majority impossible.
    #[error("election {election:?} refused by the lock")]
    Lock {
        /// The election's name.
        election: String,
        /// The lock's error.
        #[source]
        source: Box<Error>,
    },
    /// A record with a higher term refused this leader's write: a newer
    /// leader exists, and this one must stop acting as leader. Nothing was
    /// written.
    #[error("leader of {election:?} with term {term} superseded by term {current}")]
    Superseded {
        /// The election's name.
        election: String,
        /// This leader's term.
        term: FencingToken,
        /// The newer term the record holds.
        current: FencingToken,
    },
    /// The leadership was lost (its lease ran out or was found taken) or
    /// resigned before the operation.
    #[error("leadership lost")]
    Lost(#[source] Box<LostLock>),
    /// Fewer than a majority of the nodes answered: the record was not
    /// written on a majority (`phase` "publish"), or the leader could not
    /// be read from one ("read"). A publish may have landed on the nodes
    /// that did not answer in time.
    #[error(
        "election {election:?}: {phase} answered by {answered} of the {quorum} nodes it needs"
    )]
    Unavailable {
        /// The election's name.
        election: String,
        /// `"publish"` or `"read"`.
        phase: &'static str,
        /// Nodes that answered.
        answered: usize,
        /// Nodes needed: ⌊N/2⌋ + 1.
        quorum: usize,
        /// What the others did.
        failures: Vec<NodeFailure>,
    },
}

impl ElectionError {
    /// Whether a newer leader refused this leader's write.
    pub fn is_superseded(&self) -> bool {
        matches!(self, Self::Superseded { .. })
    }

    /// Whether the leadership was lost before the operation.
    pub fn is_lost(&self) -> bool {
        matches!(self, Self::Lost(_))
    }
}
