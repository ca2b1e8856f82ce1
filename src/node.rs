//! One Redis master: its connection, its identity checks, and every command
//! sent to it, each bounded by a deadline.
//!
//! Each node keeps **one** multiplexed connection, shared by every task of the
//! client and reused across calls: concurrent commands are pipelined on it,
//! so there is no pool and no connection per command. The connection is our
//! own small state machine rather than redis-rs's `ConnectionManager` because
//! a (re)connect must run the identity checks (`INFO server`, `ROLE`) *before*
//! the first lock command travels over it; `ConnectionManager` reconnects
//! silently underneath its users.
//!
//! Commands on one connection are executed by Redis in the order they were
//! enqueued. The lock protocol relies on that: a release enqueued after an
//! acquire on the same node can never be overtaken by it, even when the node
//! is paused and both sit in its socket buffer.

use std::fmt;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt, Shared};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, ServerErrorKind, Value};

use crate::error::NodeErrorKind;
use crate::fanout::Settled;
use crate::scripts::Script;

/// What a node learned about the server at connect time. Later features (the
/// restart guard) compare `run_id` and `uptime` across reconnects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) run_id: String,
    pub(crate) version: String,
    pub(crate) uptime: Duration,
}

type ConnectResult = Result<Connected, NodeErrorKind>;

/// Commands that may wait to be written on one node's connection.
const PIPELINE_BUFFER: usize = 1024;

#[derive(Clone)]
struct Connected {
    conn: MultiplexedConnection,
    /// Distinguishes this connection from its successors, so a failure seen
    /// on an old connection cannot tear down a newer one.
    generation: u64,
    #[allow(dead_code)] // read by the restart guard (roadmap)
    identity: Arc<Identity>,
}

enum State {
    /// Never connected, or the last connection was lost: connect on next use.
    Idle,
    /// A connect is in flight; every caller awaits the same one.
    Connecting(Shared<BoxFuture<'static, ConnectResult>>),
    Ready(Connected),
    /// The last connect failed; calls fail fast until `retry_at`.
    Down {
        retry_at: Instant,
        error: NodeErrorKind,
    },
}

/// Node state shared by the nodes of one client: the `run_id` each node
/// reported, to catch two URLs that reach the same server.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    run_ids: Mutex<Vec<Option<String>>>,
}

impl Registry {
    pub(crate) fn new(nodes: usize) -> Arc<Self> {
        Arc::new(Self {
            run_ids: Mutex::new(vec![None; nodes]),
        })
    }

    /// Records `run_id` for node `index`, unless another node already
    /// claimed it. The first node to connect keeps the identity, so the
    /// outcome does not flap between the two URLs.
    fn claim(&self, index: usize, run_id: &str) -> Result<(), usize> {
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

/// Timing settings a node needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeTimeouts {
    /// Bound on TCP connect + AUTH + identity checks.
    pub(crate) connect: Duration,
    /// First pause after a failed connect; doubles up to `backoff_max`.
    pub(crate) backoff_min: Duration,
    pub(crate) backoff_max: Duration,
}

pub(crate) struct Node {
    index: usize,
    addr: String,
    client: redis::Client,
    timeouts: NodeTimeouts,
    registry: Arc<Registry>,
    me: Weak<Node>,
    inner: Mutex<Inner>,
}

struct Inner {
    state: State,
    next_generation: u64,
    backoff: Duration,
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("index", &self.index)
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Node {
    pub(crate) fn new(
        index: usize,
        addr: String,
        client: redis::Client,
        timeouts: NodeTimeouts,
        registry: Arc<Registry>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Node {
            index,
            addr,
            client,
            timeouts,
            registry,
            me: me.clone(),
            inner: Mutex::new(Inner {
                state: State::Idle,
                next_generation: 0,
                backoff: timeouts.backoff_min,
            }),
        })
    }

    pub(crate) fn index(&self) -> usize {
        self.index
    }

    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    fn lock_inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Nothing panics while holding this lock; recover from poison anyway
        // rather than propagate a panic into the caller.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `script` on this node, finishing by `deadline` (an `Instant`, so
    /// connect time and the `NOSCRIPT` retry come out of the same budget).
    /// If `settled` is set by the time a connection is available, nothing is
    /// sent (see `fanout`: a straggler must not overtake a later release).
    pub(crate) async fn run_script(
        &self,
        script: &Script,
        key: &str,
        args: &[&[u8]],
        deadline: Instant,
        settled: &Settled,
    ) -> Result<Value, NodeErrorKind> {
        let budget = deadline.saturating_duration_since(Instant::now());
        let work = async {
            let connected = self.connection().await?;
            // Each send is preceded by this check with no await in between
            // (the first poll of `query_async` puts the command in the
            // connection's queue), so the check cannot go stale.
            let abandoned = || settled.is_set().then_some(NodeErrorKind::Abandoned);
            if let Some(e) = abandoned() {
                return Err(e);
            }
            let mut conn = connected.conn.clone();
            let first = script.evalsha(key, args).query_async(&mut conn).await;
            let reply = match first {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    // The node restarted (or flushed scripts) since we last
                    // used it. EVAL runs and re-caches in one round trip.
                    if let Some(e) = abandoned() {
                        return Err(e);
                    }
                    script.eval(key, args).query_async(&mut conn).await
                }
                other => other,
            };
            reply.map_err(|e| self.command_failed(connected.generation, e))
        };
        match tokio::time::timeout_at(deadline.into(), work).await {
            Ok(result) => result,
            Err(_) => Err(NodeErrorKind::Timeout(budget)),
        }
    }

    /// The current connection, connecting first if there is none.
    async fn connection(&self) -> Result<Connected, NodeErrorKind> {
        let pending = {
            let mut inner = self.lock_inner();
            match &inner.state {
                State::Ready(c) => return Ok(c.clone()),
                State::Connecting(fut) => fut.clone(),
                State::Down { retry_at, error } => {
                    let now = Instant::now();
                    if now < *retry_at {
                        return Err(NodeErrorKind::Backoff {
                            retry_in: *retry_at - now,
                            last: Box::new(error.clone()),
                        });
                    }
                    self.start_connect(&mut inner)
                }
                State::Idle => self.start_connect(&mut inner),
            }
        };
        pending.await
    }

    fn start_connect(&self, inner: &mut Inner) -> Shared<BoxFuture<'static, ConnectResult>> {
        let generation = inner.next_generation;
        inner.next_generation += 1;
        let client = self.client.clone();
        let timeout = self.timeouts.connect;
        // The future holds a Weak: the node owns the future (in its state), so
        // a strong reference here would be a cycle that leaks both.
        let me = self.me.clone();
        let fut = async move {
            let result = match tokio::time::timeout(timeout, handshake(&client, timeout)).await {
                Ok(r) => r,
                Err(_) => Err(NodeErrorKind::Timeout(timeout)),
            };
            match me.upgrade() {
                Some(node) => node.finish_connect(generation, result),
                None => result.map(|(conn, identity)| Connected {
                    conn,
                    generation,
                    identity: Arc::new(identity),
                }),
            }
        }
        .boxed()
        .shared();
        // Drive the connect on its own task so it progresses even when every
        // caller gave up on its (shorter) per-call deadline; it ends by itself
        // within the connect timeout. Outside a runtime the callers drive it.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(fut.clone());
        }
        inner.state = State::Connecting(fut.clone());
        fut
    }

    fn finish_connect(
        &self,
        generation: u64,
        result: Result<(MultiplexedConnection, Identity), NodeErrorKind>,
    ) -> ConnectResult {
        let result = result.and_then(|(conn, identity)| {
            self.registry
                .claim(self.index, &identity.run_id)
                .map_err(|other| NodeErrorKind::SameServer {
                    other,
                    run_id: identity.run_id.clone(),
                })?;
            Ok(Connected {
                conn,
                generation,
                identity: Arc::new(identity),
            })
        });
        let mut inner = self.lock_inner();
        // Only the newest connect may install its result.
        if inner.next_generation != generation + 1 {
            return result;
        }
        match &result {
            Ok(connected) => {
                tracing::debug!(node = %self.addr, run_id = %connected.identity.run_id, "connected");
                inner.backoff = self.timeouts.backoff_min;
                inner.state = State::Ready(connected.clone());
            }
            Err(error) => {
                tracing::debug!(node = %self.addr, %error, "connect failed");
                let pause = inner.backoff;
                inner.backoff = (pause * 2).min(self.timeouts.backoff_max);
                inner.state = State::Down {
                    retry_at: Instant::now() + pause,
                    error: error.clone(),
                };
            }
        }
        result
    }

    /// Classifies a command error; a broken connection is dropped so the next
    /// call reconnects (and re-checks identity).
    fn command_failed(&self, generation: u64, e: RedisError) -> NodeErrorKind {
        let broken = e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error();
        if broken {
            let mut inner = self.lock_inner();
            if matches!(&inner.state, State::Ready(c) if c.generation == generation) {
                inner.state = State::Idle;
            }
            return NodeErrorKind::ConnectionLost(Arc::new(e));
        }
        classify(e)
    }
}

fn classify(e: RedisError) -> NodeErrorKind {
    let auth = matches!(
        e.kind(),
        ErrorKind::AuthenticationFailed | ErrorKind::Server(ServerErrorKind::NoPerm)
    ) || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"));
    if auth {
        NodeErrorKind::Auth(Arc::new(e))
    } else if e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped() {
        NodeErrorKind::Connect(Arc::new(e))
    } else {
        NodeErrorKind::Redis(Arc::new(e))
    }
}

/// TCP connect, AUTH (from the URL), then `INFO server` and `ROLE` pipelined
/// in one round trip. The node may vote only if it is a master.
async fn handshake(
    client: &redis::Client,
    timeout: Duration,
) -> Result<(MultiplexedConnection, Identity), NodeErrorKind> {
    // Our own deadline bounds every call, so the driver's response timeout is
    // off: it would only race ours.
    //
    // The pipeline buffer is the queue between callers and the connection's
    // writer task. Its default (50) makes callers wait for a slot when many
    // tasks share the connection, and a command whose deadline fires while
    // waiting is never sent: a release lost that way leaves its key for the
    // whole TTL. 1024 slots keep enqueueing immediate under any load this
    // client can generate.
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(None)
        .set_pipeline_buffer_size(PIPELINE_BUFFER);
    let conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(classify)?;
    // Two commands on the multiplexed connection at once: one round trip,
    // but each with its own reply, so an error (NOAUTH when the URL lacks a
    // password) keeps its code; a pipeline would fold it into a
    // pipeline error without one.
    let (mut c1, mut c2) = (conn.clone(), conn.clone());
    let mut info_cmd = redis::cmd("INFO");
    info_cmd.arg("server");
    let role_cmd = redis::cmd("ROLE");
    let (info, role) = futures::future::join(
        info_cmd.query_async::<String>(&mut c1),
        role_cmd.query_async::<Value>(&mut c2),
    )
    .await;
    let (info, role) = (info.map_err(classify)?, role.map_err(classify)?);
    let role = match role {
        Value::Array(items) => match items.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => String::from("unknown"),
        },
        _ => String::from("unknown"),
    };
    if role != "master" {
        return Err(NodeErrorKind::NotMaster { role });
    }
    let identity = parse_info(&info);
    Ok((conn, identity))
}

/// Picks `run_id`, `redis_version` and `uptime_in_seconds` out of `INFO server`.
fn parse_info(info: &str) -> Identity {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_owned())
    };
    Identity {
        run_id: field("run_id").unwrap_or_default(),
        version: field("redis_version").unwrap_or_default(),
        uptime: Duration::from_secs(
            field("uptime_in_seconds")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_parsing() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n";
        let id = parse_info(info);
        assert_eq!(id.run_id, "abc123");
        assert_eq!(id.version, "7.0.15");
        assert_eq!(id.uptime, Duration::from_secs(42));
        assert_eq!(parse_info("").run_id, "");
    }

    #[test]
    fn registry_first_claim_wins() {
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
