//! The command line: subcommands, flags, their help with examples, and the
//! exit statuses (one table, shown by `redfence exec --help` and the
//! README).

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args as ClapArgs, Parser, Subcommand};

use crate::duration;

/// A usage error: clap's convention (bad flag, unknown subcommand), also
/// no nodes, a bad URL, a zero or too long TTL.
pub(crate) const EXIT_USAGE: i32 = 2;
/// `exec --no-wait` found the lock held (like `flock -n`); changed with
/// `--conflict-exit-code`.
pub(crate) const EXIT_CONFLICT: u8 = 1;
/// A majority of nodes could not be reached (EX_UNAVAILABLE).
pub(crate) const EXIT_UNAVAILABLE: i32 = 69;
/// `exec --wait` ran out of time while others held the lock (EX_TEMPFAIL).
pub(crate) const EXIT_TIMEOUT: i32 = 75;
/// The lease was lost while the command ran; the command was terminated.
pub(crate) const EXIT_LOST: i32 = 124;
/// Any other failure of redfence itself.
pub(crate) const EXIT_FAILURE: i32 = 125;
/// The command was found but could not be run (permission).
pub(crate) const EXIT_NOT_EXECUTABLE: i32 = 126;
/// The command was not found.
pub(crate) const EXIT_NOT_FOUND: i32 = 127;

const EXIT_STATUSES: &str = "\
Exit status:
  N        the command's own exit status (0–255)
  128+N    the command was killed by signal N (143: SIGTERM, 137: SIGKILL)
  1        --no-wait and the lock is held: the command did not run
           (change it with --conflict-exit-code)
  2        usage error: bad flag or value, no nodes, bad URL, zero or too long TTL
  69       a majority of the nodes could not be reached: the command did not run
  75       --wait ran out while the lock stayed held: the command did not run
  124      the lock was lost while the command ran: the command's process group got
           SIGTERM, then SIGKILL after --kill-after; the reason is printed
  125      another failure of redfence itself
  126      the command could not be executed (permission)
  127      the command was not found";

const EXAMPLES: &str = "\
Examples:
  export REDFENCE_NODES=redis://10.0.0.1:6379,redis://10.0.0.2:6379,redis://10.0.0.3:6379
  redfence exec --no-wait nightly-dedup -- /usr/local/bin/dedup --since yesterday
  redfence exec --wait 2m --ttl 30s invoices -- ./bill.sh
  redfence elect outbox-relay -- ./relay
  redfence status nightly-dedup invoices --json
  redfence doctor
  redfence release --force nightly-dedup
  redfence completions bash > /etc/bash_completion.d/redfence";

/// Runs a program under a Redlock quorum lock held on N independent Redis
/// masters (flock(1) across hosts); inspects and releases locks; audits the
/// deployment.
#[derive(Debug, Parser)]
#[command(name = "redfence", version, after_help = EXAMPLES, propagate_version = true)]
pub(crate) struct Args {
    #[command(flatten)]
    pub(crate) common: Common,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Flags every subcommand takes.
#[derive(Debug, ClapArgs)]
pub(crate) struct Common {
    /// The Redis masters, comma-separated: redis://[user:pass@]host:port[/db],
    /// rediss:// (with the `tls` feature), unix:///path, a whole Redis
    /// Cluster as one node: redis+cluster://[user:pass@]host:port, or a
    /// Sentinel-managed master as one node:
    /// redis+sentinel://host1:26379,host2:26379/mastername.
    #[arg(
        long,
        env = "REDFENCE_NODES",
        value_delimiter = ',',
        global = true,
        hide_env_values = true
    )]
    pub(crate) nodes: Vec<String>,
    /// Bound on every request to one node.
    #[arg(long, env = "REDFENCE_NODE_TIMEOUT", value_parser = duration::parse, default_value = "1s", global = true, hide_env_values = true)]
    pub(crate) node_timeout: Duration,
    /// The prefix of the lock and fence keys (the library's default:
    /// "redfence:"). Every client of a lock must use the same one.
    #[arg(
        long,
        env = "REDFENCE_KEY_PREFIX",
        global = true,
        hide_env_values = true
    )]
    pub(crate) key_prefix: Option<String>,
    /// Count nodes that started less than a TTL ago toward quorums (the
    /// restart guard keeps them out by default: one may have restarted
    /// without its data). For freshly started test servers.
    #[arg(
        long,
        env = "REDFENCE_NO_RESTART_GUARD",
        global = true,
        hide_env_values = true,
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::FalseyValueParser::new()
    )]
    pub(crate) no_restart_guard: bool,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a command while holding a lock; release it when the command exits.
    Exec(Exec),
    /// Campaign to lead an election; run a command while leader.
    Elect(Elect),
    /// Show who holds locks, on which nodes, for how long.
    Status(Status),
    /// Audit the nodes against what Redlock assumes (exit 0 clean, 1 warnings,
    /// 2 errors).
    Doctor(Doctor),
    /// Delete a lock whatever its holder (dangerous).
    Release(Release),
    /// Measure acquire/release latency and throughput on these nodes.
    Bench(Bench),
    /// Print a shell completion script.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// `redfence exec`.
#[derive(Debug, ClapArgs)]
#[command(
    after_help = EXIT_STATUSES,
    long_about = "Acquires RESOURCE on a majority of the nodes (waiting for a release \
notice, up to --wait), runs COMMAND in its own process group with the lease extended \
in the background, passes it REDFENCE_RESOURCE, REDFENCE_TOKEN (the fencing token) and \
REDFENCE_VALID_UNTIL (Unix time in ms when the first lease ends unless extended), \
forwards SIGINT, SIGTERM and SIGHUP to it, releases when it exits and exits with its \
status. If the lease is lost meanwhile, the command is terminated (see exit 124).\n\n\
Example: redfence exec --no-wait nightly-dedup -- /usr/local/bin/dedup"
)]
pub(crate) struct Exec {
    /// The lease: how long the lock outlives a redfence that vanished (it is
    /// extended every third of it while the command runs).
    #[arg(long, value_parser = duration::parse, default_value = "30s")]
    pub(crate) ttl: Duration,
    /// How long to wait for a held lock.
    #[arg(long, value_parser = duration::parse, default_value = "10s")]
    pub(crate) wait: Duration,
    /// Do not wait: exit with the conflict status if the lock is held.
    #[arg(long, short = 'n', conflicts_with = "wait")]
    pub(crate) no_wait: bool,
    /// The exit status when --no-wait finds the lock held.
    #[arg(long, default_value_t = EXIT_CONFLICT)]
    pub(crate) conflict_exit_code: u8,
    /// After a lost lease, how long the command has between SIGTERM and SIGKILL.
    #[arg(long, value_parser = duration::parse, default_value = "5s")]
    pub(crate) kill_after: Duration,
    /// Hold one of K permits of the semaphore RESOURCE instead of the lock:
    /// at most K hosts run the command at once (every host must give the
    /// same K). The command also gets REDFENCE_SLOT, the permit's slot in
    /// 0..K; REDFENCE_TOKEN is that slot's token and REDFENCE_RESOURCE the
    /// slot's name (RESOURCE:permit:SLOT), what a store keys the token by.
    #[arg(long, value_name = "K")]
    pub(crate) permits: Option<u32>,
    /// The lock's name; every host must use the same one.
    pub(crate) resource: String,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1.., value_name = "COMMAND")]
    pub(crate) command: Vec<OsString>,
}

/// `redfence elect`.
#[derive(Debug, ClapArgs)]
#[command(
    after_help = ELECT_EXIT_STATUSES,
    long_about = "Campaigns to lead election NAME (the lock on election:NAME, which \
`redfence status election:NAME` shows), waiting as long as another candidate leads \
(woken by its release notice or its lease's expiry; SIGINT, SIGTERM or SIGHUP stop the \
wait cleanly). Once elected, publishes --value as the leader's, runs COMMAND in its own \
process group with the leadership extended in the background, passes it \
REDFENCE_ELECTION, REDFENCE_RESOURCE, REDFENCE_TOKEN (the term: a fencing token larger \
for every later leader) and REDFENCE_VALID_UNTIL, and forwards signals to it. When \
COMMAND exits, resigns (the next candidate is woken) and exits with its status; if the \
leadership is lost meanwhile, the command is terminated (exit 124). Run it on every \
host: COMMAND runs on one at a time, and on another within about a TTL when the \
leader's host dies.\n\n\
Example: redfence elect --ttl 10s outbox-relay -- ./relay --token-from-env"
)]
pub(crate) struct Elect {
    /// The leadership's lease: how long a vanished leader keeps the others
    /// out (it is extended every third of it while the command runs).
    #[arg(long, value_parser = duration::parse, default_value = "10s")]
    pub(crate) ttl: Duration,
    /// Give up campaigning after this long (exit 75). Default: wait until
    /// elected.
    #[arg(long, value_parser = duration::parse)]
    pub(crate) wait: Option<Duration>,
    /// The value published as the leader's (what `leader()` reads).
    /// Default: HOST:PID.
    #[arg(long)]
    pub(crate) value: Option<String>,
    /// After a lost leadership, how long the command has between SIGTERM
    /// and SIGKILL.
    #[arg(long, value_parser = duration::parse, default_value = "5s")]
    pub(crate) kill_after: Duration,
    /// The election's name; every candidate must use the same one.
    pub(crate) name: String,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1.., value_name = "COMMAND")]
    pub(crate) command: Vec<OsString>,
}

const ELECT_EXIT_STATUSES: &str = "\
Exit status:
  N        the command's own exit status (0–255), after resigning
  128+N    the command was killed by signal N; or redfence got signal N while campaigning
  2        usage error
  69       a majority of the nodes refused for good (wrong password, a replica)
  75       --wait ran out before this candidate was elected: the command did not run
  124      the leadership was lost while the command ran: the command's process group got
           SIGTERM, then SIGKILL after --kill-after
  125      another failure of redfence itself
  126/127  the command could not be executed / was not found";

/// `redfence status`.
#[derive(Debug, ClapArgs)]
#[command(
    after_help = "Example: redfence status nightly-dedup invoices --json\n         redfence status --permits 3 backup\n         redfence status --rw price-table\n\n\
Exit status: 0 when every resource was read, 69 when fewer than a majority of nodes \
answered for one, 2 on a usage error."
)]
pub(crate) struct Status {
    /// The resources to inspect (with --permits, the semaphores; with
    /// --rw, the read-write locks).
    #[arg(required = true)]
    pub(crate) resources: Vec<String>,
    /// Show each RESOURCE as a semaphore of K permits: every slot
    /// (RESOURCE:permit:0 … K-1), held or free, its holder's client tag, on
    /// how many nodes, the time it stays held for at least, and the slot's
    /// fence (at least its holder's token: the token of the next holder of
    /// the slot is larger). Give the K the holders use.
    #[arg(long, value_name = "K")]
    pub(crate) permits: Option<u32>,
    /// Show each RESOURCE as a read-write lock: the write or the reads
    /// held on a majority (holder's client tag, on how many nodes, the
    /// time it stays held for at least), and per node the writer, the
    /// live readers, whether a writer waits (no new reader is admitted
    /// there meanwhile) and the fence.
    #[arg(long, conflicts_with = "permits")]
    pub(crate) rw: bool,
    /// JSON output (one array, one object per resource).
    #[arg(long)]
    pub(crate) json: bool,
}

/// `redfence doctor`.
#[derive(Debug, ClapArgs)]
#[command(after_help = "Example: redfence doctor --json\n\n\
Exit status: 0 clean, 1 warnings, 2 errors (a replica, a duplicate server, an \
unreachable node, eviction of lock keys, …).")]
pub(crate) struct Doctor {
    /// JSON output.
    #[arg(long)]
    pub(crate) json: bool,
    /// Also show the informational findings.
    #[arg(long, short)]
    pub(crate) verbose: bool,
}

/// `redfence release`.
#[derive(Debug, ClapArgs)]
#[command(
    long_about = "Deletes RESOURCE's lock key on every node whatever its value. It breaks \
the current holder's exclusion: the next acquire succeeds at once while the holder may \
still run (its watchdog notices at its next extend). Fencing still refuses the old \
holder's writes once the next holder has written. For a holder known to be gone.",
    after_help = "Example: redfence release --force --yes nightly-dedup\n\n\
Exit status: 0 when every node answered, 69 when some did not (their key may remain), \
2 on a usage error or a refused confirmation."
)]
pub(crate) struct Release {
    /// Required: this release ignores who holds the lock.
    #[arg(long)]
    pub(crate) force: bool,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub(crate) yes: bool,
    /// The lock to delete.
    pub(crate) resource: String,
    /// JSON output.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `redfence bench`.
#[derive(Debug, ClapArgs)]
#[command(
    after_help = "Example: redfence bench --concurrency 1,8,32 --duration 5s\n\n\
Each task locks its own resource (no contention): what is measured is the protocol's \
cost on these nodes, next to the first node alone."
)]
pub(crate) struct Bench {
    /// Concurrent tasks, one run per value.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 32])]
    pub(crate) concurrency: Vec<usize>,
    /// Length of each run.
    #[arg(long, value_parser = duration::parse, default_value = "10s")]
    pub(crate) duration: Duration,
    /// The TTL of each lock.
    #[arg(long, value_parser = duration::parse, default_value = "10s")]
    pub(crate) ttl: Duration,
    /// JSON output.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Rejoins a Sentinel URL's hosts, which `--nodes` split at their commas:
/// `redis+sentinel://a:1`, `b:2/m` is `redis+sentinel://a:1,b:2/m`. An item
/// without a scheme continues the Sentinel URL before it while that URL
/// has not yet named its master.
pub(crate) fn join_sentinel_hosts(items: Vec<String>) -> Vec<String> {
    let mut joined: Vec<String> = Vec::with_capacity(items.len());
    for item in items {
        let open = joined.last().is_some_and(|last| {
            let lower = last.to_ascii_lowercase();
            (lower.starts_with("redis+sentinel://") || lower.starts_with("rediss+sentinel://"))
                && !last
                    .split_once("://")
                    .is_some_and(|(_, rest)| rest.contains('/'))
        });
        match joined.last_mut() {
            Some(last) if open && !item.contains("://") => {
                last.push(',');
                last.push_str(item.trim());
            }
            _ => joined.push(item),
        }
    }
    joined
}

#[cfg(test)]
mod sentinel_tests {
    use super::join_sentinel_hosts;

    #[test]
    fn sentinel_hosts_are_rejoined() {
        let items = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            join_sentinel_hosts(items(&[
                "redis://a:1",
                "redis+sentinel://s1:26379",
                "s2:26379",
                "s3:26379/m",
                "redis://b:2",
            ])),
            items(&[
                "redis://a:1",
                "redis+sentinel://s1:26379,s2:26379,s3:26379/m",
                "redis://b:2",
            ])
        );
        assert_eq!(
            join_sentinel_hosts(items(&["redis+sentinel://s1/m", "x:1"])),
            items(&["redis+sentinel://s1/m", "x:1"])
        );
    }
}
