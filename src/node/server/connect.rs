//! Connecting: one connect in flight at a time, shared by every caller,
//! with backoff; the handshake (`INFO server`, `ROLE`) that runs before
//! the first lock command travels over a new connection.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt, Shared};
use redis::{ConnectionAddr, Value};

use super::classify::classify;
use super::identity::Identity;
use super::link::{self, Link};
use super::state::{ConnectResult, Connected, Inner, Server, State};
use crate::error::failure::NodeErrorKind;
use crate::node::sentinel::Sentinel;
use crate::wire::scripts::{lock_scripts, sharded_scripts};
use crate::wire::{info, probe};

impl Server {
    /// The current connection, connecting first if there is none.
    pub(super) async fn connection(&self, through_stall: bool) -> Result<Connected, NodeErrorKind> {
        let pending = {
            let mut inner = self.lock_inner();
            if let (Some(since), false) = (inner.stalled, through_stall) {
                let now = Instant::now();
                if now < inner.next_probe {
                    return Err(NodeErrorKind::Stalled {
                        silent_for: now.saturating_duration_since(since),
                    });
                }
                // This request is the probe.
                inner.next_probe = now + self.timeouts.probe;
            }
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
        // After a permanent failure (a refused certificate or password, a
        // replica), a reconnect in flight is most likely refused again: the
        // caller hears the refusal now instead of waiting out the connect,
        // which could outlast its node timeout and pass for a transient
        // timeout. The reconnect goes on in the background and clears this
        // when it succeeds.
        if let Some(refused) = self.lock_inner().refused.clone() {
            return Err(NodeErrorKind::Backoff {
                retry_in: Duration::ZERO,
                last: Box::new(refused),
            });
        }
        pending.await
    }

    pub(super) fn start_connect(
        &self,
        inner: &mut Inner,
    ) -> Shared<BoxFuture<'static, ConnectResult>> {
        let generation = inner.next_generation;
        inner.next_generation += 1;
        let (client, shard, gather) = (self.client.clone(), self.shard, self.gathers());
        let sentinel = self.sentinel.clone();
        let timeout = self.timeouts.connect;
        // The future holds a Weak: the node owns the future (in its state), so
        // a strong reference here would be a cycle that leaks both.
        let me = self.me.clone();
        let predecessor = inner
            .installed
            .clone()
            .filter(|_| !self.cut_off_refused.load(Ordering::Relaxed));
        let fut = async move {
            let connect = async {
                let (conn, identity) =
                    reach(&client, sentinel.as_deref(), timeout, shard, gather).await?;
                if cut_off(&conn, &identity, predecessor.as_deref()).await {
                    if let Some(node) = me.upgrade() {
                        node.cut_off_refused.store(true, Ordering::Relaxed);
                    }
                }
                Ok((conn, identity))
            };
            let result = match tokio::time::timeout(timeout, connect).await {
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

    pub(super) fn finish_connect(
        &self,
        generation: u64,
        result: Result<(Link, Identity), NodeErrorKind>,
    ) -> ConnectResult {
        // A connect overtaken by a newer one tells the restart guard
        // nothing: its server may not be the one the address reaches now.
        let newest = self.lock_inner().next_generation == generation + 1;
        let result = result.and_then(|(conn, identity)| {
            self.registry
                .claim(self.index, &identity.run_id)
                .map_err(|other| NodeErrorKind::SameServer {
                    other,
                    run_id: identity.run_id.clone(),
                })?;
            Ok(if newest {
                self.connected(conn, generation, identity)
            } else {
                Connected {
                    conn,
                    generation,
                    identity: Arc::new(identity),
                }
            })
        });
        let mut inner = self.lock_inner();
        // Only the newest connect may install its result.
        if inner.next_generation != generation + 1 {
            return result;
        }
        inner.refused = match &result {
            Err(error) if error.is_permanent() => Some(error.clone()),
            _ => None,
        };
        match &result {
            Ok(connected) => {
                tracing::debug!(node = %self.addr, run_id = %connected.identity.run_id, "connected");
                self.watch_sentinels();
                inner.backoff = self.timeouts.backoff_min;
                inner.installed = Some(Arc::clone(&connected.identity));
                inner.state = State::Ready(connected.clone());
                // A new connection starts with a clean slate.
                inner.stalled = None;
                self.stalled_hint.store(false, Ordering::Relaxed);
                self.gauges.up(&self.addr, true);
                self.gauges.stalled(&self.addr, false);
            }
            Err(error) => {
                tracing::debug!(node = %self.addr, %error, "connect failed");
                self.gauges.up(&self.addr, false);
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

    /// A new connection to the server that answered the handshake. A server
    /// whose `run_id` differs from the one this node reached before is
    /// another server: the old one restarted, or the address now reaches a
    /// different one (a moved VIP or DNS name, a replaced pod, a promoted
    /// replica). Either way it has none of the locks it may be asked about,
    /// so it counts as a server that started now, whatever its uptime: out
    /// of quorums for the restart guard's window, and with fencing its
    /// fences re-seeded before it votes (DESIGN.md, "The restart guard").
    /// That verdict is kept with the server (`restart::Lineage`), so a
    /// later connection to it, which reads its real uptime, changes
    /// nothing.
    pub(super) fn connected(&self, conn: Link, generation: u64, identity: Identity) -> Connected {
        let mut lineage = self.lineage();
        let previous = lineage.run_id().map(str::to_owned);
        if lineage.observe(&identity.run_id, identity.uptime, Instant::now()) {
            // The master it replaced is never used again for the group.
            if let (Some(sentinel), Some(previous)) = (&self.sentinel, previous) {
                if previous != identity.run_id {
                    sentinel.demote(&previous);
                }
            }
            tracing::warn!(node = %self.addr, run_id = %identity.run_id, uptime = ?identity.uptime, "another server (restarted, replaced or promoted): counted as started now");
        }
        Connected {
            conn,
            generation,
            identity: Arc::new(identity),
        }
    }
}
/// The handshake with the node's server; on a Sentinel node, with the
/// master the Sentinels name (see `sentinel.rs`): a server that is not a
/// master, or a master this node saw replaced, is refused (`Demoted`), and
/// its uptime counts only from when the Sentinel first knew it as master.
pub(super) async fn reach(
    client: &redis::Client,
    sentinel: Option<&Sentinel>,
    timeout: Duration,
    shard: bool,
    gather: bool,
) -> Result<(Link, Identity), NodeErrorKind> {
    let Some(sentinel) = sentinel else {
        return handshake(client, timeout, shard, gather).await;
    };
    let located = sentinel.locate(timeout).await?;
    let (conn, mut identity) = match handshake(&located.client, timeout, shard, gather).await {
        Err(NodeErrorKind::NotMaster { role }) => return Err(NodeErrorKind::Demoted { role }),
        other => other?,
    };
    if !sentinel.admit(&identity.run_id, located.report.epoch) {
        return Err(NodeErrorKind::Demoted {
            role: String::from("master replaced by a failover"),
        });
    }
    identity.uptime = identity.uptime.min(located.report.master_for);
    sentinel.set_current(located.client);
    Ok((conn, identity))
}

/// TCP connect, AUTH (from the URL), then `INFO server` and `ROLE` pipelined
/// in one round trip. The node may vote only if it is a master.
pub(super) async fn handshake(
    client: &redis::Client,
    timeout: Duration,
    shard: bool,
    gather: bool,
) -> Result<(Link, Identity), NodeErrorKind> {
    let connect = link::open(client, timeout, gather);
    let conn = match client.get_connection_info().addr() {
        ConnectionAddr::TcpTls { host, port, .. } => {
            // A plain-text server takes the TLS hello for the start of an
            // inline command and waits for the rest, so the handshake would
            // only time out. Past half the budget, one plain `PING` on a
            // second connection tells the two apart: a RESP answer means
            // the URL should not say `rediss://`. A healthy TLS server
            // answers long before, and never sees the probe.
            let plain = async {
                tokio::time::sleep(timeout / 2).await;
                if probe::answers_plain_resp(host, *port, timeout / 2).await {
                    NodeErrorKind::Tls {
                        reason: String::from(
                            "the server answers in plain text (a redis:// server behind a rediss:// url)",
                        ),
                    }
                } else {
                    std::future::pending().await
                }
            };
            tokio::select! {
                connected = connect => connected?,
                refused = plain => return Err(refused),
            }
        }
        _ => connect.await?,
    };
    // Two commands on the multiplexed connection at once: one round trip,
    // but each with its own reply, so an error (NOAUTH when the URL lacks a
    // password) keeps its code; a pipeline would fold it into a
    // pipeline error without one.
    // The lock's scripts go in the same round trip: a fresh or restarted
    // server then has them before the first EVALSHA (a failed load, say an
    // ACL without SCRIPT, only leaves the NOSCRIPT fallback to do it).
    // `CLIENT ID` too: the id by which the connection that may one day
    // replace this one cuts it off (`cut_off`).
    let (mut c1, mut c2, mut c3) = (conn.clone(), conn.clone(), conn.clone());
    let mut info_cmd = redis::cmd("INFO");
    info_cmd.arg("server");
    let role_cmd = redis::cmd("ROLE");
    let mut id_cmd = redis::cmd("CLIENT");
    id_cmd.arg("ID");
    let (plain, sharded) = (lock_scripts(), sharded_scripts());
    let sharded = if shard { &sharded[..] } else { &[] };
    let loads = futures::future::join_all(plain.iter().chain(sharded).map(|script| {
        let mut c = conn.clone();
        async move { script.load().query_async::<Value>(&mut c).await }
    }));
    let (info, role, client_id, _) = futures::future::join4(
        info_cmd.query_async::<String>(&mut c1),
        role_cmd.query_async::<Value>(&mut c2),
        id_cmd.query_async::<u64>(&mut c3),
        loads,
    )
    .await;
    let (server, role) = (
        info.map_err(|e| classify(e, "INFO"))?,
        role.map_err(|e| classify(e, "ROLE"))?,
    );
    // The audit reads ROLE with the same parser, so what it reports is what
    // this check decides.
    let role = info::parse_role(&role).map_or_else(|| String::from("unknown"), |r| r.name);
    if role != "master" {
        return Err(NodeErrorKind::NotMaster { role });
    }
    // A cluster node answers `ROLE` as a master too, then refuses every
    // script of ours (`CROSSSLOT`) or sends keys elsewhere (`MOVED`).
    // A shard of a cluster node is one on purpose (`cluster.rs`).
    if !shard && info::info_field(&server, "redis_mode") == Some("cluster") {
        return Err(NodeErrorKind::ClusterMode);
    }
    let field = |name: &str| {
        info::info_field(&server, name)
            .unwrap_or_default()
            .to_owned()
    };
    let identity = Identity {
        run_id: field("run_id"),
        version: field("redis_version"),
        uptime: info::uptime(&server).unwrap_or_default(),
        // Refused (an ACL user without `client|id`): nothing to cut off by.
        client_id: client_id.ok(),
    };
    Ok((conn, identity))
}

/// Cuts off the connection that `conn` (to the server `identity` names)
/// follows, before `conn` carries anything: `CLIENT KILL ID` of
/// `predecessor`, the newest connection installed before it. Whatever the
/// old one still carried and the server had not run (bytes held on a
/// stalled path or in a proxy, the server's unread buffer) is then thrown
/// away with it, rather than run after what the new one sends: an
/// acquire's `SET` after the release sent on the new connection would
/// leave its key for its TTL (DESIGN.md section 3, "A replaced connection
/// is cut off"). Only on the same server (`run_id`): on another one the id
/// is some other client's. Best effort: an id already gone changes
/// nothing, and a refusal (an ACL user without `client|kill`) leaves the
/// old connection only dropped, as before, and is returned (`true`) so
/// that the node does not ask again.
pub(super) async fn cut_off(
    conn: &Link,
    identity: &Identity,
    predecessor: Option<&Identity>,
) -> bool {
    let Some(old) = predecessor else {
        return false;
    };
    let Some(id) = old
        .client_id
        .filter(|id| old.run_id == identity.run_id && identity.client_id != Some(*id))
    else {
        return false;
    };
    let mut kill = redis::cmd("CLIENT");
    kill.arg("KILL").arg("ID").arg(id);
    let mut conn = conn.clone();
    match kill.query_async::<Value>(&mut conn).await {
        Ok(killed) => {
            tracing::debug!(id, ?killed, "the replaced connection cut off");
            false
        }
        Err(error) => {
            tracing::debug!(id, %error, "the replaced connection not cut off");
            crate::wire::info::permission_denied(&error, "CLIENT KILL").is_some()
        }
    }
}
