//! A Redis Cluster as one Redlock node: each request goes to the master of
//! its key's hash slot, through a [`Server`] per master shard, so that every
//! shard keeps what a plain node has (one multiplexed connection, the
//! identity checks, the restart guard, stalled-node detection).
//!
//! - **Routing.** The slot map comes from `CLUSTER SLOTS`, read on first
//!   use and after redirects or lost connections: from the masters already
//!   connected, else from every address the last map named and the seeds
//!   at once ([`Cluster::refresh`]). Every key of one resource shares a
//!   hash tag (`resource::Layout::Tagged`), so every script and pipeline of
//!   ours touches one slot.
//! - **Redirects.** `MOVED` updates the map for that slot and resends to the
//!   new owner (and refreshes the whole map in the background); `ASK` sends
//!   `ASKING` and the request to the importing master, once; `TRYAGAIN` and
//!   `CLUSTERDOWN` (a request on several keys of a slot mid-migration, a
//!   failover under way) refresh and resend after a short pause. At most
//!   [`MAX_REDIRECTS`] redirects and `MAX_PAUSES` pauses; the caller's node
//!   timeout bounds them all.
//! - **Failover.** A master serving slots that the previous map did not
//!   list as one is taken for a promoted replica: it may lack the last
//!   writes of the master it replaced, so it counts as a server that started now
//!   (`Server::restarted_now`): out of quorums for the restart guard's
//!   window, then with fencing its fences raised to the clock seed before
//!   it votes in fenced requests ([`Cluster::raise_fences`]).
//! - **Stalls.** A request that timed out marks stalled only the shards
//!   that were sent something since it started and answered nothing since.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use redis::{Cmd, ConnectionInfo, ErrorKind, Pipeline, ServerErrorKind, Value};

use crate::error::failure::NodeErrorKind;
use crate::logic::fence::clock_seed;
use crate::logic::limits::FENCE_BUCKETS;
use crate::logic::resource::bucket_key;
use crate::node::server::{classify, NodeTimeouts, Registry, Server, Settled, Vote};
use crate::node::slot::{key_slot, SlotMap};
use crate::node::tls::Tls;
use crate::wire::scripts::{on_cluster, Script, RESEED};

/// Resends of one request after redirects; a slot moves at most a few times
/// within one node timeout.
pub(crate) const MAX_REDIRECTS: usize = 5;

/// The pause before resending after `TRYAGAIN` or `CLUSTERDOWN` (a slot
/// mid-migration, a failover under way).
const TRY_AGAIN_PAUSE: Duration = Duration::from_millis(10);

/// Resends of one request after `TRYAGAIN` or `CLUSTERDOWN`: half a second
/// of pauses, more than one node timeout by default.
const MAX_PAUSES: usize = 50;

/// The least time between two background refreshes of the slot map.
const REFRESH_MIN: Duration = Duration::from_millis(100);

/// Makes the `redis::Client` of one server from the seed's settings
/// (credentials, TLS, protocol) and another address.
pub(crate) type MakeClient =
    Arc<dyn Fn(ConnectionInfo) -> redis::RedisResult<redis::Client> + Send + Sync>;

struct Shard {
    server: Arc<Server>,
    /// Nanoseconds after the cluster's epoch of the last request sent.
    sent: AtomicU64,
}

#[derive(Default)]
struct Topology {
    map: Option<Arc<SlotMap>>,
    refreshed: Option<Instant>,
}

impl Topology {
    /// Installs `map`; returns its masters that serve slots and that the
    /// previous map did not list as masters serving slots: replicas
    /// promoted by a failover (`CLUSTER SLOTS` lists a replica only once
    /// it has replicated something, so "was a replica" cannot be read
    /// from it), and also a master that took slots by resharding without
    /// holding any before (a node added to the cluster), which is
    /// conservative: its keys came by `MIGRATE`, whole.
    fn install(&mut self, map: Arc<SlotMap>) -> Vec<String> {
        let serving = |m: &SlotMap| -> HashSet<String> {
            m.masters
                .iter()
                .filter(|a| m.slots_of(a).next().is_some())
                .cloned()
                .collect()
        };
        let promoted = match &self.map {
            Some(old) => {
                let before = serving(old);
                let mut new: Vec<String> = serving(&map).difference(&before).cloned().collect();
                new.sort();
                new
            }
            None => Vec::new(),
        };
        self.map = Some(map);
        self.refreshed = Some(Instant::now());
        promoted
    }
}

pub(crate) struct Cluster {
    /// The node index (in errors, the servers' gauges).
    index: usize,
    seeds: Vec<ConnectionInfo>,
    make: MakeClient,
    timeouts: NodeTimeouts,
    /// The fence keys' prefix, for the re-seed of a promoted master.
    prefix: String,
    /// The client's TLS settings, for the subscription connection.
    tls: Option<Tls>,
    topology: Mutex<Topology>,
    shards: Mutex<HashMap<String, Arc<Shard>>>,
    /// One refresh at a time; the others wait for its map.
    refreshing: tokio::sync::Mutex<()>,
    epoch: Instant,
    me: Weak<Cluster>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("index", &self.index)
            .field("seeds", &self.seeds.len())
            .finish_non_exhaustive()
    }
}

/// Where a refused request should go instead.
enum Redirect {
    Moved(String),
    Ask(String),
    TryAgain,
}

/// The redirect in `e`, also when it is a pipeline's first failure.
fn redirect(e: &redis::RedisError) -> Option<Redirect> {
    let (kind, detail) = match e.redirect_node() {
        Some((to, _)) => (e.kind(), Some(to.to_owned())),
        None => match e.clone().into_server_errors() {
            Some(items) => {
                let (_, first) = items.first()?;
                let to = first
                    .details()
                    .and_then(|d| d.split_ascii_whitespace().nth(1))
                    .map(str::to_owned);
                (ErrorKind::Server(first.kind()?), to)
            }
            None => (e.kind(), None),
        },
    };
    match (kind, detail) {
        (ErrorKind::Server(ServerErrorKind::Moved), Some(to)) => Some(Redirect::Moved(to)),
        (ErrorKind::Server(ServerErrorKind::Ask), Some(to)) => Some(Redirect::Ask(to)),
        (ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown), _) => {
            Some(Redirect::TryAgain)
        }
        _ => None,
    }
}

/// The host of a server's settings, for a `CLUSTER SLOTS` reply that
/// leaves it out.
fn host_of(info: &ConnectionInfo) -> String {
    match info.addr() {
        redis::ConnectionAddr::Tcp(host, _) | redis::ConnectionAddr::TcpTls { host, .. } => {
            host.clone()
        }
        _ => String::new(),
    }
}

/// What one routed request sends.
#[derive(Clone, Copy)]
pub(crate) enum Routed<'a> {
    Script(&'a Script, &'a Cmd),
    Cmd(&'a Cmd),
    Pipe(&'a Pipeline),
}

impl Routed<'_> {
    /// The hash slot of the key that routes the request: a script's first
    /// key, a command's first argument, a pipeline's first command's; 0
    /// without one.
    fn slot(&self) -> u16 {
        let nth = |cmd: &Cmd, n: usize| match cmd.args_iter().nth(n) {
            Some(redis::Arg::Simple(bytes)) => Some(key_slot(bytes)),
            _ => None,
        };
        let slot = match self {
            Routed::Script(_, cmd) => match cmd.args_iter().nth(2) {
                Some(redis::Arg::Simple(b"0")) => None,
                _ => nth(cmd, 3),
            },
            Routed::Cmd(cmd) => nth(cmd, 1),
            Routed::Pipe(pipe) => pipe.cmd_iter().find_map(|cmd| nth(cmd, 1)),
        };
        slot.unwrap_or(0)
    }

    /// The same request after `ASKING`, for the master importing its slot.
    /// A script goes as `EVAL` (the importing master may not have it
    /// cached, and a pipeline's `NOSCRIPT` has no fallback).
    fn asking(&self) -> Pipeline {
        let mut pipe = redis::pipe();
        let mut ask = |cmd: Cmd| {
            pipe.cmd("ASKING").add_command(cmd);
        };
        match self {
            Routed::Script(script, evalsha) => ask(script.eval_of(evalsha)),
            Routed::Cmd(cmd) => ask((*cmd).clone()),
            Routed::Pipe(inner) => {
                for cmd in inner.cmd_iter() {
                    ask(cmd.clone());
                }
            }
        }
        pipe
    }

    /// The request's own reply from the reply to [`asking`](Self::asking):
    /// every second one (the others are `ASKING`'s `OK`s).
    fn after_asking(&self, reply: Value) -> Result<Value, NodeErrorKind> {
        let Value::Array(replies) = reply else {
            return Ok(reply);
        };
        let mut own: Vec<Value> = replies.into_iter().skip(1).step_by(2).collect();
        match self {
            Routed::Pipe(_) => Ok(Value::Array(own)),
            _ => own.pop().ok_or_else(|| NodeErrorKind::ClusterTopology {
                reason: "an empty reply after ASKING".into(),
            }),
        }
    }
}

impl Cluster {
    pub(crate) fn new(
        index: usize,
        seeds: Vec<ConnectionInfo>,
        make: MakeClient,
        timeouts: NodeTimeouts,
        prefix: String,
        tls: Option<Tls>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Cluster {
            index,
            seeds,
            make,
            timeouts,
            prefix,
            tls,
            topology: Mutex::default(),
            shards: Mutex::default(),
            refreshing: tokio::sync::Mutex::new(()),
            epoch: Instant::now(),
            me: me.clone(),
        })
    }

    fn topology(&self) -> std::sync::MutexGuard<'_, Topology> {
        self.topology.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current slot map, if one was read.
    pub(crate) fn map(&self) -> Option<Arc<SlotMap>> {
        self.topology().map.clone()
    }

    /// The server of master `addr`, made on first use.
    fn shard(&self, addr: &str) -> Result<Arc<Shard>, NodeErrorKind> {
        let mut shards = self.shards.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(shard) = shards.get(addr) {
            return Ok(Arc::clone(shard));
        }
        let info = self
            .info_for(addr)
            .ok_or_else(|| NodeErrorKind::ClusterTopology {
                reason: format!("a master at `{addr}`"),
            })?;
        let client = (self.make)(info).map_err(|e| NodeErrorKind::Connect(Arc::new(e)))?;
        // Each master is its own identity (`Registry` of one): a new
        // `run_id` behind the same address is a replaced server.
        let server = Server::new(
            0,
            addr.to_owned(),
            0,
            client,
            self.timeouts,
            Registry::new(1),
            crate::node::server::Reach::Shard,
        );
        let shard = Arc::new(Shard {
            server,
            sent: AtomicU64::new(0),
        });
        shards.insert(addr.to_owned(), Arc::clone(&shard));
        Ok(shard)
    }

    /// The masters' servers made so far.
    fn known(&self) -> Vec<Arc<Shard>> {
        let shards = self.shards.lock().unwrap_or_else(|p| p.into_inner());
        shards.values().cloned().collect()
    }

    fn since_epoch(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// The server of the master serving `slot`, reading the map first if
    /// there is none.
    async fn master_of(&self, slot: u16) -> Result<Arc<Shard>, NodeErrorKind> {
        let map = match self.map() {
            Some(map) => map,
            None => self.refresh(None).await?,
        };
        match map.master_of(slot) {
            Some(addr) => self.shard(addr),
            None => Err(NodeErrorKind::ClusterTopology {
                reason: format!("no master serves hash slot {slot}"),
            }),
        }
    }

    /// Sends `request` to the master of its key's slot, following
    /// redirects. See [`Server::run_script_prepared`] for the other arguments.
    pub(crate) async fn run(
        &self,
        request: Routed<'_>,
        settled: &Settled,
        through_stall: bool,
        vote: Option<Vote>,
    ) -> Result<Value, NodeErrorKind> {
        // A script that publishes runs its sharded variant on a cluster.
        let rebound;
        let request = match request {
            Routed::Script(script, evalsha) if !std::ptr::eq(on_cluster(script), script) => {
                let sharded = on_cluster(script);
                rebound = sharded.evalsha_of(evalsha);
                Routed::Script(sharded, &rebound)
            }
            other => other,
        };
        let slot = request.slot();
        let mut ask: Option<String> = None;
        let (mut redirects, mut pauses) = (0, 0);
        loop {
            let asking = ask.take();
            let shard = match &asking {
                Some(addr) => self.shard(addr)?,
                None => self.master_of(slot).await?,
            };
            shard
                .sent
                .store(self.since_epoch(Instant::now()), Ordering::Relaxed);
            let server = &shard.server;
            let reply = match (&asking, request) {
                (Some(_), _) => server
                    .run_pipeline(&request.asking(), settled, through_stall, vote)
                    .await
                    .and_then(|reply| request.after_asking(reply)),
                (None, Routed::Script(script, evalsha)) => {
                    server
                        .run_script_prepared(script, evalsha, settled, through_stall, vote)
                        .await
                }
                (None, Routed::Cmd(cmd)) => {
                    server.run_command(cmd, settled, through_stall, vote).await
                }
                (None, Routed::Pipe(pipe)) => {
                    server
                        .run_pipeline(pipe, settled, through_stall, vote)
                        .await
                }
            };
            let error = match reply {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            match &error {
                NodeErrorKind::Redis(e) => match redirect(e) {
                    Some(Redirect::Moved(to)) if redirects < MAX_REDIRECTS => {
                        redirects += 1;
                        self.moved(slot, &to);
                    }
                    Some(Redirect::Ask(to)) if redirects < MAX_REDIRECTS => {
                        redirects += 1;
                        ask = Some(to);
                    }
                    // A slot mid-migration refuses a request on several
                    // keys until its keys have all moved; a failover
                    // refuses everything for a moment. Both pass within
                    // milliseconds; the caller's deadline bounds the wait.
                    Some(Redirect::TryAgain) if pauses < MAX_PAUSES => {
                        pauses += 1;
                        // Refused by the importing master: ask it again.
                        ask.clone_from(&asking);
                        tokio::time::sleep(TRY_AGAIN_PAUSE).await;
                        self.refresh_in_background();
                    }
                    _ => return Err(error),
                },
                // Our map is behind a failover: the address serves as a
                // replica now.
                NodeErrorKind::NotMaster { .. } => {
                    let _ = self.refresh(Some(Instant::now())).await;
                }
                NodeErrorKind::Reseeding => {
                    if server.take_reseed_wanted() {
                        self.raise_fences(&shard);
                    }
                    return Err(error);
                }
                NodeErrorKind::ConnectionLost(_)
                | NodeErrorKind::Connect(_)
                | NodeErrorKind::Backoff { .. } => {
                    // Perhaps failed over: the next request finds out.
                    self.refresh_in_background();
                    return Err(error);
                }
                _ => return Err(error),
            }
        }
    }

    /// `MGET` of `keys`, which live in many slots: one pipeline of `GET`s
    /// per master (by the current map), all at once, the replies put back
    /// in the order of `keys`. A key whose slot moved since the map was
    /// read fails its pipeline (the caller's read fails; the map is read
    /// again on the redirect).
    pub(crate) async fn mget(
        &self,
        keys: &[Vec<u8>],
        settled: &Settled,
        vote: Option<Vote>,
    ) -> Result<Value, NodeErrorKind> {
        let map = match self.map() {
            Some(map) => map,
            None => self.refresh(None).await?,
        };
        let mut groups: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, key) in keys.iter().enumerate() {
            let slot = key_slot(key);
            let master = map
                .master_of(slot)
                .ok_or_else(|| NodeErrorKind::ClusterTopology {
                    reason: format!("no master serves hash slot {slot}"),
                })?;
            groups.entry(master).or_default().push(i);
        }
        let pipes: Vec<(Vec<usize>, Pipeline)> = groups
            .into_values()
            .map(|indexes| {
                let mut pipe = redis::pipe();
                for &i in &indexes {
                    pipe.cmd("GET").arg(&keys[i]);
                }
                (indexes, pipe)
            })
            .collect();
        let replies = futures::future::join_all(
            pipes
                .iter()
                .map(|(_, pipe)| self.run(Routed::Pipe(pipe), settled, false, vote)),
        )
        .await;
        let mut values = vec![Value::Nil; keys.len()];
        for ((indexes, _), reply) in pipes.iter().zip(replies) {
            let Value::Array(items) = reply? else {
                return Err(NodeErrorKind::ClusterTopology {
                    reason: "a pipeline of GETs answered with no array".into(),
                });
            };
            for (&i, item) in indexes.iter().zip(items) {
                values[i] = item;
            }
        }
        Ok(Value::Array(values))
    }

    /// A request that went out at `sent_at` timed out: the shards sent
    /// something since that answered nothing since are stalled.
    pub(crate) fn note_timeout(&self, sent_at: Instant) {
        let since = self.since_epoch(sent_at);
        for shard in self.known() {
            if shard.sent.load(Ordering::Relaxed) >= since {
                shard.server.note_timeout(sent_at);
            }
        }
    }

    /// Records a `MOVED`: `slot` is served by `to` now.
    fn moved(&self, slot: u16, to: &str) {
        let mut topology = self.topology();
        let promoted = match topology.map.clone() {
            Some(mut map) => {
                Arc::make_mut(&mut map).moved(slot, to);
                let refreshed = topology.refreshed;
                let promoted = topology.install(map);
                // Not a full read: the next background refresh is still due.
                topology.refreshed = refreshed;
                promoted
            }
            None => Vec::new(),
        };
        drop(topology);
        self.restarted(promoted);
        self.refresh_in_background();
    }

    /// Counts the promoted masters at `addrs` as servers that started now.
    fn restarted(&self, addrs: Vec<String>) {
        for addr in addrs {
            if let Ok(shard) = self.shard(&addr) {
                shard.server.restarted_now();
            }
        }
    }

    fn refresh_in_background(&self) {
        let due = self
            .topology()
            .refreshed
            .is_none_or(|at| at.elapsed() >= REFRESH_MIN);
        let (Some(me), true, Ok(runtime)) = (
            self.me.upgrade(),
            due,
            tokio::runtime::Handle::try_current(),
        ) else {
            return;
        };
        runtime.spawn(async move {
            let timeout = me.timeouts.connect;
            let _ = tokio::time::timeout(timeout * 2, me.refresh(Some(Instant::now()))).await;
        });
    }

    /// Reads the slot map (`CLUSTER SLOTS`) and installs it: asked first
    /// of the masters already connected (over their connections), then,
    /// all at once on fresh connections, of every other address the last
    /// map named (masters and replicas) and the seeds; the first map wins.
    /// Each ask is bounded by the connect timeout. With `after`, a map read
    /// since then by another refresh is taken as is.
    pub(crate) async fn refresh(
        &self,
        after: Option<Instant>,
    ) -> Result<Arc<SlotMap>, NodeErrorKind> {
        let _one = self.refreshing.lock().await;
        let old = {
            let topology = self.topology();
            if let (Some(map), Some(at)) = (&topology.map, topology.refreshed) {
                if after.is_none_or(|after| at >= after) {
                    return Ok(Arc::clone(map));
                }
            }
            topology.map.clone()
        };
        let timeout = self.timeouts.connect;
        let mut slots = redis::cmd("CLUSTER");
        slots.arg("SLOTS");
        let known = self.known();
        let mut last = NodeErrorKind::ClusterTopology {
            reason: "no seed answered CLUSTER SLOTS".into(),
        };
        for shard in &known {
            let asked = shard
                .server
                .run_command(&slots, &Settled::NEVER, false, None);
            match tokio::time::timeout(timeout, asked).await {
                Ok(Ok(reply)) => {
                    let host = shard.server.addr().rsplit_once(':').map_or("", |(h, _)| h);
                    if let Some(map) = self.install(&reply, host) {
                        return Ok(map);
                    }
                }
                Ok(Err(e)) => last = e,
                Err(_) => last = NodeErrorKind::Timeout(timeout),
            }
        }
        let named = old
            .iter()
            .flat_map(|map| map.masters.iter().chain(map.replicas()))
            .filter(|addr| !known.iter().any(|s| s.server.addr() == addr.as_str()))
            .filter_map(|addr| self.info_for(addr));
        let mut candidates: Vec<ConnectionInfo> = named.collect();
        candidates.extend(self.seeds.iter().cloned());
        let asks = candidates.into_iter().map(|info| {
            let slots = &slots;
            Box::pin(async move {
                let asked = async {
                    let host = host_of(&info);
                    let client =
                        (self.make)(info).map_err(|e| NodeErrorKind::Connect(Arc::new(e)))?;
                    let mut conn = client
                        .get_multiplexed_async_connection()
                        .await
                        .map_err(|e| classify(e, "HELLO/AUTH"))?;
                    let reply = slots.query_async::<Value>(&mut conn).await.map_err(|e| {
                        if e.to_string().contains("cluster support disabled") {
                            NodeErrorKind::NotCluster
                        } else {
                            classify(e, "CLUSTER")
                        }
                    })?;
                    self.install(&reply, &host)
                        .ok_or_else(|| NodeErrorKind::ClusterTopology {
                            reason: "CLUSTER SLOTS answered with no map".into(),
                        })
                };
                match tokio::time::timeout(timeout, asked).await {
                    Ok(result) => result,
                    Err(_) => Err(NodeErrorKind::Timeout(timeout)),
                }
            })
        });
        let asks: Vec<_> = asks.collect();
        if asks.is_empty() {
            return Err(last);
        }
        futures::future::select_ok(asks).await.map(|(map, _)| map)
    }

    /// The settings of the server at `addr` (`host:port`): the seed's,
    /// with that address.
    fn info_for(&self, addr: &str) -> Option<ConnectionInfo> {
        let (host, port) = addr
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))?;
        let seed = self.seeds.first()?;
        let addr_of = match seed.addr() {
            redis::ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => redis::ConnectionAddr::TcpTls {
                host,
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => redis::ConnectionAddr::Tcp(host, port),
        };
        Some(seed.clone().set_addr(addr_of))
    }

    /// Installs the map `reply` describes; a master that an earlier map
    /// listed as a replica counts as started now.
    fn install(&self, reply: &Value, host: &str) -> Option<Arc<SlotMap>> {
        let map = Arc::new(SlotMap::from_cluster_slots(reply, host)?);
        let promoted = self.topology().install(Arc::clone(&map));
        self.restarted(promoted);
        Some(map)
    }

    /// The restart guard's re-seed for a master of this cluster that was
    /// young (restarted, or a promoted replica) when a fenced vote reached
    /// it, its window over: every fence bucket in its slots is raised to at
    /// least the clock seed, in the background. A replica promoted by a
    /// failover holds the fences it had replicated, which may be behind
    /// what its old master handed out; the clock seed is above every token
    /// issued before under the assumption fences already rest on (no bucket
    /// acquired a million times a second; DESIGN.md, "Fence state"). The
    /// majority read of plain nodes' re-seed is not used: a cluster's fence
    /// buckets live on its other masters' slots, so they cannot stand in.
    fn raise_fences(&self, shard: &Arc<Shard>) {
        let (Some(me), Ok(runtime)) = (self.me.upgrade(), tokio::runtime::Handle::try_current())
        else {
            shard.server.reseed_done(None);
            return;
        };
        let shard = Arc::clone(shard);
        runtime.spawn(async move {
            let server = &shard.server;
            let run_id = server.run_id();
            let map = me.map();
            let (Some(run_id), Some(map)) = (run_id, map) else {
                server.reseed_done(None);
                return;
            };
            let floor = clock_seed().to_string();
            let mine: Vec<Arc<str>> = (0..FENCE_BUCKETS)
                .map(|b| bucket_key(&me.prefix, b))
                .filter(|key| map.master_of(key_slot(key.as_bytes())) == Some(server.addr()))
                .collect();
            let bound = me.timeouts.connect * 4;
            let writes = futures::future::join_all(mine.iter().map(|key| {
                let evalsha = RESEED.evalsha(&[key], &[floor.as_bytes()]);
                async move {
                    server
                        .run_script_prepared(&RESEED, &evalsha, &Settled::NEVER, true, None)
                        .await
                }
            }));
            let done = match tokio::time::timeout(bound, writes).await {
                Ok(replies) => replies.iter().all(Result::is_ok),
                Err(_) => false,
            };
            if done && server.run_id().as_deref() == Some(run_id.as_str()) {
                tracing::info!(node = %server.addr(), keys = mine.len(), "promoted master's fences raised to the clock seed");
                server.reseed_done(Some(run_id));
            } else {
                tracing::warn!(node = %server.addr(), "raising a promoted master's fences failed; retried on the next vote");
                server.reseed_done(None);
            }
        });
    }

    /// Every master's server, for the audit and the subscriptions.
    pub(crate) fn servers(&self) -> Vec<Arc<Server>> {
        let Some(map) = self.map() else {
            return Vec::new();
        };
        map.masters
            .iter()
            .filter(|m| map.slots_of(m).next().is_some())
            .filter_map(|m| self.shard(m).ok())
            .map(|s| Arc::clone(&s.server))
            .collect()
    }

    pub(crate) fn timeouts(&self) -> NodeTimeouts {
        self.timeouts
    }

    /// The seed settings, for the subscription's cluster connection.
    pub(crate) fn seeds(&self) -> &[ConnectionInfo] {
        &self.seeds
    }

    /// A client of the first seed (the audit visits it when no map can be
    /// read).
    pub(crate) fn seed_client(&self) -> Option<redis::Client> {
        (self.make)(self.seeds.first()?.clone()).ok()
    }

    /// The client's TLS settings, if any.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    pub(crate) fn tls(&self) -> Option<&Tls> {
        self.tls.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::slot::tests::range;

    fn map(ranges: Vec<Value>) -> Arc<SlotMap> {
        Arc::new(SlotMap::from_cluster_slots(&Value::Array(ranges), "h").unwrap())
    }

    /// A master serving slots that the previous map did not list as one
    /// counts as new, once; the first map names nobody.
    #[test]
    fn a_new_master_is_named_once() {
        let mut topology = Topology::default();
        let first = map(vec![
            range(0, 8000, "h", 7000),
            range(8001, 16383, "h", 7001),
        ]);
        assert!(topology.install(first).is_empty());
        // 7100 (a replica of 7000) serves 7000's slots now.
        let after = map(vec![
            range(0, 8000, "h", 7100),
            range(8001, 16383, "h", 7001),
        ]);
        assert_eq!(
            topology.install(Arc::clone(&after)),
            vec!["h:7100".to_owned()]
        );
        assert!(topology.install(after).is_empty(), "named twice");
        // Slots moving between masters that served slots before: nobody.
        let resharded = map(vec![range(0, 100, "h", 7001), range(101, 16383, "h", 7100)]);
        assert!(topology.install(resharded).is_empty());
        // 7000 back as a master, after a time as a replica: new again.
        let back = map(vec![range(0, 100, "h", 7000), range(101, 16383, "h", 7100)]);
        assert_eq!(topology.install(back), vec!["h:7000".to_owned()]);
    }
}
