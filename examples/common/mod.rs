//! What every example needs besides the lock itself, kept in one place so
//! the examples show only the lock.
//!
//! - `REDFENCE_NODES`: comma-separated `redis://` URLs of the lock nodes,
//!   e.g. the five masters of `docker-compose.yml`. When unset, five local
//!   `redis-server` processes are started and stopped again at exit.
//! - `REDFENCE_DATA`: URL of a Redis holding the examples' application data
//!   (stock, membership rows). When unset, one more local `redis-server` is
//!   started. It is never one of the lock nodes: in a real system the data
//!   lives in its own store, and a lock node should hold nothing but locks.
//!
//! Cargo does not build `examples/common/mod.rs` as an example of its own;
//! each example includes it with `mod common;`.

// Each example uses a different subset.
#![allow(dead_code)]

// `pub`, for an example that includes `postgres.rs` as well: both need
// this one `process` module.
#[path = "../../tests/support/process.rs"]
pub mod process;
#[path = "../../tests/support/server.rs"]
mod server;

use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::process::ExitCode;

use redis::aio::MultiplexedConnection;

use server::{Cluster, RedisServer};

/// Errors of the example code: the lock's, Redis's, and the examples' own
/// "this should not have happened" messages.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Redlock wants an odd N of independent masters; five tolerate two down.
const LOCAL_NODES: usize = 5;

/// Finds or starts the lock nodes, runs `body` with their URLs on a tokio
/// runtime, and stops whatever was started, also on an error or Ctrl-C.
/// Returns the process exit code: failure when `body` failed.
pub fn run<F, Fut>(body: F) -> ExitCode
where
    F: FnOnce(Vec<String>) -> Fut,
    Fut: Future<Output = Result<(), BoxError>>,
{
    match run_inner(body) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            // Some errors (redis-rs's) repeat their source in their own
            // message; print only what adds something.
            let mut shown = e.to_string();
            let mut source = e.source();
            while let Some(s) = source {
                let text = s.to_string();
                if !shown.contains(&text) {
                    eprintln!("  caused by: {text}");
                    shown = text;
                }
                source = s.source();
            }
            ExitCode::FAILURE
        }
    }
}

/// Whether the lock nodes were started by this example a moment ago.
static FRESH_NODES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A client builder for the lock nodes. Against nodes this example started
/// itself the restart guard is off: the servers are seconds old, and the
/// guard cannot tell a server that just started from one that just
/// restarted without its data, so it would keep them out of every quorum
/// for one TTL. Against your own nodes (`REDFENCE_NODES`) the guard stays
/// on, as in any real deployment.
pub fn builder(nodes: &[String]) -> redfence::Builder {
    let builder = redfence::Client::builder(nodes.iter().cloned());
    if FRESH_NODES.load(std::sync::atomic::Ordering::Relaxed) {
        builder.restart_guard(redfence::RestartGuard::off())
    } else {
        builder
    }
}

/// `Client::new` for the lock nodes; see [`builder`].
pub fn client(nodes: &[String]) -> Result<redfence::Client, BoxError> {
    Ok(builder(nodes).build()?)
}

fn run_inner<F, Fut>(body: F) -> Result<(), BoxError>
where
    F: FnOnce(Vec<String>) -> Fut,
    Fut: Future<Output = Result<(), BoxError>>,
{
    // Started before the runtime and declared before it, so it is dropped
    // after it: background releases still in flight end before their nodes
    // are killed.
    let nodes = LockNodes::from_env_or_start()?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        // A Ctrl-C must not skip the `Drop`s that kill local servers, so it
        // ends `body` (dropping its future) instead of the process.
        tokio::select! {
            outcome = body(nodes.urls.clone()) => outcome,
            _ = tokio::signal::ctrl_c() => Err("interrupted".into()),
        }
    })
}

/// The lock nodes: from `REDFENCE_NODES`, or local servers owned here.
struct LockNodes {
    urls: Vec<String>,
    /// Kills the local servers on drop; `None` for nodes from the env.
    _local: Option<Cluster>,
}

impl LockNodes {
    fn from_env_or_start() -> Result<Self, BoxError> {
        if let Some(urls) = env_urls("REDFENCE_NODES")? {
            println!("lock nodes (REDFENCE_NODES): {}", urls.join(", "));
            return Ok(Self { urls, _local: None });
        }
        let cluster = start_local(|| Cluster::start(LOCAL_NODES))?;
        FRESH_NODES.store(true, std::sync::atomic::Ordering::Relaxed);
        let urls = cluster.urls();
        println!(
            "lock nodes: {LOCAL_NODES} local redis-server processes, stopped at exit \
             (set REDFENCE_NODES to use your own)"
        );
        println!("  {}", urls.join(", "));
        Ok(Self {
            urls,
            _local: Some(cluster),
        })
    }
}

/// The Redis holding an example's application data, separate from the lock
/// nodes. Keys are namespaced per run, and the example deletes its own keys,
/// so runs against a shared `REDFENCE_DATA` do not see each other.
pub struct DataStore {
    url: String,
    namespace: String,
    /// Kills the local server on drop; `None` for `REDFENCE_DATA`.
    _local: Option<RedisServer>,
}

impl DataStore {
    /// Uses `REDFENCE_DATA` if set, otherwise starts a local server.
    pub async fn from_env_or_start() -> Result<Self, BoxError> {
        let namespace = format!("redfence-example:{:08x}:", rand::random::<u32>());
        if let Some(mut urls) = env_urls("REDFENCE_DATA")? {
            if urls.len() != 1 {
                return Err("REDFENCE_DATA takes exactly one URL".into());
            }
            let url = urls.remove(0);
            println!("data store (REDFENCE_DATA): {url}");
            return Ok(Self {
                url,
                namespace,
                _local: None,
            });
        }
        // Starting a server sleeps while it polls for readiness.
        let server = tokio::task::spawn_blocking(|| start_local(RedisServer::start)).await??;
        let url = server.url();
        println!(
            "data store: 1 more local redis-server at {url} (set REDFENCE_DATA to use your own)"
        );
        Ok(Self {
            url,
            namespace,
            _local: Some(server),
        })
    }

    /// A new connection, as a separate host would have. Multiplexed, so
    /// clones share it across tasks.
    pub async fn connect(&self) -> Result<MultiplexedConnection, BoxError> {
        let client = redis::Client::open(self.url.as_str())?;
        Ok(client.get_multiplexed_async_connection().await?)
    }

    /// `name` inside this run's namespace.
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.namespace)
    }
}

/// Splits a comma-separated URL list; `None` when the variable is unset.
fn env_urls(var: &str) -> Result<Option<Vec<String>>, BoxError> {
    let Ok(raw) = std::env::var(var) else {
        return Ok(None);
    };
    let urls: Vec<String> = raw
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect();
    if urls.is_empty() {
        return Err(format!("{var} is set but lists no URLs").into());
    }
    Ok(Some(urls))
}

/// The harness panics with a precise message (printed by the panic hook)
/// when `redis-server` is missing or will not start; this turns that into
/// an error that also names the way around it.
fn start_local<T>(start: impl FnOnce() -> T) -> Result<T, BoxError> {
    panic::catch_unwind(AssertUnwindSafe(start)).map_err(|_| {
        "could not start a local redis-server (see above): install redis-server, \
         or point REDFENCE_NODES / REDFENCE_DATA at running servers \
         (docker compose up -d starts five lock nodes)"
            .into()
    })
}
