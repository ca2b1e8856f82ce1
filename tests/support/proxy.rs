//! A fault-injecting TCP proxy, for tests, examples and benches.
//!
//! The kernel the tests run on has no `netem`, so network faults between the
//! lock client and one Redis node (a partition, a slow link, a reset) are
//! made by putting a [`FaultProxy`] in front of that node and pointing the
//! client at [`FaultProxy::url`] instead of the server's. [`FaultProxy::set`]
//! switches the behaviour at once, for connections already open as well as
//! new ones.
//!
//! Like `server.rs`, this file never names `crate` or `super` and uses only
//! `std` and `tokio`, so examples and benches can include it with
//! `#[path = "../tests/support/proxy.rs"] mod proxy;`.
//!
//! The proxy runs on **its own thread with its own current-thread runtime**
//! rather than as tasks on the caller's runtime, so it keeps moving whatever
//! the test does: a `current_thread` test that blocks its only thread (a
//! synchronous `RedisServer::cli`, `std::thread::sleep`, a `pause()` that
//! waits on `/proc`) would otherwise freeze the network with it, and a test
//! under `start_paused` time would see every injected delay skipped by the
//! auto-advancing clock. Its own runtime also gives `Drop` something
//! synchronous to do: stop the accept loop, drop the runtime (which drops
//! every connection task and so closes every socket), and join the thread.

// Each includer (test binary, example, bench) uses a different subset.
#![allow(dead_code)]

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdTcpListener};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};

/// Bytes read from a socket in one go; each read becomes one queued chunk.
const CHUNK_SIZE: usize = 16 * 1024;
/// Chunks queued per direction. Many chunks may be in flight under a delay
/// (throughput is not capped at one chunk per delay), but a peer that sends
/// faster than the other side reads, or sends into a stall, eventually meets
/// backpressure instead of growing the proxy's memory without bound.
const QUEUE_CHUNKS: usize = 1024;
/// A stalled or unroutable upstream must not pin a connection task forever.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A persistent accept error (out of file descriptors) must not spin a core.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(10);
/// How long `Drop` waits for the proxy thread. Shutting down takes
/// microseconds; the bound exists so that a wedged proxy costs a leaked
/// thread, never a hung test.
const JOIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Longer delays are cut to this, so that no deadline can overflow `Instant`.
const MAX_DELAY: Duration = Duration::from_secs(24 * 3600);
/// Nothing runs on the proxy runtime's blocking pool; this only bounds the
/// runtime shutdown should that ever change.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(500);

/// What the proxy does to the traffic through it.
///
/// A new value applies at once to every connection, open or new. A chunk is
/// judged twice: when it is read (discarded right away under a black hole)
/// and when it is due to be written (discarded if a black hole began while it
/// was queued, held while stalled), so a fault also catches bytes that were
/// already in flight, as a real partition would.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    /// Forward both directions unchanged.
    #[default]
    Pass,
    /// Deliver every chunk, in each direction, this long after the proxy
    /// read it, in order. A round trip therefore takes at least twice the
    /// delay. Chunks are queued with their deadlines rather than forwarded
    /// after a sleep each, so pipelined traffic is delayed, not throttled.
    /// Chunks already queued keep the deadline they were read with. Delays
    /// above a day count as a day.
    Delay(Duration),
    /// A partition in which packets vanish: connections stay open, bytes read
    /// from either side are discarded, nothing is forwarded, and new
    /// connections are accepted and black-holed too. Clients see timeouts,
    /// not errors.
    ///
    /// Switching back forwards only bytes read *after* the switch: the
    /// discarded ones are gone. Real TCP never loses bytes inside a live
    /// connection, and RESP relies on that: a client pairs replies with
    /// requests by order alone, so after a black hole an old connection is
    /// desynchronised. Requests whose bytes were dropped never get a reply,
    /// and a pipelining client (redis-rs's multiplexed connection) hands each
    /// later reply to the oldest request still waiting, which may be a
    /// different command. Tests should expect an old connection to time out
    /// or misbehave after healing and a client to recover only by
    /// reconnecting; use [`Fault::Stall`] for a partition that heals the way
    /// TCP does.
    Blackhole,
    /// A partition that heals the way TCP does: nothing is delivered while it
    /// lasts, but bytes are held (up to [`QUEUE_CHUNKS`] per direction, then
    /// the senders meet backpressure) and delivered in order once the fault
    /// changes, as retransmission would deliver them. Clients see timeouts,
    /// and an old connection stays in sync afterwards.
    Stall,
    /// Forward requests (client to server) but discard replies: commands run
    /// on the server while the client times out waiting, e.g. a lock that was
    /// set although its owner never heard so. The discarded replies
    /// desynchronise the connection as under [`Fault::Blackhole`].
    DropReplies,
    /// Discard requests but forward anything the server sends on its own.
    /// For a request/reply protocol this is a black hole that still delivers
    /// pushes and replies already on their way.
    DropRequests,
    /// A partition the client sees as errors: every open connection is
    /// aborted on both sides (an RST, so the peers see a reset, not a clean
    /// end of stream), and new connections are accepted and aborted at once.
    /// Switching back accepts and forwards normally again.
    Reset,
    /// [`Fault::Stall`] for the connections accepted before the `n`-th
    /// (counting from 0), [`Fault::Pass`] for the others: a path that went
    /// silent under the open connections while new ones get through (a
    /// middlebox that lost their state), so that a client replaces them.
    /// What they held is delivered, in order, when the fault changes.
    /// [`FaultProxy::stall_open`] sets it for the connections open now.
    StallBefore(u64),
}

/// What happens to one chunk in one direction under a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Forward(Duration),
    Hold,
    Discard,
}

/// Client to server is a request; server to client a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Request,
    Reply,
}

impl Fault {
    /// What this fault does to a chunk going `dir` on the `conn`-th
    /// connection accepted.
    fn action(self, dir: Direction, conn: u64) -> Action {
        match (self, dir) {
            (Fault::StallBefore(n), _) if conn < n => Action::Hold,
            (Fault::StallBefore(_), _) => Action::Forward(Duration::ZERO),
            (Fault::Pass, _)
            | (Fault::DropReplies, Direction::Request)
            | (Fault::DropRequests, Direction::Reply) => Action::Forward(Duration::ZERO),
            (Fault::Delay(d), _) => Action::Forward(d),
            (Fault::Stall, _) => Action::Hold,
            // Under `Reset` the connection is being torn down; nothing more
            // may slip through in the meantime.
            (Fault::Blackhole | Fault::Reset, _)
            | (Fault::DropReplies, Direction::Reply)
            | (Fault::DropRequests, Direction::Request) => Action::Discard,
        }
    }
}

/// State shared by the handle and the proxy's tasks.
#[derive(Debug)]
struct Shared {
    /// A watch channel, not a mutex: connection tasks must both read the
    /// current fault cheaply and be woken when it changes (a `Reset` aborts
    /// them, the end of a `Stall` releases held chunks). Its lock is only
    /// ever held for a copy, never across an await.
    fault: watch::Sender<Fault>,
    /// Where new connections go; [`FaultProxy::repoint`] changes it (a DNS
    /// name or VIP that now reaches another server). A std mutex, held only
    /// for a copy.
    upstream: std::sync::Mutex<SocketAddr>,
    accepted: AtomicU64,
    open: AtomicUsize,
    forwarded: AtomicU64,
}

impl Shared {
    fn fault(&self) -> Fault {
        *self.fault.borrow()
    }
}

/// A TCP proxy on `127.0.0.1` in front of one upstream address, with a fault
/// that can be switched at any time. Dropping it closes the listener and
/// every connection through it.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// Dropping it stops the accept loop; the proxy thread then drops its
    /// runtime and with it every connection.
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Starts a proxy to `upstream` on a free port of 127.0.0.1, in
    /// [`Fault::Pass`]. Everything that can fail (bind, runtime, thread)
    /// fails here rather than later on the proxy thread. The upstream is
    /// connected per client connection, so it need not be up yet.
    pub fn start(upstream: SocketAddr) -> io::Result<FaultProxy> {
        // Bound synchronously so the port is known, and taken, before
        // `start` returns: no free-port race as with redis-server.
        let std_listener = StdTcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let listener = {
            // Registers the socket with this runtime's I/O driver; the
            // runtime then moves to the proxy thread with it.
            let _enter = runtime.enter();
            TcpListener::from_std(std_listener)?
        };
        let shared = Arc::new(Shared {
            fault: watch::Sender::new(Fault::Pass),
            upstream: std::sync::Mutex::new(upstream),
            accepted: AtomicU64::new(0),
            open: AtomicUsize::new(0),
            forwarded: AtomicU64::new(0),
        });
        let (stop, stopped) = oneshot::channel();
        let task_shared = Arc::clone(&shared);
        // Linux truncates thread names to 15 bytes; "proxy-65535" fits, and
        // names the proxy in a debugger or in /proc/self/task/*/comm.
        let thread = thread::Builder::new()
            .name(format!("proxy-{}", addr.port()))
            .spawn(move || {
                runtime.block_on(accept_loop(listener, task_shared, stopped));
                // Drops every connection task, closing both of its sockets.
                runtime.shutdown_timeout(SHUTDOWN_GRACE);
            })?;
        Ok(FaultProxy {
            addr,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://127.0.0.1:PORT`, the address to give the client instead of
    /// the server's.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port())
    }

    pub fn upstream(&self) -> SocketAddr {
        *self
            .shared
            .upstream
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sends new connections to `upstream` from now on, as a DNS name or a
    /// VIP that is moved to another server does. Open connections keep
    /// their server; `set(Fault::Reset)` closes them.
    pub fn repoint(&self, upstream: SocketAddr) {
        *self
            .shared
            .upstream
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = upstream;
    }

    /// Switches the behaviour for open and new connections. Returns at once;
    /// the connection tasks react within microseconds, but asynchronously, so
    /// a test that must know a `Reset` has closed everything can wait for
    /// [`open_connections`](Self::open_connections) to reach 0.
    pub fn set(&self, fault: Fault) {
        self.shared.fault.send_replace(fault);
    }

    /// [`Fault::StallBefore`] the connections accepted so far: they go
    /// silent, later ones pass.
    pub fn stall_open(&self) {
        self.set(Fault::StallBefore(self.connections_accepted()));
    }

    pub fn fault(&self) -> Fault {
        self.shared.fault()
    }

    /// TCP connections accepted so far, including those a `Reset` aborted
    /// right after accepting.
    pub fn connections_accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// Client connections the proxy currently holds open.
    pub fn open_connections(&self) -> usize {
        self.shared.open.load(Ordering::Relaxed)
    }

    /// Bytes written to either side so far (discarded bytes do not count).
    pub fn bytes_forwarded(&self) -> u64 {
        self.shared.forwarded.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    /// Signals the proxy thread and waits for it, for at most
    /// [`JOIN_TIMEOUT`], so that connections are closed when `drop` returns.
    /// This wait is the only blocking in `Drop`, and it is bounded: if the
    /// thread does not finish in time it is leaked, never waited on further.
    fn drop(&mut self) {
        drop(self.stop.take());
        let Some(thread) = self.thread.take() else {
            return;
        };
        let deadline = Instant::now() + JOIN_TIMEOUT;
        while !thread.is_finished() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(1));
        }
        if thread.is_finished() {
            // A panic on the proxy thread must not become a panic in `Drop`
            // (a double panic aborts the whole test binary).
            let _ = thread.join();
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, mut stop: oneshot::Receiver<()>) {
    loop {
        let accepted = tokio::select! {
            // Fires when the handle is dropped (the sender goes away).
            _ = &mut stop => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((client, _)) => {
                let conn = shared.accepted.fetch_add(1, Ordering::Relaxed);
                let upstream = *shared
                    .upstream
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                tokio::spawn(serve(client, upstream, conn, Arc::clone(&shared)));
            }
            Err(_) => tokio::time::sleep(ACCEPT_ERROR_PAUSE).await,
        }
    }
}

/// Counts a connection as open for as long as its task lives, including
/// when the task is dropped by the runtime shutdown.
struct OpenGuard<'a>(&'a Shared);

impl<'a> OpenGuard<'a> {
    fn new(shared: &'a Shared) -> Self {
        shared.open.fetch_add(1, Ordering::Relaxed);
        OpenGuard(shared)
    }
}

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One client connection: connect upstream, then pump both directions until
/// both have ended, either side fails, or a `Reset` arrives.
async fn serve(mut client: TcpStream, upstream: SocketAddr, conn: u64, shared: Arc<Shared>) {
    let _open = OpenGuard::new(&shared);
    let mut faults = shared.fault.subscribe();
    // `wait_for` looks at the current value first, so a `Reset` set before
    // this connection was accepted aborts it immediately.
    let reset = async {
        let _ = faults.wait_for(|f| *f == Fault::Reset).await;
    };
    tokio::pin!(reset);

    let connect = tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, TcpStream::connect(upstream));
    let mut server = tokio::select! {
        biased;
        () = &mut reset => return abort(&client),
        connected = connect => match connected {
            Ok(Ok(server)) => server,
            // The upstream is down: the client sees an error, much as it
            // would have seen a refused connection without the proxy.
            _ => return abort(&client),
        },
    };
    // Small RESP commands must not wait for Nagle on the proxy's hop either.
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);

    let failed = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        let pumps = async {
            tokio::try_join!(
                pump(client_read, server_write, Direction::Request, conn, &shared),
                pump(server_read, client_write, Direction::Reply, conn, &shared),
            )
        };
        tokio::select! {
            biased;
            () = &mut reset => true,
            result = pumps => result.is_err(),
        }
    };
    // A clean end (both sides shut down their writes) closes normally. A
    // `Reset`, or a failure on one side, aborts both, so an error on one hop
    // shows up as an error on the other rather than as a clean end of stream.
    if failed {
        abort(&client);
        abort(&server);
    }
}

/// Makes the coming close an abortive one: the kernel sends an RST and
/// discards unsent data, so the peer sees a connection reset.
fn abort(stream: &TcpStream) {
    // `set_linger` is deprecated because a *non-zero* linger blocks the
    // thread in `close`; a zero linger never blocks. It is used instead of
    // `set_zero_linger` to keep building with every tokio 1.x the
    // dev-dependency allows.
    #[allow(deprecated)]
    let _ = stream.set_linger(Some(Duration::ZERO));
}

/// A chunk read from one side, due for delivery at `due`.
struct Chunk {
    due: Instant,
    data: Vec<u8>,
}

/// Moves one direction of one connection: a reader that stamps every chunk
/// with its delivery deadline as soon as it is read, and a writer that
/// delivers chunks in order at their deadlines. They are joined through a
/// queue so reading never waits for a delay to pass: that is what keeps a
/// delay from becoming a throughput limit. When the reader sees end of
/// stream, the writer delivers what is queued and then shuts down its write
/// side, so half-closes pass through (also under a fault: a closed
/// connection has nothing left to partition).
async fn pump(
    mut from: ReadHalf<'_>,
    mut to: WriteHalf<'_>,
    dir: Direction,
    conn: u64,
    shared: &Shared,
) -> io::Result<()> {
    let (queue, mut queued) = mpsc::channel::<Chunk>(QUEUE_CHUNKS);
    let read = async move {
        let mut buf = vec![0; CHUNK_SIZE];
        loop {
            let n = from.read(&mut buf).await?;
            if n == 0 {
                // Dropping `queue` tells the writer to finish up.
                return Ok::<(), io::Error>(());
            }
            let now = Instant::now();
            let due = match shared.fault().action(dir, conn) {
                Action::Discard => continue,
                Action::Forward(delay) => now + delay.min(MAX_DELAY),
                Action::Hold => now,
            };
            let chunk = Chunk {
                due,
                data: buf[..n].to_vec(),
            };
            if queue.send(chunk).await.is_err() {
                // The writer failed; its error is the one to report.
                return Ok(());
            }
        }
    };
    let write = async move {
        let mut faults = shared.fault.subscribe();
        while let Some(chunk) = queued.recv().await {
            tokio::time::sleep_until(chunk.due.into()).await;
            // Held while stalled; dropped if a black hole began while the
            // chunk was queued. The borrow ends before the write awaits.
            let discard = match faults
                .wait_for(|f| f.action(dir, conn) != Action::Hold)
                .await
            {
                Ok(fault) => fault.action(dir, conn) == Action::Discard,
                Err(_) => true,
            };
            if discard {
                continue;
            }
            to.write_all(&chunk.data).await?;
            let n = u64::try_from(chunk.data.len()).unwrap_or(u64::MAX);
            shared.forwarded.fetch_add(n, Ordering::Relaxed);
        }
        to.shutdown().await
    };
    tokio::try_join!(read, write).map(|_| ())
}
