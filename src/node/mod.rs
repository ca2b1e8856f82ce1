//! One Redlock node, one vote: a Redis server (`server/`) or a Redis
//! Cluster (`cluster.rs`), behind the calls the protocol makes.

pub(crate) mod cluster;
pub(crate) mod restart;
pub(crate) mod sentinel;
pub(crate) mod server;
pub(crate) mod slot;
pub(crate) mod tls;

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{Cmd, Pipeline, Value};

use crate::error::failure::NodeErrorKind;
use crate::node::cluster::{Cluster, Routed};
use crate::wire::outgoing::Outgoing;
use crate::wire::scripts::Script;

pub(crate) use crate::node::server::{NodeTimeouts, Reach, Registry, Server, Settled, Vote};

#[derive(Debug)]
pub(crate) struct Node {
    index: usize,
    addr: String,
    kind: Kind,
}

/// What a node is.
#[derive(Debug, Clone)]
pub(crate) enum Kind {
    Server(Arc<Server>),
    Cluster(Arc<Cluster>),
}

impl Node {
    pub(crate) fn server(server: Arc<Server>) -> Arc<Self> {
        Arc::new(Node {
            index: server.index(),
            addr: server.addr().to_owned(),
            kind: Kind::Server(server),
        })
    }

    pub(crate) fn cluster(index: usize, addr: String, cluster: Arc<Cluster>) -> Arc<Self> {
        Arc::new(Node {
            index,
            addr,
            kind: Kind::Cluster(cluster),
        })
    }

    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// `host:port[/db]`, `unix:path`, or `cluster:host:port` (the first
    /// seed).
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    pub(crate) fn kind(&self) -> &Kind {
        &self.kind
    }

    /// See [`Server::started`]; `None` on a cluster.
    pub(crate) fn started(&self) -> Option<Instant> {
        match &self.kind {
            Kind::Server(server) => server.started(),
            Kind::Cluster(_) => None,
        }
    }

    /// The database index the URL selects (always 0 on a cluster).
    pub(crate) fn db(&self) -> i64 {
        match &self.kind {
            Kind::Server(s) => s.db(),
            Kind::Cluster(_) => 0,
        }
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        match &self.kind {
            Kind::Server(s) => s.connect_timeout(),
            Kind::Cluster(c) => c.timeouts().connect,
        }
    }

    pub(crate) fn backoff_max(&self) -> Duration {
        match &self.kind {
            Kind::Server(s) => s.backoff_max(),
            Kind::Cluster(c) => c.timeouts().backoff_max,
        }
    }

    /// See [`Server::run_script_prepared`].
    pub(crate) async fn run_script(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
        settled: &Settled,
        through_stall: bool,
        vote: Option<Vote>,
    ) -> Result<Value, NodeErrorKind> {
        let evalsha = script.evalsha(keys, args);
        self.run_script_prepared(script, &evalsha, settled, through_stall, vote)
            .await
    }

    /// See [`Server::run_script_prepared`].
    pub(crate) async fn run_script_prepared<R: Outgoing + ?Sized>(
        &self,
        script: &Script,
        evalsha: &R,
        settled: &Settled,
        through_stall: bool,
        vote: Option<Vote>,
    ) -> Result<Value, NodeErrorKind> {
        match &self.kind {
            Kind::Server(s) => {
                s.run_script_prepared(script, evalsha, settled, through_stall, vote)
                    .await
            }
            // Boxed: a cluster's routing future is twice a server's, and
            // every per-node future of a round would otherwise carry it
            // (moved, copied, for every request; BENCHMARKS.md "Out of
            // process").
            Kind::Cluster(c) => {
                Box::pin(c.run(
                    Routed::Script(script, evalsha.cmd()),
                    settled,
                    through_stall,
                    vote,
                ))
                .await
            }
        }
    }

    /// See [`Server::run_script_vouched`]; a cluster always runs `plain`
    /// (its shards never pre-grant).
    pub(crate) async fn run_script_vouched(
        &self,
        script: &Script,
        vouched: &Cmd,
        plain: &Cmd,
        vouch: Option<Vote>,
    ) -> Result<Value, NodeErrorKind> {
        match &self.kind {
            Kind::Server(s) => s.run_script_vouched(script, vouched, plain, vouch).await,
            Kind::Cluster(c) => {
                Box::pin(c.run(Routed::Script(script, plain), &Settled::NEVER, true, None)).await
            }
        }
    }

    /// See [`Server::votes_now`]; `false` on a cluster.
    pub(crate) fn votes_now(&self, vote: Vote) -> bool {
        match &self.kind {
            Kind::Server(s) => s.votes_now(vote),
            Kind::Cluster(_) => false,
        }
    }

    /// See [`Server::run_command`]. On a cluster an `MGET` of keys in
    /// several slots goes as one pipeline of `GET`s per master
    /// ([`Cluster::mget`]).
    pub(crate) async fn run_command(
        &self,
        cmd: &dyn Outgoing,
        settled: &Settled,
        vote: Option<Vote>,
    ) -> Result<Value, NodeErrorKind> {
        match &self.kind {
            Kind::Server(s) => s.run_command(cmd, settled, false, vote).await,
            Kind::Cluster(c) => match mget_keys(cmd.cmd()) {
                Some(keys) => Box::pin(c.mget(&keys, settled, vote)).await,
                None => Box::pin(c.run(Routed::Cmd(cmd.cmd()), settled, false, vote)).await,
            },
        }
    }

    /// See [`Server::run_pipeline`].
    pub(crate) async fn run_pipeline(
        &self,
        pipe: &Pipeline,
        settled: &Settled,
        vote: Option<Vote>,
    ) -> Result<Value, NodeErrorKind> {
        match &self.kind {
            Kind::Server(s) => s.run_pipeline(pipe, settled, false, vote).await,
            Kind::Cluster(c) => Box::pin(c.run(Routed::Pipe(pipe), settled, false, vote)).await,
        }
    }

    /// See [`Server::note_timeout`]; on a cluster, the shards concerned.
    pub(crate) fn note_timeout(&self, sent_at: Instant) {
        match &self.kind {
            Kind::Server(s) => s.note_timeout(sent_at),
            Kind::Cluster(c) => c.note_timeout(sent_at),
        }
    }

    /// The re-seed from a majority is a plain node's; a cluster's masters
    /// raise their own fences (`Cluster::raise_fences`).
    pub(crate) fn take_reseed_wanted(&self) -> bool {
        match &self.kind {
            Kind::Server(s) => s.take_reseed_wanted(),
            Kind::Cluster(_) => false,
        }
    }

    pub(crate) fn reseed_done(&self, run_id: Option<String>) {
        if let Kind::Server(s) = &self.kind {
            s.reseed_done(run_id);
        }
    }

    pub(crate) fn run_id(&self) -> Option<String> {
        match &self.kind {
            Kind::Server(s) => s.run_id(),
            Kind::Cluster(_) => None,
        }
    }

    pub(crate) fn run_id_past_window(&self, window: Duration) -> Option<String> {
        match &self.kind {
            Kind::Server(s) => s.run_id_past_window(window),
            Kind::Cluster(_) => None,
        }
    }
}

/// The keys of `MGET k1 k2 …`; `None` for any other command or an `MGET`
/// of one key (one slot: it goes as it is).
fn mget_keys(cmd: &Cmd) -> Option<Vec<Vec<u8>>> {
    let mut args = cmd.args_iter();
    match args.next() {
        Some(redis::Arg::Simple(name)) if name.eq_ignore_ascii_case(b"MGET") => {}
        _ => return None,
    }
    let keys: Vec<Vec<u8>> = args
        .filter_map(|arg| match arg {
            redis::Arg::Simple(key) => Some(key.to_vec()),
            _ => None,
        })
        .collect();
    (keys.len() > 1).then_some(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mget_keys_are_read_from_the_command() {
        let mut mget = redis::cmd("MGET");
        mget.arg("a").arg("b");
        assert_eq!(mget_keys(&mget), Some(vec![b"a".to_vec(), b"b".to_vec()]));
        let mut one = redis::cmd("MGET");
        one.arg("a");
        assert!(mget_keys(&one).is_none());
        assert!(mget_keys(redis::cmd("GET").arg("a")).is_none());
    }
}
