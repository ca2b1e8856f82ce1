//! What `server.rs` (redis-server) and `postgres.rs` (PostgreSQL) share about
//! running a server as a child process: a free port, a private directory,
//! spawning with logs, waiting until it is ready, signals, and cleanup.
//!
//! Pure `std` and never names `crate` or `super`, so it can be included
//! anywhere with `#[path]`. `server.rs` and `postgres.rs` use it as their
//! sibling module `process`: whoever includes them (the tests, examples,
//! benches) includes this file beside them, once per binary, so that all of
//! the binary's servers share one set of port reservations.
//!
//! Signals go through the `kill` command rather than `libc` to keep the
//! dev-dependency list empty.
//!
//! Cleanup runs in `Drop`, and `Drop` runs during unwinding, so a failing
//! test still cleans up. A test binary that aborts (or is `SIGKILLed`) can
//! still leak servers: catching that needs `prctl(PR_SET_PDEATHSIG)`, which
//! is not reachable from `std`.

// Each includer uses a different subset.
#![allow(dead_code)]

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

/// Readiness probes use a short timeout because the port may briefly belong
/// to a foreign listener (the free-port race) that never answers the
/// server's protocol.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
pub const PROBE_INTERVAL: Duration = Duration::from_millis(20);
/// The free-port race is rare; ten losses in a row means something else is
/// wrong.
pub const MAX_PORT_ATTEMPTS: usize = 10;
/// How often [`wait_timeout`] looks at a child that has not exited yet.
const EXIT_POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Distinguishes directories made by one test process; the pid alone is not
/// unique because tests in one binary run on parallel threads.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// Ports held by [`ReservedPort`]s in this process (Redis and PostgreSQL
/// servers alike), so a free-port pick for one test never lands on the port
/// another test's killed server will be restarted on. Collisions with other processes are still possible and are
/// handled by retrying ([`on_free_port`]).
static RESERVED_PORTS: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

fn reserved_ports() -> MutexGuard<'static, Option<HashSet<u16>>> {
    // A panic while holding this lock leaves the set consistent (it only
    // ever holds insert/remove), so poisoning is safe to ignore; that also
    // keeps `Drop` panic-free.
    RESERVED_PORTS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// A port on 127.0.0.1 that was free when picked, reserved in this process
/// until dropped.
#[derive(Debug)]
pub struct ReservedPort(u16);

impl ReservedPort {
    /// Binds port 0 so the kernel picks a free port, then releases it for
    /// the server; the gap is the race [`on_free_port`] retries on.
    pub fn pick() -> ReservedPort {
        loop {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .unwrap_or_else(|e| panic!("binding 127.0.0.1:0 to find a free port: {e}"));
            let port = listener
                .local_addr()
                .unwrap_or_else(|e| panic!("reading the bound port: {e}"))
                .port();
            drop(listener);
            if reserved_ports()
                .get_or_insert_with(HashSet::new)
                .insert(port)
            {
                return ReservedPort(port);
            }
        }
    }

    pub fn get(&self) -> u16 {
        self.0
    }
}

impl Drop for ReservedPort {
    fn drop(&mut self) {
        if let Some(set) = reserved_ports().as_mut() {
            set.remove(&self.0);
        }
    }
}

/// Picking a port and then handing it to another process is inherently
/// racy, so `start` gets a fresh port until it returns `Some` (it returns
/// `None` when it lost the race: [`Launch::PortBusy`]). Panics after
/// [`MAX_PORT_ATTEMPTS`] losses, naming `what`.
pub fn on_free_port<T>(what: &str, mut start: impl FnMut(ReservedPort) -> Option<T>) -> T {
    for _ in 0..MAX_PORT_ATTEMPTS {
        if let Some(started) = start(ReservedPort::pick()) {
            return started;
        }
    }
    panic!("{what}: lost the free-port race {MAX_PORT_ATTEMPTS} times in a row");
}

/// A directory of its own under the system's temporary directory, named
/// `redfence-{kind}-{pid}-{n}`, removed on drop. Not created here: the
/// server decides how (and for which user).
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(kind: &str) -> TempDir {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("redfence-{kind}-{}-{id}", std::process::id()));
        // Only a leak from an earlier process with the same pid can be here.
        let _ = fs::remove_dir_all(&dir);
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Whether `bin --version` runs and exits 0: the program is installed and
/// works.
pub fn runs(bin: &str) -> bool {
    Command::new(bin)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .is_ok_and(|out| out.status.success())
}

/// The binary named by the environment variable `env`, else `default` from
/// `PATH`, checked by running it with `--version`: missing means the test
/// fails naming the Debian `package` to install, never that it skips.
pub fn checked_bin(env: &str, default: &str, package: &str) -> String {
    let bin = std::env::var(env).unwrap_or_else(|_| default.to_owned());
    assert!(
        runs(&bin),
        "{default} not found: install it (Debian: apt-get install {package}) \
         or set {env} (tried {bin:?})"
    );
    bin
}

/// Spawns `cmd` with no stdin and its stdout and stderr into `log` (created
/// or truncated): config errors are printed there before a server's own log
/// file takes effect.
pub fn spawn_logged(cmd: &mut Command, log: &Path) -> Child {
    let out = File::create(log).unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
    let err = out
        .try_clone()
        .unwrap_or_else(|e| panic!("cloning {}: {e}", log.display()));
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"))
}

/// Waits up to `timeout` for `child` to exit; `None` if it is still running
/// (the caller decides whether to kill it).
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => thread::sleep(EXIT_POLL_INTERVAL),
            Ok(None) | Err(_) => return None,
        }
    }
}

/// Why a launch did not produce a ready server, when that is recoverable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launch {
    Ready,
    /// Someone else holds the port; any other failure panics immediately,
    /// because retrying a bad config ten times only hides the message.
    PortBusy,
}

/// One server process, killed on drop (resumed first if paused).
///
/// The child sits behind a `Mutex` so that `pid(&self)` can reap it
/// (`Child::try_wait` needs `&mut`) while the server owning it stays `Sync`
/// for tests that share it across threads.
#[derive(Debug, Default)]
pub struct Process {
    child: Mutex<Option<Child>>,
    paused: AtomicBool,
}

impl Process {
    /// Starts `cmd` (see [`spawn_logged`]), killing the previous child if
    /// there still is one.
    pub fn spawn(&mut self, cmd: &mut Command, log: &Path) {
        self.kill();
        *self.child_mut() = Some(spawn_logged(cmd, log));
    }

    /// `Some` while the process exists, including while it is paused.
    pub fn pid(&self) -> Option<u32> {
        let mut child = self.lock_child();
        let c = child.as_mut()?;
        matches!(c.try_wait(), Ok(None)).then(|| c.id())
    }

    /// True while the process exists, paused or not.
    pub fn is_running(&self) -> bool {
        self.pid().is_some()
    }

    /// True between [`pause`](Self::pause) and [`resume`](Self::resume) (or
    /// a kill).
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// The child's exit status once it has exited (forgetting the child);
    /// `None` while it runs or when there is none.
    fn exited(&self) -> Option<ExitStatus> {
        let mut child = self.lock_child();
        let status = child.as_mut()?.try_wait().ok().flatten()?;
        *child = None;
        Some(status)
    }

    /// Waits until `ready` holds. A child that exits first panics with its
    /// `logs`, unless they say that the port was taken
    /// ([`Launch::PortBusy`]); so does one not ready within `timeout`.
    /// `what` names the server in those messages, e.g. "postgres on port 5".
    pub fn wait_ready(
        &self,
        what: &str,
        timeout: Duration,
        mut ready: impl FnMut() -> bool,
        logs: impl Fn() -> String,
    ) -> Launch {
        let deadline = Instant::now() + timeout;
        loop {
            // Checked before probing: if our child died, whatever answers on
            // the port is someone else.
            if let Some(status) = self.exited() {
                let logs = logs();
                if logs.contains("Address already in use") {
                    return Launch::PortBusy;
                }
                panic!("{what} exited during startup ({status})\n{logs}");
            }
            if ready() {
                return Launch::Ready;
            }
            // The owner's `Drop` kills the child once this unwinds.
            assert!(
                Instant::now() < deadline,
                "{what} not ready after {timeout:?}\n{}",
                logs()
            );
            thread::sleep(PROBE_INTERVAL);
        }
    }

    /// SIGKILL, so the process gets no chance to flush or clean up, and
    /// reaps it, so its port is free once this returns. Idempotent.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child_mut().take() {
            // SIGKILL also ends a stopped process.
            let _ = c.kill();
            let _ = c.wait();
        }
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Sends `signal` (e.g. "TERM") and waits up to `grace` for the process
    /// to exit, then kills it. Idempotent.
    pub fn stop(&mut self, signal: &str, grace: Duration) {
        let Some(mut c) = self.child_mut().take() else {
            return;
        };
        let _ = send_signal(c.id(), signal);
        if wait_timeout(&mut c, grace).is_none() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.paused.store(false, Ordering::SeqCst);
    }

    /// SIGSTOP: the process keeps its connections open and the kernel keeps
    /// accepting, but nothing answers. Returns only once the process is
    /// actually stopped (on Linux), so the next request cannot sneak in
    /// before the freeze. `what` names the server in panic messages.
    pub fn pause(&mut self, what: &str) {
        let pid = self
            .pid()
            .unwrap_or_else(|| panic!("{what}: pause() on a server that is not running"));
        send_signal(pid, "STOP").unwrap_or_else(|e| panic!("{what}: sending SIGSTOP failed: {e}"));
        self.paused.store(true, Ordering::SeqCst);
        wait_for_proc_state(pid, true);
    }

    /// SIGCONT; a no-op when the process is not running.
    pub fn resume(&mut self, what: &str) {
        let Some(pid) = self.pid() else {
            self.paused.store(false, Ordering::SeqCst);
            return;
        };
        send_signal(pid, "CONT").unwrap_or_else(|e| panic!("{what}: sending SIGCONT failed: {e}"));
        self.paused.store(false, Ordering::SeqCst);
        wait_for_proc_state(pid, false);
    }

    fn lock_child(&self) -> MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn child_mut(&mut self) -> &mut Option<Child> {
        self.child.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.is_paused() {
            if let Some(pid) = self.pid() {
                let _ = send_signal(pid, "CONT");
            }
        }
        self.kill();
    }
}

/// `kill -SIG PID`, e.g. `sig` = "STOP", "CONT", "TERM", "KILL".
pub fn send_signal(pid: u32, sig: &str) -> io::Result<()> {
    let status = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "`kill -{sig} {pid}` exited with {status}"
        )))
    }
}

/// Signals are delivered asynchronously; polls `/proc` until the process
/// is (or is no longer) stopped. Where `/proc` is missing this returns at
/// once and the caller gets the usual asynchronous behaviour.
fn wait_for_proc_state(pid: u32, stopped: bool) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return;
        };
        // The state follows the parenthesised command name, which may itself
        // contain spaces or parentheses.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        match state {
            Some('T' | 't') if stopped => return,
            Some('T' | 't') => {}
            Some(_) if !stopped => return,
            Some(_) => {}
            None => return,
        }
        thread::sleep(Duration::from_millis(1));
    }
}

/// The file from byte `from` on (logs are appended to across restarts), for
/// failure messages; empty when it cannot be read.
pub fn read_from(path: &Path, from: u64) -> String {
    let mut buf = Vec::new();
    if let Ok(f) = File::open(path) {
        let mut reader = BufReader::new(f);
        let _ = io::copy(&mut (&mut reader).take(from), &mut io::sink());
        let _ = reader.read_to_end(&mut buf);
    }
    String::from_utf8_lossy(&buf).into_owned()
}
