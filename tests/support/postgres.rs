//! Real PostgreSQL servers for tests and examples.
//!
//! The fenced store's guarantees are about what PostgreSQL does under
//! concurrency (`ON CONFLICT` re-checks, row locks held to commit, rolled
//! back transactions), so the tests run against the real server, never a
//! mock. Each [`PgServer`] is a throwaway cluster: `initdb` into a fresh
//! directory, `postgres` on a free 127.0.0.1 port, trust authentication for
//! the `postgres` user, no fsync. `Drop` stops it and removes the directory,
//! also when a test panics.
//!
//! Pure `std` and, like `server.rs`, names no module but its sibling
//! `process` (`process.rs`), so an example can include the two side by side
//! with `#[path = "../tests/support/..."]`.
//!
//! `initdb` and `postgres` refuse to run as root. When this process is root
//! (containers, CI), they run as the `postgres` system user (created by the
//! distribution's package) through `setpriv`, which `exec`s, so the child
//! this file owns and signals is the postmaster itself. (`runuser` and `su`
//! fork and wait instead; killing them would orphan the server.)

// Each includer uses a different subset.
#![allow(dead_code)]

use std::fs;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use super::process::{self, Launch, Process, ReservedPort, TempDir, PROBE_TIMEOUT};

/// `initdb` takes about a second; a loaded CI machine may take several.
const INITDB_TIMEOUT: Duration = Duration::from_secs(60);
/// A fresh cluster has nothing to recover, but a busy machine is slow to
/// start a few processes; a broken one fails the test instead of hanging.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Immediate shutdown is a few milliseconds; past this, SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Where `initdb` and `postgres` are: `$POSTGRES_BIN_DIR`, else the first
/// `PATH` directory holding both, else the newest
/// `/usr/lib/postgresql/<version>/bin` (Debian and Ubuntu keep them there,
/// off `PATH`).
///
/// Panics with an install hint when there is none: a fencing test that
/// silently skipped without PostgreSQL would hide the bugs it is for.
pub fn pg_bin_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("POSTGRES_BIN_DIR") {
            let dir = PathBuf::from(dir);
            assert!(
                has_server_bins(&dir),
                "POSTGRES_BIN_DIR={} holds no executable initdb and postgres",
                dir.display()
            );
            return dir;
        }
        let on_path = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .unwrap_or_default();
        let mut packaged: Vec<(Vec<u32>, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let version = entry.file_name().to_str()?.to_owned();
                let number = version
                    .split('.')
                    .map(str::parse)
                    .collect::<Result<Vec<u32>, _>>()
                    .ok()?;
                Some((number, entry.path().join("bin")))
            })
            .collect();
        // Highest version first: numerically, so 10 beats 9.6.
        packaged.sort_by(|a, b| b.0.cmp(&a.0));
        on_path
            .into_iter()
            .chain(packaged.into_iter().map(|(_, dir)| dir))
            .find(|dir| has_server_bins(dir))
            .unwrap_or_else(|| {
                panic!(
                    "PostgreSQL server not found (looked for initdb and postgres in \
                     $POSTGRES_BIN_DIR, PATH and /usr/lib/postgresql/*/bin): install it \
                     (Debian/Ubuntu: apt-get install postgresql) or set POSTGRES_BIN_DIR"
                )
            })
    })
    .clone()
}

fn has_server_bins(dir: &Path) -> bool {
    ["initdb", "postgres"].iter().all(|bin| {
        fs::metadata(dir.join(bin))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// Who runs the server processes.
#[derive(Debug, Clone, Copy)]
enum RunAs {
    /// This process's user: not root.
    Me,
    /// Root runs them as this uid/gid (the `postgres` user).
    User { uid: u32, gid: u32 },
}

fn run_as() -> RunAs {
    static RUN_AS: OnceLock<RunAs> = OnceLock::new();
    *RUN_AS.get_or_init(|| {
        // `id` rather than `libc::geteuid`, to keep the dev-dependencies
        // empty; it is run once per process.
        if id(&["-u"]).as_deref() != Some("0") {
            return RunAs::Me;
        }
        let (Some(uid), Some(gid)) = (id(&["-u", "postgres"]), id(&["-g", "postgres"])) else {
            panic!(
                "running as root, which initdb and postgres refuse; they would run as the \
                 `postgres` user, but there is none (the postgresql package creates it; \
                 or run the tests as a normal user)"
            );
        };
        assert!(
            process::runs("setpriv"),
            "running as root, which initdb and postgres refuse; running them as the \
             `postgres` user needs setpriv (util-linux), which is missing"
        );
        let parse = |s: String| {
            s.parse()
                .unwrap_or_else(|_| panic!("`id` printed {s:?}, not a number"))
        };
        RunAs::User {
            uid: parse(uid),
            gid: parse(gid),
        }
    })
}

/// The output of `id ARGS`, trimmed; `None` when it fails.
fn id(args: &[&str]) -> Option<String> {
    let out = Command::new("id")
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// One throwaway PostgreSQL cluster on 127.0.0.1, stopped and its directory
/// removed on drop.
#[derive(Debug)]
pub struct PgServer {
    // Fields drop in order (after `Drop::drop` has stopped the server): the
    // process before its directory.
    process: Process,
    /// Owned by the server's user: holds `data/`, the Unix socket and logs.
    dir: TempDir,
    /// `None` until the first launch.
    port: Option<ReservedPort>,
    bin_dir: PathBuf,
    run_as: RunAs,
}

impl PgServer {
    /// A server of its own.
    pub fn start() -> PgServer {
        // Built before anything is created, so that a panic from here on
        // still removes the directory (and stops the server) through `Drop`.
        let mut server = PgServer {
            process: Process::default(),
            dir: TempDir::new("pg"),
            port: None,
            bin_dir: pg_bin_dir(),
            run_as: run_as(),
        };
        server.init();
        // A lost race keeps the cluster and tries the next port.
        process::on_free_port("postgres", |port| {
            server.port = Some(port);
            (server.launch() == Launch::Ready).then_some(())
        });
        server
    }

    /// One server for every caller in this process while any of them holds
    /// it; the last to drop it stops it, and the next caller starts a new
    /// one. `initdb` costs about a second, so tests share a server and
    /// isolate themselves by table name instead.
    pub fn shared() -> Arc<PgServer> {
        static SHARED: Mutex<Weak<PgServer>> = Mutex::new(Weak::new());
        // Held while starting, so that concurrent tests wait for one server
        // instead of each starting their own. A panic while starting leaves
        // an empty `Weak`, so poisoning is harmless.
        let mut slot = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(server) = slot.upgrade() {
            return server;
        }
        let server = Arc::new(PgServer::start());
        *slot = Arc::downgrade(&server);
        server
    }

    pub fn port(&self) -> u16 {
        self.port.as_ref().map_or(0, ReservedPort::get)
    }

    /// A connection URL for `tokio_postgres::connect` (user `postgres`,
    /// database `postgres`, no password: trust authentication).
    pub fn url(&self) -> String {
        format!("postgresql://postgres@127.0.0.1:{}/postgres", self.port())
    }

    /// The server's log so far, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for name in ["initdb.log", "postgres.log"] {
            let path = self.dir.join(name);
            let text = process::read_from(&path, 0);
            out.push_str(&format!("--- {} ---\n{text}\n", path.display()));
        }
        out
    }

    /// A command for a server binary, as the user the server runs as.
    fn command(&self, bin: &str) -> Command {
        let program = self.bin_dir.join(bin);
        let mut cmd = match self.run_as {
            RunAs::Me => Command::new(program),
            RunAs::User { uid, gid } => {
                let mut cmd = Command::new("setpriv");
                cmd.arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={gid}"))
                    .arg("--clear-groups")
                    .arg("--")
                    .arg(program);
                cmd
            }
        };
        // The server user may not be allowed into the caller's directory,
        // and initdb and postgres both want a readable working directory.
        cmd.current_dir(self.dir.path());
        cmd
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Creates the directory for the server's user and runs `initdb` into
    /// it, bounded.
    fn init(&mut self) {
        let dir = self.dir.path();
        fs::create_dir(dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        if let RunAs::User { uid, gid } = self.run_as {
            std::os::unix::fs::chown(dir, Some(uid), Some(gid))
                .unwrap_or_else(|e| panic!("chown {}: {e}", dir.display()));
        }
        let mut cmd = self.command("initdb");
        cmd.arg("-D")
            .arg(self.data_dir())
            .args(["-U", "postgres", "--auth=trust", "--no-sync"])
            // Independent of the host's locales, which minimal containers
            // lack.
            .args(["--encoding=UTF8", "--locale=C"]);
        let mut child = process::spawn_logged(&mut cmd, &self.dir.join("initdb.log"));
        match process::wait_timeout(&mut child, INITDB_TIMEOUT) {
            Some(status) if status.success() => {}
            Some(status) => panic!("initdb failed ({status})\n{}", self.logs()),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "initdb did not finish within {INITDB_TIMEOUT:?}\n{}",
                    self.logs()
                );
            }
        }
    }

    fn launch(&mut self) -> Launch {
        let port = self.port();
        let mut cmd = self.command("postgres");
        cmd.arg("-D")
            .arg(self.data_dir())
            .args(["-p", &port.to_string()])
            .args(["-h", "127.0.0.1"])
            // The socket goes into the private directory: the default
            // (/var/run/postgresql) may not exist or not be writable.
            .arg("-k")
            .arg(self.dir.path())
            // Throwaway data: durability only costs time.
            .args(["-c", "fsync=off"])
            .args(["-c", "synchronous_commit=off"])
            .args(["-c", "full_page_writes=off"])
            // Several servers may run at once; the defaults assume one.
            .args(["-c", "shared_buffers=16MB"])
            .args(["-c", "logging_collector=off"]);
        let log = self.dir.join("postgres.log");
        self.process.spawn(&mut cmd, &log);
        self.process.wait_ready(
            &format!("postgres on port {port}"),
            READY_TIMEOUT,
            || probe(port),
            || self.logs(),
        )
    }
}

impl Drop for PgServer {
    /// SIGQUIT is PostgreSQL's immediate shutdown: the postmaster stops its
    /// backends and exits without a checkpoint, which throwaway data does
    /// not need. SIGKILL first would leave the backends running until they
    /// notice their parent is gone.
    fn drop(&mut self) {
        self.process.stop("QUIT", STOP_TIMEOUT);
    }
}

/// Ready means a session can start now: the server answers a startup
/// message with ReadyForQuery. While it starts up it answers with an error
/// (`the database system is starting up`) instead.
fn probe(port: u16) -> bool {
    try_probe(port).unwrap_or(false)
}

fn try_probe(port: u16) -> io::Result<bool> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT)?;
    stream.set_read_timeout(Some(PROBE_TIMEOUT))?;
    stream.set_write_timeout(Some(PROBE_TIMEOUT))?;
    // StartupMessage: length, protocol 3.0, then NUL-terminated key/value
    // pairs and a final NUL.
    let params = b"user\0postgres\0database\0postgres\0\0";
    let len = u32::try_from(8 + params.len()).map_err(io::Error::other)?;
    let mut msg = Vec::with_capacity(len as usize);
    msg.extend_from_slice(&len.to_be_bytes());
    msg.extend_from_slice(&196_608_u32.to_be_bytes());
    msg.extend_from_slice(params);
    stream.write_all(&msg)?;
    // Authentication, parameter statuses and the backend key come first;
    // a bound on the count keeps a foreign talker from holding us here.
    for _ in 0..64 {
        let mut header = [0_u8; 5];
        stream.read_exact(&mut header)?;
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
        let body_len = usize::try_from(len)
            .map_err(io::Error::other)?
            .saturating_sub(4);
        if body_len > 1 << 16 {
            return Ok(false); // not PostgreSQL
        }
        let mut body = vec![0_u8; body_len];
        stream.read_exact(&mut body)?;
        match header[0] {
            b'Z' => {
                // Terminate, so the server does not log an unexpected EOF.
                let _ = stream.write_all(&[b'X', 0, 0, 0, 4]);
                return Ok(true);
            }
            b'E' => return Ok(false),
            _ => {}
        }
    }
    Ok(false)
}
