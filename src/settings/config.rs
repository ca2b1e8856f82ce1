//! The validated settings a client runs with, and the parsing of node URLs
//! into connections-to-be (nothing connects here). The public setters that
//! fill these live on `Builder`, in `client`.

use std::sync::Arc;
use std::time::Duration;

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};

use crate::error::ConfigError;
use crate::logic::resource::Layout;
use crate::logic::validity::DriftFactor;
use crate::node::cluster::{Cluster, MakeClient};
use crate::node::restart::RestartGuard;
use crate::node::sentinel::{self, Sentinel};
use crate::node::tls::{self, Tls};
use crate::node::{Node, NodeTimeouts, Reach, Registry, Server};
use crate::settings::autoextend::AutoExtend;
use crate::settings::retry::Retry;

/// The validated settings a client runs with.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) node_timeout: Duration,
    pub(crate) drift_factor: DriftFactor,
    pub(crate) min_validity: Duration,
    pub(crate) key_prefix: String,
    pub(crate) retry: Retry,
    /// Whether acquisitions hand out fencing tokens.
    pub(crate) fencing: bool,
    pub(crate) auto_extend: Option<AutoExtend>,
    pub(crate) wake_on_release: bool,
    pub(crate) max_local_handoffs: u32,
    pub(crate) fair: bool,
    /// Whether a contended release asks the home to hand the lock over
    /// (`Builder::handover`).
    pub(crate) handover: bool,
    pub(crate) restart_guard: RestartGuard,
    /// Tagged when a node is a Redis Cluster.
    pub(crate) layout: Layout,
}

/// One node of a client: a URL, or the `redis::ConnectionInfo` a service
/// already has. [`Client::builder`](crate::Client::builder) and
/// [`Client::new`](crate::Client::new) take anything that converts into it:
/// `&str`, `String`, `&String`, `redis::ConnectionInfo`.
///
/// URLs are `redis://[user][:password@]host[:port][/db]`,
/// `rediss://…` for TLS (feature `tls`, see [`Tls`]), or
/// `unix:///path/to/redis.sock[?db=N&user=U&pass=P]` (also `redis+unix://`).
/// A Redis Cluster is one node: `redis+cluster://[user][:password@]host:port`
/// (`rediss+cluster://` for TLS) names one of its nodes, from which the
/// client reads the others; [`NodeSpec::cluster`] takes several seeds.
/// A master watched by Redis Sentinel is one node:
/// `redis+sentinel://[user][:password@]host1:26379,host2:26379/mastername[/db]`
/// (`rediss+sentinel://` for TLS to the master and the Sentinels; the
/// credentials are the master's, and Sentinels with a password take
/// `?sentinel_password=P[&sentinel_user=U]`), or [`NodeSpec::sentinel`];
/// see docs/operations.md, "Redis Sentinel".
/// Its `Debug` never shows a password.
#[derive(Clone)]
pub struct NodeSpec(Spec);

#[derive(Clone)]
enum Spec {
    Url(String),
    Info(Box<ConnectionInfo>),
    /// A Redis Cluster, by its seeds (plain specs).
    Cluster(Vec<NodeSpec>),
}

impl NodeSpec {
    /// One Redis Cluster as one node (one vote), given some of its nodes
    /// as `redis://` or `rediss://` URLs (or `redis::ConnectionInfo`s):
    /// the client reads the slot map from whichever answers first. Every
    /// key of one resource shares a hash tag, so each lock lives on one
    /// shard; see docs/operations.md, "Redis Cluster".
    pub fn cluster<I, S>(seeds: I) -> NodeSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<NodeSpec>,
    {
        NodeSpec(Spec::Cluster(seeds.into_iter().map(Into::into).collect()))
    }

    /// A master watched by Redis Sentinel, as one node (one vote): the
    /// Sentinels' `host:port` addresses and the master's name in their
    /// configuration. The same as
    /// `redis+sentinel://host1:port1,host2:port2/name`; use that form for
    /// passwords (the master's, and the Sentinels' as
    /// `?sentinel_password=`) or TLS.
    ///
    /// ```
    /// let node = redfence::NodeSpec::sentinel(["10.0.0.1:26379", "10.0.0.2:26379"], "mymaster");
    /// assert!(node.is_sentinel());
    /// ```
    pub fn sentinel<I, S>(sentinels: I, master: &str) -> NodeSpec
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let hosts: Vec<String> = sentinels
            .into_iter()
            .map(|s| s.as_ref().to_owned())
            .collect();
        NodeSpec(Spec::Url(format!(
            "redis+sentinel://{}/{master}",
            hosts.join(",")
        )))
    }

    /// Whether this spec is a Sentinel-managed master (`redis+sentinel://`,
    /// `rediss+sentinel://` or [`NodeSpec::sentinel`]).
    pub fn is_sentinel(&self) -> bool {
        matches!(&self.0, Spec::Url(url) if sentinel::parse_url(url).is_some())
    }

    /// Whether this spec is a Redis Cluster (`redis+cluster://` or
    /// [`NodeSpec::cluster`]).
    pub fn is_cluster(&self) -> bool {
        match &self.0 {
            Spec::Url(url) => cluster_scheme(url).is_some(),
            Spec::Info(_) => false,
            Spec::Cluster(_) => true,
        }
    }
}

/// `redis+cluster://…` as `redis://…` (and `rediss+cluster` as `rediss`);
/// `None` for other URLs.
fn cluster_scheme(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let plain = match scheme.to_ascii_lowercase().as_str() {
        "redis+cluster" => "redis",
        "rediss+cluster" => "rediss",
        _ => return None,
    };
    Some(format!("{plain}://{rest}"))
}

impl From<&str> for NodeSpec {
    fn from(url: &str) -> Self {
        NodeSpec(Spec::Url(url.to_owned()))
    }
}

impl From<String> for NodeSpec {
    fn from(url: String) -> Self {
        NodeSpec(Spec::Url(url))
    }
}

impl From<&String> for NodeSpec {
    fn from(url: &String) -> Self {
        NodeSpec(Spec::Url(url.clone()))
    }
}

impl From<ConnectionInfo> for NodeSpec {
    fn from(info: ConnectionInfo) -> Self {
        NodeSpec(Spec::Info(Box::new(info)))
    }
}

impl std::fmt::Debug for NodeSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Spec::Url(url) => f.debug_tuple("NodeSpec").field(&redact(url)).finish(),
            Spec::Info(info) => f
                .debug_tuple("NodeSpec")
                .field(&describe_addr(info.addr()))
                .finish(),
            Spec::Cluster(seeds) => f.debug_tuple("Cluster").field(seeds).finish(),
        }
    }
}

/// A connection address as an error shows it: `redis://host:port`,
/// `rediss://host:port`, `unix:path` (never credentials).
fn describe_addr(addr: &ConnectionAddr) -> String {
    match addr {
        ConnectionAddr::Tcp(host, port) => format!("redis://{host}:{port}"),
        ConnectionAddr::TcpTls { host, port, .. } => format!("rediss://{host}:{port}"),
        ConnectionAddr::Unix(path) => format!("unix:{}", path.display()),
        other => format!("{other:?}"),
    }
}

/// One node per spec, in order, sharing one identity registry; two that
/// name the same address are refused (`DuplicateNode`). `tls` applies to
/// every `rediss://` node, and then every node must be one. Connects to
/// nothing.
pub(crate) fn nodes(
    specs: &[NodeSpec],
    tls: Option<&Tls>,
    timeouts: NodeTimeouts,
    prefix: &str,
) -> Result<Vec<Arc<Node>>, ConfigError> {
    let registry = Registry::new(specs.len());
    let mut seen: Vec<String> = Vec::with_capacity(specs.len());
    let mut nodes = Vec::with_capacity(specs.len());
    for (index, spec) in specs.iter().enumerate() {
        let seeds = match &spec.0 {
            Spec::Cluster(seeds) => seeds.clone(),
            Spec::Url(url) => match cluster_scheme(url) {
                Some(plain) => vec![NodeSpec::from(plain)],
                None => Vec::new(),
            },
            Spec::Info(_) => Vec::new(),
        };
        let sentinel = match &spec.0 {
            Spec::Url(url) => sentinel::parse_url(url),
            _ => None,
        };
        let (node, addrs) = if let Some(parsed) = sentinel {
            sentinel_node(index, spec, parsed, tls, timeouts, &registry)?
        } else if seeds.is_empty() {
            let (client, addr, db) = parse_node(index, spec, tls)?;
            let server = Server::new(
                index,
                addr.clone(),
                db,
                client,
                timeouts,
                Arc::clone(&registry),
                Reach::Plain,
            );
            (Node::server(server), vec![addr])
        } else {
            cluster_node(index, &seeds, tls, timeouts, prefix)?
        };
        for addr in addrs {
            if let Some(first) = seen.iter().position(|a| *a == addr) {
                return Err(ConfigError::DuplicateNode {
                    addr,
                    first,
                    second: index,
                });
            }
            seen.push(addr);
        }
        nodes.push(node);
    }
    Ok(nodes)
}

/// A Redis Cluster node from its seeds; also the seeds' addresses, for the
/// duplicate check.
fn cluster_node(
    index: usize,
    seeds: &[NodeSpec],
    tls: Option<&Tls>,
    timeouts: NodeTimeouts,
    prefix: &str,
) -> Result<(Arc<Node>, Vec<String>), ConfigError> {
    let mut infos = Vec::with_capacity(seeds.len());
    let mut addrs = Vec::with_capacity(seeds.len());
    for seed in seeds {
        if matches!(seed.0, Spec::Cluster(_)) || seed.is_cluster() {
            return Err(ConfigError::UnsupportedUrl {
                index,
                url: format!("{seed:?}"),
                reason: "is a cluster inside a cluster: give the cluster's seeds as redis:// urls",
            });
        }
        let (client, addr, db) = parse_node(index, seed, tls)?;
        if db != 0 || addr.starts_with("unix:") {
            return Err(ConfigError::UnsupportedUrl {
                index,
                url: format!("{seed:?}"),
                reason: "is not a tcp address of database 0 (a Redis Cluster has only database 0)",
            });
        }
        infos.push(client.get_connection_info().clone());
        addrs.push(addr);
    }
    let Some(first) = addrs.first() else {
        return Err(ConfigError::UnsupportedUrl {
            index,
            url: String::from("NodeSpec::cluster([])"),
            reason: "names no seed",
        });
    };
    let name = format!("cluster:{first}");
    let make = make_client(tls);
    let cluster = Cluster::new(
        index,
        infos,
        make,
        timeouts,
        prefix.to_owned(),
        tls.cloned(),
    );
    Ok((Node::cluster(index, name, cluster), addrs))
}

/// A Sentinel node: one server whose address the Sentinels give at each
/// connect; also one `sentinel:name@host:port` per Sentinel, for the
/// duplicate check (two groups of one set of Sentinels are independent).
fn sentinel_node(
    index: usize,
    spec: &NodeSpec,
    parsed: Result<sentinel::Parsed, &'static str>,
    tls: Option<&Tls>,
    timeouts: NodeTimeouts,
    registry: &Arc<Registry>,
) -> Result<(Arc<Node>, Vec<String>), ConfigError> {
    let shown = format!("{spec:?}");
    let parsed = parsed.map_err(|reason| ConfigError::UnsupportedUrl {
        index,
        url: shown.clone(),
        reason,
    })?;
    // Each Sentinel and the master's URL (at a Sentinel's address, as a
    // stand-in) go through the plain nodes' checks: TLS feature and
    // settings, credentials, database.
    let mut clients = Vec::with_capacity(parsed.sentinels.len());
    let mut addrs = Vec::with_capacity(parsed.sentinels.len());
    for (host, port) in &parsed.sentinels {
        let url = NodeSpec::from(parsed.sentinel_url(host, *port));
        let (client, addr, _) = parse_node(index, &url, tls)?;
        clients.push(client);
        addrs.push(format!("sentinel:{}@{addr}", parsed.name));
    }
    let (host, port) = &parsed.sentinels[0];
    let stand_in = NodeSpec::from(parsed.master_url.at(host, *port));
    let (placeholder, _, db) = parse_node(index, &stand_in, tls).map_err(|e| match e {
        ConfigError::InvalidUrl { source, .. } => ConfigError::InvalidUrl {
            index,
            url: shown.clone(),
            source,
        },
        other => other,
    })?;
    let name = format!("sentinel:{}@{host}:{port}", parsed.name);
    let group = Sentinel::new(parsed.name, clients, parsed.master_url, make_client(tls));
    let server = Server::new(
        index,
        name,
        db,
        placeholder,
        timeouts,
        Arc::clone(registry),
        Reach::Sentinel(Arc::new(group)),
    );
    Ok((Node::server(server), addrs))
}

/// Makes a cluster master's client from a seed's settings: with the TLS
/// settings for `rediss://`, as the seed's was.
fn make_client(tls: Option<&Tls>) -> MakeClient {
    #[cfg(feature = "tls")]
    {
        let tls = tls.cloned();
        Arc::new(move |info: ConnectionInfo| match (&tls, info.addr()) {
            (Some(tls), ConnectionAddr::TcpTls { .. }) => {
                redis::Client::build_with_tls(info, tls.certificates()?)
            }
            _ => redis::Client::open(info),
        })
    }
    #[cfg(not(feature = "tls"))]
    {
        let _ = tls;
        Arc::new(redis::Client::open)
    }
}

/// Parses one URL into a redis client and the address used to detect
/// duplicates and name the node in errors (`host:port`, or `unix:path` for
/// a Unix socket, plus `/db` when not 0; never credentials).
fn parse_node(
    index: usize,
    spec: &NodeSpec,
    tls: Option<&Tls>,
) -> Result<(redis::Client, String, i64), ConfigError> {
    let shown = match &spec.0 {
        Spec::Url(url) => redact(url),
        Spec::Info(info) => describe_addr(info.addr()),
        Spec::Cluster(_) => format!("{spec:?}"),
    };
    let invalid = |source| ConfigError::InvalidUrl {
        index,
        url: shown.clone(),
        source,
    };
    let unsupported = |reason| ConfigError::UnsupportedUrl {
        index,
        url: shown.clone(),
        reason,
    };
    let info = match &spec.0 {
        Spec::Url(url) => {
            // Decided on the scheme before parsing, so the error says what
            // is wrong with the URL rather than what the parser of this
            // build lacks.
            scheme_check(url, cfg!(feature = "tls")).map_err(unsupported)?;
            url.as_str().into_connection_info().map_err(invalid)?
        }
        Spec::Info(info) => (**info).clone(),
        Spec::Cluster(_) => {
            return Err(unsupported("is a cluster where a server was expected"));
        }
    };
    let (addr, secure) = match info.addr() {
        ConnectionAddr::Tcp(host, port) => (format!("{}:{port}", host.to_ascii_lowercase()), false),
        ConnectionAddr::TcpTls { insecure: true, .. } => {
            return Err(ConfigError::InsecureTls { index, url: shown });
        }
        ConnectionAddr::TcpTls { host, port, .. } if cfg!(feature = "tls") => {
            // Before anything can connect: the lock connection, the
            // subscriptions and the audit's own connections all go
            // through rustls, which needs a provider.
            tls::ensure_provider();
            (format!("{}:{port}", host.to_ascii_lowercase()), true)
        }
        ConnectionAddr::TcpTls { .. } => return Err(unsupported(NEEDS_TLS_FEATURE)),
        // A server on this host, through its socket file: named by the path
        // (the run_id check still catches a socket and a TCP URL of one
        // server).
        ConnectionAddr::Unix(path) => (format!("unix:{}", path.display()), false),
        _ => return Err(unsupported("is not a redis://, rediss:// or unix:// url")),
    };
    let db = info.redis_settings().db();
    let addr = if db == 0 {
        addr
    } else {
        format!("{addr}/{db}")
    };
    let client = match (tls, secure) {
        // Settings for TLS given, and a node that would ignore them: a
        // `redis://` left in a list meant to be encrypted.
        (Some(_), false) => return Err(ConfigError::TlsOnPlainNode { index, url: shown }),
        #[cfg(feature = "tls")]
        (Some(tls), true) => {
            let certificates = tls.certificates();
            certificates
                .and_then(|certificates| redis::Client::build_with_tls(info, certificates))
                .map_err(|source| ConfigError::InvalidTls {
                    index,
                    url: shown.clone(),
                    source,
                })?
        }
        _ => redis::Client::open(info).map_err(invalid)?,
    };
    Ok((client, addr, db))
}

const NEEDS_TLS_FEATURE: &str = "is a TLS url: build redfence with its `tls` feature";

/// Refuses a TLS URL in a build without TLS (`tls_built` is the feature,
/// a parameter so that both answers are tested in every build).
fn scheme_check(url: &str, tls_built: bool) -> Result<(), &'static str> {
    let scheme = url
        .split_once("://")
        .map_or(String::new(), |(scheme, _)| scheme.to_ascii_lowercase());
    if matches!(scheme.as_str(), "rediss" | "valkeys") && !tls_built {
        return Err(NEEDS_TLS_FEATURE);
    }
    Ok(())
}

/// Replaces the password in `scheme://user:password@host` and in a
/// `pass=` / `password=` query parameter with `***`.
pub(crate) fn redact(url: &str) -> String {
    // First: a Sentinel password may hold an `@`, which would mislead the
    // userinfo's redaction.
    let url = redact_userinfo(&redact_param(url, sentinel::PASSWORD_PARAM));
    let Some((head, query)) = url.split_once('?') else {
        return url;
    };
    let params: Vec<String> = query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((name, _))
                if matches!(name.to_ascii_lowercase().as_str(), "pass" | "password") =>
            {
                format!("{name}=***")
            }
            _ => param.to_owned(),
        })
        .collect();
    format!("{head}?{}", params.join("&"))
}

/// Every `name=value` (after `?` or `&`) as `name=***`.
fn redact_param(url: &str, name: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let mut rest = url;
    while let Some(at) = rest.find(name) {
        let (before, after) = rest.split_at(at);
        let after = &after[name.len()..];
        out.push_str(before);
        out.push_str(name);
        match after.strip_prefix('=') {
            Some(value) if before.ends_with(['?', '&']) => {
                out.push_str("=***");
                rest = value.find('&').map_or("", |end| &value[end..]);
            }
            _ => rest = after,
        }
    }
    out.push_str(rest);
    out
}

fn redact_userinfo(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let Some(at) = rest.rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &rest[..at];
    match userinfo.find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..scheme_end],
            &userinfo[..colon],
            &rest[at..]
        ),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TLS URL needs the `tls` feature; both builds' answers, in either
    /// build (CI builds with every feature, so `UnsupportedUrl` for a
    /// `rediss://` URL is reached only by `cargo test` without it).
    #[test]
    fn tls_urls_need_the_feature() {
        for url in ["rediss://h:1", "REDISS://h:1", "valkeys://h:1"] {
            assert_eq!(scheme_check(url, false), Err(NEEDS_TLS_FEATURE), "{url}");
            assert_eq!(scheme_check(url, true), Ok(()), "{url}");
        }
        for url in [
            "redis://h:1",
            "unix:///tmp/r.sock",
            "redis+unix:///tmp/r.sock",
            "not a url",
        ] {
            assert_eq!(scheme_check(url, false), Ok(()), "{url}");
        }
    }

    #[test]
    fn redaction() {
        assert_eq!(redact("redis://:secret@h:1"), "redis://:***@h:1");
        assert_eq!(redact("redis://u:p@ss@h:1"), "redis://u:***@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert_eq!(redact("redis://user@h:1"), "redis://user@h:1");
        assert_eq!(redact("nonsense"), "nonsense");
        assert_eq!(
            redact("redis+unix:///x?db=1&pass=hunter2"),
            "redis+unix:///x?db=1&pass=***"
        );
        assert_eq!(
            redact("redis://:a@h?password=b"),
            "redis://:***@h?password=***"
        );
        assert_eq!(
            redact("redis+sentinel://u:p@h:1/m?sentinel_user=s&sentinel_password=x@y&z"),
            "redis+sentinel://u:***@h:1/m?sentinel_user=s&sentinel_password=***&z"
        );
        assert_eq!(
            redact("redis+sentinel://h:1/m?sentinel_password=x@y"),
            "redis+sentinel://h:1/m?sentinel_password=***"
        );
    }

    #[test]
    fn addresses_normalise_case_and_db() {
        let (_, a, _) = parse_node(0, &"redis://LOCALHOST:7001".into(), None).unwrap();
        assert_eq!(a, "localhost:7001");
        let (_, b, db) = parse_node(0, &"redis://127.0.0.1:7001/2".into(), None).unwrap();
        assert_eq!(db, 2);
        assert_eq!(b, "127.0.0.1:7001/2");
        let (_, c, _) = parse_node(0, &"redis://:pw@127.0.0.1:7001".into(), None).unwrap();
        assert_eq!(c, "127.0.0.1:7001", "no credentials in the address");
    }
}
