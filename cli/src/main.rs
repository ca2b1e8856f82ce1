//! The `redfence` command: run a program under a quorum lock (flock(1)
//! across hosts), inspect a lock, release one by force, check a deployment,
//! measure the nodes. A workspace member of its own, so the library's users
//! never compile clap.
//!
//! Files: `cli` (the arguments, their help and the exit statuses), `exec`
//! (the lock's lifecycle around a child process), `elect` (the same
//! around a leadership), `status` (`semaphore_status`: its `--permits`
//! view; `rw_status`: its `--rw` view), `doctor`,
//! `release`, `bench` (one subcommand each), `duration` (parsing and
//! showing `30s`, `500ms`, `2m`).

mod bench;
mod cli;
mod doctor;
mod duration;
mod elect;
mod exec;
mod release;
mod rw_status;
mod semaphore_status;
mod status;

use std::io::Write as _;

use clap::{CommandFactory, Parser as _};

use cli::{Args, Command, Common};

fn main() {
    let mut args = match Args::try_parse() {
        Ok(args) => args,
        Err(e) => std::process::exit(usage_error(&e)),
    };
    args.common.nodes = cli::join_sentinel_hosts(std::mem::take(&mut args.common.nodes));
    let code = run(args);
    let _ = std::io::stdout().flush();
    std::process::exit(code);
}

fn run(args: Args) -> i32 {
    if let Command::Completions { shell } = args.command {
        clap_complete::generate(
            shell,
            &mut Args::command(),
            "redfence",
            &mut std::io::stdout(),
        );
        return 0;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(cli::EXIT_FAILURE, &format!("cannot start the runtime: {e}")),
    };
    runtime.block_on(async move {
        match args.command {
            Command::Exec(exec) => exec::run(&args.common, exec).await,
            Command::Elect(elect) => elect::run(&args.common, elect).await,
            Command::Status(status) => status::run(&args.common, status).await,
            Command::Doctor(doctor) => doctor::run(&args.common, doctor).await,
            Command::Release(release) => release::run(&args.common, release).await,
            Command::Bench(bench) => bench::run(&args.common, bench).await,
            Command::Completions { .. } => 0,
        }
    })
}

/// Help and version go out as clap prints them; a usage error is one line
/// (clap's first), exit status 2.
fn usage_error(e: &clap::Error) -> i32 {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
            cli::EXIT_USAGE
        } else {
            0
        };
    }
    // The message runs to the first blank line (a missing argument's names
    // are on the lines after the first); usage and tips follow it.
    let text = e.to_string();
    let message: Vec<&str> = text
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    let message = message.join(" ");
    let message = if message.is_empty() {
        "error: bad arguments"
    } else {
        &message
    };
    eprintln!("{message} (see redfence --help)");
    cli::EXIT_USAGE
}

/// Prints `error: {message}` (one line, like clap's own) and returns `code`.
pub(crate) fn fail(code: i32, message: &str) -> i32 {
    eprintln!("error: {message}");
    code
}

/// The client of the configured nodes, or the exit status of a usage error
/// (no nodes, a bad URL, a bad prefix), already reported.
pub(crate) fn client(common: &Common, urls: &[String]) -> Result<redfence::Client, i32> {
    // `--nodes ""` and `REDFENCE_NODES=` mean no nodes, as does a stray comma's
    // empty item.
    let urls: Vec<&str> = urls
        .iter()
        .map(|u| u.trim())
        .filter(|u| !u.is_empty())
        .collect();
    if urls.is_empty() {
        return Err(fail(
            cli::EXIT_USAGE,
            "no nodes configured (give --nodes URL,URL,… or set REDFENCE_NODES)",
        ));
    }
    let mut builder = redfence::Client::builder(urls).node_timeout(common.node_timeout);
    if let Some(prefix) = &common.key_prefix {
        builder = builder.key_prefix(prefix.clone());
    }
    if common.no_restart_guard {
        builder = builder.restart_guard(redfence::RestartGuard::off());
    }
    builder
        .build()
        .map_err(|e| fail(cli::EXIT_USAGE, &e.to_string()))
}
