//! The connection a server's requests travel on: our own pipelined RESP2
//! connection (`wire::pipelined`) for plain TCP and unix-socket nodes,
//! redis-rs's `MultiplexedConnection` for TLS and RESP3 nodes (the
//! encryption and the push messages are redis-rs's). Both are multiplexed
//! and keep the order of requests; the rest of `node::server` sees one
//! type.

use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ErrorKind, Pipeline, ProtocolVersion, RedisError,
    RedisFuture, Value,
};
use tokio::net::{TcpStream, UnixStream};

use super::classify::classify;
use crate::error::failure::NodeErrorKind;
use crate::wire::outgoing::Outgoing;
use crate::wire::pipelined::Pipelined;

/// Commands that may wait to be written on a redis-rs connection.
const PIPELINE_BUFFER: usize = 1024;

#[derive(Clone)]
pub(crate) enum Link {
    Redis(MultiplexedConnection),
    Pipelined(Pipelined),
}

impl Link {
    /// `cmd.query_async(self)`, without the boxed future of
    /// `ConnectionLike` on our own connection.
    pub(crate) async fn query<R: Outgoing + ?Sized>(
        &mut self,
        req: &R,
    ) -> redis::RedisResult<Value> {
        match self {
            Link::Redis(c) => req.cmd().query_async(c).await,
            Link::Pipelined(c) => c.request(req).await,
        }
    }
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Link::Redis(c) => c.req_packed_command(cmd),
            Link::Pipelined(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Link::Redis(c) => c.req_packed_commands(pipeline, offset, count),
            Link::Pipelined(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::Redis(c) => c.get_db(),
            Link::Pipelined(c) => c.get_db(),
        }
    }
}

/// Connects to the server of `client`'s URL and authenticates (`AUTH`
/// with the URL's user and password, `SELECT` of its database), within
/// `timeout`; nothing else is sent.
///
/// `gather`: the writer of our own connection waits one turn of the
/// scheduler before each write (`Pipelined::start`).
pub(super) async fn open(
    client: &redis::Client,
    timeout: Duration,
    gather: bool,
) -> Result<Link, NodeErrorKind> {
    let info = client.get_connection_info();
    let settings = info.redis_settings();
    let plain = settings.protocol() == ProtocolVersion::RESP2;
    let link = match info.addr() {
        ConnectionAddr::Tcp(host, port) if plain => {
            let socket = connect(TcpStream::connect((host.as_str(), *port)), timeout).await?;
            // As redis-rs does (Nagle on by default): under load, the
            // kernel gathers small writes.
            socket
                .set_nodelay(info.tcp_settings().nodelay())
                .map_err(io_failed)?;
            let (read, write) = socket.into_split();
            Link::Pipelined(Pipelined::start(read, write, settings.db(), gather))
        }
        ConnectionAddr::Unix(path) if plain => {
            let socket = connect(UnixStream::connect(path), timeout).await?;
            let (read, write) = socket.into_split();
            Link::Pipelined(Pipelined::start(read, write, settings.db(), gather))
        }
        _ => {
            // Our own deadline bounds every call, so the driver's response
            // timeout is off: it would only race ours.
            //
            // The pipeline buffer is the queue between callers and the
            // connection's writer task. Its default (50) makes callers wait
            // for a slot when many tasks share the connection, and a command
            // whose deadline fires while waiting is never sent: a release
            // lost that way leaves its key for the whole TTL. 1024 slots
            // keep enqueueing immediate under any load this client can
            // generate.
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(None)
                .set_pipeline_buffer_size(PIPELINE_BUFFER);
            return client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .map(Link::Redis)
                .map_err(|e| classify(e, "HELLO/AUTH"));
        }
    };
    let mut conn = link.clone();
    if let Some(password) = settings.password() {
        let mut auth = redis::cmd("AUTH");
        if let Some(user) = settings.username() {
            auth.arg(user);
        }
        auth.arg(password);
        // As redis-rs reports it: any refusal is an authentication failure.
        auth.query_async::<Value>(&mut conn).await.map_err(|e| {
            if e.is_io_error() {
                return classify(e, "AUTH");
            }
            let refused = RedisError::from((
                ErrorKind::AuthenticationFailed,
                "Password authentication failed",
                e.to_string(),
            ));
            classify(refused, "AUTH")
        })?;
    }
    if settings.db() != 0 {
        redis::cmd("SELECT")
            .arg(settings.db())
            .query_async::<Value>(&mut conn)
            .await
            .map_err(|e| classify(e, "SELECT"))?;
    }
    Ok(link)
}

async fn connect<S>(
    connecting: impl std::future::Future<Output = std::io::Result<S>>,
    timeout: Duration,
) -> Result<S, NodeErrorKind> {
    match tokio::time::timeout(timeout, connecting).await {
        Ok(socket) => socket.map_err(io_failed),
        Err(_) => Err(NodeErrorKind::Timeout(timeout)),
    }
}

fn io_failed(e: std::io::Error) -> NodeErrorKind {
    classify(RedisError::from(e), "HELLO/AUTH")
}
