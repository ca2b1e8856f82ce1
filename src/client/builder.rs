//! How a client is made: [`Builder`], its defaults and validation, and the
//! constructors `Client::new` and `Client::builder`. What a client does is
//! in `client`; the validated settings are `config::Config`.

use std::time::Duration;

use crate::client::Client;
use crate::error::ConfigError;
use crate::logic::limits::{DEFAULT_PREFIX, MAX_NODES, MAX_PREFIX_LEN, MAX_TTL};
use crate::logic::resource::{validate_prefix, validate_tagged_prefix, Layout};
use crate::logic::validity::DriftFactor;
use crate::node::restart::RestartGuard;
use crate::node::tls::Tls;
use crate::node::NodeTimeouts;
use crate::protocol::shared::Shared;
use crate::settings::autoextend::AutoExtend;
use crate::settings::config::{self, Config, NodeSpec};
use crate::settings::retry::Retry;
use crate::waiting::notify::DEFAULT_LOCAL_HANDOFFS;

/// Builds a [`Client`]. Every setter documents its default; `build`
/// validates everything and connects to nothing (nodes are connected on first
/// use, so a client can be built while some nodes are down).
#[derive(Debug, Clone)]
#[must_use]
pub struct Builder {
    urls: Vec<NodeSpec>,
    node_timeout: Duration,
    connect_timeout: Duration,
    reconnect_backoff_max: Duration,
    drift_factor: f64,
    min_validity: Duration,
    key_prefix: String,
    retry: Retry,
    fencing: bool,
    auto_extend: Option<AutoExtend>,
    wake_on_release: bool,
    max_local_handoffs: u32,
    fair: bool,
    handover: bool,
    restart_guard: RestartGuard,
    tls: Option<Tls>,
}

impl Builder {
    pub(crate) fn new<I, S>(urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<NodeSpec>,
    {
        Self {
            urls: urls.into_iter().map(Into::into).collect(),
            node_timeout: Duration::from_millis(100),
            connect_timeout: Duration::from_secs(1),
            reconnect_backoff_max: Duration::from_secs(1),
            drift_factor: 0.01,
            min_validity: Duration::ZERO,
            key_prefix: DEFAULT_PREFIX.to_owned(),
            retry: Retry::new(),
            fencing: true,
            auto_extend: None,
            wake_on_release: true,
            max_local_handoffs: DEFAULT_LOCAL_HANDOFFS,
            fair: true,
            handover: true,
            restart_guard: RestartGuard::new(),
            tls: None,
        }
    }

    /// How long one node may take to answer one command before it counts as
    /// a failed vote. Should be far below the TTLs you use; a node that is
    /// dead, paused or black-holed costs at most this, and when a majority
    /// answers sooner it costs the caller nothing. Within an attempt it is
    /// further capped by the TTL, since a grant arriving after the lock's
    /// validity ended is useless. Defaults to 100 ms.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// Bound on connecting to a node (TCP, AUTH, identity checks). A connect
    /// runs on behalf of all callers; each caller still waits at most its
    /// node timeout for it. Defaults to 1 second.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Longest pause between reconnect attempts to a node that is down
    /// (pauses start at 25 ms and double). While paused, commands to that
    /// node fail at once instead of each paying for a failed connect.
    /// Defaults to 1 second.
    pub fn reconnect_backoff_max(mut self, max: Duration) -> Self {
        self.reconnect_backoff_max = max;
        self
    }

    /// Clock drift allowance as a fraction of the TTL, in `[0, 1)`: validity
    /// = TTL − elapsed − (TTL × factor + 2 ms). Defaults to 0.01.
    pub fn drift_factor(mut self, factor: f64) -> Self {
        self.drift_factor = factor;
        self
    }

    /// A lock whose validity at grant time is below this is not granted
    /// (it is released and the attempt counts as failed). Defaults to zero:
    /// any positive validity is accepted.
    pub fn min_validity(mut self, min: Duration) -> Self {
        self.min_validity = min;
        self
    }

    /// Prefix of every key this client writes. Clients that should exclude
    /// each other must use the same prefix. It must end with `:` and have
    /// no `:`-separated segment `lock` or `fence`, so that no two prefixes
    /// can name each other's keys (`a:lock:` would reach the keys of `a:`);
    /// `build` refuses it with [`ConfigError::Prefix`]. Defaults to
    /// `"redfence:"`.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// The retry policy of [`Client::acquire`] and of lock requests that do
    /// not set their own. Defaults to [`Retry::new()`].
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// Whether acquisitions hand out fencing tokens
    /// ([`LockGuard::token`](crate::LockGuard::token)). With fencing the
    /// acquire is a Lua script running `SET NX PX` and an `INCR` of the
    /// fence of the resource's bucket, in the same single round trip (a few
    /// microseconds of server CPU more than a plain `SET NX`; rarely a
    /// second round, see DESIGN.md). A node keeps at most
    /// [`FENCE_BUCKETS`](crate::limits::FENCE_BUCKETS) fence keys, however
    /// many resources are locked. Without it the acquire is a plain `SET NX PX` and
    /// `token()` is `None`. Clients that lock the same resources should
    /// agree on this setting: a client without fencing does not move the
    /// fence, so its acquisitions are invisible to the token order.
    /// Defaults to `true`.
    pub fn fencing(mut self, enabled: bool) -> Self {
        self.fencing = enabled;
        self
    }

    /// Extend every lock automatically while its guard lives, unless the
    /// request says otherwise ([`LockRequest::auto_extend`],
    /// [`LockRequest::manual_extend`]). Defaults to off: a lock lasts its
    /// TTL unless extended.
    ///
    /// [`LockRequest::auto_extend`]: crate::LockRequest::auto_extend
    /// [`LockRequest::manual_extend`]: crate::LockRequest::manual_extend
    pub fn auto_extend(mut self, auto: AutoExtend) -> Self {
        self.auto_extend = Some(auto);
        self
    }

    /// Whether a waiting acquire sleeps until the holder's release is
    /// announced (a `PUBLISH` from the release script, heard on one shared
    /// subscription connection per node) instead of polling. The wait still
    /// ends at the holder's remaining TTL, or after the retry policy's
    /// jittered delay as a fallback, and never after the deadline. Within
    /// one client, only the longest-waiting request per resource retries on
    /// a release; the others queue behind it. Defaults to `true`; `false`
    /// polls under the retry policy alone.
    pub fn wake_on_release(mut self, enabled: bool) -> Self {
        self.wake_on_release = enabled;
        self
    }

    /// When waiting by notification: how many times in a row this client
    /// hands a lock it releases straight to its own next waiter (woken at
    /// once, without the notice's trip through Redis) while other clients
    /// wait for the same lock. Then its next waiter hears the release
    /// with theirs, and whoever lands first gets the turn. Defaults to 16:
    /// a client whose tasks loop on a lock cannot keep it from other
    /// processes, at a cost of one slower handoff in 17 while they wait.
    /// `u32::MAX` never yields (most throughput; other clients may wait
    /// until their deadlines); `0` lets every release be contended.
    pub fn max_local_handoffs(mut self, handoffs: u32) -> Self {
        self.max_local_handoffs = handoffs;
        self
    }

    /// Whether waiters on a held lock take turns through the fair queue: a
    /// list of tickets on the resource's home node (one of the N, chosen by
    /// the resource's fence bucket), whose head the holder's release names,
    /// so that only that waiter attempts and grants follow arrival order
    /// across processes. The queue orders who tries; the quorum still
    /// decides who holds, so a lost or emptied queue costs order, never
    /// safety (README, "Hot locks"). Only with
    /// [`wake_on_release`](Self::wake_on_release). Defaults to `true`;
    /// `false` gives the earlier, unordered competition between clients
    /// (FIFO within a client). Semaphore waiters follow the same setting
    /// through the semaphore's line
    /// ([`SemaphoreRequest::fair`](crate::SemaphoreRequest::fair)).
    pub fn fair(mut self, enabled: bool) -> Self {
        self.fair = enabled;
        self
    }

    /// Whether a release of a contended lock (this client's waiters wait
    /// for it, or its last release found others in the fair queue) hands
    /// the lock over to the next fair waiter: the release asks the home
    /// node first, and when the home named and pre-granted that waiter it
    /// leaves its keys on the other nodes for the waiter's acquire to
    /// replace, one script per node for the handoff instead of two
    /// ([`Released::handed_over`](crate::Released::handed_over); README,
    /// "Hot locks"). The cost: a named waiter whose process stands still
    /// keeps those keys until this holder's TTL runs out, where without
    /// the handover clients outside the queue could take the other nodes
    /// at once. Needs fencing and plain servers (no pre-grant otherwise).
    /// Defaults to `true`.
    pub fn handover(mut self, enabled: bool) -> Self {
        self.handover = enabled;
        self
    }

    /// Keeps a node whose server (re)started recently out of quorums; see
    /// [`RestartGuard`]. Defaults to [`RestartGuard::new()`]: on, for the
    /// longest TTL this client has requested.
    pub fn restart_guard(mut self, guard: RestartGuard) -> Self {
        self.restart_guard = guard;
        self
    }

    /// What the client trusts and presents on its `rediss://` nodes (feature
    /// `tls`): a private CA, a client certificate for mutual TLS. Once set,
    /// every node must be `rediss://` (a plain one is refused with
    /// [`ConfigError::TlsOnPlainNode`]); a node given as a
    /// `redis::ConnectionInfo` gets these instead of its own. Defaults to
    /// none: `rediss://` nodes are checked against the system's trust store.
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Validates the settings and builds the client. Does not connect.
    pub fn build(self) -> Result<Client, ConfigError> {
        if self.urls.is_empty() {
            return Err(ConfigError::NoNodes);
        }
        if self.urls.len() > MAX_NODES {
            return Err(ConfigError::TooManyNodes(self.urls.len()));
        }
        let drift_factor = DriftFactor::new(self.drift_factor)
            .ok_or(ConfigError::DriftFactor(self.drift_factor))?;
        for (value, name) in [
            (self.node_timeout, "node timeout"),
            (self.connect_timeout, "connect timeout"),
            (self.reconnect_backoff_max, "reconnect backoff"),
        ] {
            if value.is_zero() {
                return Err(ConfigError::ZeroDuration(name));
            }
        }
        // Every deadline is `now + setting`: a bound keeps them all
        // representable (Instant arithmetic panics on overflow).
        for (value, name) in [
            (self.node_timeout, "node timeout"),
            (self.connect_timeout, "connect timeout"),
            (self.reconnect_backoff_max, "reconnect backoff"),
            (self.min_validity, "min validity"),
        ] {
            if value > MAX_TTL {
                return Err(ConfigError::DurationTooLong {
                    name,
                    value,
                    max: MAX_TTL,
                });
            }
        }
        if self.key_prefix.len() > MAX_PREFIX_LEN {
            return Err(ConfigError::PrefixTooLong(self.key_prefix.len()));
        }
        if let Err(reason) = validate_prefix(&self.key_prefix) {
            return Err(ConfigError::Prefix {
                prefix: self.key_prefix,
                reason,
            });
        }
        let layout = if self.urls.iter().any(NodeSpec::is_cluster) {
            Layout::Tagged
        } else {
            Layout::Plain
        };
        if layout == Layout::Tagged {
            if let Err(reason) = validate_tagged_prefix(&self.key_prefix) {
                return Err(ConfigError::Prefix {
                    prefix: self.key_prefix,
                    reason,
                });
            }
        }
        let timeouts = NodeTimeouts {
            connect: self.connect_timeout,
            backoff_min: Duration::from_millis(25).min(self.reconnect_backoff_max),
            backoff_max: self.reconnect_backoff_max,
            probe: self.node_timeout,
        };
        let nodes = config::nodes(&self.urls, self.tls.as_ref(), timeouts, &self.key_prefix)?;
        let config = Config {
            node_timeout: self.node_timeout,
            drift_factor,
            min_validity: self.min_validity,
            key_prefix: self.key_prefix,
            retry: self.retry,
            fencing: self.fencing,
            auto_extend: self.auto_extend,
            wake_on_release: self.wake_on_release,
            max_local_handoffs: self.max_local_handoffs,
            fair: self.fair,
            handover: self.handover,
            restart_guard: self.restart_guard,
            layout,
        };
        Ok(Client::from_shared(Shared::new(nodes, config)))
    }
}

/// The ways to make a client; what a client does is in `client`.
impl Client {
    /// A builder with every setting at its default; see [`Builder`]. Nodes
    /// are URLs or `redis::ConnectionInfo`s ([`NodeSpec`]).
    pub fn builder<I, S>(urls: I) -> Builder
    where
        I: IntoIterator<Item = S>,
        S: Into<NodeSpec>,
    {
        Builder::new(urls)
    }

    /// A client with default settings. One URL runs single-node mode; 3 or 5
    /// run Redlock. Connects to nothing until first use.
    ///
    /// URLs are `redis://[user][:password@]host[:port][/db]`, or for a
    /// server on this host `unix:///path/to/redis.sock[?db=N&user=U&pass=P]`
    /// (also `redis+unix://`); a `redis::ConnectionInfo` works as well
    /// ([`NodeSpec`]).
    pub fn new<I, S>(urls: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: Into<NodeSpec>,
    {
        Builder::new(urls).build()
    }
}
