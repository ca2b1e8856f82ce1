//! Sending: every script, command and pipeline goes through
//! [`Server::run_request`], bounded by a deadline, on the one connection;
//! answers and failures are recorded and classified here.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use redis::{Cmd, ErrorKind, Pipeline, RedisError, ServerErrorKind, Value};

use super::classify::classify;
use super::link::Link;
use super::options::{Settled, Vote};
use super::state::{Connected, Server, State};
use crate::error::failure::NodeErrorKind;
use crate::node::restart;
use crate::wire::outgoing::Outgoing;
use crate::wire::scripts::Script;

impl Server {
    /// Runs a script, its `EVALSHA` built by the caller
    /// (`script.evalsha(keys, args)`, once for every node of a fan-out). If
    /// `settled` is set by the time a connection is available, nothing is
    /// sent (see `fanout`: a straggler must not overtake a later release).
    /// `through_stall` sends even to a server marked stalled (releases: the
    /// command they follow may be queued there). The caller bounds the
    /// wait; dropping the future abandons it.
    pub(crate) async fn run_script_prepared<R: Outgoing + ?Sized>(
        &self,
        script: &Script,
        evalsha: &R,
        settled: &Settled,
        through_stall: bool,
        vote: Option<Vote>,
    ) -> Result<Value, NodeErrorKind> {
        let connected = self.ready(settled, through_stall, vote).await?;
        self.send_script(&connected, script, evalsha, settled).await
    }

    /// Runs `vouched` when the server this connection reaches would vote
    /// under `vouch` now (always with the guard off, `None`), else `plain`:
    /// the home's release, which may pre-grant a fair waiter the home's
    /// vote only when the releaser itself would count that server's vote
    /// (DESIGN.md, section 2, step 3, "The restart guard"). Chosen on the
    /// connection the script then goes out on, so a reconnect to another
    /// server in between cannot slip past the check. Sent through stalls
    /// and however late, as releases are.
    pub(crate) async fn run_script_vouched(
        &self,
        script: &Script,
        vouched: &Cmd,
        plain: &Cmd,
        vouch: Option<Vote>,
    ) -> Result<Value, NodeErrorKind> {
        let connected = self.ready(&Settled::NEVER, true, None).await?;
        let votes = vouch.is_none_or(|v| self.verdict(&connected, v) == restart::Verdict::Votes);
        let evalsha = if votes { vouched } else { plain };
        self.send_script(&connected, script, evalsha, &Settled::NEVER)
            .await
    }

    pub(super) async fn send_script<R: Outgoing + ?Sized>(
        &self,
        connected: &Connected,
        script: &Script,
        evalsha: &R,
        settled: &Settled,
    ) -> Result<Value, NodeErrorKind> {
        let mut conn = connected.conn.clone();
        let first = conn.query(evalsha).await;
        let reply = match first {
            Err(e)
                if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
                    && !script.eval_when_decided
                    && settled.is_set() =>
            {
                // Nothing ran, and the acquire's release may already be
                // queued: load the script for the next acquire, run nothing.
                let _ = script.load().query_async::<Value>(&mut conn).await;
                return Err(NodeErrorKind::Skipped);
            }
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                // The node restarted (or flushed scripts) since we last used
                // it. EVAL runs and re-caches in one round trip. It is sent
                // even after the round decided: every script acts only on
                // our own unique value (release, extend, write-back) or only
                // raises fences (re-seed), so a late run leaves nothing
                // behind. Skipping it instead left a node that was always
                // the third to answer without the script, and so without
                // any extend, for the life of the lease (a watchdog test
                // found its key expired on one of three nodes).
                conn.query(&script.eval_of(evalsha.cmd())).await
            }
            other => other,
        };
        // On our own connections a request that skips replies went as the
        // script's transaction (`wire::transacted`): errors name that.
        let sent = match &connected.conn {
            Link::Pipelined(_) if evalsha.skip() > 0 => Sent::Transaction(script),
            _ => Sent::Script(script),
        };
        self.finish(connected.generation, reply, sent)
    }

    /// Runs a plain command; see
    /// [`run_script_prepared`](Self::run_script_prepared) (`through_stall`
    /// for releases, which a cluster routes as plain commands too).
    pub(crate) async fn run_command(
        &self,
        cmd: &dyn Outgoing,
        settled: &Settled,
        through_stall: bool,
        vote: Option<Vote>,
    ) -> Result<Value, NodeErrorKind> {
        self.run_request(Request::Cmd(cmd), settled, through_stall, vote)
            .await
    }

    /// Runs a pipeline (a `MULTI`/`EXEC` transaction when atomic) as one
    /// request: written in one piece, so nothing else on the multiplexed
    /// connection lands inside it. See
    /// [`run_script_prepared`](Self::run_script_prepared).
    pub(crate) async fn run_pipeline(
        &self,
        pipe: &Pipeline,
        settled: &Settled,
        through_stall: bool,
        vote: Option<Vote>,
    ) -> Result<Value, NodeErrorKind> {
        self.run_request(Request::Pipe(pipe), settled, through_stall, vote)
            .await
    }

    pub(super) async fn run_request(
        &self,
        request: Request<'_>,
        settled: &Settled,
        through_stall: bool,
        vote: Option<Vote>,
    ) -> Result<Value, NodeErrorKind> {
        let connected = self.ready(settled, through_stall, vote).await?;
        let mut conn = connected.conn.clone();
        let reply = match request {
            Request::Cmd(cmd) => conn.query(cmd).await,
            Request::Pipe(pipe) => pipe.query_async(&mut conn).await,
        };
        self.finish(connected.generation, reply, Sent::Request(request))
    }

    /// The connection to send on, or why nothing may be sent. The caller
    /// sends right after, with no await in between (the first poll of
    /// `query_async` puts the command in the connection's queue), so the
    /// `settled` check cannot go stale. `vote` is the restart guard's
    /// window for requests that count toward a quorum (acquire, extend,
    /// write-back): a server that started less than that ago gets nothing.
    pub(super) async fn ready(
        &self,
        settled: &Settled,
        through_stall: bool,
        vote: Option<Vote>,
    ) -> Result<Connected, NodeErrorKind> {
        let connected = self.connection(through_stall).await?;
        if settled.is_set() {
            return Err(NodeErrorKind::Skipped);
        }
        if let Some(vote) = vote {
            // The verdict is the server's, whatever connection reaches it.
            // A server already young when we first saw it may have lost
            // fences (a restart without data): with fencing it votes only
            // once they are re-seeded from the other nodes. The re-seed
            // starts only once the window is over: read earlier, while an
            // attempt this server granted before its restart still collects
            // grants elsewhere, the others may not hold that attempt's token
            // yet (DESIGN.md §6, found by the model check).
            match self.verdict(&connected, vote) {
                restart::Verdict::Votes => {}
                restart::Verdict::Young { uptime, votes_in } => {
                    self.gauges.quarantined(&self.addr, true);
                    return Err(NodeErrorKind::Restarted { uptime, votes_in });
                }
                restart::Verdict::Unseeded => {
                    if !self.reseeding.load(Ordering::Acquire) {
                        self.reseed_wanted.store(true, Ordering::Release);
                    }
                    self.gauges.quarantined(&self.addr, true);
                    return Err(NodeErrorKind::Reseeding);
                }
            }
            self.gauges.quarantined(&self.addr, false);
        }
        Ok(connected)
    }

    /// Records that the node answered (an error reply is an answer too) and
    /// classifies failures.
    pub(super) fn finish(
        &self,
        generation: u64,
        reply: redis::RedisResult<Value>,
        sent: Sent<'_>,
    ) -> Result<Value, NodeErrorKind> {
        let answered = match &reply {
            Ok(_) => true,
            Err(e) => !(e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error()),
        };
        if answered {
            self.last_reply
                .store(self.since_epoch(Instant::now()), Ordering::Relaxed);
            if self.stalled_hint.load(Ordering::Relaxed) {
                self.stalled_hint.store(false, Ordering::Relaxed);
                self.lock_inner().stalled = None;
                self.gauges.stalled(&self.addr, false);
                tracing::debug!(node = %self.addr, "answered again");
            }
        }
        reply.map_err(|e| self.command_failed(generation, e, sent))
    }

    pub(super) fn since_epoch(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Classifies a command error; a broken connection is dropped so the next
    /// call reconnects (and re-checks identity).
    pub(super) fn command_failed(
        &self,
        generation: u64,
        e: RedisError,
        sent: Sent<'_>,
    ) -> NodeErrorKind {
        if let (Some(sentinel), Some("READONLY")) = (&self.sentinel, e.code()) {
            // The Sentinels demoted this master: it is never used again for
            // the group, and the next request asks them where the new one is.
            let mut inner = self.lock_inner();
            if let State::Ready(c) = &inner.state {
                if c.generation == generation {
                    sentinel.demote(&c.identity.run_id);
                    inner.state = State::Idle;
                    self.gauges.up(&self.addr, false);
                }
            }
            return NodeErrorKind::Demoted {
                role: String::from("replica (refused a write: READONLY)"),
            };
        }
        let broken = e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error();
        if broken {
            let mut inner = self.lock_inner();
            if matches!(&inner.state, State::Ready(c) if c.generation == generation) {
                inner.state = State::Idle;
                self.gauges.up(&self.addr, false);
            }
            return NodeErrorKind::ConnectionLost(Arc::new(e));
        }
        classify(e, &sent.name())
    }
}

/// What [`Server::run_request`] sends.
#[derive(Clone, Copy)]
pub(super) enum Request<'a> {
    Cmd(&'a dyn Outgoing),
    Pipe(&'a Pipeline),
}

/// What was sent, to name it in an error.
#[derive(Clone, Copy)]
pub(super) enum Sent<'a> {
    Request(Request<'a>),
    Script(&'a Script),
    /// The transaction that stands for a script on our own connections.
    Transaction(&'a Script),
}

impl Sent<'_> {
    /// `SET`, `SET/PTTL` (a pipeline), `EVALSHA of the release script`.
    pub(super) fn name(self) -> String {
        let first = |cmd: &Cmd| match cmd.args_iter().next() {
            Some(redis::Arg::Simple(name)) => String::from_utf8_lossy(name).to_ascii_uppercase(),
            _ => String::from("a command"),
        };
        match self {
            Sent::Request(Request::Cmd(cmd)) => first(cmd.cmd()),
            Sent::Request(Request::Pipe(pipe)) => {
                pipe.cmd_iter().map(first).collect::<Vec<_>>().join("/")
            }
            Sent::Script(script) => format!("EVALSHA of the {} script", script.name),
            Sent::Transaction(script) => format!("the {} transaction (MULTI/EXEC)", script.name),
        }
    }
}
