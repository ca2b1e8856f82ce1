//! Real Redis Clusters on 127.0.0.1, for tests of the cluster mode.
//!
//! [`RedisCluster::start`] runs `masters * (1 + replicas)` `redis-server`
//! processes (each a [`RedisServer`], so a test can kill, pause, resume and
//! restart any of them), joins them with `redis-cli --cluster create`, and
//! returns once every node agrees on who owns all 16384 slots. Slots move
//! through `redis-cli --cluster reshard` ([`RedisCluster::reshard`], also in
//! the background while load runs) or by hand in two halves
//! ([`RedisCluster::migrate_slot_begin`] leaves the slot migrating, so
//! clients get `ASK`; [`RedisCluster::migrate_slot_finish`] completes it).
//! Roles change through [`RedisCluster::failover`] (manual) and
//! [`RedisCluster::kill_master_and_wait_failover`] (a crash).
//!
//! Every wait is bounded and polls every 50 ms; a wait that runs out panics
//! naming what it waited for and what was last wrong.
//!
//! The harness reads the cluster over its own RESP connections (not
//! `RedisServer::cli`, whose rendering flattens the nested replies of
//! `CLUSTER SLOTS`, and not the crate under test, so a test's view of the
//! topology cannot share the library's bugs). `redis-cli` comes from `PATH`
//! (Debian's `redis-tools`, which `redis-server` depends on) or
//! `REDIS_CLI_BIN`.
//!
//! [`RedisCluster::start_tls`] starts the same cluster TLS only: every node
//! with `--port 0 --tls-port P`, TLS on the cluster bus and replication
//! links too (`tls-cluster`, `tls-replication`), `redis-cli` run with
//! `--tls`. The harness then queries each node over its Unix socket (which
//! `RedisServer` opens for every TLS server), so it needs no TLS client of
//! its own; the nodes still announce their TLS ports, which is what
//! [`RedisCluster::seed_url`] (`rediss+cluster://`) and the topology
//! queries report.
//!
//! Nodes use `cluster-port` for their bus port (a second reserved free
//! port) rather than the default `port + 10000`, which overflows for ports
//! the kernel hands out. Roles change only when a test asks:
//! `cluster-allow-replica-migration no`, and `cluster-replica-validity-factor
//! 0` so a replica takes over however long it was cut off (e.g. after a
//! test paused it).

// Each includer uses a different subset.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use super::process::{self, ReservedPort, TempDir};
use super::server::{
    encode, protocol_error, read_reply, RedisServer, Reply, ServerOptions, ServerTls,
};

/// Number of hash slots of every Redis Cluster.
pub const SLOTS: usize = 16384;
/// Small so that failure detection, and with it failover, takes about a
/// second or two instead of the default 15.
pub const NODE_TIMEOUT_MS: u64 = 1000;
/// Bounds every wait for the topology to settle (start, reshard, failover).
const STABLE_TIMEOUT: Duration = Duration::from_secs(30);
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Bounds one `redis-cli --cluster create` or `reshard` run.
const REDIS_CLI_TIMEOUT: Duration = Duration::from_secs(60);
/// Bounds each of the harness's own commands, so a paused node fails a
/// poll instead of hanging it.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);
/// `CLUSTER FAILOVER` is given up by Redis after 5 s (`CLUSTER_MF_TIMEOUT`);
/// the harness asks again after this long.
const MANUAL_FAILOVER_RETRY: Duration = Duration::from_secs(6);
/// A bus port lost to another process makes `RedisServer::start_with`
/// panic after its own retries (which only change the client port).
const BUS_PORT_ATTEMPTS: usize = 3;

/// The `redis-cli` binary: `REDIS_CLI_BIN`, else `redis-cli` from `PATH`.
/// Like [`super::server::redis_server_bin`], missing means fail, never skip.
pub fn redis_cli_bin() -> String {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| process::checked_bin("REDIS_CLI_BIN", "redis-cli", "redis-tools"))
        .clone()
}

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0, no reflection),
/// the checksum Redis Cluster hashes keys with.
pub fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The hash slot of `key`: CRC16 mod 16384 of the hash tag if there is one
/// (the bytes between the first `{` and the first `}` after it, when not
/// empty), else of the whole key.
pub fn slot_of(key: &str) -> u16 {
    slot_of_bytes(key.as_bytes())
}

/// [`slot_of`] for keys that are not UTF-8.
pub fn slot_of_bytes(key: &[u8]) -> u16 {
    let mut hashed = key;
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                hashed = &key[open + 1..open + 1 + len];
            }
        }
    }
    crc16(hashed) % SLOTS as u16
}

/// A hash tag (braces included) whose keys all land in `slot`: any key
/// starting with it, e.g. `format!("{}lock", tag_for_slot(7))`.
pub fn tag_for_slot(slot: u16) -> String {
    assert!(usize::from(slot) < SLOTS, "slot {slot} out of range");
    (0u64..)
        .map(|n| format!("{{t{n}}}"))
        .find(|tag| slot_of(tag) == slot)
        .expect("every slot has a tag")
}

/// One line of `CLUSTER NODES`, as seen by the node that was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    pub id: String,
    /// 0 for a node whose address is not known yet (`noaddr`).
    pub port: u16,
    /// E.g. `myself`, `master`, `slave`, `fail?`, `fail`, `handshake`.
    pub flags: Vec<String>,
    /// The master's id, for a replica.
    pub master_id: Option<String>,
    /// Owned slot ranges, inclusive; open migrations (`[slot->-id]`,
    /// `[slot-<-id]`) are not listed.
    pub slots: Vec<(u16, u16)>,
    /// Whether the asking node's bus link to this node is up.
    pub connected: bool,
}

impl ClusterNode {
    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    pub fn is_master(&self) -> bool {
        self.has_flag("master")
    }

    pub fn is_replica(&self) -> bool {
        self.has_flag("slave")
    }

    /// Marked failed by the cluster (`fail`), not merely suspected by the
    /// asking node (`fail?`).
    pub fn is_failed(&self) -> bool {
        self.has_flag("fail")
    }

    pub fn slot_count(&self) -> usize {
        self.slots
            .iter()
            .map(|&(a, b)| usize::from(b) - usize::from(a) + 1)
            .sum()
    }

    fn parse(line: &str) -> Option<ClusterNode> {
        let mut fields = line.split_whitespace();
        let id = fields.next()?.to_owned();
        let addr = fields.next()?;
        let flags = fields.next()?.split(',').map(str::to_owned).collect();
        let master = fields.next()?;
        let (_ping, _pong, _epoch) = (fields.next()?, fields.next()?, fields.next()?);
        let link = fields.next()?;
        // ip:port@cport[,hostname]; the ip may be empty (noaddr).
        let host_port = addr.split('@').next()?;
        let port = host_port.rsplit_once(':')?.1.parse().unwrap_or(0);
        let slots = fields
            .filter(|s| !s.starts_with('['))
            .map(|s| match s.split_once('-') {
                Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                None => s.parse().ok().map(|a| (a, a)),
            })
            .collect::<Option<Vec<_>>>()?;
        Some(ClusterNode {
            id,
            port,
            flags,
            master_id: (master != "-").then(|| master.to_owned()),
            slots,
            connected: link == "connected",
        })
    }
}

/// A Redis Cluster of real `redis-server` processes on 127.0.0.1, all
/// killed and their files removed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    // Dropped in this order (after `Drop::drop` killed the processes): the
    // servers (each removing its own directory), the bus ports, then the
    // directory with the cluster config files and redis-cli logs.
    nodes: Vec<RedisServer>,
    bus_ports: Vec<ReservedPort>,
    dir: TempDir,
    /// Numbers the redis-cli log files.
    runs: AtomicUsize,
    /// Set by [`Self::start_tls`]: every node's TLS, which `redis-cli` also
    /// uses (its files are in `dir`).
    tls: Option<ServerTls>,
}

impl RedisCluster {
    /// `masters` (at least 3, as `redis-cli --cluster create` requires)
    /// masters sharing the 16384 slots evenly, each with
    /// `replicas_per_master` replicas. Returns once every node reports
    /// `cluster_state:ok`, knows every other node, agrees on the owner of
    /// every slot, and every replica's link to its master is up.
    pub fn start(masters: usize, replicas_per_master: usize) -> RedisCluster {
        RedisCluster::create(masters, replicas_per_master, None)
    }

    /// [`Self::start`], TLS only: every node listens on its TLS port alone
    /// (`--port 0 --tls-port P`, no plain TCP port), with `tls`'s
    /// certificate, key and CA, `tls-auth-clients` as `tls.auth_clients`
    /// says, and TLS on the cluster bus (`tls-cluster yes`) and on the
    /// replication links (`tls-replication yes`). `redis-cli --cluster`
    /// runs with `--tls --cacert --cert --key` (the nodes' own files).
    ///
    /// The certificate must be valid for client authentication too (e.g.
    /// `certs().cluster_node(..)`): the nodes present it to each other, and
    /// the cluster bus always asks for a client certificate.
    ///
    /// [`Self::seed_url`] is then `rediss+cluster://127.0.0.1:P`,
    /// [`Self::seed_urls`] are `rediss://` URLs, and every other method
    /// works as on a plain cluster: the harness reaches the nodes through
    /// their Unix sockets.
    pub fn start_tls(masters: usize, replicas_per_master: usize, tls: &ServerTls) -> RedisCluster {
        RedisCluster::create(masters, replicas_per_master, Some(tls))
    }

    /// Whether the nodes are TLS only ([`Self::start_tls`]).
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The nodes' TLS settings, for a cluster from [`Self::start_tls`].
    pub fn tls(&self) -> Option<&ServerTls> {
        self.tls.as_ref()
    }

    fn create(masters: usize, replicas_per_master: usize, tls: Option<&ServerTls>) -> RedisCluster {
        assert!(
            masters >= 3,
            "redis-cli --cluster create needs at least 3 masters, asked for {masters}"
        );
        let dir = TempDir::new("cluster");
        fs::create_dir_all(dir.path())
            .unwrap_or_else(|e| panic!("creating {}: {e}", dir.path().display()));
        let mut cluster = RedisCluster {
            nodes: Vec::new(),
            bus_ports: Vec::new(),
            dir,
            runs: AtomicUsize::new(0),
            tls: tls.cloned(),
        };
        cluster.write_tls_files();
        let total = masters * (1 + replicas_per_master);
        for _ in 0..total {
            let (server, bus) = cluster.start_node();
            cluster.nodes.push(server);
            cluster.bus_ports.push(bus);
        }
        let mut args = vec!["--cluster".to_owned(), "create".to_owned()];
        args.extend(cluster.ports().iter().map(|p| format!("127.0.0.1:{p}")));
        args.extend([
            "--cluster-replicas".to_owned(),
            replicas_per_master.to_string(),
            "--cluster-yes".to_owned(),
        ]);
        // A node certificate not valid for client authentication makes
        // every bus handshake fail: redis-cli then waits for the join until
        // killed.
        let tls_hint = if cluster.is_tls() {
            " (TLS: the nodes' certificate must also be valid for client authentication, \
             which the cluster bus and the replication links check)"
        } else {
            ""
        };
        let mut run = cluster.spawn_redis_cli("create", &args);
        run.what.push_str(tls_hint);
        run.finish();
        let ports = cluster.ports();
        let what = format!(
            "cluster of {masters} masters x {replicas_per_master} replicas (ports {ports:?}) \
             to be ok, fully joined and agreed on all slots{tls_hint}"
        );
        wait_joined(&what, &ports, masters, total);
        cluster
    }

    /// `masters` masters (at least 1) without replicas, joined by hand for
    /// the sizes `redis-cli --cluster create` refuses (1 and 2): nodes
    /// started as by [`Self::start`], each given a contiguous, even share
    /// of the 16384 slots (`CLUSTER ADDSLOTSRANGE`), the others introduced
    /// to the first by `CLUSTER MEET` with its bus port. Returns once every
    /// node reports `cluster_state:ok` (a master waits about 2 s after its
    /// start before it does), knows every other node, and all agree on the
    /// owner of every slot.
    pub fn start_small(masters: usize) -> RedisCluster {
        assert!(masters >= 1, "a cluster needs at least one master");
        let dir = TempDir::new("cluster");
        fs::create_dir_all(dir.path())
            .unwrap_or_else(|e| panic!("creating {}: {e}", dir.path().display()));
        let mut cluster = RedisCluster {
            nodes: Vec::new(),
            bus_ports: Vec::new(),
            dir,
            runs: AtomicUsize::new(0),
            tls: None,
        };
        for _ in 0..masters {
            let (server, bus) = cluster.start_node();
            cluster.nodes.push(server);
            cluster.bus_ports.push(bus);
        }
        let ports = cluster.ports();
        for (i, &port) in ports.iter().enumerate() {
            let first = (i * SLOTS / masters).to_string();
            let last = ((i + 1) * SLOTS / masters - 1).to_string();
            expect_ok(port, &["CLUSTER", "ADDSLOTSRANGE", &first, &last]);
        }
        let seed = ports[0].to_string();
        let seed_bus = cluster.bus_ports[0].get().to_string();
        for &port in &ports[1..] {
            expect_ok(port, &["CLUSTER", "MEET", "127.0.0.1", &seed, &seed_bus]);
        }
        let what = format!(
            "hand-joined cluster of {masters} masters (ports {ports:?}) to be ok, fully \
             joined and agreed on all slots"
        );
        wait_joined(&what, &ports, masters, masters);
        cluster
    }

    /// One node, with a bus port of its own; a lost bus port is retried on
    /// a fresh one (see [`BUS_PORT_ATTEMPTS`]).
    fn start_node(&self) -> (RedisServer, ReservedPort) {
        for attempt in 1..=BUS_PORT_ATTEMPTS {
            let bus = ReservedPort::pick();
            let conf = self.dir.join(&format!("nodes-{}.conf", bus.get()));
            let mut opts = ServerOptions {
                extra_args: [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &conf.display().to_string(),
                    "--cluster-port",
                    &bus.get().to_string(),
                    "--cluster-node-timeout",
                    &NODE_TIMEOUT_MS.to_string(),
                    "--cluster-replica-validity-factor",
                    "0",
                    "--cluster-allow-replica-migration",
                    "no",
                    // A full sync (new replica, restarted node) starts at
                    // once instead of after the default 5 s.
                    "--repl-diskless-sync-delay",
                    "0",
                ]
                .map(str::to_owned)
                .to_vec(),
                ..ServerOptions::default()
            };
            if let Some(tls) = &self.tls {
                opts.tls = Some(tls.clone());
                opts.extra_args.extend(
                    ["--tls-cluster", "yes", "--tls-replication", "yes"].map(str::to_owned),
                );
            }
            match panic::catch_unwind(AssertUnwindSafe(|| RedisServer::start_with(opts))) {
                Ok(server) => {
                    if self.tls.is_some() {
                        register_socket(&server);
                    }
                    return (server, bus);
                }
                Err(_) if attempt < BUS_PORT_ATTEMPTS => {
                    let bus = bus.get();
                    eprintln!(
                        "cluster node (bus port {bus}) failed to start; trying another bus port"
                    );
                    let _ = fs::remove_file(&conf);
                }
                Err(e) => panic::resume_unwind(e),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// Every node's client port, in start order (whatever its role now).
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(RedisServer::port).collect()
    }

    /// Ports of the nodes whose process is running (paused ones included).
    pub fn running_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.is_running())
            .map(RedisServer::port)
            .collect()
    }

    /// The process on `port`, to kill, pause, resume or restart it.
    /// Panics if no node of this cluster has that port.
    pub fn node(&mut self, port: u16) -> &mut RedisServer {
        let known = self.ports();
        self.nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port} (nodes: {known:?})"))
    }

    /// The node on `port`, e.g. for [`RedisServer::cli`].
    pub fn server(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port} (nodes: {:?})", self.ports()))
    }

    /// `redis+cluster://127.0.0.1:P`, P the first of [`Self::master_ports`]
    /// (`rediss+cluster://` for a cluster from [`Self::start_tls`]).
    pub fn seed_url(&self) -> String {
        let port = *self
            .master_ports()
            .first()
            .expect("the cluster has no live master");
        format!("{}+cluster://127.0.0.1:{port}", self.scheme())
    }

    /// `redis://127.0.0.1:P` for every master (`rediss://` for a cluster
    /// from [`Self::start_tls`]).
    pub fn seed_urls(&self) -> Vec<String> {
        self.master_ports()
            .into_iter()
            .map(|p| format!("{}://127.0.0.1:{p}", self.scheme()))
            .collect()
    }

    fn scheme(&self) -> &'static str {
        if self.is_tls() {
            "rediss"
        } else {
            "redis"
        }
    }

    /// The masters now, in start order, as `CLUSTER NODES` of the first
    /// live node tells: nodes flagged `master` and not `fail` (a master
    /// only suspected, `fail?`, still counts).
    pub fn master_ports(&self) -> Vec<u16> {
        self.ports_where(|n| n.is_master() && !n.is_failed())
    }

    /// The replicas now, in start order (see [`Self::master_ports`]).
    pub fn replica_ports(&self) -> Vec<u16> {
        self.ports_where(|n| n.is_replica() && !n.is_failed())
    }

    /// The replicas of the master on `master_port`, in start order.
    pub fn replicas_of(&self, master_port: u16) -> Vec<u16> {
        let id = self.node_id(master_port);
        self.ports_where(|n| n.is_replica() && !n.is_failed() && n.master_id.as_ref() == Some(&id))
    }

    /// The port of the master that the replica on `replica_port` follows.
    pub fn master_of(&self, replica_port: u16) -> u16 {
        let nodes = self.nodes_view();
        let replica = find_port(&nodes, replica_port);
        let master_id = replica
            .master_id
            .as_ref()
            .unwrap_or_else(|| panic!("node {replica_port} is not a replica: {replica:?}"));
        nodes
            .iter()
            .find(|n| &n.id == master_id)
            .unwrap_or_else(|| panic!("master {master_id} of {replica_port} unknown: {nodes:?}"))
            .port
    }

    fn ports_where(&self, keep: impl Fn(&ClusterNode) -> bool) -> Vec<u16> {
        let nodes = self.nodes_view();
        self.ports()
            .into_iter()
            .filter(|&p| nodes.iter().any(|n| n.port == p && keep(n)))
            .collect()
    }

    /// `CLUSTER NODES` of the first node (in start order) that answers.
    pub fn nodes_view(&self) -> Vec<ClusterNode> {
        self.ask_live("CLUSTER NODES", cluster_nodes)
    }

    /// The cluster id of the node on `port` (known to the others even while
    /// that node is down).
    pub fn node_id(&self, port: u16) -> String {
        find_port(&self.nodes_view(), port).id.clone()
    }

    /// [`slot_of`], for callers that have the type at hand.
    pub fn slot_of(key: &str) -> u16 {
        slot_of(key)
    }

    /// The port of the master owning `slot`, from `CLUSTER SLOTS` of the
    /// first live node. During a migration that is still the source.
    pub fn owner_of_slot(&self, slot: u16) -> u16 {
        self.slot_owners()[usize::from(slot)]
            .unwrap_or_else(|| panic!("slot {slot} is not covered"))
    }

    /// Owner port of every slot (index = slot; `None`: uncovered), from
    /// `CLUSTER SLOTS` of the first live node.
    pub fn slot_owners(&self) -> Vec<Option<u16>> {
        self.ask_live("CLUSTER SLOTS", slot_owners)
    }

    /// The slots the master on `port` owns, ascending.
    pub fn slots_of(&self, port: u16) -> Vec<u16> {
        (0u16..)
            .zip(self.slot_owners())
            .filter(|&(_, owner)| owner == Some(port))
            .map(|(slot, _)| slot)
            .collect()
    }

    /// Asks the running nodes in start order until one answers.
    fn ask_live<T>(&self, what: &str, ask: impl Fn(u16) -> io::Result<T>) -> T {
        let mut errors = Vec::new();
        for port in self.running_ports() {
            match ask(port) {
                Ok(v) => return v,
                Err(e) => errors.push(format!("{port}: {e}")),
            }
        }
        panic!("{what}: no cluster node answered ({errors:?})")
    }

    /// Waits (30 s at most) until every running node that answers reports
    /// `cluster_state:ok` and the same owner for each of the 16384 slots,
    /// and every replica among them has `master_link_status:up`. For after
    /// a test changed the topology itself (e.g. restarted a node).
    pub fn wait_consistent(&self) {
        let ports = self.running_ports();
        wait_until(
            &format!("cluster nodes {ports:?} to be ok and agree on all slots"),
            || consistency(&ports).map(drop),
        );
    }

    /// Like [`Self::wait_consistent`], but returns what is wrong instead of
    /// waiting.
    pub fn check_consistent(&self) -> Result<(), String> {
        consistency(&self.running_ports()).map(drop)
    }

    /// Moves `slots` slots from the master on `from_port` to the one on
    /// `to_port` with `redis-cli --cluster reshard`, and returns once the
    /// cluster is consistent again.
    pub fn reshard(&self, from_port: u16, to_port: u16, slots: usize) {
        self.reshard_in_background(from_port, to_port, slots).wait();
    }

    /// [`Self::reshard`] without waiting: the test runs load meanwhile and
    /// calls [`Reshard::wait`]. Waits for a consistent cluster first, since
    /// redis-cli refuses to reshard one with open slots or disagreements.
    pub fn reshard_in_background(&self, from_port: u16, to_port: u16, slots: usize) -> Reshard {
        self.wait_consistent();
        let nodes = self.nodes_view();
        let from = find_port(&nodes, from_port).id.clone();
        let to = find_port(&nodes, to_port).id.clone();
        let entry = self
            .master_ports()
            .into_iter()
            .find(|&p| ping(p))
            .expect("no live master to run redis-cli --cluster reshard against");
        let args = [
            "--cluster".to_owned(),
            "reshard".to_owned(),
            format!("127.0.0.1:{entry}"),
            "--cluster-from".to_owned(),
            from,
            "--cluster-to".to_owned(),
            to,
            "--cluster-slots".to_owned(),
            slots.to_string(),
            "--cluster-yes".to_owned(),
        ];
        let mut run = self.spawn_redis_cli("reshard", &args);
        run.what = format!("reshard of {slots} slots from {from_port} to {to_port}");
        Reshard {
            run,
            ports: self.ports(),
        }
    }

    /// First half of a manual migration of `slot` from the master on
    /// `from_port` to the one on `to_port`: the slot is marked importing on
    /// the target and migrating on the source, and the keys it holds now are
    /// moved. The source then answers `ASK` for keys of the slot it does not
    /// have (all of them, unless written since), and the target serves them
    /// after `ASKING`. `CLUSTER SLOTS` still names the source.
    pub fn migrate_slot_begin(&self, slot: u16, from_port: u16, to_port: u16) {
        self.migrate_slot_open(slot, from_port, to_port);
        self.migrate_slot_keys(slot, from_port, to_port);
    }

    /// Only the state change of [`Self::migrate_slot_begin`], keys left
    /// where they are: the source keeps serving the keys it has and answers
    /// `ASK` for the others.
    pub fn migrate_slot_open(&self, slot: u16, from_port: u16, to_port: u16) {
        let owner = self.owner_of_slot(slot);
        assert_eq!(
            owner, from_port,
            "migrating slot {slot} from {from_port}, but {owner} owns it"
        );
        let from = self.node_id(from_port);
        let to = self.node_id(to_port);
        let slot = slot.to_string();
        expect_ok(to_port, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from]);
        expect_ok(from_port, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to]);
    }

    /// Moves every key of `slot` from `from_port` to `to_port` with
    /// `MIGRATE ... KEYS` (the slot must be migrating); returns how many.
    pub fn migrate_slot_keys(&self, slot: u16, from_port: u16, to_port: u16) -> usize {
        let slot_arg = slot.to_string();
        let to_arg = to_port.to_string();
        let mut moved = 0;
        loop {
            let keys = match command(from_port, &["CLUSTER", "GETKEYSINSLOT", &slot_arg, "100"]) {
                Reply::Array(Some(keys)) => keys,
                other => panic!("{from_port}: CLUSTER GETKEYSINSLOT {slot}: {other:?}"),
            };
            if keys.is_empty() {
                return moved;
            }
            let mut args: Vec<Vec<u8>> = ["MIGRATE", "127.0.0.1", &to_arg, "", "0", "5000", "KEYS"]
                .iter()
                .map(|a| a.as_bytes().to_vec())
                .collect();
            for key in &keys {
                match key {
                    Reply::Bulk(Some(k)) => args.push(k.clone()),
                    other => panic!("{from_port}: CLUSTER GETKEYSINSLOT {slot}: key {other:?}"),
                }
            }
            match command(from_port, &args) {
                Reply::Simple(s) if s == "OK" || s == "NOKEY" => moved += keys.len(),
                other => panic!("{from_port}: MIGRATE of slot {slot} to {to_port}: {other:?}"),
            }
        }
    }

    /// Second half of a manual migration: moves any keys still on the
    /// source, assigns the slot to the target (on the target first, then
    /// the source, then the other masters), and returns once every node
    /// agrees that the target owns it.
    pub fn migrate_slot_finish(&self, slot: u16, from_port: u16, to_port: u16) {
        self.migrate_slot_keys(slot, from_port, to_port);
        let to = self.node_id(to_port);
        let slot_arg = slot.to_string();
        let mut order = vec![to_port, from_port];
        order.extend(
            self.master_ports()
                .into_iter()
                .filter(|&p| p != to_port && p != from_port),
        );
        for port in order {
            expect_ok(port, &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to]);
        }
        let ports = self.running_ports();
        wait_until(
            &format!("slot {slot} to belong to {to_port} on all of {ports:?}"),
            || {
                let view = consistency(&ports)?;
                match view.owners[usize::from(slot)] {
                    Some(p) if p == to_port => Ok(()),
                    other => Err(format!("slot {slot} owned by {other:?}")),
                }
            },
        );
    }

    /// `CLUSTER FAILOVER` on the replica on `replica_port` (asked again if
    /// Redis gives up on it), and waits until that node is a master that
    /// owns its old master's slots in every node's view, and the cluster is
    /// consistent (see [`Self::wait_consistent`]; the old master then
    /// replicates from it).
    pub fn failover(&self, replica_port: u16) {
        let old_master = self.master_of(replica_port);
        let ports = self.running_ports();
        let mut asked: Option<Instant> = None;
        wait_until(
            &format!("replica {replica_port} to take over from {old_master} (CLUSTER FAILOVER)"),
            || {
                if asked.is_none_or(|at| at.elapsed() >= MANUAL_FAILOVER_RETRY)
                    && role(replica_port)? != "master"
                {
                    match query(replica_port, &["CLUSTER", "FAILOVER"], QUERY_TIMEOUT) {
                        Ok(Reply::Simple(ok)) if ok == "OK" => {}
                        other => return Err(format!("CLUSTER FAILOVER: {other:?}")),
                    }
                    asked = Some(Instant::now());
                }
                promoted(replica_port, &ports)
            },
        );
    }

    /// SIGKILLs the master on `master_port` and waits (30 s at most) until
    /// one of its replicas has been elected in its place and the running
    /// nodes are consistent again (see [`Self::wait_consistent`]). Returns
    /// the new master's port. The killed node stays down; restarting it
    /// (`node(port).restart()`) makes it a replica of the new master.
    pub fn kill_master_and_wait_failover(&mut self, master_port: u16) -> u16 {
        let nodes = self.nodes_view();
        let master = find_port(&nodes, master_port);
        assert!(
            master.is_master() && !master.slots.is_empty(),
            "node {master_port} is not a master with slots, so no replica would take over: {master:?}"
        );
        let candidates = self.replicas_of(master_port);
        assert!(
            !candidates.is_empty(),
            "master {master_port} has no replica to take over"
        );
        self.node(master_port).kill();
        let ports = self.running_ports();
        wait_until(
            &format!(
                "a replica of killed master {master_port} (one of {candidates:?}) to take over"
            ),
            || {
                let mut last = String::new();
                for &candidate in &candidates {
                    match promoted(candidate, &ports) {
                        Ok(()) => return Ok(candidate),
                        Err(e) => last = format!("{candidate}: {e}"),
                    }
                }
                Err(last)
            },
        )
    }

    /// The PEM files of [`Self::start_tls`]'s TLS for `redis-cli`, in the
    /// cluster's directory (nothing for a plain cluster).
    fn write_tls_files(&self) {
        let Some(tls) = &self.tls else {
            return;
        };
        for (name, pem) in [
            ("tls.crt", &tls.cert_pem),
            ("tls.key", &tls.key_pem),
            ("ca.crt", &tls.ca_pem),
        ] {
            let path = self.dir.join(name);
            fs::write(&path, pem).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        }
    }

    /// `--tls --cacert --cert --key` for a cluster from [`Self::start_tls`]
    /// (the nodes' own certificate, valid for client authentication too),
    /// nothing for a plain one.
    fn redis_cli_tls_args(&self) -> Vec<String> {
        if self.tls.is_none() {
            return Vec::new();
        }
        let file = |name: &str| self.dir.join(name).display().to_string();
        vec![
            "--tls".to_owned(),
            "--cacert".to_owned(),
            file("ca.crt"),
            "--cert".to_owned(),
            file("tls.crt"),
            "--key".to_owned(),
            file("tls.key"),
        ]
    }

    /// Starts `redis-cli ARGS` with its output in a log file of its own.
    fn spawn_redis_cli(&self, kind: &str, args: &[String]) -> RedisCli {
        let n = self.runs.fetch_add(1, Ordering::Relaxed);
        let log = self.dir.join(&format!("redis-cli-{kind}-{n}.log"));
        let mut cmd = Command::new(redis_cli_bin());
        cmd.args(self.redis_cli_tls_args());
        cmd.args(args);
        let child = process::spawn_logged(&mut cmd, &log);
        RedisCli {
            child: Some(child),
            log,
            what: format!("redis-cli {}", args.join(" ")),
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        // Every process dies (and is reaped) before the fields drop and the
        // directories are removed.
        for node in &mut self.nodes {
            node.kill();
        }
        if self.tls.is_some() {
            let mut sockets = tls_sockets();
            for node in &self.nodes {
                sockets.remove(&node.port());
            }
        }
    }
}

/// A running `redis-cli` (killed on drop if still running).
#[derive(Debug)]
struct RedisCli {
    child: Option<Child>,
    log: PathBuf,
    what: String,
}

impl RedisCli {
    /// Waits for a successful exit (bounded), else panics with the output.
    fn finish(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let status = process::wait_timeout(&mut child, REDIS_CLI_TIMEOUT);
        let output = || process::read_from(&self.log, 0);
        let Some(status) = status else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{} still running after {REDIS_CLI_TIMEOUT:?}; killed\n{}",
                self.what,
                output()
            );
        };
        let out = output();
        assert!(
            status.success() && !out.contains("[ERR]"),
            "{} failed ({status})\n{out}",
            self.what
        );
    }

    fn is_finished(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| !matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for RedisCli {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A `redis-cli --cluster reshard` running in the background
/// ([`RedisCluster::reshard_in_background`]); killed if dropped unwaited.
/// Independent of the cluster's borrow, so the test may still kill or pause
/// nodes meanwhile.
#[derive(Debug)]
pub struct Reshard {
    run: RedisCli,
    ports: Vec<u16>,
}

impl Reshard {
    /// True once redis-cli has exited (successfully or not).
    pub fn is_finished(&mut self) -> bool {
        self.run.is_finished()
    }

    /// Waits for redis-cli (60 s at most) and panics with its output unless
    /// it succeeded, then waits until the nodes that still accept
    /// connections are consistent (see [`RedisCluster::wait_consistent`]).
    pub fn wait(mut self) {
        self.run.finish();
        let ports = self.ports.clone();
        wait_until(
            &format!("{}: cluster nodes {ports:?} to agree again", self.run.what),
            || consistency(&ports).map(drop),
        );
    }
}

/// What the answering nodes agreed on.
struct View {
    /// Owner port of every slot (index = slot).
    owners: Vec<Option<u16>>,
    /// The ports that answered.
    live: Vec<u16>,
}

/// `Ok` when every node of `ports` that answers (one refusing connections
/// is down and skipped; any other failure counts against it) reports
/// `cluster_state:ok`, covers all slots in `CLUSTER SLOTS` with the same
/// owners as the others, sees the same nodes in the same roles in `CLUSTER
/// NODES` (master or replica of whom, failed or not), and, as a replica,
/// has `master_link_status:up`.
fn consistency(ports: &[u16]) -> Result<View, String> {
    let mut first: Option<(u16, Vec<Option<u16>>, Vec<Role>)> = None;
    let mut live = Vec::new();
    for &port in ports {
        let info = match text(port, &["CLUSTER", "INFO"]) {
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
            other => other.map_err(|e| format!("{port}: CLUSTER INFO: {e}"))?,
        };
        live.push(port);
        if field(&info, "cluster_state") != Some("ok") {
            return Err(format!("{port}: cluster_state is not ok"));
        }
        let owners = slot_owners(port).map_err(|e| format!("{port}: CLUSTER SLOTS: {e}"))?;
        if let Some(slot) = owners.iter().position(Option::is_none) {
            return Err(format!("{port}: slot {slot} not covered"));
        }
        let nodes = cluster_nodes(port).map_err(|e| format!("{port}: CLUSTER NODES: {e}"))?;
        let roles = roles(&nodes);
        match &first {
            None => first = Some((port, owners, roles)),
            Some((first, seen_owners, seen_roles)) => {
                if let Some(slot) = (0..SLOTS).find(|&s| seen_owners[s] != owners[s]) {
                    return Err(format!(
                        "slot {slot}: {first} says {:?}, {port} says {:?}",
                        seen_owners[slot], owners[slot]
                    ));
                }
                if *seen_roles != roles {
                    return Err(format!(
                        "roles: {first} says {seen_roles:?}, {port} says {roles:?}"
                    ));
                }
            }
        }
        let replication =
            text(port, &["INFO", "replication"]).map_err(|e| format!("{port}: INFO: {e}"))?;
        if field(&replication, "role") == Some("slave")
            && field(&replication, "master_link_status") != Some("up")
        {
            return Err(format!("{port}: replica's master link is not up"));
        }
    }
    let (_, owners, _) = first.ok_or_else(|| format!("none of {ports:?} answers"))?;
    Ok(View { owners, live })
}

/// A node's role as one node sees it: port, master (or replica of which
/// port), failed; what all nodes must agree on.
type Role = (u16, Option<u16>, bool);

/// Sorted by port. `fail?` (one node's suspicion) is not compared, `fail`
/// (the cluster's verdict) is.
fn roles(nodes: &[ClusterNode]) -> Vec<Role> {
    let port_of = |id: &String| nodes.iter().find(|n| &n.id == id).map_or(0, |n| n.port);
    let mut roles: Vec<Role> = nodes
        .iter()
        .map(|n| {
            let master = n.master_id.as_ref().filter(|_| n.is_replica()).map(port_of);
            (n.port, master, n.is_failed())
        })
        .collect();
    roles.sort_unstable();
    roles
}

/// `Ok` once `port` calls itself a master, owns slots in every node's view,
/// and the nodes of `ports` are consistent.
fn promoted(port: u16, ports: &[u16]) -> Result<(), String> {
    let role = role(port)?;
    if role != "master" {
        return Err(format!("{port} is still a {role}"));
    }
    let view = consistency(ports)?;
    if !view.owners.contains(&Some(port)) {
        return Err(format!("{port} owns no slot yet"));
    }
    Ok(())
}

/// `role:` of `INFO replication`: `master` or `slave`.
fn role(port: u16) -> Result<String, String> {
    let info = text(port, &["INFO", "replication"]).map_err(|e| format!("{port}: INFO: {e}"))?;
    field(&info, "role")
        .map(str::to_owned)
        .ok_or_else(|| format!("{port}: no role in INFO replication"))
}

fn find_port(nodes: &[ClusterNode], port: u16) -> &ClusterNode {
    nodes
        .iter()
        .find(|n| n.port == port)
        .unwrap_or_else(|| panic!("no node on port {port} in CLUSTER NODES: {nodes:?}"))
}

/// The value of `name:value` in an `INFO`-style text.
fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// Polls `check` every 50 ms for 30 s at most; panics naming `what` and the
/// last error.
/// Waits until the `total` nodes on `ports` all answer, each knows all of
/// them (connected, none failed or mid-handshake), `masters` of them own
/// slots and the rest are replicas, and they agree on the slots
/// ([`consistency`]).
fn wait_joined(what: &str, ports: &[u16], masters: usize, total: usize) {
    wait_until(what, || {
        let view = consistency(ports)?;
        if view.live.len() != total {
            return Err(format!("only {:?} answer", view.live));
        }
        for &port in ports {
            let nodes = cluster_nodes(port).map_err(|e| format!("{port}: {e}"))?;
            if nodes.len() != total {
                return Err(format!("{port} knows {} of {total} nodes", nodes.len()));
            }
            if let Some(n) = nodes.iter().find(|n| {
                n.port == 0
                    || !n.connected
                    || ["handshake", "noaddr", "fail", "fail?"]
                        .iter()
                        .any(|f| n.has_flag(f))
            }) {
                return Err(format!("{port} sees {n:?}"));
            }
            let owners = nodes.iter().filter(|n| !n.slots.is_empty()).count();
            let replicas = nodes.iter().filter(|n| n.is_replica()).count();
            if owners != masters || replicas != total - masters {
                return Err(format!(
                    "{port} sees {owners} masters with slots and {replicas} replicas"
                ));
            }
        }
        Ok(())
    });
}

fn wait_until<T>(what: &str, mut check: impl FnMut() -> Result<T, String>) -> T {
    let start = Instant::now();
    loop {
        match check() {
            Ok(v) => return v,
            Err(e) if start.elapsed() >= STABLE_TIMEOUT => {
                panic!("timed out after {STABLE_TIMEOUT:?} waiting for {what}; last: {e}")
            }
            Err(_) => thread::sleep(POLL_INTERVAL),
        }
    }
}

fn ping(port: u16) -> bool {
    matches!(query(port, &["PING"], QUERY_TIMEOUT), Ok(Reply::Simple(s)) if s == "PONG")
}

fn cluster_nodes(port: u16) -> io::Result<Vec<ClusterNode>> {
    let text = text(port, &["CLUSTER", "NODES"])?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            ClusterNode::parse(l)
                .ok_or_else(|| protocol_error(format!("unparsable CLUSTER NODES line {l:?}")))
        })
        .collect()
}

/// `CLUSTER SLOTS` of `port` as the owner port of every slot.
fn slot_owners(port: u16) -> io::Result<Vec<Option<u16>>> {
    let bad = |what: &str| protocol_error(format!("CLUSTER SLOTS: {what}"));
    let Reply::Array(Some(ranges)) = query(port, &["CLUSTER", "SLOTS"], QUERY_TIMEOUT)? else {
        return Err(bad("not an array"));
    };
    let mut owners = vec![None; SLOTS];
    for range in &ranges {
        let Reply::Array(Some(items)) = range else {
            return Err(bad("range not an array"));
        };
        let (Some(Reply::Int(start)), Some(Reply::Int(end)), Some(Reply::Array(Some(master)))) =
            (items.first(), items.get(1), items.get(2))
        else {
            return Err(bad("range without start, end and master"));
        };
        let Some(Reply::Int(owner)) = master.get(1) else {
            return Err(bad("master without port"));
        };
        let owner = u16::try_from(*owner).map_err(|_| bad("port out of range"))?;
        let (start, end) = (usize::try_from(*start), usize::try_from(*end));
        let (Ok(start), Ok(end)) = (start, end) else {
            return Err(bad("negative slot"));
        };
        for slot in owners
            .get_mut(start..=end)
            .ok_or_else(|| bad("slot out of range"))?
        {
            *slot = Some(owner);
        }
    }
    Ok(owners)
}

/// Panics on a connection failure, for commands that must go through.
fn command<A: AsRef<[u8]>>(port: u16, args: &[A]) -> Reply {
    query(port, args, QUERY_TIMEOUT).unwrap_or_else(|e| {
        let shown: Vec<_> = args
            .iter()
            .map(|a| String::from_utf8_lossy(a.as_ref()).into_owned())
            .collect();
        panic!("redis {port}: command {shown:?} failed: {e}")
    })
}

fn expect_ok(port: u16, args: &[&str]) {
    match command(port, args) {
        Reply::Simple(s) if s == "OK" => {}
        other => panic!("redis {port}: {args:?}: {other:?}"),
    }
}

/// A bulk or simple string reply as text; an error reply is an `Err`.
fn text(port: u16, args: &[&str]) -> io::Result<String> {
    match query(port, args, QUERY_TIMEOUT)? {
        Reply::Bulk(Some(b)) => Ok(String::from_utf8_lossy(&b).into_owned()),
        Reply::Simple(s) => Ok(s),
        other => Err(io::Error::other(format!("{args:?}: {other:?}"))),
    }
}

/// The Unix sockets of the running TLS clusters' nodes, by client (TLS)
/// port: [`query`] goes through them, since the nodes take no plain TCP.
/// Ports are reserved for the life of their node, so a port here is never
/// a plain server's; a cluster removes its own when dropped.
static TLS_SOCKETS: Mutex<BTreeMap<u16, PathBuf>> = Mutex::new(BTreeMap::new());

fn tls_sockets() -> std::sync::MutexGuard<'static, BTreeMap<u16, PathBuf>> {
    TLS_SOCKETS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Makes [`query`] reach the TLS-only `server` over its Unix socket.
fn register_socket(server: &RedisServer) {
    let url = server.socket_url();
    let path = url
        .strip_prefix("unix://")
        .unwrap_or_else(|| panic!("redis {}: socket URL {url:?}", server.port()));
    tls_sockets().insert(server.port(), PathBuf::from(path));
}

/// One command on a fresh connection to 127.0.0.1:`port` (over the node's
/// Unix socket for a node of a TLS cluster, see [`TLS_SOCKETS`]).
fn query<A: AsRef<[u8]>>(port: u16, args: &[A], timeout: Duration) -> io::Result<Reply> {
    let mut request = Vec::new();
    encode(&mut request, args);
    let socket = tls_sockets().get(&port).cloned();
    if let Some(path) = socket {
        let stream = UnixStream::connect(&path).map_err(|e| {
            // A killed node leaves its socket file behind (refused) or
            // none (not found): either way down, as a refused TCP connect.
            if e.kind() == io::ErrorKind::NotFound {
                io::Error::new(io::ErrorKind::ConnectionRefused, e)
            } else {
                e
            }
        })?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        return exchange(stream, &request);
    }
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    exchange(stream, &request)
}

/// Sends `request` and reads one reply.
fn exchange(mut stream: impl Read + Write, request: &[u8]) -> io::Result<Reply> {
    stream.write_all(request)?;
    read_reply(&mut BufReader::new(stream))
}
