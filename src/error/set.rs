//! Why a set of resources given to a multi-resource lock
//! ([`Client::lock_all`](crate::Client::lock_all)) was refused before any
//! round trip.

/// A set of resources a multi-resource lock cannot take, found at the call
/// (nothing was sent). Carried by [`Error::InvalidResourceSet`](crate::Error::InvalidResourceSet).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResourceSetError {
    /// No resources were given.
    #[error("no resources given")]
    Empty,
    /// More resources than [`MAX_RESOURCES`](crate::limits::MAX_RESOURCES):
    /// each costs two keys in one script call per node.
    #[error("{count} resources given, more than the maximum of {max}")]
    TooMany {
        /// How many were given.
        count: usize,
        /// The most allowed.
        max: usize,
    },
    /// A resource appears twice: a lock cannot be held twice by one owner,
    /// and a silently merged set would hand out fewer tokens than asked.
    #[error("resource {resource:?} given twice (positions {first} and {second})")]
    Duplicate {
        /// The resource named twice.
        resource: String,
        /// Its first position in the set.
        first: usize,
        /// Its second position.
        second: usize,
    },
    /// A node is a Redis Cluster and the resources' keys fall in different
    /// hash slots: one script cannot touch them atomically (Redis would
    /// answer `CROSSSLOT`), so the call is refused instead.
    #[error(
        "resources {first:?} and {other:?} map to different hash slots of a redis cluster node; \
         one script per node cannot lock both (lock them one by one, or use plain nodes)"
    )]
    CrossSlot {
        /// The first resource of the set.
        first: String,
        /// A resource whose keys are in another slot than the first's.
        other: String,
    },
}
