//! "The sync job held the lock, yet its transaction committed after the
//! lock was gone, and overwrote a newer balance."
//!
//! A job recomputes an account's balance from its ledger and writes it back,
//! in one PostgreSQL transaction, under a lock on `account:{id}` so that two
//! hosts never sync the same account at once. Worker A takes the lock, sums
//! the ledger (100), checks that its lease is still valid, and is then
//! paused (a GC pause, a stalled VM, a slow network: anything longer than the
//! lease) right before its write. Its lease runs out. A new ledger entry
//! (+50) arrives, worker B takes the lock, sums 150, writes it and commits.
//! Then A wakes up and writes the 100 it computed earlier.
//!
//! Without fencing A's write succeeds: the balance goes back to 100 and the
//! +50 is lost. The lock cannot prevent this: A checked its lease, and the
//! pause came after the check. With fencing, each write carries the lock's
//! token and the row remembers the largest it accepted
//! ([`FencedTable::update`]), inside the same transaction; A's token is
//! older than B's, so the write is refused and A rolls back.
//!
//! The example fails (exit code 1) unless the fenced run ends with B's
//! balance and A refused.
//!
//! ```sh
//! cargo run --example fenced_postgres --features postgres
//! # starts 5 local redis-server nodes and a throwaway PostgreSQL; or yours:
//! REDFENCE_PG_URL=postgresql://postgres@127.0.0.1:5432/postgres \
//!     cargo run --example fenced_postgres --features postgres
//! ```

mod common;
#[path = "../tests/support/postgres.rs"]
mod pg_server;
// `postgres.rs` needs `process.rs` beside it: the copy `common` includes
// (one per binary, shared with `common`'s redis servers).
use common::process;

use std::panic::{self, AssertUnwindSafe};
use std::process::ExitCode;
use std::time::Duration;

use redfence::postgres::FencedTable;
use redfence::Client;
use tokio::sync::oneshot;
use tokio_postgres::NoTls;

use common::BoxError;
use pg_server::PgServer;

/// Short, so that B does not wait long for A's lease to run out.
const LOCK_TTL: Duration = Duration::from_millis(500);
const LEDGER: [i64; 2] = [60, 40];
const LATE_ENTRY: i64 = 50;

fn main() -> ExitCode {
    common::run(fenced_postgres)
}

async fn fenced_postgres(nodes: Vec<String>) -> Result<(), BoxError> {
    let db = Database::from_env_or_start().await?;
    db.create_tables().await?;
    let outcome = async {
        println!("\n--- without fencing ---");
        let unfenced = sync_race(&db, &nodes, 1, false).await?;
        println!("\n--- with fencing ---");
        let fenced = sync_race(&db, &nodes, 2, true).await?;
        Ok::<_, BoxError>((unfenced, fenced))
    }
    .await;
    // Tables of this run only: also on a shared REDFENCE_PG_URL database.
    db.drop_tables().await?;
    let (unfenced, fenced) = outcome?;

    let expected = LEDGER.iter().sum::<i64>() + LATE_ENTRY;
    println!();
    unfenced.print("without fencing", expected);
    fenced.print("with fencing   ", expected);
    if unfenced.balance == expected {
        println!("note: the unfenced run happened not to lose the update");
    }
    if fenced.balance != expected || fenced.a_committed || fenced.syncs != 1 {
        return Err(format!(
            "with fencing: balance {} (expected {expected}), A committed: {}, syncs {}",
            fenced.balance, fenced.a_committed, fenced.syncs
        )
        .into());
    }
    println!("with fencing the paused worker's late write was refused and rolled back");
    Ok(())
}

/// What one run left behind.
struct Outcome {
    balance: i64,
    synced_by: String,
    /// Rows in the sync log: one per committed sync.
    syncs: i64,
    a_committed: bool,
}

impl Outcome {
    fn print(&self, label: &str, expected: i64) {
        println!(
            "{label}: balance {} (ledger: {expected}), last synced by {}, syncs committed: {}",
            self.balance, self.synced_by, self.syncs
        );
    }
}

/// Worker A pauses between its check and its write while B syncs.
async fn sync_race(
    db: &Database,
    nodes: &[String],
    account: i64,
    fenced: bool,
) -> Result<Outcome, BoxError> {
    let setup = db.connect().await?;
    setup
        .execute(
            &format!("INSERT INTO {} (id) VALUES ($1)", db.accounts),
            &[&account],
        )
        .await?;
    for amount in LEDGER {
        db.add_entry(&setup, account, amount).await?;
    }

    // Each worker is a separate host: its own lock client and connection.
    let (paused_tx, paused_rx) = oneshot::channel();
    let (wake_tx, wake_rx) = oneshot::channel();
    let a = Worker::new("A", db, nodes, fenced).await?;
    let a = tokio::spawn(a.sync(account, Some(Pause { paused_tx, wake_rx })));
    // A has read the ledger and is paused now. Meanwhile:
    paused_rx.await?;
    db.add_entry(&setup, account, LATE_ENTRY).await?;
    println!("    a new ledger entry: +{LATE_ENTRY}");
    let b = Worker::new("B", db, nodes, fenced).await?;
    if !b.sync(account, None).await? {
        return Err("B was refused, but nobody wrote after it".into());
    }
    // B is done; A wakes up.
    let _ = wake_tx.send(());
    let a_committed = a.await??;

    let row = setup
        .query_one(
            &format!(
                "SELECT balance, synced_by, (SELECT count(*) FROM {} WHERE account = $1) \
                 FROM {} WHERE id = $1",
                db.sync_log, db.accounts
            ),
            &[&account],
        )
        .await?;
    Ok(Outcome {
        balance: row.get(0),
        synced_by: row.get(1),
        syncs: row.get(2),
        a_committed,
    })
}

/// Where worker A stops, and what ends the pause.
struct Pause {
    paused_tx: oneshot::Sender<()>,
    wake_rx: oneshot::Receiver<()>,
}

struct Worker {
    name: &'static str,
    client: Client,
    db: tokio_postgres::Client,
    accounts: FencedTable,
    accounts_name: String,
    ledger: String,
    sync_log: String,
    fenced: bool,
}

impl Worker {
    async fn new(
        name: &'static str,
        db: &Database,
        nodes: &[String],
        fenced: bool,
    ) -> Result<Self, BoxError> {
        Ok(Self {
            name,
            client: common::client(nodes)?,
            db: db.connect().await?,
            accounts: FencedTable::new(&db.accounts, "id", "fence")?,
            accounts_name: db.accounts.clone(),
            ledger: db.ledger.clone(),
            sync_log: db.sync_log.clone(),
            fenced,
        })
    }

    /// The job: under the lock, in one transaction, sum the ledger and
    /// write the balance. Returns whether it committed.
    async fn sync(mut self, account: i64, pause: Option<Pause>) -> Result<bool, BoxError> {
        let name = self.name;
        let guard = self
            .client
            .acquire(&format!("account:{account}"), LOCK_TTL)
            .await?;
        let token = guard
            .token()
            .ok_or("the client was built with fencing off")?;
        println!("    {name}: acquired account:{account}, token {token}");

        let tx = self.db.transaction().await?;
        let balance: i64 = tx
            .query_one(
                &format!(
                    "SELECT COALESCE(sum(amount), 0)::bigint FROM {} WHERE account = $1",
                    self.ledger
                ),
                &[&account],
            )
            .await?
            .get(0);
        // The careful check before writing. It cannot help with a pause
        // that comes after it.
        if guard.validity().is_zero() {
            return Err(format!("{name}: lease ran out before the write").into());
        }
        println!(
            "    {name}: ledger sums to {balance}; lease valid for {:.0?} more: writing",
            guard.validity()
        );
        if let Some(pause) = pause {
            println!("    {name}: paused (GC, stalled VM, slow network...)");
            let _ = pause.paused_tx.send(());
            let _ = pause.wake_rx.await;
            println!(
                "    {name}: resumes; its lease ran out {:.0?} ago, it does not know",
                guard.valid_until().elapsed()
            );
        }

        if self.fenced {
            let update = self
                .accounts
                .update(
                    &tx,
                    &account,
                    "balance = $1, synced_by = $2",
                    &[&balance, &name],
                    token,
                )
                .await;
            match update {
                Ok(1) => {}
                Ok(_) => return Err(format!("{name}: no account {account}").into()),
                Err(e) if e.is_stale() => {
                    println!("    {name}: write refused ({e}); rolling back");
                    tx.rollback().await?;
                    // The lock is someone else's by now; this releases
                    // nothing of theirs.
                    guard.release().await;
                    return Ok(false);
                }
                Err(e) => return Err(e.into()),
            }
        } else {
            tx.execute(
                &format!(
                    "UPDATE {} SET balance = $1, synced_by = $2 WHERE id = $3",
                    self.accounts_name
                ),
                &[&balance, &name, &account],
            )
            .await?;
        }
        tx.execute(
            &format!(
                "INSERT INTO {} (account, worker, balance) VALUES ($1, $2, $3)",
                self.sync_log
            ),
            &[&account, &name, &balance],
        )
        .await?;
        tx.commit().await?;
        println!("    {name}: wrote balance {balance} and committed");
        guard.release().await;
        Ok(true)
    }
}

/// The PostgreSQL database: `REDFENCE_PG_URL`, or a throwaway local server
/// owned here. Table names carry a per-run suffix so that runs against a
/// shared database do not see each other.
struct Database {
    url: String,
    accounts: String,
    ledger: String,
    sync_log: String,
    /// Stops the local server on drop; `None` for `REDFENCE_PG_URL`.
    _local: Option<PgServer>,
}

impl Database {
    async fn from_env_or_start() -> Result<Self, BoxError> {
        let suffix = format!("{:08x}", rand::random::<u32>());
        let (url, local) = match std::env::var("REDFENCE_PG_URL") {
            Ok(url) => {
                println!("database (REDFENCE_PG_URL): {url}");
                (url, None)
            }
            Err(_) => {
                // Starting a server sleeps while it polls for readiness.
                let server = tokio::task::spawn_blocking(|| {
                    panic::catch_unwind(AssertUnwindSafe(PgServer::start))
                })
                .await?
                .map_err(|_| {
                    "could not start a local PostgreSQL (see above): install it \
                     (Debian/Ubuntu: apt-get install postgresql), or set REDFENCE_PG_URL"
                })?;
                let url = server.url();
                println!(
                    "database: a local throwaway PostgreSQL at {url} \
                     (set REDFENCE_PG_URL to use your own)"
                );
                (url, Some(server))
            }
        };
        Ok(Self {
            url,
            accounts: format!("fenced_example_{suffix}_accounts"),
            ledger: format!("fenced_example_{suffix}_ledger"),
            sync_log: format!("fenced_example_{suffix}_sync_log"),
            _local: local,
        })
    }

    async fn connect(&self) -> Result<tokio_postgres::Client, BoxError> {
        let (client, connection) = tokio::time::timeout(
            Duration::from_secs(10),
            tokio_postgres::connect(&self.url, NoTls),
        )
        .await
        .map_err(|_| format!("connecting to {} timed out", self.url))??;
        // Ends when the client is dropped.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }

    async fn create_tables(&self) -> Result<(), BoxError> {
        // The fence column is all that fencing adds to a table of yours.
        self.connect()
            .await?
            .batch_execute(&format!(
                "CREATE TABLE {accounts} (id bigint PRIMARY KEY, balance bigint NOT NULL DEFAULT 0, \
                     synced_by text NOT NULL DEFAULT '', fence bigint NOT NULL DEFAULT 0); \
                 CREATE TABLE {ledger} (account bigint NOT NULL, amount bigint NOT NULL); \
                 CREATE TABLE {sync_log} (account bigint NOT NULL, worker text NOT NULL, \
                     balance bigint NOT NULL)",
                accounts = self.accounts,
                ledger = self.ledger,
                sync_log = self.sync_log,
            ))
            .await?;
        Ok(())
    }

    async fn drop_tables(&self) -> Result<(), BoxError> {
        self.connect()
            .await?
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {}, {}, {}",
                self.accounts, self.ledger, self.sync_log
            ))
            .await?;
        Ok(())
    }

    async fn add_entry(
        &self,
        conn: &tokio_postgres::Client,
        account: i64,
        amount: i64,
    ) -> Result<(), BoxError> {
        conn.execute(
            &format!(
                "INSERT INTO {} (account, amount) VALUES ($1, $2)",
                self.ledger
            ),
            &[&account, &amount],
        )
        .await?;
        Ok(())
    }
}
