//! A real Redis Sentinel group on loopback: a master, one replica and
//! three Sentinels (`redis-server <conf> --sentinel`), each a
//! [`RedisServer`] on a free port, killed on drop.
//!
//! The replica replicates through a [`FaultProxy`], so a test can cut it off
//! from the master ([`SentinelGroup::cut_replication`]) and make it miss the
//! last writes before a failover promotes it: the asynchronous-replication
//! loss a Sentinel failover really has. The Sentinels would eventually
//! "fix" a replica whose master address differs from theirs, so the
//! failover timeout (which is also that grace) is long; failovers here are
//! decided by `down-after-milliseconds` and end as soon as the one replica
//! is promoted.
//!
//! The fault suite (`chaos/src/rig.rs`) builds its Sentinel groups from
//! [`start_sentinels`] and [`wait_acquainted`], around replicas of its own
//! that replicate directly (and short timeouts: see there).

// Each includer (the integration tests, the CLI's) uses a different subset.
#![allow(dead_code)]

use std::thread;
use std::time::{Duration, Instant};

use super::proxy::{Fault, FaultProxy};
use super::server::{RedisServer, ServerOptions, ServerTls};

/// The master's name in the Sentinels' configuration.
pub const MASTER_NAME: &str = "mymaster";
/// How long the Sentinels wait before they call a silent master down.
pub const DOWN_AFTER: Duration = Duration::from_millis(1500);
/// Long: the Sentinels "fix" a replica whose master address differs from
/// theirs (this one replicates through a proxy) after this long.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(60);
/// Bounds every wait of this harness.
const WAIT: Duration = Duration::from_secs(30);

/// How a [`SentinelGroup`] is secured. `Default`: plain TCP, no passwords.
#[derive(Debug, Clone, Default)]
pub struct GroupOptions {
    /// Every server and Sentinel serves TLS only (`--port 0 --tls-port P`)
    /// with these settings, and they talk TLS to each other
    /// (`tls-replication yes`): the replica to the master (through the
    /// proxy, which only forwards bytes) and the Sentinels to the servers
    /// and to each other. The certificate must be valid for client
    /// authentication too (`Certs::cluster_node`), as each is also a
    /// client.
    pub tls: Option<ServerTls>,
    /// `(user, password)`: the master and the replica refuse a client that
    /// is not this ACL user (the `default` user has the password
    /// [`ADMIN_PASSWORD`], which the harness's `cli` uses); the replica
    /// and the Sentinels authenticate as this user.
    pub acl_user: Option<(String, String)>,
    /// `requirepass` on the Sentinels (which then authenticate to each
    /// other with it).
    pub sentinel_password: Option<String>,
}

/// The `default` user's password on the servers of a group with an ACL
/// user: only the harness uses it.
pub const ADMIN_PASSWORD: &str = "harness-admin";

/// A master, a replica (through a proxy) and three Sentinels.
#[derive(Debug)]
pub struct SentinelGroup {
    /// `servers[0]` starts as the master, `servers[1]` as its replica.
    pub servers: Vec<RedisServer>,
    pub sentinels: Vec<RedisServer>,
    replication: FaultProxy,
    options: GroupOptions,
}

impl SentinelGroup {
    /// Starts the group and returns once every Sentinel knows the replica
    /// and the two other Sentinels (so a failover can be authorised).
    pub fn start() -> SentinelGroup {
        SentinelGroup::start_with(GroupOptions::default())
    }

    /// [`SentinelGroup::start`], secured as `options` says.
    pub fn start_with(options: GroupOptions) -> SentinelGroup {
        let server_options = |replica_of: Option<u16>| {
            let mut extra_args = Vec::new();
            if options.tls.is_some() {
                extra_args.extend(["--tls-replication".into(), "yes".into()]);
            }
            let (requirepass, acl_user) = match &options.acl_user {
                Some((user, pass)) => {
                    extra_args.extend([
                        "--masteruser".into(),
                        user.clone(),
                        "--masterauth".into(),
                        pass.clone(),
                    ]);
                    (
                        Some(ADMIN_PASSWORD.to_owned()),
                        Some((user.clone(), pass.clone())),
                    )
                }
                None => (None, None),
            };
            ServerOptions {
                replica_of,
                tls: options.tls.clone(),
                requirepass,
                acl_user,
                extra_args,
                ..ServerOptions::default()
            }
        };
        let master = RedisServer::start_with(server_options(None));
        let replication =
            FaultProxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], master.port())))
                .expect("replication proxy");
        let replica = RedisServer::start_with(server_options(Some(replication.port())));
        let sentinels = start_sentinels_with(master.port(), DOWN_AFTER, FAILOVER_TIMEOUT, &options);
        let group = SentinelGroup {
            servers: vec![master, replica],
            sentinels,
            replication,
            options,
        };
        group.wait_until("the replica in sync", |g| {
            g.servers[1]
                .cli(&["INFO", "replication"])
                .contains("master_link_status:up")
        });
        wait_acquainted(&group.sentinels, 1);
        group
    }

    /// `redis+sentinel://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3/mymaster`
    /// (`rediss+sentinel://` for a TLS group; no credentials).
    pub fn url(&self) -> String {
        let url = url(&self.sentinels);
        match self.options.tls {
            Some(_) => url.replacen("redis+sentinel://", "rediss+sentinel://", 1),
            None => url,
        }
    }

    /// The port the first Sentinel that answers names as master.
    pub fn master_port(&self) -> u16 {
        for s in self.sentinels.iter().filter(|s| s.is_running()) {
            let reply = s.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME]);
            if let Some(port) = reply.lines().nth(1).and_then(|p| p.parse().ok()) {
                return port;
            }
        }
        panic!("no sentinel names a master")
    }

    /// The server the Sentinels name as master.
    pub fn master(&mut self) -> &mut RedisServer {
        let port = self.master_port();
        self.servers
            .iter_mut()
            .find(|s| s.port() == port)
            .expect("the sentinels name a server of the group")
    }

    /// The replica stops receiving the master's writes (its replication
    /// connection is reset, and so is every reconnect); returns once the
    /// replica and the master both see the link down.
    pub fn cut_replication(&self) {
        self.replication.set(Fault::Reset);
        self.wait_until("the replication link down", |g| {
            g.replication.open_connections() == 0
                && g.servers[1]
                    .cli(&["INFO", "replication"])
                    .contains("master_link_status:down")
                && g.servers[0]
                    .cli(&["INFO", "replication"])
                    .contains("connected_slaves:0")
        });
    }

    /// `SENTINEL FAILOVER`: a forced failover, without agreement. Asked
    /// again while the Sentinel finds no replica to promote
    /// (`NOGOODSLAVE`: on a loaded machine its last reply from the replica
    /// can be seconds old).
    pub fn failover(&self) {
        let mut reply = String::new();
        self.wait_until("SENTINEL FAILOVER accepted", |g| {
            reply = g.sentinels[0].cli(&["SENTINEL", "FAILOVER", MASTER_NAME]);
            !reply.contains("NOGOODSLAVE")
        });
        assert_eq!(reply, "OK", "SENTINEL FAILOVER: {reply}");
    }

    /// Waits until every Sentinel names `servers[index]` and it answers
    /// `ROLE` as a master.
    pub fn wait_master(&self, index: usize) {
        let port = self.servers[index].port().to_string();
        self.wait_until(&format!("server {index} the master"), |g| {
            g.servers[index]
                .role()
                .is_some_and(|role| role.starts_with("master"))
                && g.sentinels.iter().all(|s| {
                    s.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME])
                        .lines()
                        .nth(1)
                        == Some(port.as_str())
                })
        });
    }

    /// The Sentinels redeployed: each killed and started again on its port
    /// from a fresh configuration that monitors the current master, as a
    /// deployment template would write it. Their config epochs start from
    /// 0 again, below what any client saw before. Returns once all three
    /// name the master at epoch 0 and know each other.
    pub fn redeploy_sentinels(&mut self) {
        let master = self.master_port();
        let fresh = conf(master, DOWN_AFTER, FAILOVER_TIMEOUT, &self.options);
        for s in &mut self.sentinels {
            let info = s.cli(&["INFO", "server"]);
            let path = info
                .lines()
                .find_map(|l| l.strip_prefix("config_file:"))
                .map(|p| std::path::PathBuf::from(p.trim()))
                .expect("a Sentinel reports its config file");
            s.kill();
            std::fs::write(&path, &fresh)
                .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
            s.restart();
        }
        let port = master.to_string();
        self.wait_until("the redeployed sentinels agreed at epoch 0", |g| {
            g.sentinels.iter().all(|s| {
                let m = s.cli(&["SENTINEL", "MASTER", MASTER_NAME]);
                field(&m, "port") == Some(port.as_str())
                    && field(&m, "config-epoch") == Some("0")
                    && field(&m, "num-other-sentinels") == Some("2")
            })
        });
    }

    fn wait_until(&self, what: &str, mut done: impl FnMut(&Self) -> bool) {
        wait_for(what, || done(self));
    }
}

/// Three Sentinels (`redis-server <conf> --sentinel`) watching the master
/// on `master` as [`MASTER_NAME`]; they find its replicas and each other
/// on their own ([`wait_acquainted`] waits for that).
pub fn start_sentinels(
    master: u16,
    down_after: Duration,
    failover_timeout: Duration,
) -> Vec<RedisServer> {
    start_sentinels_with(
        master,
        down_after,
        failover_timeout,
        &GroupOptions::default(),
    )
}

fn start_sentinels_with(
    master: u16,
    down_after: Duration,
    failover_timeout: Duration,
    options: &GroupOptions,
) -> Vec<RedisServer> {
    let conf = conf(master, down_after, failover_timeout, options);
    let extra_args: Vec<String> = match options.tls {
        Some(_) => vec!["--tls-replication".into(), "yes".into()],
        None => Vec::new(),
    };
    (0..3)
        .map(|_| {
            RedisServer::start_with(ServerOptions {
                sentinel_conf: Some(conf.clone()),
                tls: options.tls.clone(),
                requirepass: options.sentinel_password.clone(),
                extra_args: extra_args.clone(),
                ..ServerOptions::default()
            })
        })
        .collect()
}

/// A Sentinel's configuration as deployed: no epoch, no other Sentinels
/// or replicas yet (it finds them), the master on `master` (and the ACL
/// user it authenticates as, if any).
fn conf(
    master: u16,
    down_after: Duration,
    failover_timeout: Duration,
    options: &GroupOptions,
) -> String {
    let mut conf = format!(
        "sentinel resolve-hostnames no\n\
         sentinel announce-ip 127.0.0.1\n\
         sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\n\
         sentinel down-after-milliseconds {MASTER_NAME} {}\n\
         sentinel failover-timeout {MASTER_NAME} {}\n",
        down_after.as_millis(),
        failover_timeout.as_millis()
    );
    if let Some((user, pass)) = &options.acl_user {
        conf.push_str(&format!(
            "sentinel auth-user {MASTER_NAME} {user}\nsentinel auth-pass {MASTER_NAME} {pass}\n"
        ));
    }
    conf
}

/// Waits until every Sentinel of a group knows `replicas` replicas and the
/// other Sentinels (so a failover can be authorised).
pub fn wait_acquainted(sentinels: &[RedisServer], replicas: usize) {
    let (others, replicas) = ((sentinels.len() - 1).to_string(), replicas.to_string());
    wait_for("the sentinels acquainted", || {
        sentinels.iter().all(|s| {
            let m = s.cli(&["SENTINEL", "MASTER", MASTER_NAME]);
            field(&m, "num-other-sentinels") == Some(others.as_str())
                && field(&m, "num-slaves") == Some(replicas.as_str())
        })
    });
}

/// `redis+sentinel://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3/mymaster`.
pub fn url(sentinels: &[RedisServer]) -> String {
    let hosts: Vec<String> = sentinels
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    format!("redis+sentinel://{}/{MASTER_NAME}", hosts.join(","))
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "sentinel group: not {what} after {WAIT:?}"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// A field of a flattened `SENTINEL MASTER` reply (names and values on
/// alternate lines).
pub fn field<'a>(reply: &'a str, name: &str) -> Option<&'a str> {
    let lines: Vec<&str> = reply.lines().collect();
    lines
        .chunks(2)
        .find(|pair| pair.first() == Some(&name))
        .and_then(|pair| pair.get(1).copied())
}
