//! "The nightly import runs on several hosts, and one night it inserted the
//! same membership twice."
//!
//! Four hosts (four tasks, each with its own [`Client`], as separate
//! processes would have) import the same 200 records at the same time, in
//! the same order, as they would from one shared input file. The import of a
//! record is the classic check-then-insert: "is it imported yet? no: insert
//! the membership row, mark it imported". Between the check and the mark,
//! another host can run the same check.
//!
//! With the lock, each record is imported under `try_acquire` on
//! `import:record:{id}`, and a host that finds it held skips it (someone
//! else is on it). The lock alone is not enough for exactly once: it only
//! excludes hosts *while* it is held, and a host that reaches the record
//! after the first one released would import it again. So the check for the
//! "imported" mark runs under the lock too: the lock makes check and insert
//! one step, the mark makes that step happen once for good.
//!
//! A record can end up skipped by every host in a pass (a split vote: each
//! got some nodes, none a majority), so each host repeats its pass over the
//! records still not marked until none are left, which is what a re-run of
//! an idempotent job does anyway.
//!
//! Operators who run the import from cron get the same exclusion without
//! this code: `redfence exec --no-wait nightly-import -- import-memberships`
//! on every host (README, "For operators").
//!
//! The same import without the lock is the negative control: it inserts
//! duplicates. The example fails (exit code 1) if the locked run inserts
//! any duplicate or misses any record.

mod common;

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use redfence::Client;
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

use common::{BoxError, DataStore};

const HOSTS: usize = 4;
const RECORDS: u32 = 200;
/// Far above the time one import takes; a host that crashes mid-record
/// blocks that record for at most this long.
const LOCK_TTL: Duration = Duration::from_secs(5);
/// Bounds the repeat passes; in practice one or two suffice.
const MAX_PASSES: u32 = 20;

fn main() -> ExitCode {
    common::run(batch_dedup)
}

async fn batch_dedup(nodes: Vec<String>) -> Result<(), BoxError> {
    let store = DataStore::from_env_or_start().await?;
    println!("\n{HOSTS} hosts import the same {RECORDS} records concurrently\n");

    let unlocked = import(&store, "unlocked", None).await?;
    unlocked.print("without the lock");
    let locked = import(&store, "locked", Some(&nodes)).await?;
    locked.print("with the lock   ");

    println!();
    if unlocked.duplicates == 0 {
        println!("note: the unlocked run happened to insert no duplicate this time (a race)");
    }
    if locked.duplicates != 0 || locked.missing != 0 {
        return Err(format!(
            "with the lock: {} duplicates, {} records missing; expected exactly once",
            locked.duplicates, locked.missing
        )
        .into());
    }
    println!("with the lock every record was imported exactly once");
    Ok(())
}

/// One run of the import on all hosts. `nodes` is `None` for the unlocked
/// run.
async fn import(
    store: &DataStore,
    run: &str,
    nodes: Option<&[String]>,
) -> Result<Report, BoxError> {
    let table = Table {
        rows: store.key(&format!("{run}:memberships")),
        imported: store.key(&format!("{run}:imported")),
    };
    let started = Instant::now();
    let mut hosts = Vec::with_capacity(HOSTS);
    for host in 1..=HOSTS {
        let host = Host {
            name: format!("host-{host}"),
            client: nodes.map(common::client).transpose()?,
            db: store.connect().await?,
            table: table.clone(),
        };
        hosts.push(tokio::spawn(host.run()));
    }
    let mut stats = Vec::with_capacity(HOSTS);
    for host in hosts {
        stats.push(host.await??);
    }
    let report = Report::count(&table, &mut store.connect().await?, stats, started).await?;
    let _: () = store
        .connect()
        .await?
        .del(&[&table.rows, &table.imported])
        .await?;
    Ok(report)
}

/// The membership table (a list of rows, where a duplicate is simply a
/// second row, as in a SQL table without a unique constraint) and the
/// "imported" marks.
#[derive(Clone)]
struct Table {
    rows: String,
    imported: String,
}

/// One host running the import job.
struct Host {
    name: String,
    client: Option<Client>,
    db: MultiplexedConnection,
    table: Table,
}

/// What one host did.
#[derive(Default)]
struct HostStats {
    inserted: u32,
    /// `try_acquire` said `Ok(None)`: another host holds the record.
    skipped_held: u32,
    passes: u32,
}

impl Host {
    async fn run(mut self) -> Result<HostStats, BoxError> {
        let mut stats = HostStats::default();
        let mut todo: Vec<u32> = (1..=RECORDS).collect();
        while !todo.is_empty() {
            stats.passes += 1;
            if stats.passes > MAX_PASSES {
                return Err(format!(
                    "{}: {} records still not imported after {MAX_PASSES} passes",
                    self.name,
                    todo.len()
                )
                .into());
            }
            let mut held = Vec::new();
            for id in todo {
                match self.import_record(id).await? {
                    Outcome::Inserted => stats.inserted += 1,
                    Outcome::AlreadyImported => {}
                    Outcome::Held => {
                        stats.skipped_held += 1;
                        held.push(id);
                    }
                }
            }
            // A held record is usually finished by its holder meanwhile; the
            // next pass finds its mark and moves on.
            todo = held;
            if !todo.is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(stats)
    }

    async fn import_record(&mut self, id: u32) -> Result<Outcome, BoxError> {
        let Some(client) = &self.client else {
            return self.check_then_insert(id).await;
        };
        let Some(guard) = client
            .try_acquire(&format!("import:record:{id}"), LOCK_TTL)
            .await?
        else {
            return Ok(Outcome::Held);
        };
        let outcome = self.check_then_insert(id).await;
        // A guard that is dropped also releases (in the background); an
        // explicit release returns once a majority has let go.
        guard.release().await;
        outcome
    }

    /// The job's own logic, unchanged by the lock.
    async fn check_then_insert(&mut self, id: u32) -> Result<Outcome, BoxError> {
        let done: bool = self.db.hexists(&self.table.imported, id).await?;
        if done {
            return Ok(Outcome::AlreadyImported);
        }
        // Looking up the member, building the row: the window in which
        // another host can pass the same check.
        tokio::time::sleep(Duration::from_millis(2)).await;
        let row = format!("record={id} imported_by={}", self.name);
        let _: () = self.db.rpush(&self.table.rows, row).await?;
        let _: () = self.db.hset(&self.table.imported, id, &self.name).await?;
        Ok(Outcome::Inserted)
    }
}

enum Outcome {
    Inserted,
    AlreadyImported,
    Held,
}

/// The membership table after a run, checked record by record.
struct Report {
    inserts: usize,
    duplicates: usize,
    missing: usize,
    hosts: Vec<HostStats>,
    elapsed: Duration,
}

impl Report {
    async fn count(
        table: &Table,
        db: &mut MultiplexedConnection,
        hosts: Vec<HostStats>,
        started: Instant,
    ) -> Result<Self, BoxError> {
        let elapsed = started.elapsed();
        let rows: Vec<String> = db.lrange(&table.rows, 0, -1).await?;
        let mut per_record: HashMap<&str, usize> = HashMap::new();
        for row in &rows {
            let record = row.split_whitespace().next().unwrap_or_default();
            *per_record.entry(record).or_default() += 1;
        }
        let duplicates = per_record.values().map(|n| n - 1).sum();
        let missing = usize::try_from(RECORDS)? - per_record.len();
        Ok(Self {
            inserts: rows.len(),
            duplicates,
            missing,
            hosts,
            elapsed,
        })
    }

    fn print(&self, label: &str) {
        println!(
            "{label}: records {RECORDS}, inserts {}, duplicates {}, missing {} ({:.2?})",
            self.inserts, self.duplicates, self.missing, self.elapsed
        );
        let column = |f: fn(&HostStats) -> u32| {
            let values: Vec<String> = self.hosts.iter().map(|h| f(h).to_string()).collect();
            values.join("/")
        };
        println!(
            "    per host: inserted {}, skipped as held {}, passes {}",
            column(|h| h.inserted),
            column(|h| h.skipped_held),
            column(|h| h.passes)
        );
    }
}
