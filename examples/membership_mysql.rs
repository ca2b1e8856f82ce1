//! "The nightly membership import ran on several hosts, and one night it
//! inserted the same membership twice."
//!
//! The incident, on MySQL/MariaDB through sqlx, with real processes: three
//! worker processes (three hosts), four tasks each, import the same 120
//! ERP records at the same time, in the same order. Importing a record is
//! the classic check-then-insert: "is `erp_id` there? no: insert the
//! membership".
//!
//! 1. **Without the lock**, on a table without a unique index: between one
//!    task's check and its insert another task runs the same check, and
//!    the membership is inserted twice.
//! 2. **With the lock** (the incident's fix): a unique index on `erp_id`,
//!    each record imported under `try_acquire("import:{erp_id}")` (held
//!    elsewhere: skip it), the existence check kept under the lock as a
//!    second line of defence, and the insert fenced by the lock's token
//!    ([`FencedTable::insert_if_absent`]). No duplicate; and the unique
//!    index never had to refuse one (the lock kept the attempts apart).
//! 3. **A paused holder**: a worker process takes the lock on one record,
//!    finds it absent, and is stopped (SIGSTOP) past its lease. Another
//!    process takes the lock, inserts the membership and goes on. When the
//!    first is resumed (SIGCONT), its late insert carries the older token
//!    and is refused (`StoreError::Stale`, both tokens printed): it learns
//!    that its lease ran out instead of believing it imported the record.
//!
//! The example fails (exit code 1) if the locked import leaves a duplicate
//! or a record missing, or the paused holder's insert is not refused.
//!
//! ```sh
//! cargo run --example membership_mysql --features sqlx-mysql
//! # starts 5 local redis-server nodes and a throwaway MariaDB; or yours:
//! REDFENCE_MYSQL_URL=mysql://root@127.0.0.1:3306/test \
//!     cargo run --example membership_mysql --features sqlx-mysql
//! ```

mod common;
#[path = "../tests/support/mariadb.rs"]
mod mariadb_server;
// `mariadb.rs` needs `process.rs` beside it: the copy `common` includes.
use common::process;

use std::io::{BufRead, BufReader};
use std::panic::{self, AssertUnwindSafe};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use redfence::sqlx::mysql::FencedTable;
use redfence::sqlx::Inserted;
use redfence::Client;
use sqlx::mysql::{MySqlArguments, MySqlPool, MySqlPoolOptions};
use sqlx::Arguments;

use common::BoxError;
use mariadb_server::MariaDbServer;

const PROCESSES: usize = 3;
const TASKS: usize = 4;
const RECORDS: u32 = 120;
/// Far above one import; a worker that dies mid-record blocks it this long.
const LOCK_TTL: Duration = Duration::from_secs(5);
/// The paused holder's lease: short, so the next holder need not wait long.
const PAUSED_TTL: Duration = Duration::from_millis(500);
/// Bounds a worker's repeat passes over records skipped (held elsewhere).
const MAX_PASSES: u32 = 20;
const PAUSED_RECORD: &str = "E-PAUSED";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("worker") {
        return worker_main(&args[1..]);
    }
    common::run(membership_mysql)
}

async fn membership_mysql(nodes: Vec<String>) -> Result<(), BoxError> {
    let (url, _server) = database().await?;
    let pool = connect(&url, 4).await?;
    let suffix = format!("{:06x}", rand::random::<u32>() >> 8);
    let plain = format!("memberships_plain_{suffix}");
    let fenced = format!("memberships_{suffix}");
    for ddl in [
        format!(
            "CREATE TABLE {plain} (id BIGINT AUTO_INCREMENT PRIMARY KEY, erp_id VARCHAR(32) \
             NOT NULL, level VARCHAR(16), fence BIGINT NOT NULL DEFAULT 0)"
        ),
        // The incident's fix: a unique index on erp_id, and the fence.
        format!(
            "CREATE TABLE {fenced} (id BIGINT AUTO_INCREMENT PRIMARY KEY, erp_id VARCHAR(32) \
             NOT NULL UNIQUE, level VARCHAR(16), fence BIGINT NOT NULL DEFAULT 0)"
        ),
    ] {
        sqlx::query(&ddl).execute(&pool).await?;
    }
    let env = WorkerEnv { nodes, url };

    let outcome = async {
        println!("\n{PROCESSES} processes x {TASKS} tasks import the same {RECORDS} records\n");
        let unlocked = import(&env, &pool, "unlocked", &plain).await?;
        let locked = import(&env, &pool, "locked", &fenced).await?;
        println!("\n--- a holder paused past its lease ---");
        let refused = paused_holder(&env, &pool, &fenced).await?;
        Ok::<_, BoxError>((unlocked, locked, refused))
    }
    .await;
    sqlx::query(&format!("DROP TABLE IF EXISTS {plain}, {fenced}"))
        .execute(&pool)
        .await?;
    let (unlocked, locked, refused) = outcome?;

    println!();
    unlocked.print("without the lock");
    locked.print("with the lock   ");
    if unlocked.duplicates == 0 {
        println!("note: the unlocked run happened to insert no duplicate this time (a race)");
    }
    if locked.duplicates != 0 || locked.rows != i64::from(RECORDS) {
        return Err(format!(
            "with the lock: {} duplicates, {} of {RECORDS} records; expected each exactly once",
            locked.duplicates, locked.rows
        )
        .into());
    }
    if !refused {
        return Err("the paused holder's late insert was not refused".into());
    }
    println!("with the lock every record was imported once, and the late insert was refused");
    Ok(())
}

/// What the worker processes need: the lock nodes and the database.
struct WorkerEnv {
    nodes: Vec<String>,
    url: String,
}

impl WorkerEnv {
    fn spawn(&self, args: &[&str]) -> Result<Child, BoxError> {
        Ok(Command::new(std::env::current_exe()?)
            .arg("worker")
            .args(args)
            .env("REDFENCE_NODES", self.nodes.join(","))
            .env("REDFENCE_MYSQL_URL", &self.url)
            // The nodes may be seconds old (started by this example): see
            // `common::builder` on the restart guard.
            .env(
                "REDFENCE_EXAMPLE_GUARD_OFF",
                if std::env::var_os("REDFENCE_NODES").is_some() {
                    "0"
                } else {
                    "1"
                },
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?)
    }
}

/// One import run across the worker processes, then its count.
async fn import(
    env: &WorkerEnv,
    pool: &MySqlPool,
    mode: &str,
    table: &str,
) -> Result<Report, BoxError> {
    let started = Instant::now();
    let children: Vec<Child> = (0..PROCESSES)
        .map(|_| env.spawn(&[mode, table]))
        .collect::<Result<_, _>>()?;
    let mut stats = Stats::default();
    for child in children {
        let out = tokio::task::spawn_blocking(move || child.wait_with_output()).await??;
        if !out.status.success() {
            return Err(format!("a {mode} worker failed ({})", out.status).into());
        }
        stats.add_lines(&String::from_utf8_lossy(&out.stdout));
    }
    let (rows, distinct): (i64, i64) = sqlx::query_as(&format!(
        "SELECT COUNT(*), COUNT(DISTINCT erp_id) FROM {table}"
    ))
    .fetch_one(pool)
    .await?;
    Ok(Report {
        rows: distinct,
        duplicates: rows - distinct,
        stats,
        elapsed: started.elapsed(),
    })
}

/// Worker A takes the lock on one record, finds it absent and stops
/// itself; after its lease, worker B imports the record; A is resumed.
async fn paused_holder(env: &WorkerEnv, pool: &MySqlPool, table: &str) -> Result<bool, BoxError> {
    let mut a = env.spawn(&["paused", table])?;
    let stdout = a.stdout.take().ok_or("no stdout")?;
    let (ready, lines) = tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(stdout).lines();
        (lines.next(), lines)
    })
    .await?;
    let ready = ready.ok_or("worker A said nothing")??;
    println!("A: {ready}");
    let pid = a.id();
    // It stops itself right after saying so; wait until it has.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !is_stopped(pid) {
        if Instant::now() > deadline {
            return Err("worker A did not stop".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!("A: stopped (SIGSTOP); its lease of {PAUSED_TTL:?} runs out");
    tokio::time::sleep(PAUSED_TTL * 2).await;

    let b = env.spawn(&["second", table])?;
    let out = tokio::task::spawn_blocking(move || b.wait_with_output()).await??;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        println!("B: {line}");
    }
    if !out.status.success() {
        return Err("worker B failed".into());
    }

    process::send_signal(pid, "CONT")?;
    println!("A: resumed (SIGCONT)");
    let mut refused = false;
    for line in tokio::task::spawn_blocking(move || lines.collect::<Vec<_>>()).await? {
        let line = line?;
        refused |= line.starts_with("refused");
        println!("A: {line}");
    }
    let status = tokio::task::spawn_blocking(move || a.wait()).await??;
    if !status.success() {
        return Err(format!("worker A failed ({status})").into());
    }
    let level: String = sqlx::query_scalar(&format!("SELECT level FROM {table} WHERE erp_id = ?"))
        .bind(PAUSED_RECORD)
        .fetch_one(pool)
        .await?;
    println!("the row keeps B's level: {level}");
    Ok(refused && level == "gold")
}

/// Linux: the process state in /proc/PID/stat is `T` (stopped).
fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            // The state follows the command name, which is in parentheses.
            let after = stat.rsplit_once(')')?.1;
            after.split_whitespace().next().map(|s| s == "T")
        })
        .unwrap_or(false)
}

#[derive(Default, Debug)]
struct Stats {
    inserted: u64,
    /// Inserts that found the row there (the unique index, or the fence
    /// table's duplicate path): duplicates the lock did not keep apart.
    existing: u64,
    skipped_held: u64,
    passes: u32,
}

impl Stats {
    /// Sums the workers' `stats inserted=.. existing=.. held=.. passes=..`.
    fn add_lines(&mut self, out: &str) {
        for line in out.lines().filter(|l| l.starts_with("stats ")) {
            for field in line.split_whitespace().skip(1) {
                let Some((name, value)) = field.split_once('=') else {
                    continue;
                };
                let value: u64 = value.parse().unwrap_or(0);
                match name {
                    "inserted" => self.inserted += value,
                    "existing" => self.existing += value,
                    "held" => self.skipped_held += value,
                    "passes" => self.passes = self.passes.max(value as u32),
                    _ => {}
                }
            }
        }
    }
}

struct Report {
    rows: i64,
    duplicates: i64,
    stats: Stats,
    elapsed: Duration,
}

impl Report {
    fn print(&self, label: &str) {
        println!(
            "{label}: {} records, {} duplicate rows; {} inserts, {} refused by the unique \
             index, {} skips (lock held elsewhere), up to {} passes, {:.2?}",
            self.rows,
            self.duplicates,
            self.stats.inserted,
            self.stats.existing,
            self.stats.skipped_held,
            self.stats.passes.max(1),
            self.elapsed
        );
    }
}

/// `REDFENCE_MYSQL_URL`, or a throwaway local MariaDB (stopped on drop).
async fn database() -> Result<(String, Option<MariaDbServer>), BoxError> {
    if let Ok(url) = std::env::var("REDFENCE_MYSQL_URL") {
        println!("database (REDFENCE_MYSQL_URL): {url}");
        return Ok((url, None));
    }
    let server =
        tokio::task::spawn_blocking(|| panic::catch_unwind(AssertUnwindSafe(MariaDbServer::start)))
            .await?
            .map_err(|_| "could not start MariaDB (see the message above)")?;
    println!("database: a local MariaDB on port {}", server.port());
    Ok((server.url(), Some(server)))
}

async fn connect(url: &str, max: u32) -> Result<MySqlPool, BoxError> {
    Ok(MySqlPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(20))
        .connect(url)
        .await?)
}

// --- the worker processes ---

fn worker_main(args: &[String]) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(TASKS)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(worker(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("worker {args:?}: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn worker(args: &[String]) -> Result<(), BoxError> {
    let [mode, table] = args else {
        return Err("usage: worker MODE TABLE".into());
    };
    let url = std::env::var("REDFENCE_MYSQL_URL")?;
    let nodes: Vec<String> = std::env::var("REDFENCE_NODES")?
        .split(',')
        .map(str::to_owned)
        .collect();
    let mut builder = Client::builder(nodes);
    if std::env::var("REDFENCE_EXAMPLE_GUARD_OFF").as_deref() == Ok("1") {
        builder = builder.restart_guard(redfence::RestartGuard::off());
    }
    let client = builder.build()?;
    let pool = connect(&url, TASKS as u32 + 1).await?;
    let fenced = FencedTable::new(table, "erp_id", "fence")?;
    match mode.as_str() {
        "unlocked" | "locked" => {
            let tasks: Vec<_> = (0..TASKS)
                .map(|_| {
                    let (client, pool, fenced) = (client.clone(), pool.clone(), fenced.clone());
                    let (table, locked) = (table.clone(), mode == "locked");
                    tokio::spawn(async move {
                        import_all(&client, &pool, &fenced, &table, locked).await
                    })
                })
                .collect();
            let mut stats = Stats::default();
            for task in tasks {
                let s = task.await??;
                stats.inserted += s.inserted;
                stats.existing += s.existing;
                stats.skipped_held += s.skipped_held;
                stats.passes = stats.passes.max(s.passes);
            }
            println!(
                "stats inserted={} existing={} held={} passes={}",
                stats.inserted, stats.existing, stats.skipped_held, stats.passes
            );
        }
        "paused" => {
            let guard = client
                .acquire(&format!("import:{PAUSED_RECORD}"), PAUSED_TTL)
                .await?;
            let token = guard.token().ok_or("fencing is on by default")?;
            let exists = exists(&pool, table, PAUSED_RECORD).await?;
            println!("holds import:{PAUSED_RECORD} (token {token}); record there: {exists}");
            // The pause: this process stops itself; the parent resumes it.
            process::send_signal(std::process::id(), "STOP")?;
            println!("lease valid after the pause: {}", guard.lease().is_valid());
            match fenced
                .insert_if_absent(&pool, PAUSED_RECORD, "level", level("silver")?, token)
                .await
            {
                Err(e) if e.is_stale() => println!("refused: {e}"),
                Ok(outcome) => println!("late insert went through: {outcome:?}"),
                Err(e) => return Err(e.into()),
            }
            guard.release().await;
        }
        "second" => {
            let guard = client
                .acquire(&format!("import:{PAUSED_RECORD}"), LOCK_TTL)
                .await?;
            let token = guard.token().ok_or("fencing is on by default")?;
            let outcome = fenced
                .insert_if_absent(&pool, PAUSED_RECORD, "level", level("gold")?, token)
                .await?;
            println!("holds import:{PAUSED_RECORD} (token {token}); inserted: {outcome:?}");
            guard.release().await;
        }
        other => return Err(format!("unknown worker mode {other:?}").into()),
    }
    Ok(())
}

/// One task's passes over every record, until each is there.
async fn import_all(
    client: &Client,
    pool: &MySqlPool,
    fenced: &FencedTable,
    table: &str,
    locked: bool,
) -> Result<Stats, BoxError> {
    let mut stats = Stats::default();
    let mut todo: Vec<u32> = (1..=RECORDS).collect();
    while !todo.is_empty() && stats.passes < MAX_PASSES {
        stats.passes += 1;
        let mut left = Vec::new();
        for record in todo {
            let erp_id = format!("E-{record:04}");
            if !locked {
                // Check, validate (the window), insert.
                if !exists(pool, table, &erp_id).await? {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    sqlx::query(&format!(
                        "INSERT INTO {table} (erp_id, level) VALUES (?, 'basic')"
                    ))
                    .bind(&erp_id)
                    .execute(pool)
                    .await?;
                    stats.inserted += 1;
                }
                continue;
            }
            let Some(guard) = client
                .try_acquire(&format!("import:{erp_id}"), LOCK_TTL)
                .await?
            else {
                stats.skipped_held += 1;
                left.push(record);
                continue;
            };
            let token = guard.token().ok_or("fencing is on by default")?;
            // The existence check, kept under the lock as a second line of
            // defence, then the fenced insert.
            if !exists(pool, table, &erp_id).await? {
                tokio::time::sleep(Duration::from_millis(1)).await;
                match fenced
                    .insert_if_absent(pool, erp_id.as_str(), "level", level("basic")?, token)
                    .await
                {
                    Ok(Inserted::New) => stats.inserted += 1,
                    Ok(Inserted::Existing) => stats.existing += 1,
                    Err(e) => return Err(e.into()),
                }
            }
            guard.release().await;
        }
        todo = left;
    }
    Ok(stats)
}

async fn exists(pool: &MySqlPool, table: &str, erp_id: &str) -> Result<bool, BoxError> {
    let n: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table} WHERE erp_id = ?"))
        .bind(erp_id)
        .fetch_one(pool)
        .await?;
    Ok(n > 0)
}

fn level(name: &str) -> Result<MySqlArguments, BoxError> {
    let mut args = MySqlArguments::default();
    args.add(name.to_owned())?;
    Ok(args)
}
