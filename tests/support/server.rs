//! Real `redis-server` processes for tests, examples and benches.
//!
//! Redlock's safety argument is about processes that crash, stall and come
//! back, so the tests need real servers they can SIGKILL, SIGSTOP and restart
//! on the same port; a mock cannot lose its data or freeze mid-reply.
//!
//! This file is pure `std` and names no module but its sibling `process`
//! (`process.rs`: free ports, spawning, signals, cleanup; shared with
//! `postgres.rs`), so examples and benches can include the two side by side:
//!
//! ```ignore
//! #[path = "../tests/support/process.rs"]
//! mod process;
//! #[path = "../tests/support/server.rs"]
//! mod server;
//! ```
//!
//! One `process` per binary, not one per file that needs it, so that Redis
//! and PostgreSQL servers of one test binary share its port reservations.
//!
//! Every process is owned by a [`RedisServer`] whose `Drop` kills it, also
//! when a test panics (see `process.rs` for what still leaks).

// Each includer (test binary, example, bench) uses a different subset.
#![allow(dead_code)]

use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use super::process::{self, Launch, Process, ReservedPort, TempDir, PROBE_TIMEOUT};

/// Long enough for a loaded CI machine to replay a small AOF, short enough
/// that a broken server fails the test instead of hanging it.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Bounds every `cli` round trip so a paused or wedged server fails the
/// test rather than hanging it.
const CLI_TIMEOUT: Duration = Duration::from_secs(5);
/// A restarted server must come back on its old port (clients hold that
/// address), so wait out a briefly busy port instead of choosing another.
const RESTART_PORT_WAIT: Duration = Duration::from_secs(3);

/// The `redis-server` binary to run.
///
/// Tests must fail loudly, never skip: a suite that silently passes without
/// Redis would hide every distributed-lock bug. The check runs once per
/// process because `--version` costs a fork per server otherwise.
pub fn redis_server_bin() -> String {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| process::checked_bin("REDIS_SERVER_BIN", "redis-server", "redis-server"))
        .clone()
}

/// How to configure one server. `Default` is a plain, password-less,
/// non-persistent master, which is what most lock tests want.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// Needed for tests where a restarted node must still hold its keys;
    /// without it a restart models a node that lost everything.
    pub appendonly: bool,
    /// `appendfsync always`, so a SIGKILL right after a reply cannot lose
    /// that write (the default `everysec` may lose up to a second).
    pub appendfsync_always: bool,
    /// Password of the `default` user. [`RedisServer::cli`] authenticates
    /// with it; [`RedisServer::url`] deliberately does not include it.
    pub requirepass: Option<String>,
    /// `(user, password)` of an extra ACL user with full rights. The
    /// `default` user stays as configured (password-less unless
    /// `requirepass` is set), so `cli` keeps working.
    pub acl_user: Option<(String, String)>,
    /// Port of a master on 127.0.0.1 to replicate. If that master has a
    /// password, pass `--masterauth PASS` in `extra_args`.
    pub replica_of: Option<u16>,
    /// Also listen on a Unix socket in the server's directory
    /// ([`RedisServer::socket_url`]).
    pub unixsocket: bool,
    /// For tests of lock keys under eviction pressure.
    pub maxmemory_policy: Option<String>,
    /// TLS only: `--port 0 --tls-port P`, so the server takes no plain TCP
    /// connection at all. The harness itself talks to it over its Unix
    /// socket (always on for a TLS server), so it needs no TLS client.
    pub tls: Option<ServerTls>,
    /// A Sentinel (`redis-server <conf> --sentinel`) with this
    /// configuration, written into the server's directory at launch
    /// (Sentinel rewrites it, so it must be writable).
    pub sentinel_conf: Option<String>,
    /// Appended after the generated arguments; later directives win, so
    /// these can also override the defaults (e.g. `--loglevel verbose`).
    pub extra_args: Vec<String>,
}

/// A TLS server's certificate, key and the CA it checks client certificates
/// against, as PEM text (made at test time; written into the server's
/// directory at launch).
#[derive(Debug, Clone, Default)]
pub struct ServerTls {
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_pem: String,
    /// `tls-auth-clients yes`: a client without a certificate signed by
    /// `ca_pem` is refused (mutual TLS). `no` accepts any client.
    pub auth_clients: bool,
}

/// One `redis-server` child process on 127.0.0.1, killed and its data
/// directory removed on drop. `Sync`, for tests that share it across
/// threads.
#[derive(Debug)]
pub struct RedisServer {
    // Fields drop in order: the process dies (resumed first if paused)
    // before its directory is removed and its port is released.
    process: Process,
    dir: TempDir,
    port: ReservedPort,
    opts: ServerOptions,
    bin: String,
}

impl RedisServer {
    /// A default-configured server on a free port.
    pub fn start() -> RedisServer {
        RedisServer::start_with(ServerOptions::default())
    }

    /// Picking a port and then handing it to another process is inherently
    /// racy, so a lost race is retried on a fresh port.
    pub fn start_with(opts: ServerOptions) -> RedisServer {
        let bin = redis_server_bin();
        process::on_free_port("redis-server", |port| {
            // Built before spawning so that a panic during startup still
            // kills the child and removes the directory through `Drop`; on
            // `PortBusy`, dropping it releases its port and directory.
            let mut server = RedisServer {
                process: Process::default(),
                dir: TempDir::new("redis"),
                port,
                opts: opts.clone(),
                bin: bin.clone(),
            };
            (server.launch() == Launch::Ready).then_some(server)
        })
    }

    pub fn port(&self) -> u16 {
        self.port.get()
    }

    /// Without credentials on purpose: auth tests need to build both the
    /// right and the wrong URL themselves. `rediss://` for a TLS server.
    pub fn url(&self) -> String {
        let scheme = if self.opts.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port())
    }

    /// The `unix://` URL of the server's socket (`ServerOptions::unixsocket`).
    pub fn socket_url(&self) -> String {
        assert!(self.has_socket(), "started without a Unix socket");
        format!("unix://{}", self.socket_path().display())
    }

    fn socket_path(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    fn has_socket(&self) -> bool {
        self.opts.unixsocket || self.opts.tls.is_some()
    }

    /// `Some` while the process exists, including while it is paused.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// SIGKILL, not SIGTERM: a crash must not get the chance to flush or
    /// rewrite its AOF. Idempotent so cleanup paths can call it freely.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// SIGSTOP models a GC pause or a frozen VM: connections stay open and
    /// the kernel keeps accepting, but nothing answers. Returns only once the
    /// process is actually stopped (on Linux), so the next command a test
    /// sends cannot sneak in before the freeze.
    pub fn pause(&mut self) {
        let what = format!("redis {}", self.port());
        self.process.pause(&what);
    }

    /// A no-op on a server that is not running, so cleanup paths need not
    /// track which nodes they killed.
    pub fn resume(&mut self) {
        let what = format!("redis {}", self.port());
        self.process.resume(&what);
    }

    /// Same port, options and data directory, so clients reconnect to the
    /// same address and an AOF (if enabled) is replayed. Without `appendonly`
    /// the node comes back empty, which is the "lost its locks" case.
    /// Returns once the data is loaded and the server answers PING.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + RESTART_PORT_WAIT;
        loop {
            match self.launch() {
                Launch::Ready => return,
                Launch::PortBusy if Instant::now() < deadline => thread::sleep(Duration::from_millis(100)),
                Launch::PortBusy => panic!(
                    "redis {}: port still in use {RESTART_PORT_WAIT:?} after kill; cannot restart\n{}",
                    self.port(),
                    self.logs(0)
                ),
            }
        }
    }

    /// True while the process exists, paused or not.
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// Keys matching `pattern`; see [`Cluster::count_keys`] for the
    /// special values.
    pub fn count_keys(&self, pattern: &str) -> usize {
        if !self.is_running() {
            return 0;
        }
        if self.process.is_paused() {
            return usize::MAX;
        }
        match self.query(&["KEYS", pattern], CLI_TIMEOUT) {
            Ok(Reply::Array(Some(keys))) => keys.len(),
            _ => usize::MAX,
        }
    }

    /// Runs one command over a fresh RESP connection, independent of both
    /// `redis-cli` and the crate under test, so a test's view of the server
    /// cannot share the library's bugs. Authenticates with `requirepass`
    /// when set.
    ///
    /// Rendering: strings as-is, integers in decimal, nil as `(nil)`, arrays
    /// flattened and joined by `\n`, errors as `(error) ERR ...`. Panics if
    /// the server does not answer within 5 s (e.g. it is paused).
    pub fn cli(&self, args: &[&str]) -> String {
        match self.query(args, CLI_TIMEOUT) {
            Ok(reply) => render(&reply),
            Err(e) => panic!("redis {}: command {args:?} failed: {e}", self.port()),
        }
    }

    /// `ROLE` (rendered as [`cli`](Self::cli) does: `master`, `slave`, …
    /// first), or `None` when the query failed. Sentinel ends its
    /// reconfiguration of a server with `CLIENT KILL TYPE normal`, which
    /// resets any connection open to it at that moment, the harness's own
    /// included (seen once in CI: "Connection reset by peer" in the middle
    /// of a failover): a test that polls the role through a failover asks
    /// again at its next turn instead of failing.
    pub fn role(&self) -> Option<String> {
        self.query(&["ROLE"], CLI_TIMEOUT)
            .ok()
            .map(|reply| render(&reply))
    }

    /// Starts `MONITOR` on a connection of its own (plain TCP servers
    /// only): every command the server runs from now on, as the lines
    /// Redis prints (`+1700000000.123456 [0 127.0.0.1:5000] "SET" "k"`;
    /// commands a script runs show `[0 lua]`), until the [`Monitor`] is
    /// dropped.
    pub fn monitor(&self) -> Monitor {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port()));
        let mut stream = TcpStream::connect_timeout(&addr, CLI_TIMEOUT)
            .unwrap_or_else(|e| panic!("redis {}: MONITOR connect: {e}", self.port()));
        stream
            .write_all(b"MONITOR\r\n")
            .unwrap_or_else(|e| panic!("redis {}: MONITOR: {e}", self.port()));
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (seen, reader) = (
            lines.clone(),
            stream.try_clone().expect("a clone of the socket"),
        );
        thread::spawn(move || {
            for line in BufReader::new(reader).lines() {
                let Ok(line) = line else { return };
                seen.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        // Monitoring from the server's `+OK` on: a command sent before it
        // might not be seen (on a loaded machine the first commands of a
        // test were missed).
        let deadline = Instant::now() + CLI_TIMEOUT;
        while lines.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
            assert!(
                Instant::now() < deadline,
                "redis {}: MONITOR never answered",
                self.port()
            );
            thread::sleep(Duration::from_millis(2));
        }
        Monitor { stream, lines }
    }

    fn query(&self, args: &[&str], timeout: Duration) -> io::Result<Reply> {
        let password = self.opts.requirepass.as_deref();
        if self.opts.tls.is_some() {
            let stream = UnixStream::connect(self.socket_path())?;
            exchange(stream, password, args, timeout)
        } else {
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port()));
            let stream = TcpStream::connect_timeout(&addr, timeout)?;
            stream.set_nodelay(true)?;
            exchange(stream, password, args, timeout)
        }
    }

    fn args(&self) -> Vec<String> {
        let o = &self.opts;
        let (port, tls_port) = match o.tls {
            Some(_) => (0, Some(self.port())),
            None => (self.port(), None),
        };
        let mut a: Vec<String> = Vec::new();
        if o.sentinel_conf.is_some() {
            a.extend([
                self.dir.join("sentinel.conf").display().to_string(),
                "--sentinel".into(),
            ]);
        }
        a.extend([
            "--port".into(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            // No RDB snapshots: persistence is exactly what `appendonly`
            // says, so a restart without it reliably loses everything.
            "--save".into(),
            String::new(),
            "--appendonly".into(),
            if o.appendonly { "yes" } else { "no" }.into(),
            "--dir".into(),
            self.dir.path().display().to_string(),
            "--daemonize".into(),
            "no".into(),
            "--protected-mode".into(),
            "no".into(),
            "--loglevel".into(),
            "warning".into(),
            "--logfile".into(),
            self.log_path().display().to_string(),
        ]);
        if let (Some(tls), Some(tls_port)) = (&o.tls, tls_port) {
            let file = |name: &str| self.dir.join(name).display().to_string();
            a.extend([
                "--tls-port".into(),
                tls_port.to_string(),
                "--tls-cert-file".into(),
                file("tls.crt"),
                "--tls-key-file".into(),
                file("tls.key"),
                "--tls-ca-cert-file".into(),
                file("ca.crt"),
                "--tls-auth-clients".into(),
                if tls.auth_clients { "yes" } else { "no" }.into(),
            ]);
        }
        if self.has_socket() {
            a.extend([
                "--unixsocket".into(),
                self.socket_path().display().to_string(),
                "--unixsocketperm".into(),
                "700".into(),
            ]);
        }
        if o.appendfsync_always {
            a.extend(["--appendfsync".into(), "always".into()]);
        }
        if let Some(pass) = &o.requirepass {
            a.extend(["--requirepass".into(), pass.clone()]);
        }
        if let Some((user, pass)) = &o.acl_user {
            // Any config directive works as `--directive args...`; `user`
            // takes its ACL rules as separate arguments.
            a.extend([
                "--user".into(),
                user.clone(),
                "on".into(),
                format!(">{pass}"),
                "~*".into(),
                "&*".into(),
                "+@all".into(),
            ]);
        }
        if let Some(master) = o.replica_of {
            a.extend(["--replicaof".into(), "127.0.0.1".into(), master.to_string()]);
        }
        if let Some(policy) = &o.maxmemory_policy {
            a.extend(["--maxmemory-policy".into(), policy.clone()]);
        }
        a.extend(o.extra_args.iter().cloned());
        a
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    /// Config errors are printed before `--logfile` takes effect, so they
    /// only ever reach stdout/stderr.
    fn output_path(&self) -> PathBuf {
        self.dir.join("output.log")
    }

    /// The log written since byte `from` (the log is appended to across
    /// restarts) plus the child's stdout/stderr, for failure messages.
    fn logs(&self, from: u64) -> String {
        let log = process::read_from(&self.log_path(), from);
        let out = process::read_from(&self.output_path(), 0);
        format!(
            "--- {} ---\n{log}\n--- {} ---\n{out}",
            self.log_path().display(),
            self.output_path().display()
        )
    }

    fn launch(&mut self) -> Launch {
        fs::create_dir_all(self.dir.path())
            .unwrap_or_else(|e| panic!("creating {}: {e}", self.dir.path().display()));
        let log_start = fs::metadata(self.log_path()).map_or(0, |m| m.len());
        if let Some(conf) = &self.opts.sentinel_conf {
            // Once: a restarted Sentinel keeps what it rewrote.
            let path = self.dir.join("sentinel.conf");
            if !path.exists() {
                fs::write(&path, conf)
                    .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
            }
        }
        if let Some(tls) = &self.opts.tls {
            for (name, pem) in [
                ("tls.crt", &tls.cert_pem),
                ("tls.key", &tls.key_pem),
                ("ca.crt", &tls.ca_pem),
            ] {
                let path = self.dir.join(name);
                fs::write(&path, pem).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
            }
        }
        let mut cmd = Command::new(&self.bin);
        cmd.args(self.args());
        let output = self.output_path();
        self.process.spawn(&mut cmd, &output);
        self.process.wait_ready(
            &format!("redis-server on port {}", self.port()),
            READY_TIMEOUT,
            || self.probe(),
            || self.logs(log_start),
        )
    }

    /// Ready means a command would succeed now: `-LOADING` (AOF replay)
    /// keeps waiting so that a test's first GET after `restart` sees the
    /// replayed data. Other errors (e.g. `-MASTERDOWN` on a replica) still
    /// prove the server is up.
    fn probe(&self) -> bool {
        match self.query(&["PING"], PROBE_TIMEOUT) {
            Ok(Reply::Error(e)) => !e.starts_with("LOADING"),
            Ok(_) => true,
            Err(_) => false,
        }
    }
}

/// N independent masters, the topology Redlock assumes.
#[derive(Debug)]
pub struct Cluster {
    pub nodes: Vec<RedisServer>,
}

impl Cluster {
    pub fn start(n: usize) -> Cluster {
        Cluster::start_with(n, |_| ServerOptions::default())
    }

    /// `opts` gets the node index so tests can vary one node (e.g. make
    /// node 0 persistent). Nodes start one after another: a startup is a few
    /// milliseconds, and a partial start still cleans up through `Drop`.
    pub fn start_with(n: usize, opts: impl Fn(usize) -> ServerOptions) -> Cluster {
        Cluster {
            nodes: (0..n).map(|i| RedisServer::start_with(opts(i))).collect(),
        }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    pub fn node(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// Keys matching `pattern` on each node, e.g. to check that a release
    /// left nothing behind. A node that is not running counts 0. A paused
    /// node, or one that fails to answer within 5 s, reports `usize::MAX`:
    /// resume paused nodes before counting. Paused nodes are reported
    /// without asking, because asking would always cost the full timeout.
    pub fn count_keys(&self, pattern: &str) -> Vec<usize> {
        self.nodes
            .iter()
            .map(|node| node.count_keys(pattern))
            .collect()
    }
}

/// A parsed reply. RESP3 types are accepted too, because a test may send
/// `HELLO 3` through `cli`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

/// One command (after AUTH when `password` is set) on a fresh connection.
fn exchange<S>(
    stream: S,
    password: Option<&str>,
    args: &[&str],
    timeout: Duration,
) -> io::Result<Reply>
where
    S: Read + Write + Timeouts,
{
    stream.timeouts(timeout)?;
    let mut stream = stream;
    let mut request = Vec::new();
    if let Some(pass) = password {
        encode(&mut request, &["AUTH", pass]);
    }
    encode(&mut request, args);
    stream.write_all(&request)?;
    let mut reader = BufReader::new(stream);
    if password.is_some() {
        // A failed AUTH shows up again as NOAUTH on the real command, which
        // is the more useful error for the test to see.
        read_reply(&mut reader)?;
    }
    read_reply(&mut reader)
}

/// Read and write deadlines, on a TCP or a Unix stream alike.
trait Timeouts {
    fn timeouts(&self, timeout: Duration) -> io::Result<()>;
}

impl Timeouts for TcpStream {
    fn timeouts(&self, timeout: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(timeout))?;
        self.set_write_timeout(Some(timeout))
    }
}

impl Timeouts for UnixStream {
    fn timeouts(&self, timeout: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(timeout))?;
        self.set_write_timeout(Some(timeout))
    }
}

/// Appends `args` as one RESP command.
pub(crate) fn encode<A: AsRef<[u8]>>(out: &mut Vec<u8>, args: &[A]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        let arg = arg.as_ref();
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

pub(crate) fn protocol_error(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn read_line(r: &mut impl BufRead) -> io::Result<String> {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line)?;
    if !line.ends_with(b"\r\n") {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed mid-reply",
        ));
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).map_err(|e| protocol_error(format!("non-UTF-8 reply line: {e}")))
}

fn parse_len(s: &str) -> io::Result<i64> {
    s.parse()
        .map_err(|_| protocol_error(format!("bad length {s:?}")))
}

fn read_blob(r: &mut impl BufRead, len: i64) -> io::Result<Option<Vec<u8>>> {
    let Ok(len) = usize::try_from(len) else {
        return Ok(None); // -1: nil
    };
    let mut buf = vec![0; len + 2];
    r.read_exact(&mut buf)?;
    buf.truncate(len);
    Ok(Some(buf))
}

fn read_items(r: &mut impl BufRead, count: i64) -> io::Result<Option<Vec<Reply>>> {
    let Ok(count) = usize::try_from(count) else {
        return Ok(None);
    };
    (0..count)
        .map(|_| read_reply(r))
        .collect::<io::Result<Vec<_>>>()
        .map(Some)
}

/// Reads one reply, nesting kept (RESP2 or RESP3).
pub(crate) fn read_reply(r: &mut impl BufRead) -> io::Result<Reply> {
    let line = read_line(r)?;
    let Some(kind) = line.chars().next() else {
        return Err(protocol_error("empty reply line".into()));
    };
    let rest = &line[1..];
    Ok(match kind {
        '+' | ',' | '(' => Reply::Simple(rest.to_owned()),
        '#' => Reply::Simple(if rest == "t" { "(true)" } else { "(false)" }.to_owned()),
        '-' => Reply::Error(rest.to_owned()),
        ':' => Reply::Int(parse_len(rest)?),
        '_' => Reply::Bulk(None),
        '$' => Reply::Bulk(read_blob(r, parse_len(rest)?)?),
        '!' => {
            let blob = read_blob(r, parse_len(rest)?)?.unwrap_or_default();
            Reply::Error(String::from_utf8_lossy(&blob).into_owned())
        }
        '=' => {
            // Verbatim strings carry a "txt:" format prefix.
            let blob = read_blob(r, parse_len(rest)?)?.unwrap_or_default();
            Reply::Bulk(Some(blob.get(4..).unwrap_or_default().to_vec()))
        }
        '*' | '~' | '>' => Reply::Array(read_items(r, parse_len(rest)?)?),
        '%' => Reply::Array(read_items(r, parse_len(rest)?.saturating_mul(2))?),
        other => return Err(protocol_error(format!("unknown reply type {other:?}"))),
    })
}

fn render(reply: &Reply) -> String {
    match reply {
        Reply::Simple(s) => s.clone(),
        Reply::Error(e) => format!("(error) {e}"),
        Reply::Int(i) => i.to_string(),
        Reply::Bulk(Some(b)) => String::from_utf8_lossy(b).into_owned(),
        Reply::Bulk(None) | Reply::Array(None) => "(nil)".to_owned(),
        Reply::Array(Some(items)) => items.iter().map(render).collect::<Vec<_>>().join("\n"),
    }
}

/// A `MONITOR` connection ([`RedisServer::monitor`]); closed on drop.
#[derive(Debug)]
pub struct Monitor {
    stream: TcpStream,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Monitor {
    /// The lines seen so far (the first is `+OK`).
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}
