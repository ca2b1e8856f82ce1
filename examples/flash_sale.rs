//! A flash sale: 100 items, 500 buyers at once, served by two instances of
//! the shop (two `Client`s, 250 buyer tasks each).
//!
//! The stock is a plain key in a separate Redis that the shop reads, checks
//! and writes back: GET, decide, SET. That read-modify-write is not atomic
//! (here it could be a single `DECR`; in real shops the decision involves
//! other reads, a payment, a database row), so without a lock two buyers
//! read the same stock and both sell the last item. With every buyer going
//! through `sale:stock`, exactly 100 sell and 400 are turned away.
//!
//! The example fails (exit code 1) unless the locked run sells exactly 100.

mod common;

use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redfence::{Lease, Retry};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

use common::{BoxError, DataStore};

const ITEMS: u32 = 100;
const INSTANCES: u32 = 2;
const BUYERS_PER_INSTANCE: u32 = 250;
/// One purchase holds the lock for a few milliseconds; the TTL only matters
/// if an instance dies holding it.
const LOCK_TTL: Duration = Duration::from_secs(2);
/// Waiting buyers retry with the default jittered pauses, whose random
/// window doubles after every failed attempt (100 ms up to 1 s): 500 buyers
/// retrying at a fixed short pause would split the nodes' votes so often
/// that nobody wins (Redlock's livelock under contention); the growing
/// window spreads them out. The deadline is generous because the last buyer
/// waits for nearly the whole sale.
const BUYER_RETRY: Retry = Retry::new().with_max_wait(Duration::from_secs(60));

fn main() -> ExitCode {
    common::run(flash_sale)
}

async fn flash_sale(nodes: Vec<String>) -> Result<(), BoxError> {
    let store = DataStore::from_env_or_start().await?;
    println!(
        "\n{ITEMS} items, {} buyers on {INSTANCES} instances\n",
        INSTANCES * BUYERS_PER_INSTANCE
    );

    let unlocked = sale(&store, "unlocked", None).await?;
    unlocked.print("without the lock");
    let locked = sale(&store, "locked", Some(&nodes)).await?;
    locked.print("with the lock   ");

    println!();
    if unlocked.sold <= ITEMS {
        println!("note: the unlocked run happened not to oversell this time (a race)");
    }
    if locked.sold != ITEMS || locked.stock_left != 0 {
        return Err(format!(
            "with the lock: sold {} with {} left in stock; expected exactly {ITEMS} sold",
            locked.sold, locked.stock_left
        )
        .into());
    }
    println!("with the lock exactly {ITEMS} items were sold");
    Ok(())
}

/// Runs one sale; `nodes` is `None` for the unlocked run.
async fn sale(store: &DataStore, run: &str, nodes: Option<&[String]>) -> Result<Report, BoxError> {
    let stock_key: Arc<str> = store.key(&format!("{run}:stock")).into();
    let mut setup = store.connect().await?;
    let _: () = setup.set(&*stock_key, ITEMS).await?;

    let counts = Arc::new(Counts::default());
    let started = Instant::now();
    let mut buyers = Vec::new();
    for _ in 0..INSTANCES {
        // One instance: its own lock client and its own data connection,
        // shared by its buyer tasks.
        let client = nodes.map(common::client).transpose()?;
        let db = store.connect().await?;
        for _ in 0..BUYERS_PER_INSTANCE {
            let (client, mut db) = (client.clone(), db.clone());
            let (stock_key, counts) = (stock_key.clone(), counts.clone());
            buyers.push(tokio::spawn(async move {
                let sold =
                    match client {
                        None => buy(&mut db, &stock_key, None).await?,
                        Some(client) => client
                            .lock("sale:stock", LOCK_TTL)
                            .retry(BUYER_RETRY)
                            .run(|lease| async move { buy(&mut db, &stock_key, Some(lease)).await })
                            .await??,
                    };
                counts.record(sold);
                Ok::<(), BoxError>(())
            }));
        }
    }
    for buyer in buyers {
        buyer.await??;
    }
    let elapsed = started.elapsed();
    let stock_left: i64 = setup.get(&*stock_key).await?;
    let _: () = setup.del(&*stock_key).await?;
    Ok(Report {
        sold: counts.sold.load(Ordering::Relaxed),
        rejected: counts.rejected.load(Ordering::Relaxed),
        stock_left,
        elapsed,
    })
}

/// One purchase: read the stock, decide, write it back. Returns whether the
/// buyer got an item.
async fn buy(
    db: &mut MultiplexedConnection,
    stock_key: &str,
    lease: Option<Lease>,
) -> Result<bool, BoxError> {
    let stock: u32 = db.get(stock_key).await?;
    if stock == 0 {
        return Ok(false);
    }
    // Reserving the item, charging the card: the window in which another
    // buyer reads the same stock.
    tokio::time::sleep(Duration::from_millis(1)).await;
    // Writing after the lease ran out would be writing without the lock.
    // (A fencing token checked by the store closes the gap between this
    // check and the write.)
    if lease.is_some_and(|lease| !lease.is_valid()) {
        return Err("lock lost before the stock was written".into());
    }
    let _: () = db.set(stock_key, stock - 1).await?;
    Ok(true)
}

#[derive(Default)]
struct Counts {
    sold: AtomicU32,
    rejected: AtomicU32,
}

impl Counts {
    fn record(&self, sold: bool) {
        let counter = if sold { &self.sold } else { &self.rejected };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

struct Report {
    sold: u32,
    rejected: u32,
    stock_left: i64,
    elapsed: Duration,
}

impl Report {
    fn print(&self, label: &str) {
        let oversold = self.sold.saturating_sub(ITEMS);
        println!(
            "{label}: sold {}, rejected {}, stock left {}, oversold {oversold} ({:.2?})",
            self.sold, self.rejected, self.stock_left, self.elapsed
        );
    }
}
