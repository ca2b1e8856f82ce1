//! Real MariaDB servers for tests and examples (the MySQL side of the sqlx
//! fenced stores).
//!
//! Affected-row counts, InnoDB's row and gap locks, and what a rolled back
//! transaction leaves are the server's behaviour, so the tests run against
//! the real server, never a mock. Each [`MariaDbServer`] is a throwaway
//! instance: `mariadb-install-db` into a fresh directory, `mariadbd` on a
//! free 127.0.0.1 port with its socket in that directory, user `root` with
//! no password, a database `redfence` made at startup (`--init-file`), no
//! binary log and no flush at commit. `Drop` kills it and removes the
//! directory, also when a test panics.
//!
//! Pure `std`, and names no module but its sibling `process`, so an
//! example can include the two side by side with `#[path = ...]`.
//!
//! `mariadbd` refuses to run as root unless told `--user=root`; as root it
//! is told that (the data directory is this process's own), so the child
//! this file owns and signals is the server itself.

// Each includer uses a different subset.
#![allow(dead_code)]

use std::fs;
use std::io::{self, Read};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use super::process::{self, Launch, Process, ReservedPort, TempDir, PROBE_TIMEOUT};

/// `mariadb-install-db` takes about half a second; a loaded machine more.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(120);
/// A fresh instance has nothing to recover; a broken one fails the test
/// instead of hanging.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// SIGTERM is a clean shutdown of a few hundred milliseconds; past this,
/// SIGKILL (the data is thrown away either way).
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// The database every server has, for the tests' tables.
pub const DATABASE: &str = "redfence";

/// `$NAME` if set, else `default`; checked to run (`--version`), naming
/// the Debian package to install when it does not: a test that silently
/// skipped without MariaDB would hide the bugs it is for.
fn bin(env: &str, default: &str) -> String {
    process::checked_bin(env, default, "mariadb-server")
}

fn is_root() -> bool {
    static ROOT: OnceLock<bool> = OnceLock::new();
    *ROOT.get_or_init(|| {
        Command::new("id")
            .arg("-u")
            .stdin(Stdio::null())
            .output()
            .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
    })
}

/// One throwaway MariaDB instance on 127.0.0.1, killed and its directory
/// removed on drop.
#[derive(Debug)]
pub struct MariaDbServer {
    // Fields drop in order (after `Drop::drop` has stopped the server): the
    // process before its directory.
    process: Process,
    dir: TempDir,
    port: Option<ReservedPort>,
}

impl MariaDbServer {
    /// A server of its own.
    pub fn start() -> MariaDbServer {
        let mut server = MariaDbServer {
            process: Process::default(),
            dir: TempDir::new("mariadb"),
            port: None,
        };
        server.install();
        process::on_free_port("mariadbd", |port| {
            server.port = Some(port);
            (server.launch() == Launch::Ready).then_some(())
        });
        server
    }

    /// One server for every caller in this process while any of them holds
    /// it (the last to drop it stops it): tests share it and isolate
    /// themselves by table name.
    pub fn shared() -> Arc<MariaDbServer> {
        static SHARED: Mutex<Weak<MariaDbServer>> = Mutex::new(Weak::new());
        let mut slot = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(server) = slot.upgrade() {
            return server;
        }
        let server = Arc::new(MariaDbServer::start());
        *slot = Arc::downgrade(&server);
        server
    }

    pub fn port(&self) -> u16 {
        self.port.as_ref().map_or(0, ReservedPort::get)
    }

    /// A URL for sqlx's `MySqlPool::connect` (user `root`, no password,
    /// database [`DATABASE`]).
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/{DATABASE}", self.port())
    }

    /// Stops the server (SIGSTOP) until [`resume`](Self::resume).
    pub fn pause(&mut self) {
        self.process.pause("mariadbd");
    }

    pub fn resume(&mut self) {
        self.process.resume("mariadbd");
    }

    /// The server's logs so far, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for name in ["install.log", "mariadbd.log", "error.log"] {
            let path = self.dir.join(name);
            let text = process::read_from(&path, 0);
            out.push_str(&format!("--- {} ---\n{text}\n", path.display()));
        }
        out
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn install(&mut self) {
        let dir = self.dir.path();
        fs::create_dir(dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        fs::write(
            self.dir.join("init.sql"),
            format!("CREATE DATABASE IF NOT EXISTS {DATABASE};\n"),
        )
        .unwrap_or_else(|e| panic!("writing init.sql: {e}"));
        let mut cmd = Command::new(bin("MARIADB_INSTALL_DB", "mariadb-install-db"));
        cmd.current_dir(dir)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", self.data_dir().display()))
            // root@localhost with an empty password instead of unix_socket
            // authentication, which only the OS user root could use.
            .arg("--auth-root-authentication-method=normal")
            .arg("--skip-test-db")
            .arg("--skip-name-resolve");
        if is_root() {
            cmd.arg("--user=root");
        }
        let mut child = process::spawn_logged(&mut cmd, &self.dir.join("install.log"));
        match process::wait_timeout(&mut child, INSTALL_TIMEOUT) {
            Some(status) if status.success() => {}
            Some(status) => panic!("mariadb-install-db failed ({status})\n{}", self.logs()),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "mariadb-install-db did not finish within {INSTALL_TIMEOUT:?}\n{}",
                    self.logs()
                );
            }
        }
    }

    fn launch(&mut self) -> Launch {
        let port = self.port();
        // Debian keeps it in /usr/sbin, which a normal user's PATH may lack.
        let default = if process::runs("mariadbd") {
            "mariadbd"
        } else {
            "/usr/sbin/mariadbd"
        };
        let mut cmd = Command::new(bin("MARIADBD", default));
        cmd.current_dir(self.dir.path())
            .arg("--no-defaults")
            .arg(format!("--datadir={}", self.data_dir().display()))
            .arg(format!("--port={port}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", self.dir.join("sock").display()))
            .arg(format!("--pid-file={}", self.dir.join("pid").display()))
            .arg(format!(
                "--init-file={}",
                self.dir.join("init.sql").display()
            ))
            .arg(format!(
                "--log-error={}",
                self.dir.join("error.log").display()
            ))
            .arg("--skip-name-resolve")
            // Throwaway data: durability only costs time; several servers
            // may run at once, so small buffers.
            .arg("--innodb-flush-log-at-trx-commit=0")
            .arg("--innodb-buffer-pool-size=16M")
            .arg("--innodb-log-file-size=8M")
            .arg("--skip-log-bin")
            .arg("--max-connections=500");
        if is_root() {
            cmd.arg("--user=root");
        }
        self.process.spawn(&mut cmd, &self.dir.join("mariadbd.log"));
        // A taken port is named in the error log, which `logs` includes.
        self.process.wait_ready(
            &format!("mariadbd on port {port}"),
            READY_TIMEOUT,
            || probe(port),
            || self.logs(),
        )
    }
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        self.process.stop("TERM", STOP_TIMEOUT);
    }
}

/// Ready means the server greets a new connection: its first packet is a
/// handshake (protocol version 10), not an error packet (0xff), which it
/// sends while still starting up or when refusing the host. The init file
/// has run by then (the server runs it before it listens).
fn probe(port: u16) -> bool {
    try_probe(port).unwrap_or(false)
}

fn try_probe(port: u16) -> io::Result<bool> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT)?;
    stream.set_read_timeout(Some(PROBE_TIMEOUT))?;
    // 3 bytes of length, 1 of sequence, then the payload's first byte.
    let mut head = [0_u8; 5];
    stream.read_exact(&mut head)?;
    Ok(head[4] == 10)
}
