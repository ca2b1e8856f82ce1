//! `redfence exec`: a child process under a lock. The lifecycle: acquire
//! (waiting by release notice, up to `--wait`) → spawn the command in its
//! own process group with the lock's environment → the library's watchdog
//! extends the lease while it runs, and signals sent to redfence go to the
//! group → on the command's exit, release and exit with its status; on a
//! lost lease, SIGTERM to the group, SIGKILL after `--kill-after`, release
//! (a no-op by then, but harmless), exit [`EXIT_LOST`].
//!
//! Signal handlers are installed before the acquire: a SIGTERM while
//! waiting drops the acquire (the library then releases wherever its
//! attempt may have landed) instead of killing redfence with a key left to
//! block everyone for a TTL.

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt as _;
use std::process::ExitStatus;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redfence::{
    AutoExtend, Error, FailureReason, Lease, LockGuard, LostLock, QuorumFailure, Released, Retry,
};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::cli::{
    Common, Exec, EXIT_FAILURE, EXIT_LOST, EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, EXIT_TIMEOUT,
    EXIT_UNAVAILABLE, EXIT_USAGE,
};
use crate::duration::show;
use crate::fail;

/// At most this long (else one node timeout) is given before exiting to a
/// release the library sends in the background: the cleanup of a failed or
/// cancelled attempt, the nodes that had not confirmed a release when a
/// majority had. Their commands are queued on the node connections; the
/// process exiting would drop them, and their keys would block everyone
/// until the TTL ran out.
pub(crate) const MAX_GRACE: Duration = Duration::from_secs(1);

/// The client of `common`'s nodes and the signal handlers, or the exit
/// status that says why not. Shared with `elect`.
pub(crate) fn client_and_signals(common: &Common) -> Result<(redfence::Client, Signals), i32> {
    let client = crate::client(common, &common.nodes)?;
    let signals = Signals::new().map_err(|e| {
        fail(
            EXIT_FAILURE,
            &format!("cannot install signal handlers: {e}"),
        )
    })?;
    Ok((client, signals))
}

pub(crate) async fn run(common: &Common, args: Exec) -> i32 {
    let (client, mut signals) = match client_and_signals(common) {
        Ok(both) => both,
        Err(code) => return code,
    };
    // Connections open lazily, and an attempt's requests still connecting
    // when a majority has answered are not sent: a fresh process's lock
    // would often live on a bare majority, and one node lost mid-run would
    // then lose the lease. One read of every node first (bounded by the
    // node timeout; its answer is not needed) opens them all.
    let _ = client.inspect(&args.resource).await;
    // `--no-wait` is one attempt through `acquire`, not `try_acquire`: its
    // error says whether the attempt may have left a key somewhere.
    let retry = if args.no_wait {
        Retry::once()
    } else {
        Retry::new().with_max_wait(args.wait)
    };
    let grace = common.node_timeout.min(MAX_GRACE);
    // With `--permits`, one of K permits: the slot's lock guard, and the
    // slot for the command's environment.
    let acquire = async {
        match args.permits {
            None => client
                .lock(args.resource.clone(), args.ttl)
                .auto_extend(AutoExtend::new())
                .retry(retry)
                .acquire()
                .await
                .map(|guard| (guard, None)),
            Some(permits) => {
                let permit = client
                    .semaphore(&args.resource, permits)?
                    .permit(args.ttl)
                    .auto_extend(AutoExtend::new())
                    .retry(retry)
                    .acquire()
                    .await?;
                let slot = permit.slot();
                Ok((permit.into_guard(), Some(slot)))
            }
        }
    };
    let acquired = tokio::select! {
        acquired = acquire => acquired,
        signal = signals.recv() => {
            // The dropped acquire's cleanup is queued in the background.
            tokio::time::sleep(grace).await;
            return 128 + signal;
        }
    };
    let (guard, slot) = match acquired {
        Ok(held) => held,
        Err(e) => {
            if let Error::NotAcquired(failure) = &e {
                if !refused_everywhere(failure) {
                    // A node may hold the failed attempt's key: its release
                    // is queued in the background, which exiting would drop.
                    tokio::time::sleep(grace).await;
                }
            }
            return not_acquired(&args, &e);
        }
    };
    let child = match spawn(&args, &guard, slot) {
        Ok(child) => child,
        Err(e) => {
            release(guard, common.node_timeout).await;
            let code = if e.kind() == io::ErrorKind::NotFound {
                EXIT_NOT_FOUND
            } else {
                EXIT_NOT_EXECUTABLE
            };
            return fail(
                code,
                &format!("cannot run {:?}: {e}", args.command[0].to_string_lossy()),
            );
        }
    };
    supervise(
        child,
        guard,
        &mut signals,
        args.kill_after,
        common.node_timeout,
    )
    .await
}

/// Releases, and gives the nodes that had not confirmed when a majority
/// did a grace period (see [`MAX_GRACE`]).
async fn release(guard: LockGuard, node_timeout: Duration) {
    linger(&guard.release().await, node_timeout).await;
}

/// After a release: the grace period when nodes had not confirmed it.
/// Shared with `elect`'s resign.
pub(crate) async fn linger(released: &Released, node_timeout: Duration) {
    if released.confirmed + released.handed_over < released.nodes {
        tokio::time::sleep(node_timeout.min(MAX_GRACE)).await;
    }
}

/// Whether every node answered the last attempt with a refusal: then no key
/// of it exists anywhere and nothing needs cleaning up.
fn refused_everywhere(failure: &QuorumFailure) -> bool {
    failure.granted == 0 && failure.failures.len() == failure.nodes
}

/// The exit status and message of an acquire that failed.
fn not_acquired(args: &Exec, e: &Error) -> i32 {
    match e {
        Error::NotAcquired(failure) => match failure.reason {
            FailureReason::Contended if args.no_wait => i32::from(args.conflict_exit_code),
            FailureReason::Contended | FailureReason::ValidityExhausted => fail(
                EXIT_TIMEOUT,
                &format!(
                    "could not acquire {:?} within {}: {}",
                    args.resource,
                    show(args.wait),
                    failure.reason
                ),
            ),
            // The failure, not the error: its message has the per-node detail.
            _ => fail(EXIT_UNAVAILABLE, &one_line(&failure.to_string())),
        },
        Error::InvalidTtl { .. }
        | Error::InvalidResource(_)
        | Error::InvalidAutoExtend { .. }
        | Error::InvalidPermits { .. } => fail(EXIT_USAGE, &e.to_string()),
        Error::Config(_) => fail(EXIT_USAGE, &e.to_string()),
        _ => fail(EXIT_FAILURE, &one_line(&e.to_string())),
    }
}

/// A multi-line message (the per-node detail) joined into one line.
pub(crate) fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

fn spawn(args: &Exec, guard: &LockGuard, slot: Option<u32>) -> io::Result<Child> {
    let slot = slot.map(|s| s.to_string());
    let env: Vec<(&str, &str)> = slot.iter().map(|s| ("REDFENCE_SLOT", s.as_str())).collect();
    spawn_under(&args.command, &guard.lease(), &env)
}

/// Spawns `command` in its own process group with the lease's environment
/// (`REDFENCE_RESOURCE`, `REDFENCE_TOKEN`, `REDFENCE_VALID_UNTIL`) and
/// `env`. Shared with `elect`.
pub(crate) fn spawn_under(
    command: &[OsString],
    lease: &Lease,
    env: &[(&str, &str)],
) -> io::Result<Child> {
    let (program, rest) = command
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no command"))?;
    let valid_until = SystemTime::now()
        .checked_add(lease.validity())
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis());
    let token = lease
        .token()
        .map(|t| t.get().to_string())
        .unwrap_or_default();
    Command::new(program)
        .args(rest)
        .env("REDFENCE_RESOURCE", lease.resource())
        .env("REDFENCE_TOKEN", token)
        .env("REDFENCE_VALID_UNTIL", valid_until.to_string())
        .envs(env.iter().copied())
        // Its own group: a lost lease terminates the command's whole tree,
        // and a terminal's Ctrl-C reaches it through redfence only.
        .process_group(0)
        .spawn()
}

/// Waits for the child, forwarding signals, and terminates it if the lease
/// is lost; then releases and returns the exit status.
async fn supervise(
    child: Child,
    guard: LockGuard,
    signals: &mut Signals,
    kill_after: Duration,
    node_timeout: Duration,
) -> i32 {
    let ended = watch(child, guard.lost(), signals, kill_after).await;
    release(guard, node_timeout).await;
    ended
}

/// Waits for the child, forwarding signals to its group; when `lost`
/// resolves first, SIGTERM to the group, SIGKILL after `kill_after`. Returns
/// the exit status redfence exits with: the child's, or [`EXIT_LOST`].
/// Shared with `elect`, whose caller resigns instead of releasing.
pub(crate) async fn watch(
    mut child: Child,
    lost: impl Future<Output = LostLock>,
    signals: &mut Signals,
    kill_after: Duration,
) -> i32 {
    // The child is its group's leader: its pid is the group id.
    let group = child.id().and_then(|pid| i32::try_from(pid).ok());
    tokio::pin!(lost);
    let outcome = loop {
        tokio::select! {
            status = child.wait() => break Outcome::Exited(status),
            signal = signals.recv() => {
                if let Some(group) = group {
                    signal_group(group, signal);
                }
            }
            loss = &mut lost => break Outcome::Lost(loss),
        }
    };
    match outcome {
        Outcome::Exited(status) => match status {
            Ok(status) => exit_code(status),
            Err(e) => fail(EXIT_FAILURE, &format!("cannot wait for the command: {e}")),
        },
        Outcome::Lost(loss) => {
            eprintln!(
                "redfence: {}; terminating the command (SIGTERM, SIGKILL after {})",
                describe(&loss),
                show(kill_after)
            );
            if let Some(group) = group {
                signal_group(group, libc::SIGTERM);
            }
            let status = match tokio::time::timeout(kill_after, child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    if let Some(group) = group {
                        signal_group(group, libc::SIGKILL);
                    }
                    child.wait().await
                }
            };
            if let Ok(status) = status {
                eprintln!(
                    "redfence: command terminated ({}), exiting with {EXIT_LOST}",
                    describe_status(status)
                );
            }
            EXIT_LOST
        }
    }
}

enum Outcome {
    Exited(io::Result<ExitStatus>),
    Lost(LostLock),
}

/// Why the lease was lost, in one line: the library's message, and the
/// failed extend's per-node detail when there is one.
fn describe(loss: &LostLock) -> String {
    let mut text = loss.to_string();
    if let Some(failure) = &loss.failure {
        text.push_str(": ");
        text.push_str(&one_line(&failure.to_string()));
    }
    text
}

fn describe_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        _ => "ended".into(),
    }
}

/// The shell's convention: the exit status, or 128 + the signal that
/// killed the command.
fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        _ => EXIT_FAILURE,
    }
}

/// Sends `signal` to process group `group`. A group already gone (ESRCH)
/// is not an error: the command exited meanwhile.
#[allow(unsafe_code)]
fn signal_group(group: i32, signal: i32) {
    if group <= 1 {
        return;
    }
    // SAFETY: kill(2) has no memory-safety preconditions; a negative pid
    // names the process group, which is our child's own (`process_group(0)`
    // at spawn), never ours or a broadcast (group > 1 checked above).
    unsafe {
        libc::kill(-group, signal);
    }
}

/// SIGINT, SIGTERM and SIGHUP, caught from before the acquire.
pub(crate) struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    pub(crate) fn new() -> io::Result<Self> {
        Ok(Self {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal's number.
    pub(crate) async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
            _ = self.hup.recv() => libc::SIGHUP,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_shell() {
        assert_eq!(exit_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGTERM)), 143);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGKILL)), 137);
    }

    #[test]
    fn messages_are_one_line() {
        assert_eq!(one_line("a\n  b\n\n c"), "a; b; c");
    }
}
