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

use std::cell::Cell;
use std::fmt;
use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Once;

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
        let cluster = start_local(Role::LockNodes, || Cluster::start(LOCAL_NODES))?;
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
        let server =
            tokio::task::spawn_blocking(|| start_local(Role::DataStore, RedisServer::start))
                .await??;
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

/// The lock nodes of `docker-compose.yml`, as `REDFENCE_NODES` lists them.
const COMPOSE_NODES: &str = "redis://127.0.0.1:7001,redis://127.0.0.1:7002,\
                             redis://127.0.0.1:7003,redis://127.0.0.1:7004,redis://127.0.0.1:7005";

/// What a local server is for, to name the way around a missing one.
#[derive(Clone, Copy)]
enum Role {
    LockNodes,
    DataStore,
}

impl Role {
    /// The way around a missing local server, as an "or ..." clause.
    fn alternative(self) -> String {
        match self {
            Role::LockNodes => format!(
                "or use Docker (docker compose up -d, then set REDFENCE_NODES={COMPOSE_NODES})"
            ),
            Role::DataStore => "or set REDFENCE_DATA=redis://HOST:PORT to a Redis that is not \
                                a lock node"
                .to_owned(),
        }
    }
}

/// Starts local servers with the test harness, which reports a missing
/// `redis-server` or a failed start by panicking (a test must fail, never
/// skip). An example is not a test: this checks for the binary first, and
/// turns any panic of the harness into an error, with the panic hook silenced
/// for it so that no panic message or backtrace reaches the terminal.
fn start_local<T>(role: Role, start: impl FnOnce() -> T) -> Result<T, BoxError> {
    let bin = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".to_owned());
    let found = Command::new(&bin)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !found {
        let what = if bin == "redis-server" {
            "redis-server not found on PATH".to_owned()
        } else {
            format!("REDIS_SERVER_BIN={bin:?} does not run")
        };
        return Err(format!(
            "{what}; install it (Debian/Ubuntu: sudo apt-get install redis-server, \
             macOS: brew install redis) {}",
            role.alternative()
        )
        .into());
    }
    silence_panics_on_this_thread(true);
    let started = panic::catch_unwind(AssertUnwindSafe(start));
    silence_panics_on_this_thread(false);
    started.map_err(|payload| {
        let detail = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("no detail");
        // The harness's message can carry the server's log: its first line
        // here, the rest as the cause.
        let (first, rest) = detail.split_once('\n').unwrap_or((detail, ""));
        StartFailed {
            summary: format!(
                "could not start a local redis-server ({first}); check the installation \
                 {}",
                role.alternative()
            ),
            detail: Detail(rest.trim().to_owned()),
        }
        .into()
    })
}

/// A failed start: one line, with the rest of the harness's message (the
/// server's log, if any) as its source.
#[derive(Debug)]
struct StartFailed {
    summary: String,
    detail: Detail,
}

#[derive(Debug)]
struct Detail(String);

impl fmt::Display for StartFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.summary)
    }
}

impl std::error::Error for StartFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        (!self.detail.0.is_empty()).then_some(&self.detail as _)
    }
}

impl fmt::Display for Detail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Detail {}

thread_local! {
    static SILENT: Cell<bool> = const { Cell::new(false) };
}

/// While on, panics on this thread print nothing (they are caught and
/// reported as errors); panics elsewhere still reach the previous hook.
fn silence_panics_on_this_thread(on: bool) {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !SILENT.with(Cell::get) {
                previous(info);
            }
        }));
    });
    SILENT.with(|silent| silent.set(on));
}
