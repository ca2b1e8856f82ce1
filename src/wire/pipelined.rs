//! The node connection of plain TCP and unix-socket nodes speaking RESP2:
//! one socket per node, multiplexed, every request pipelined on it, as
//! redis-rs's `MultiplexedConnection` does, with less work per request
//! (BENCHMARKS.md, "Out of process": the lock's cycle paid more in
//! redis-rs's per-request path, its channel hop to a driver task, its
//! packing into a fresh buffer, its combinator parser, than in the lock's
//! own logic).
//!
//! A request is packed straight into the socket's outgoing buffer and
//! queued for its reply in the same critical section, so the order of the
//! requests on the wire is the order of the queue (Redis answers in
//! order): the first poll of a request puts it on the connection, and
//! nothing sent later overtakes it. A writer task writes whatever
//! accumulated in one `write` (under load, many requests per system call);
//! a reader task parses replies (`wire::resp`) and hands each to the
//! oldest request still waiting. A request dropped before its reply (a
//! deadline, a cancelled caller) leaves its entry in the queue, so its
//! reply is read and thrown away and the replies of later requests stay in
//! step. When the socket fails or a reply does not parse, every waiting
//! request fails with a dropped connection's error and later ones fail at
//! once; the node then reconnects (`node::server`). Dropping the last
//! handle stops both tasks.
//!
//! TLS and RESP3 nodes keep redis-rs's connection (`node::server::link`).

use std::collections::VecDeque;
use std::future::poll_fn;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::outgoing::Outgoing;
use super::resp;

/// The reader's buffer to begin with.
const READ_CAPACITY: usize = 16 * 1024;
/// A buffer grown past this (a large reply, a backlog written after a
/// stall) is given back rather than kept for the connection's life.
const KEEP_CAPACITY: usize = 1 << 20;

/// A multiplexed RESP2 connection; clones share the socket.
#[derive(Clone)]
pub(crate) struct Pipelined {
    shared: Arc<Shared>,
    /// Stops the tasks when the last clone is dropped.
    _tasks: Arc<Tasks>,
    db: i64,
}

struct Shared {
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    /// Packed requests not yet handed to the socket, in order.
    out: Vec<u8>,
    /// Every request written or to be written, oldest first.
    waiting: VecDeque<Waiting>,
    /// Why the connection is over, once it is.
    broken: Option<(io::ErrorKind, String)>,
    /// The writer, asleep with nothing to write.
    writer: Option<Waker>,
}

struct Waiting {
    /// Replies to read and drop before the kept ones (a transaction's
    /// `MULTI` and `QUEUED`s).
    skip: usize,
    /// Replies to keep: `None` for a single command.
    keep: Option<usize>,
    kept: Vec<Value>,
    /// A server error among the skipped replies (a transaction's queued
    /// command refused: its code is more useful than `EXECABORT`).
    refused: Option<Value>,
    /// A transaction: it skips its `MULTI` and `QUEUED` replies.
    transaction: bool,
    reply: Option<oneshot::Sender<RedisResult<Reply>>>,
}

enum Reply {
    One(Value),
    Many(Vec<Value>),
}

struct Tasks {
    shared: Arc<Shared>,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

impl Drop for Tasks {
    fn drop(&mut self) {
        self.shared
            .lock()
            .fail(io::ErrorKind::NotConnected, "connection dropped");
        self.reader.abort();
        self.writer.abort();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // Nothing panics while holding this lock; recover anyway.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Queue {
    /// Ends the connection: every waiting request and every later one gets
    /// a dropped connection's error. The first cause is kept.
    fn fail(&mut self, kind: io::ErrorKind, why: &str) {
        if self.broken.is_none() {
            self.broken = Some((kind, why.to_owned()));
        }
        for mut waiting in self.waiting.drain(..) {
            if let Some(reply) = waiting.reply.take() {
                let _ = reply.send(Err(broken(kind, why)));
            }
        }
        self.out.clear();
        if let Some(writer) = self.writer.take() {
            writer.wake();
        }
    }

    /// Reads past the statuses at the start of `buf` that the oldest
    /// request skips (a transaction's `OK` and `QUEUED`s), without
    /// building them; how many bytes they took. Stops at anything else
    /// (an error is kept: [`Queue::deliver`]) or at a partial line.
    fn skip_statuses(&mut self, buf: &[u8]) -> usize {
        let Some(waiting) = self.waiting.front_mut() else {
            return 0;
        };
        let mut at = 0;
        while waiting.skip > 0 {
            match resp::status_len(&buf[at..]) {
                Some(len) => {
                    at += len;
                    waiting.skip -= 1;
                }
                None => break,
            }
        }
        at
    }

    /// The next reply from the server, to the oldest request waiting.
    fn deliver(&mut self, value: Value) -> Result<(), &'static str> {
        let Some(waiting) = self.waiting.front_mut() else {
            return Err("a reply that no request waits for");
        };
        if waiting.skip > 0 {
            waiting.skip -= 1;
            if waiting.refused.is_none() && matches!(value, Value::ServerError(_)) {
                waiting.refused = Some(value);
            }
            return Ok(());
        }
        // A transaction's `EXEC` answered by an error that does not end
        // the transaction could leave the connection inside `MULTI`, where
        // every later command would only be queued: the connection is
        // given up once this reply is out. Redis 7 ends it on any refusal
        // of `EXEC` (`EXECABORT`, the ACL's `NOPERM` in its text); "EXEC
        // without MULTI" had none to end.
        let stuck = waiting.transaction
            && matches!(&value, Value::ServerError(e)
                if e.code() != "EXECABORT" && !e.details().unwrap_or_default().contains("without MULTI"));
        let done = match waiting.keep {
            None => Some(Reply::One(value)),
            Some(keep) => {
                waiting.kept.push(value);
                (waiting.kept.len() >= keep).then(|| Reply::Many(std::mem::take(&mut waiting.kept)))
            }
        };
        if let Some(done) = done {
            let mut waiting = self.waiting.pop_front().expect("front exists");
            let result = match waiting.refused.take() {
                Some(refused) => refused.extract_error().map(|_| done),
                None => Ok(done),
            };
            if let Some(reply) = waiting.reply.take() {
                // The request may have been dropped: its reply is read all
                // the same, and thrown away.
                let _ = reply.send(result);
            }
        }
        if stuck {
            return Err("EXEC refused: the connection may still be inside MULTI");
        }
        Ok(())
    }
}

fn broken(kind: io::ErrorKind, why: &str) -> RedisError {
    RedisError::from(io::Error::new(kind, why.to_owned()))
}

impl Pipelined {
    /// Takes over a connected socket (after nothing was sent on it), `db`
    /// being the database it will have selected. Must run inside a tokio
    /// runtime: the two tasks are spawned on it.
    ///
    /// With `gather`, the writer, woken by a request, lets the tasks
    /// already runnable go first (it wakes itself and goes to the back of
    /// its worker's queue, once) and then writes what they queued too. A
    /// client of several nodes wants it: each of its rounds puts one
    /// request on every node's connection, and under load the writers,
    /// woken by the first task's requests, would otherwise each write one
    /// request per system call while the other tasks' requests wait for
    /// the next (issue 32; BENCHMARKS.md "Gathered writes": at 5 nodes
    /// c=32, fewer system calls on both sides). With one node it is off:
    /// there, writing at once keeps the client and Redis working side by
    /// side on two cores, and gathering measured slower.
    pub(crate) fn start<R, W>(read: R, write: W, db: i64, gather: bool) -> Self
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
        });
        let reader = tokio::spawn(read_replies(Arc::clone(&shared), read));
        let writer = tokio::spawn(write_requests(Arc::clone(&shared), write, gather));
        Pipelined {
            _tasks: Arc::new(Tasks {
                shared: Arc::clone(&shared),
                reader,
                writer,
            }),
            shared,
            db,
        }
    }

    /// Puts a request on the connection: its bytes, written by `pack`, and
    /// its place in the queue, in one critical section.
    /// Sends `cmd` and waits for its reply: the trait's
    /// `req_packed_command` without the boxed future (one allocation per
    /// request less, issue 32), for `Link::query`.
    pub(crate) async fn request<R: Outgoing + ?Sized>(&self, req: &R) -> RedisResult<Value> {
        let skip = req.skip();
        let rx = self.enqueue(skip, None, |out| req.write_packed(out))?;
        match answer(rx).await? {
            // A transaction's `EXEC`: an error inside it is its reader's
            // to read (redis-rs's `extract_error` would rebuild the array).
            Reply::One(value @ Value::Array(_)) if skip > 0 => Ok(value),
            Reply::One(value) => value.extract_error(),
            // Never: a single command is queued for one reply.
            Reply::Many(_) => Err(broken(io::ErrorKind::InvalidData, "one reply expected")),
        }
    }

    fn enqueue(
        &self,
        skip: usize,
        keep: Option<usize>,
        pack: impl FnOnce(&mut Vec<u8>),
    ) -> Result<oneshot::Receiver<RedisResult<Reply>>, RedisError> {
        let (tx, rx) = oneshot::channel();
        let writer = {
            let mut queue = self.shared.lock();
            if let Some((kind, why)) = &queue.broken {
                return Err(broken(*kind, why));
            }
            pack(&mut queue.out);
            queue.waiting.push_back(Waiting {
                skip,
                keep,
                kept: Vec::new(),
                refused: None,
                transaction: skip > 0,
                reply: Some(tx),
            });
            queue.writer.take()
        };
        if let Some(writer) = writer {
            writer.wake();
        }
        Ok(rx)
    }
}

async fn answer(rx: oneshot::Receiver<RedisResult<Reply>>) -> RedisResult<Reply> {
    rx.await.unwrap_or_else(|_| {
        Err(broken(
            io::ErrorKind::ConnectionAborted,
            "connection closed before the reply",
        ))
    })
}

impl redis::aio::ConnectionLike for Pipelined {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.request(cmd))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let packed = pipeline.get_packed_pipeline();
            let rx = self.enqueue(offset, Some(count), |out| out.extend_from_slice(&packed))?;
            match answer(rx).await? {
                Reply::Many(values) => Ok(values),
                Reply::One(value) => Ok(vec![value]),
            }
        })
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}

/// Writes whatever requests accumulated, in one piece, until the
/// connection ends.
async fn write_requests<W: AsyncWrite + Unpin>(shared: Arc<Shared>, mut socket: W, gather: bool) {
    let mut batch = Vec::new();
    loop {
        if gather {
            // Until there is something to write; then one turn at the back
            // of the worker's queue, so that the tasks woken with the one
            // that woke us queue theirs (a self-wake goes to the back of
            // the queue without polling the I/O driver, which
            // `tokio::task::yield_now` does: measured slower).
            poll_fn(|cx| {
                let mut queue = shared.lock();
                if queue.broken.is_some() || !queue.out.is_empty() {
                    return Poll::Ready(());
                }
                park(&mut queue, cx.waker());
                Poll::Pending
            })
            .await;
            let mut turned = false;
            poll_fn(|cx| {
                if turned {
                    return Poll::Ready(());
                }
                turned = true;
                cx.waker().wake_by_ref();
                Poll::Pending
            })
            .await;
        }
        let more = poll_fn(|cx| {
            let mut queue = shared.lock();
            if queue.broken.is_some() {
                return Poll::Ready(false);
            }
            if queue.out.is_empty() {
                park(&mut queue, cx.waker());
                return Poll::Pending;
            }
            std::mem::swap(&mut batch, &mut queue.out);
            Poll::Ready(true)
        })
        .await;
        if !more {
            return;
        }
        if let Err(e) = socket.write_all(&batch).await {
            shared.lock().fail(e.kind(), &e.to_string());
            return;
        }
        batch.clear();
        if batch.capacity() > KEEP_CAPACITY {
            // After a stall's backlog: not kept for the connection's life.
            batch = Vec::new();
        }
    }
}

/// The writer sleeps until a request wakes it.
fn park(queue: &mut Queue, waker: &Waker) {
    match &queue.writer {
        Some(w) if w.will_wake(waker) => {}
        _ => queue.writer = Some(waker.clone()),
    }
}

/// Reads replies and hands them out in order, until the connection ends.
async fn read_replies<R: AsyncRead + Unpin>(shared: Arc<Shared>, mut socket: R) {
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CAPACITY);
    let mut parsed = 0;
    loop {
        if parsed == buf.len() {
            buf.clear();
            parsed = 0;
            if buf.capacity() > KEEP_CAPACITY {
                buf = Vec::with_capacity(READ_CAPACITY);
            }
        } else if parsed > 0 && buf.capacity() - buf.len() < 4096 {
            buf.drain(..parsed);
            parsed = 0;
        }
        buf.reserve(4096);
        match socket.read_buf(&mut buf).await {
            Ok(0) => {
                shared.lock().fail(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                );
                return;
            }
            Ok(_) => {}
            Err(e) => {
                shared.lock().fail(e.kind(), &e.to_string());
                return;
            }
        }
        let mut queue = shared.lock();
        loop {
            parsed += queue.skip_statuses(&buf[parsed..]);
            match resp::parse(&buf[parsed..]) {
                Ok(Some((value, used))) => {
                    parsed += used;
                    if let Err(why) = queue.deliver(value) {
                        queue.fail(io::ErrorKind::InvalidData, why);
                        return;
                    }
                }
                Ok(None) => break,
                Err(resp::Garbled(why)) => {
                    queue.fail(io::ErrorKind::InvalidData, &why);
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Against a fake server: a socket pair whose other end the test
    //! writes replies into. The connection's behaviour with a real Redis is
    //! tested by every integration test (`tests/it`), which runs on it.

    use super::*;
    use redis::aio::ConnectionLike;
    use std::time::Duration;
    use tokio::io::{AsyncBufReadExt, BufReader};
    use tokio::net::UnixStream;

    fn pair() -> (Pipelined, BufReader<UnixStream>) {
        pair_gathering(false)
    }

    fn pair_gathering(gather: bool) -> (Pipelined, BufReader<UnixStream>) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (r, w) = ours.into_split();
        (Pipelined::start(r, w, 0, gather), BufReader::new(theirs))
    }

    /// Reads one packed command (`*n` then n bulk strings) the client sent.
    async fn command(server: &mut BufReader<UnixStream>) -> Vec<String> {
        let mut line = String::new();
        server.read_line(&mut line).await.unwrap();
        let n: usize = line.trim()[1..].parse().unwrap();
        let mut args = Vec::new();
        for _ in 0..n {
            line.clear();
            server.read_line(&mut line).await.unwrap();
            line.clear();
            server.read_line(&mut line).await.unwrap();
            args.push(line.trim_end().to_owned());
        }
        args
    }

    #[tokio::test]
    async fn a_dropped_request_leaves_the_later_replies_in_step() {
        let (conn, mut server) = pair();
        let mut a = conn.clone();
        let mut b = conn.clone();
        let first = redis::cmd("GET").arg("one").clone();
        let second = redis::cmd("GET").arg("two").clone();
        // The first request is put on the wire by its first poll, then
        // dropped (a deadline) before its reply.
        let mut dropped = Box::pin(a.req_packed_command(&first));
        assert!(futures::poll!(dropped.as_mut()).is_pending());
        drop(dropped);
        let kept = b.req_packed_command(&second);
        let serve = async {
            assert_eq!(command(&mut server).await, ["GET", "one"]);
            assert_eq!(command(&mut server).await, ["GET", "two"]);
            server
                .get_mut()
                .write_all(b"$3\r\none\r\n$3\r\ntwo\r\n")
                .await
                .unwrap();
        };
        let (reply, ()) = tokio::join!(kept, serve);
        assert_eq!(reply.unwrap(), Value::BulkString(b"two".to_vec()));
    }

    #[tokio::test]
    async fn requests_go_out_in_the_order_of_their_first_poll() {
        for gather in [false, true] {
            in_the_order_of_their_first_poll(gather).await;
        }
    }

    async fn in_the_order_of_their_first_poll(gather: bool) {
        let (conn, mut server) = pair_gathering(gather);
        let cmds: Vec<Cmd> = (0..50).map(|i| redis::cmd("ECHO").arg(i).clone()).collect();
        let mut conns: Vec<Pipelined> = (0..50).map(|_| conn.clone()).collect();
        let mut futures: Vec<_> = conns
            .iter_mut()
            .zip(&cmds)
            .map(|(c, cmd)| Box::pin(c.req_packed_command(cmd)))
            .collect();
        // Polled in reverse: the wire's order follows the polls.
        for f in futures.iter_mut().rev() {
            assert!(futures::poll!(f.as_mut()).is_pending());
        }
        let serve = async {
            let mut replies = Vec::new();
            for _ in 0..50 {
                let args = command(&mut server).await;
                replies.extend(format!(":{}\r\n", args[1]).into_bytes());
            }
            server.get_mut().write_all(&replies).await.unwrap();
        };
        let (replies, ()) = tokio::join!(futures::future::join_all(futures), serve);
        for (i, reply) in replies.into_iter().enumerate() {
            assert_eq!(reply.unwrap(), Value::Int(i as i64));
        }
    }

    #[tokio::test]
    async fn a_broken_connection_fails_every_waiting_request_and_every_later_one() {
        let (conn, mut server) = pair();
        let mut a = conn.clone();
        let get = redis::cmd("GET").arg("k").clone();
        let waiting = a.req_packed_command(&get);
        let close = async {
            command(&mut server).await;
            drop(server);
        };
        let (reply, ()) = tokio::join!(waiting, close);
        let e = reply.unwrap_err();
        assert!(e.is_connection_dropped() && e.is_io_error(), "{e:?}");
        let e = conn.clone().req_packed_command(&get).await.unwrap_err();
        assert!(e.is_connection_dropped(), "{e:?}");
    }

    #[tokio::test]
    async fn a_garbled_reply_breaks_the_connection() {
        let (mut conn, mut server) = pair();
        let get = redis::cmd("GET").arg("k").clone();
        let serve = async {
            command(&mut server).await;
            server.get_mut().write_all(b"!what\r\n").await.unwrap();
            server
        };
        let (reply, _server) = tokio::join!(conn.req_packed_command(&get), serve);
        let e = reply.unwrap_err();
        assert!(e.is_io_error() && e.to_string().contains("RESP2"), "{e}");
    }

    #[tokio::test]
    async fn a_pipeline_gets_its_replies_and_a_server_error_keeps_its_code() {
        let (mut conn, mut server) = pair();
        let mut pipe = redis::pipe();
        pipe.cmd("SET").arg("k").arg("v").cmd("PTTL").arg("k");
        let script = redis::cmd("EVALSHA").arg("0").arg(0).clone();
        let serve = async {
            command(&mut server).await;
            command(&mut server).await;
            server.get_mut().write_all(b"+OK\r\n:-1\r\n").await.unwrap();
            command(&mut server).await;
            server
                .get_mut()
                .write_all(b"-NOSCRIPT No matching script.\r\n")
                .await
                .unwrap();
        };
        let run = async {
            let replies = conn.req_packed_commands(&pipe, 0, 2).await;
            let script = conn.req_packed_command(&script).await;
            (replies, script)
        };
        let ((replies, script), ()) = tokio::join!(run, serve);
        assert_eq!(replies.unwrap(), vec![Value::Okay, Value::Int(-1)]);
        assert_eq!(
            script.unwrap_err().kind(),
            redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
        );
    }

    /// A request that skips replies (the fenced acquire's transaction)
    /// gets its `EXEC` reply whole, however the statuses before it arrive
    /// (here a byte at a time); a queued command refused is its error; and
    /// an `EXEC` refused by itself (the connection would stay inside
    /// `MULTI`) gives the connection up, the requests behind it failing
    /// rather than reading `QUEUED`s.
    #[tokio::test]
    async fn a_transaction_reads_past_its_statuses_and_a_refused_exec_ends_the_connection() {
        let (conn, mut server) = pair();
        let tx = crate::wire::transacted::Transacted::new(
            Arc::from("k"),
            Arc::from("f"),
            Arc::from("v"),
            1000,
            7,
            false,
            1,
        );
        let serve = async {
            for _ in 0..4 {
                command(&mut server).await;
            }
            for byte in b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n:42\r\n" {
                server.get_mut().write_all(&[*byte]).await.unwrap();
                tokio::task::yield_now().await;
            }
            for _ in 0..4 {
                command(&mut server).await;
            }
            server
                .get_mut()
                .write_all(
                    b"+OK\r\n-NOPERM no INCR\r\n+QUEUED\r\n-EXECABORT Transaction discarded.\r\n",
                )
                .await
                .unwrap();
            for _ in 0..4 {
                command(&mut server).await;
            }
            command(&mut server).await;
            server
                .get_mut()
                .write_all(b"+OK\r\n+QUEUED\r\n+QUEUED\r\n-NOPERM no EXEC\r\n+QUEUED\r\n")
                .await
                .unwrap();
        };
        let run = async {
            let first = conn.request(&tx).await;
            let refused = conn.request(&tx).await;
            let (stuck, behind) = tokio::join!(conn.request(&tx), async {
                tokio::task::yield_now().await;
                conn.request(&redis::cmd("PING")).await
            });
            (first, refused, stuck, behind)
        };
        let ((first, refused, stuck, behind), ()) = tokio::join!(run, serve);
        assert_eq!(
            first.unwrap(),
            Value::Array(vec![Value::Okay, Value::Int(42)])
        );
        assert_eq!(refused.unwrap_err().code(), Some("NOPERM"));
        assert_eq!(stuck.unwrap_err().code(), Some("NOPERM"));
        assert!(behind.unwrap_err().is_io_error());
        let later = conn.request(&redis::cmd("PING")).await.unwrap_err();
        assert!(later.is_io_error(), "{later}");
    }

    #[tokio::test]
    async fn dropping_the_last_handle_stops_the_tasks() {
        let (conn, mut server) = pair();
        drop(conn);
        // The reader is gone, and with it our end of the socket.
        let mut rest = Vec::new();
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            server.read_to_end(&mut rest),
        )
        .await;
        assert!(matches!(read, Ok(Ok(0))), "{read:?}");
    }

    /// The gathering writer (a client of several nodes) still writes a
    /// lone request with nothing else to run (c=1: the self-wake brings
    /// it back), and a burst from many tasks comes out whole and in
    /// order, each reply to its own request.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_gathering_writer_sends_a_lone_request_and_a_burst_from_many_tasks() {
        let (conn, mut server) = pair_gathering(true);
        let lone = tokio::spawn({
            let conn = conn.clone();
            async move { conn.request(&redis::cmd("PING")).await }
        });
        let written = tokio::time::timeout(Duration::from_secs(10), command(&mut server)).await;
        assert_eq!(written.expect("the lone request is written"), ["PING"]);
        server.get_mut().write_all(b"+PONG\r\n").await.unwrap();
        let pong = tokio::time::timeout(Duration::from_secs(10), lone).await;
        assert_eq!(
            pong.unwrap().unwrap().unwrap(),
            Value::SimpleString("PONG".into())
        );
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let conn = conn.clone();
                tokio::spawn(async move { (i, conn.request(redis::cmd("ECHO").arg(i)).await) })
            })
            .collect();
        let mut seen = Vec::new();
        let mut replies = Vec::new();
        for _ in 0..64 {
            let args = command(&mut server).await;
            assert_eq!(args[0], "ECHO");
            seen.push(args[1].clone());
            replies.extend(format!(":{}\r\n", args[1]).into_bytes());
        }
        server.get_mut().write_all(&replies).await.unwrap();
        for task in tasks {
            let (i, reply) = tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(reply.unwrap(), Value::Int(i));
        }
        seen.sort_by_key(|s| s.parse::<i64>().unwrap());
        assert_eq!(seen, (0..64).map(|i| i.to_string()).collect::<Vec<_>>());
    }
}
