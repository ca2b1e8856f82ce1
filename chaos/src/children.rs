//! Worker processes: the example re-executed with `--worker ...`.
//!
//! Each child writes its events as JSON lines to its stdout; one reader
//! thread per child parses them (a line that is not an event is counted,
//! never silently kept) and appends them to the history through the same
//! [`Writer`] as the parent's own workers. A child that is inside a
//! critical section says so with a `#cs LEASE` line; when the worker-pause
//! nemesis has armed the [`PauseGate`] for that child, its reader thread
//! SIGSTOPs it right there, microseconds after the line arrived, while the
//! child dwells between its counter's read and its write.
//!
//! [`Children`] owns the processes: its `Drop` SIGCONTs and SIGKILLs every
//! one still running and reaps it, so a failing run leaks nothing. Children
//! also ask the kernel to kill them when the parent dies (`PR_SET_PDEATHSIG`,
//! in `worker.rs`), which covers a SIGKILLed parent that runs no `Drop`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::history::{Event, Writer};
use crate::worker::ProcArgs;
use crate::BoxError;

/// A SIGSTOP delivered by a reader thread.
#[derive(Debug, Clone, Copy)]
pub struct Stopped {
    pub process: usize,
    pub pid: u32,
    pub lease: u64,
    pub at_ns: u64,
}

/// Lets the nemesis ask for "stop process P at its next critical section".
#[derive(Debug, Default)]
pub struct PauseGate {
    /// The process to stop and where to report it. Taken by whoever acts
    /// first: the reader thread that stops it, or the nemesis giving up.
    /// The reader sends while holding the lock, so a nemesis that finds it
    /// empty after giving up finds the report in its channel.
    armed: Mutex<Option<(usize, Sender<Stopped>)>>,
}

impl PauseGate {
    pub fn arm(&self, process: usize, report: Sender<Stopped>) {
        *self.lock() = Some((process, report));
    }

    pub fn disarm(&self) {
        self.lock().take();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(usize, Sender<Stopped>)>> {
        self.armed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Called by process `process`'s reader on a `#cs` line.
    fn critical_section(&self, process: usize, pid: u32, lease: u64, clock: &Clock) {
        let mut armed = self.lock();
        if armed.as_ref().is_some_and(|(p, _)| *p == process) {
            let Some((_, report)) = armed.take() else {
                return;
            };
            if signal(pid, libc::SIGSTOP) {
                let at_ns = clock.now_ns();
                let _ = report.send(Stopped {
                    process,
                    pid,
                    lease,
                    at_ns,
                });
            }
        }
    }
}

/// Sends `sig` to `pid`; false when the process is gone.
pub fn signal(pid: u32, sig: libc::c_int) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill(2) takes plain integers; `pid` is one of our children
    // (never 0 or -1, which would address process groups).
    pid > 0 && unsafe { libc::kill(pid, sig) } == 0
}

/// What the nemesis needs to pause workers.
#[derive(Debug, Clone)]
pub struct PauseTargets {
    pub pids: Vec<u32>,
    pub gate: Arc<PauseGate>,
}

struct Proc {
    child: Child,
    reader: Option<JoinHandle<()>>,
}

/// The worker processes of one run.
pub struct Children {
    procs: Vec<Proc>,
    gate: Arc<PauseGate>,
    /// Lines from children that were not events.
    bad_lines: Arc<AtomicU64>,
}

impl Children {
    /// Spawns one process per `ProcArgs`. Call from the main thread: the
    /// children's `PR_SET_PDEATHSIG` fires when the spawning *thread* ends,
    /// and the main thread outlives the run.
    pub fn spawn(args: &[ProcArgs], writer: &Arc<Writer>, clock: Clock) -> Result<Self, BoxError> {
        let exe = std::env::current_exe()?;
        let mut children = Children {
            procs: Vec::new(),
            gate: Arc::new(PauseGate::default()),
            bad_lines: Arc::new(AtomicU64::new(0)),
        };
        for a in args {
            // Pushed before anything else can fail, so `Drop` kills it.
            let mut child = Command::new(&exe)
                .args(a.to_args())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()?;
            let stdout = child.stdout.take();
            let pid = child.id();
            children.procs.push(Proc {
                child,
                reader: None,
            });
            let stdout = stdout.ok_or("worker stdout was not captured")?;
            let (writer, gate, bad) = (
                Arc::clone(writer),
                Arc::clone(&children.gate),
                Arc::clone(&children.bad_lines),
            );
            let process = a.index as usize;
            let reader = thread::Builder::new()
                .name(format!("worker-{process}-out"))
                .spawn(move || {
                    for line in BufReader::new(stdout).lines() {
                        let Ok(line) = line else { break };
                        if let Some(lease) = line.strip_prefix("#cs ") {
                            let lease = lease.trim().parse().unwrap_or(0);
                            gate.critical_section(process, pid, lease, &clock);
                            continue;
                        }
                        match serde_json::from_str::<Event>(&line) {
                            Ok(event) => {
                                if writer.record(&event).is_err() {
                                    crate::RECORD_FAILED.store(true, Ordering::Relaxed);
                                }
                            }
                            Err(_) => {
                                bad.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                })?;
            if let Some(p) = children.procs.last_mut() {
                p.reader = Some(reader);
            }
        }
        Ok(children)
    }

    pub fn targets(&self) -> PauseTargets {
        PauseTargets {
            pids: self.procs.iter().map(|p| p.child.id()).collect(),
            gate: Arc::clone(&self.gate),
        }
    }

    pub fn bad_lines(&self) -> u64 {
        self.bad_lines.load(Ordering::Relaxed)
    }

    /// Waits for every child to exit, until `deadline`; then kills the
    /// rest. Returns a description of each child that did not exit cleanly.
    /// Joins the reader threads, which end at the children's EOF.
    pub fn wait(&mut self, deadline: Instant) -> Vec<String> {
        let mut problems = Vec::new();
        for (i, p) in self.procs.iter_mut().enumerate() {
            let status = wait_until(&mut p.child, deadline);
            match status {
                Some(s) if s.success() => {}
                Some(s) => problems.push(format!("worker process {i} exited with {s}")),
                None => {
                    problems.push(format!("worker process {i} did not finish in time: killed"));
                    kill(&mut p.child);
                }
            }
            if let Some(reader) = p.reader.take() {
                // EOF follows the exit at once; the bound only protects
                // against a grandchild holding the pipe open.
                let until = Instant::now() + Duration::from_secs(2);
                while !reader.is_finished() && Instant::now() < until {
                    thread::sleep(Duration::from_millis(5));
                }
                if reader.is_finished() {
                    let _ = reader.join();
                } else {
                    problems.push(format!("worker process {i}: output reader did not finish"));
                }
            }
        }
        problems
    }
}

fn wait_until(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
            _ => return None,
        }
    }
}

fn kill(child: &mut Child) {
    // A stopped process dies of SIGKILL too, but SIGCONT first keeps the
    // order of things obvious in `ps` while it goes.
    signal(child.id(), libc::SIGCONT);
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for Children {
    fn drop(&mut self) {
        self.gate.disarm();
        for p in &mut self.procs {
            if !matches!(p.child.try_wait(), Ok(Some(_))) {
                kill(&mut p.child);
            }
        }
        // Readers end at EOF, which the kills just caused; not joined here
        // (Drop must not wait on a thread), they finish on their own.
    }
}
