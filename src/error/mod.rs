//! Typed errors. Every failure says which phase failed and, for quorum
//! failures, what each node answered.

pub(crate) mod failure;
pub(crate) mod lost;
pub(crate) mod set;

use std::fmt;
use std::time::Duration;

use crate::error::failure::{FailureReason, NodeFailure, QuorumFailure};
use crate::error::lost::LostLock;
use crate::error::set::ResourceSetError;

/// A configuration problem found by [`Builder::build`](crate::Builder::build).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The node list is empty.
    #[error("no nodes configured")]
    NoNodes,
    /// A node URL could not be parsed. The URL is shown with its password
    /// replaced by `***`.
    #[error("node {index} has an invalid url {url:?}")]
    InvalidUrl {
        /// Position of the node in the list.
        index: usize,
        /// The URL, redacted.
        url: String,
        /// What the parser said.
        #[source]
        source: redis::RedisError,
    },
    /// A node URL uses a scheme this build cannot connect to: `rediss://`
    /// without the `tls` feature, or a scheme that is not Redis's. Plain TCP
    /// (`redis://`), TLS (`rediss://`, feature `tls`) and Unix sockets
    /// (`unix://`, `redis+unix://`) are supported.
    #[error("node {index} ({url:?}) {reason}")]
    UnsupportedUrl {
        /// Position of the node in the list.
        index: usize,
        /// The URL, redacted.
        url: String,
        /// What is unsupported.
        reason: &'static str,
    },
    /// A `rediss://` URL asks for TLS without checking the server's
    /// certificate (`#insecure`, the redis crate's form). Refused: the lock
    /// connection would be open to anyone who can intercept it, and the
    /// redis crate's build here cannot make such a connection anyway (it
    /// failed at every acquire, issue 31). Give the server's CA instead:
    /// [`Builder::tls`](crate::Builder::tls) with
    /// [`Tls::root_ca_pem`](crate::Tls::root_ca_pem).
    #[error(
        "node {index} ({url:?}) asks for tls without certificate checks (#insecure): \
         trust the server's ca instead, with Builder::tls(Tls::new().root_ca_pem(..))"
    )]
    InsecureTls {
        /// Position of the node in the list.
        index: usize,
        /// The URL, redacted.
        url: String,
    },
    /// [`Builder::tls`](crate::Builder::tls) was given, and a node is not a
    /// `rediss://` one: it would connect in plain text while the settings
    /// say the deployment is encrypted.
    #[error("node {index} ({url:?}) is not a rediss:// url, but TLS settings were given")]
    TlsOnPlainNode {
        /// Position of the node in the list.
        index: usize,
        /// The URL, redacted.
        url: String,
    },
    /// The TLS settings could not be used for a node: a CA or client
    /// certificate that is not PEM, a key that does not parse.
    #[error("node {index} ({url:?}) has unusable TLS settings")]
    InvalidTls {
        /// Position of the node in the list.
        index: usize,
        /// The URL, redacted.
        url: String,
        /// What the TLS layer said (never the key).
        #[source]
        source: redis::RedisError,
    },
    /// The same server address appears twice. Redlock's votes must come from
    /// independent servers; listing one twice would let it vote twice.
    #[error("node {second} ({addr}) duplicates node {first}")]
    DuplicateNode {
        /// Address (`host:port/db`) listed twice.
        addr: String,
        /// Index of the first occurrence.
        first: usize,
        /// Index of the repeat.
        second: usize,
    },
    /// The drift factor is not in `[0, 1)`.
    #[error("drift factor {0} is outside [0, 1)")]
    DriftFactor(f64),
    /// A duration setting that must be positive is zero.
    #[error("{0} must be greater than zero")]
    ZeroDuration(&'static str),
    /// A duration setting is longer than it can sensibly be: more than
    /// [`MAX_TTL`](crate::limits::MAX_TTL) (a year). Such values would only
    /// push deadlines past what the clock can represent.
    #[error("{name} {value:?} is longer than the maximum of {max:?}")]
    DurationTooLong {
        /// The setting.
        name: &'static str,
        /// The value given.
        value: Duration,
        /// The largest accepted.
        max: Duration,
    },
    /// More than [`MAX_NODES`](crate::limits::MAX_NODES) nodes.
    #[error("{0} nodes configured, more than the maximum of 64")]
    TooManyNodes(usize),
    /// The key prefix is longer than [`MAX_PREFIX_LEN`](crate::limits::MAX_PREFIX_LEN) bytes.
    #[error("key prefix is {0} bytes, more than the maximum")]
    PrefixTooLong(usize),
    /// The key prefix could reach other keys: it is empty, or it contains a
    /// key kind (`lock:`, `fence:`), so that it names the keys of another
    /// prefix.
    #[error("key prefix {prefix:?} {reason}")]
    Prefix {
        /// The prefix given.
        prefix: String,
        /// Why it was refused.
        reason: &'static str,
    },
}

/// Every error this crate returns.
///
/// The message of each variant is short and names the resource; the detail
/// is in the [`source`](std::error::Error::source) chain: the
/// [`QuorumFailure`] (what each node answered) behind `NotAcquired` and
/// `ExtendFailed`, the [`LostLock`] behind `LockLost` (and behind it the
/// extend that failed, if one did). An error reporter that walks the chain
/// (anyhow's `{:#}`, `tracing`'s error fields) prints all of it.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The client configuration is invalid.
    Config(ConfigError),
    /// The resource name is empty or too long.
    InvalidResource(&'static str),
    /// The TTL is zero, below one millisecond, or above [`MAX_TTL`](crate::limits::MAX_TTL).
    InvalidTtl {
        /// The TTL given.
        ttl: Duration,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The lock was not acquired (contended, nodes unavailable, or validity
    /// used up), after the attempts the retry policy allowed.
    NotAcquired(Box<QuorumFailure>),
    /// An extend did not reach a majority of all N nodes in time. The lock was
    /// not released: it stays held until its previous validity runs out.
    ExtendFailed(Box<QuorumFailure>),
    /// The lock was acquired but lost while held: the watchdog could not
    /// keep it ([`LockRequest::run`](crate::LockRequest::run) with
    /// auto-extension cancels the closure's future and returns this), or an
    /// extend was asked of a lease already reported lost. Distinct from
    /// [`NotAcquired`](Self::NotAcquired): work may have started under the
    /// lock.
    LockLost(Box<LostLock>),
    /// The auto-extension settings do not fit the lock request (an interval
    /// of zero, or too long to extend before the validity ends).
    InvalidAutoExtend {
        /// Why it was refused.
        reason: &'static str,
    },
    /// A semaphore's number of permits is zero or above
    /// [`Semaphore::MAX_PERMITS`](crate::Semaphore::MAX_PERMITS).
    InvalidPermits {
        /// The number given.
        permits: u32,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The set of resources given to a multi-resource lock
    /// ([`Client::lock_all`](crate::Client::lock_all)) is empty, too large,
    /// names a resource twice, or cannot be locked atomically on a Redis
    /// Cluster node. Nothing was sent.
    InvalidResourceSet(ResourceSetError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // Transparent: the configuration error is the whole story.
            Error::Config(e) => fmt::Display::fmt(e, f),
            Error::InvalidResource(reason) => write!(f, "invalid resource name: {reason}"),
            Error::InvalidTtl { ttl, reason } => write!(f, "invalid ttl {ttl:?}: {reason}"),
            Error::NotAcquired(q) => write!(f, "lock on {:?} not acquired", q.resource),
            Error::ExtendFailed(q) => write!(f, "lock on {:?} not extended", q.resource),
            Error::LockLost(l) => write!(f, "lock on {:?} lost while held", l.resource),
            Error::InvalidAutoExtend { reason } => write!(f, "invalid auto-extension: {reason}"),
            Error::InvalidPermits { permits, reason } => {
                write!(f, "invalid number of permits {permits}: {reason}")
            }
            Error::InvalidResourceSet(e) => write!(f, "invalid set of resources: {e}"),
        }
    }
}

/// Written out rather than derived: the sources are the boxed values
/// themselves (a `QuorumFailure`, a `LostLock`), so that `downcast_ref`
/// finds them, not the `Box` around them.
impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Config(e) => e.source(),
            Error::NotAcquired(q) | Error::ExtendFailed(q) => Some(&**q),
            Error::LockLost(l) => Some(&**l),
            _ => None,
        }
    }
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Error::Config(e)
    }
}

impl Error {
    /// The quorum failure behind [`Error::NotAcquired`] or
    /// [`Error::ExtendFailed`].
    pub fn quorum_failure(&self) -> Option<&QuorumFailure> {
        match self {
            Error::NotAcquired(q) | Error::ExtendFailed(q) => Some(q),
            _ => None,
        }
    }

    /// Per-node detail of the last attempt (empty for other errors).
    pub fn node_failures(&self) -> &[NodeFailure] {
        self.quorum_failure().map_or(&[], |q| &q.failures)
    }

    /// True when the lock is held by someone else.
    pub fn is_contended(&self) -> bool {
        self.quorum_failure()
            .is_some_and(|q| q.reason == FailureReason::Contended)
    }

    /// The loss behind [`Error::LockLost`].
    pub fn lost_lock(&self) -> Option<&LostLock> {
        match self {
            Error::LockLost(lost) => Some(lost),
            _ => None,
        }
    }

    /// True when a held lock was lost ([`Error::LockLost`]).
    pub fn is_lost(&self) -> bool {
        matches!(self, Error::LockLost(_))
    }

    /// True when failing nodes (not other owners) prevented a majority.
    pub fn is_unavailable(&self) -> bool {
        self.quorum_failure()
            .is_some_and(|q| q.reason == FailureReason::Unavailable)
    }

    /// True when any node in the last attempt timed out.
    pub fn is_timeout(&self) -> bool {
        self.node_failures().iter().any(|f| f.kind.is_timeout())
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;
    use std::time::Instant;

    use super::*;
    use crate::error::failure::Phase;
    use crate::error::lost::LossReason;

    fn failure(phase: Phase) -> QuorumFailure {
        QuorumFailure {
            phase,
            resource: "orders".into(),
            reason: FailureReason::Unavailable,
            granted: 1,
            quorum: 2,
            nodes: 3,
            attempts: 1,
            elapsed: Duration::from_millis(3),
            failures: Vec::new(),
        }
    }

    /// A reporter that walks `source()` sees every layer once: the short
    /// message of the variant, then the quorum failure or the loss, then
    /// the extend that caused the loss.
    #[test]
    fn errors_chain_through_source() {
        let not_acquired = Error::NotAcquired(Box::new(failure(Phase::Acquire)));
        assert_eq!(not_acquired.to_string(), "lock on \"orders\" not acquired");
        let source = not_acquired.source().expect("the quorum failure");
        let quorum = source
            .downcast_ref::<QuorumFailure>()
            .expect("a QuorumFailure");
        assert_eq!(quorum.phase, Phase::Acquire);
        assert!(source
            .to_string()
            .starts_with("acquire of \"orders\" failed"));

        let extend = Error::ExtendFailed(Box::new(failure(Phase::Extend)));
        assert_eq!(extend.to_string(), "lock on \"orders\" not extended");
        assert!(extend.source().unwrap().is::<QuorumFailure>());

        let lost = Error::LockLost(Box::new(LostLock {
            resource: "orders".into(),
            token: None,
            reason: LossReason::Unreachable,
            at: Instant::now(),
            validity_left: Duration::ZERO,
            failure: Some(Box::new(failure(Phase::Extend))),
        }));
        assert_eq!(lost.to_string(), "lock on \"orders\" lost while held");
        let loss = lost.source().expect("the loss");
        assert!(loss.is::<LostLock>());
        let cause = loss.source().expect("the extend that failed");
        assert!(cause.to_string().starts_with("extend of \"orders\" failed"));
        assert!(cause.source().is_none());

        let config = Error::from(ConfigError::NoNodes);
        assert_eq!(config.to_string(), "no nodes configured");
    }
}
