//! `redfence elect`: a child process on the leader only. The lifecycle:
//! campaign (waiting by release notice as long as it takes, or `--wait`)
//! → spawn the command as `exec` does, with the term as `REDFENCE_TOKEN`
//! → on the command's exit, resign and exit with its status; on a lost
//! leadership, terminate the command's group and exit `EXIT_LOST`. The
//! child handling is `exec`'s (`spawn_under`, `watch`, `Signals`).

use std::io;

use redfence::{ElectionError, Error};

use crate::cli::{
    Common, Elect, EXIT_FAILURE, EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, EXIT_TIMEOUT,
    EXIT_UNAVAILABLE, EXIT_USAGE,
};
use crate::exec::{client_and_signals, linger, one_line, spawn_under, watch, MAX_GRACE};
use crate::fail;

pub(crate) async fn run(common: &Common, args: Elect) -> i32 {
    let (client, mut signals) = match client_and_signals(common) {
        Ok(both) => both,
        Err(code) => return code,
    };
    let mut election = client.election(&args.name).ttl(args.ttl);
    if let Some(wait) = args.wait {
        election = election.campaign_deadline(wait);
    }
    // Open every node's connection first, as `exec` does: a lock that lands
    // on a bare majority is lost with one node.
    let _ = client.inspect(election.resource()).await;
    let value = args.value.clone().unwrap_or_else(default_value);
    let grace = common.node_timeout.min(MAX_GRACE);
    let won = tokio::select! {
        won = election.campaign(value) => won,
        signal = signals.recv() => {
            // The dropped campaign's cleanup is queued in the background.
            tokio::time::sleep(grace).await;
            return 128 + signal;
        }
    };
    let leadership = match won {
        Ok(leadership) => leadership,
        Err(e) => {
            tokio::time::sleep(grace).await;
            return not_elected(&e);
        }
    };
    let env = [("REDFENCE_ELECTION", args.name.as_str())];
    let child = match spawn_under(&args.command, &leadership.lease(), &env) {
        Ok(child) => child,
        Err(e) => {
            linger(&leadership.resign().await, common.node_timeout).await;
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
    let code = watch(child, leadership.lost(), &mut signals, args.kill_after).await;
    linger(&leadership.resign().await, common.node_timeout).await;
    code
}

/// `HOST:PID`: which process leads, for `leader()` readers.
fn default_value() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}:{}", std::process::id())
}

/// The exit status and message of a campaign that failed.
fn not_elected(e: &ElectionError) -> i32 {
    match e {
        ElectionError::Deadline { .. } => fail(EXIT_TIMEOUT, &e.to_string()),
        ElectionError::Lock { source, .. } => match source.as_ref() {
            Error::NotAcquired(failure) => fail(EXIT_UNAVAILABLE, &one_line(&failure.to_string())),
            other => fail(EXIT_USAGE, &other.to_string()),
        },
        ElectionError::FencingOff => fail(EXIT_USAGE, &e.to_string()),
        _ => fail(EXIT_FAILURE, &one_line(&e.to_string())),
    }
}
