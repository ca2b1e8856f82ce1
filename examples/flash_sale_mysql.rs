//! "The stock decrement, the order row and the coupon use had to commit in
//! one transaction before the lock was released."
//!
//! A flash sale on MySQL/MariaDB through sqlx: one item left, one coupon.
//! A purchase reads the stock and the coupon, checks them, then in one
//! transaction sets the new stock, marks the coupon used and inserts the
//! order. It runs under the lock `sale:sku-1` through
//! [`Client::with_lock`]: the lock is released only after the closure's
//! future has finished, and the transaction is begun and committed inside
//! the closure, so "released before the commit" cannot be written by
//! accident (a transaction the closure forgets to commit is rolled back
//! when it is dropped, still under the lock).
//!
//! Alice's purchase reads the stock (1) and the unused coupon, and is then
//! paused (a GC pause, a stalled VM) past its lease. Bob takes the lock,
//! buys the item with the coupon and commits. Then Alice wakes up and
//! writes what she computed.
//!
//! Without fencing her transaction commits: two orders for one item, the
//! stock at 0 instead of -1 (her decrement computed from a stale read), the
//! coupon used twice. With fencing each write carries the lock's token
//! ([`FencedTable::update`] on the stock and the coupon rows, first in the
//! transaction): Alice's token is older than the one the rows accepted from
//! Bob, so her first write is refused, and her transaction rolls back.
//!
//! The honest note from the write-up: a plain counter needs no lock at all,
//! `UPDATE stock SET quantity = quantity - 1 WHERE sku = ? AND quantity >=
//! 1` cannot oversell (shown at the end). The lock pays when several rows
//! of several tables must change together.
//!
//! The example fails (exit code 1) unless the fenced run sells the item
//! once, uses the coupon once, and refuses Alice.
//!
//! ```sh
//! cargo run --example flash_sale_mysql --features sqlx-mysql
//! # starts 5 local redis-server nodes and a throwaway MariaDB; or yours:
//! REDFENCE_MYSQL_URL=mysql://root@127.0.0.1:3306/test \
//!     cargo run --example flash_sale_mysql --features sqlx-mysql
//! ```

mod common;
#[path = "../tests/support/mariadb.rs"]
mod mariadb_server;
// `mariadb.rs` needs `process.rs` beside it: the copy `common` includes.
use common::process;

use std::panic::{self, AssertUnwindSafe};
use std::process::ExitCode;
use std::time::Duration;

use redfence::sqlx::mysql::FencedTable;
use redfence::{Client, StoreError};
use sqlx::mysql::{MySqlArguments, MySqlPool, MySqlPoolOptions};
use sqlx::Arguments;
use tokio::sync::oneshot;

use common::BoxError;
use mariadb_server::MariaDbServer;

/// Short, so that Bob does not wait long for Alice's lease to run out.
const LOCK_TTL: Duration = Duration::from_millis(400);
/// Bounds every wait between the two buyers.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
const SKU: &str = "sku-1";
const COUPON: &str = "SPRING10";

fn main() -> ExitCode {
    common::run(flash_sale_mysql)
}

async fn flash_sale_mysql(nodes: Vec<String>) -> Result<(), BoxError> {
    let (pool, _server) = database().await?;
    let shop = Shop::create(&pool, &format!("{:06x}", rand::random::<u32>() >> 8)).await?;
    let client = common::client(&nodes)?;

    let outcome = async {
        println!("\n--- without fencing ---");
        let unfenced = race(&client, &shop, false).await?;
        println!("\n--- with fencing ---");
        let fenced = race(&client, &shop, true).await?;
        println!("\n--- a plain counter, no lock ---");
        let counter = plain_counter(&shop).await?;
        Ok::<_, BoxError>((unfenced, fenced, counter))
    }
    .await;
    shop.drop_tables().await?;
    let (unfenced, fenced, counter) = outcome?;

    println!();
    unfenced.print("without fencing");
    fenced.print("with fencing   ");
    println!("plain counter  : 5 buyers, 1 item: {counter} sold");
    if unfenced.orders == 1 {
        println!("note: the unfenced run happened not to oversell");
    }
    if fenced.orders != 1 || fenced.coupon_uses != 1 || fenced.stock != 0 || !fenced.alice_refused {
        return Err(
            "with fencing: expected one order, one coupon use, stock 0, Alice refused".into(),
        );
    }
    if counter != 1 {
        return Err(format!("the plain counter sold {counter} of 1 item").into());
    }
    println!("with fencing the item was sold once and Alice's late commit was refused");
    Ok(())
}

/// The sale's three tables, with a fence column on the two rows the
/// purchase writes with the token.
struct Shop {
    pool: MySqlPool,
    stock: String,
    coupons: String,
    orders: String,
}

impl Shop {
    async fn create(pool: &MySqlPool, suffix: &str) -> Result<Shop, BoxError> {
        let shop = Shop {
            pool: pool.clone(),
            stock: format!("stock_{suffix}"),
            coupons: format!("coupons_{suffix}"),
            orders: format!("orders_{suffix}"),
        };
        for ddl in [
            format!(
                "CREATE TABLE {} (sku VARCHAR(32) PRIMARY KEY, quantity BIGINT NOT NULL, \
                 fence BIGINT NOT NULL DEFAULT 0)",
                shop.stock
            ),
            format!(
                "CREATE TABLE {} (code VARCHAR(32) PRIMARY KEY, uses BIGINT NOT NULL DEFAULT 0, \
                 used_by VARCHAR(32), fence BIGINT NOT NULL DEFAULT 0)",
                shop.coupons
            ),
            format!(
                "CREATE TABLE {} (id BIGINT AUTO_INCREMENT PRIMARY KEY, sku VARCHAR(32), \
                 buyer VARCHAR(32), coupon VARCHAR(32))",
                shop.orders
            ),
        ] {
            sqlx::query(&ddl).execute(pool).await?;
        }
        Ok(shop)
    }

    async fn reset(&self) -> Result<(), BoxError> {
        for sql in [
            format!("DELETE FROM {}", self.stock),
            format!("DELETE FROM {}", self.coupons),
            format!("DELETE FROM {}", self.orders),
            format!(
                "INSERT INTO {} (sku, quantity) VALUES ('{SKU}', 1)",
                self.stock
            ),
            format!("INSERT INTO {} (code) VALUES ('{COUPON}')", self.coupons),
        ] {
            sqlx::query(&sql).execute(&self.pool).await?;
        }
        Ok(())
    }

    async fn drop_tables(&self) -> Result<(), BoxError> {
        let sql = format!(
            "DROP TABLE IF EXISTS {}, {}, {}",
            self.stock, self.coupons, self.orders
        );
        sqlx::query(&sql).execute(&self.pool).await?;
        Ok(())
    }

    async fn report(&self, alice_refused: bool) -> Result<Report, BoxError> {
        let stock: i64 = sqlx::query_scalar(&format!("SELECT quantity FROM {}", self.stock))
            .fetch_one(&self.pool)
            .await?;
        let orders: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {}", self.orders))
            .fetch_one(&self.pool)
            .await?;
        let coupon_uses: i64 = sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM {} WHERE coupon IS NOT NULL",
            self.orders
        ))
        .fetch_one(&self.pool)
        .await?;
        Ok(Report {
            stock,
            orders,
            coupon_uses,
            alice_refused,
        })
    }
}

/// How one purchase ended.
#[derive(Debug)]
enum Purchase {
    Bought,
    SoldOut,
    /// A write carried a token older than the one its row had accepted.
    Refused(StoreError),
}

/// One purchase under the lock. Everything that must commit together is
/// in the one transaction begun and committed inside the closure; the
/// lock is released after the closure's future finishes.
async fn buy(
    client: &Client,
    shop: &Shop,
    buyer: &str,
    fenced: bool,
    pause: Option<Pause>,
) -> Result<Purchase, BoxError> {
    let resource = format!("sale:{SKU}:{}", shop.stock);
    client
        .with_lock(&resource, LOCK_TTL, |lease| async move {
            let token = lease.token().ok_or("fencing is on by default")?;
            // Read and check, outside any transaction.
            let quantity: i64 = sqlx::query_scalar(&format!(
                "SELECT quantity FROM {} WHERE sku = ?",
                shop.stock
            ))
            .bind(SKU)
            .fetch_one(&shop.pool)
            .await?;
            if quantity < 1 {
                return Ok(Purchase::SoldOut);
            }
            println!("{buyer}: holds the lock (token {token}), reads stock {quantity}");
            if let Some(pause) = pause {
                println!("{buyer}: paused; the lease ({LOCK_TTL:?}) runs out");
                let _ = pause.paused.send(());
                // Until the other buyer is done: a pause of any length past
                // the lease, made deterministic (a loaded machine cannot
                // reorder the story).
                tokio::time::timeout(STEP_TIMEOUT, pause.resume).await??;
                println!("{buyer}: resumes, lease valid: {}", lease.is_valid());
            }

            let mut tx = shop.pool.begin().await?;
            if fenced {
                let stock = FencedTable::new(&shop.stock, "sku", "fence")?;
                let coupons = FencedTable::new(&shop.coupons, "code", "fence")?;
                // The fenced writes first: a stale holder learns it before
                // doing anything else, and their row locks order a newer
                // holder's writes after this transaction's commit.
                let mut args = MySqlArguments::default();
                args.add(quantity - 1)?;
                match stock
                    .update(&mut *tx, SKU, "quantity = ?", args, token)
                    .await
                {
                    Ok(_) => {}
                    Err(e) if e.is_stale() => return Ok(Purchase::Refused(e)), // `tx` rolls back
                    Err(e) => return Err(e.into()),
                }
                let mut args = MySqlArguments::default();
                args.add(buyer)?;
                match coupons
                    .update(
                        &mut *tx,
                        COUPON,
                        "uses = uses + 1, used_by = ?",
                        args,
                        token,
                    )
                    .await
                {
                    Ok(_) => {}
                    Err(e) if e.is_stale() => return Ok(Purchase::Refused(e)),
                    Err(e) => return Err(e.into()),
                }
            } else {
                sqlx::query(&format!(
                    "UPDATE {} SET quantity = ? WHERE sku = ?",
                    shop.stock
                ))
                .bind(quantity - 1)
                .bind(SKU)
                .execute(&mut *tx)
                .await?;
                sqlx::query(&format!(
                    "UPDATE {} SET uses = uses + 1, used_by = ? WHERE code = ?",
                    shop.coupons
                ))
                .bind(buyer)
                .bind(COUPON)
                .execute(&mut *tx)
                .await?;
            }
            sqlx::query(&format!(
                "INSERT INTO {} (sku, buyer, coupon) VALUES (?, ?, ?)",
                shop.orders
            ))
            .bind(SKU)
            .bind(buyer)
            .bind(COUPON)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            println!("{buyer}: committed the order, stock {}", quantity - 1);
            Ok::<_, BoxError>(Purchase::Bought)
        })
        .await?
}

/// Alice's pause: she says when it starts, and it lasts until Bob is done.
struct Pause {
    paused: oneshot::Sender<()>,
    resume: oneshot::Receiver<()>,
}

/// Alice reads and pauses past her lease; Bob buys meanwhile; Alice
/// resumes and writes.
async fn race(client: &Client, shop: &Shop, fenced: bool) -> Result<Report, BoxError> {
    shop.reset().await?;
    let (paused_tx, paused_rx) = oneshot::channel();
    let (resume_tx, resume_rx) = oneshot::channel();
    let pause = Pause {
        paused: paused_tx,
        resume: resume_rx,
    };
    let alice = buy(client, shop, "alice", fenced, Some(pause));
    let bob = async {
        tokio::time::timeout(STEP_TIMEOUT, paused_rx).await??;
        // Bob's acquire waits until Alice's lease has run out.
        let bought = buy(client, shop, "bob", fenced, None).await;
        let _ = resume_tx.send(());
        bought
    };
    let (alice, bob) = tokio::join!(alice, bob);
    let (alice, bob) = (alice?, bob?);
    println!("bob: {bob:?}");
    let alice_refused = match &alice {
        Purchase::Refused(e) => {
            println!("alice: refused: {e}");
            true
        }
        other => {
            println!("alice: {other:?}");
            false
        }
    };
    shop.report(alice_refused).await
}

/// Five buyers at once with the atomic decrement and no lock.
async fn plain_counter(shop: &Shop) -> Result<u64, BoxError> {
    shop.reset().await?;
    let sql = format!(
        "UPDATE {} SET quantity = quantity - 1 WHERE sku = ? AND quantity >= 1",
        shop.stock
    );
    let buyers = (0..5).map(|_| {
        let sql = sql.clone();
        let pool = shop.pool.clone();
        tokio::spawn(async move {
            sqlx::query(&sql)
                .bind(SKU)
                .execute(&pool)
                .await
                .map(|done| done.rows_affected())
        })
    });
    let mut sold = 0;
    for buyer in buyers.collect::<Vec<_>>() {
        sold += buyer.await??;
    }
    println!("5 buyers ran `{sql}`: {sold} row(s) changed, the rest found it sold out");
    Ok(sold)
}

struct Report {
    stock: i64,
    orders: i64,
    coupon_uses: i64,
    alice_refused: bool,
}

impl Report {
    fn print(&self, label: &str) {
        println!(
            "{label}: 1 item, 1 coupon -> {} orders, stock {}, coupon used {} times{}",
            self.orders,
            self.stock,
            self.coupon_uses,
            if self.alice_refused {
                ", Alice refused"
            } else {
                ""
            }
        );
    }
}

/// `REDFENCE_MYSQL_URL`, or a throwaway local MariaDB owned by the second
/// element (stopped on drop).
async fn database() -> Result<(MySqlPool, Option<MariaDbServer>), BoxError> {
    let (url, local) = match std::env::var("REDFENCE_MYSQL_URL") {
        Ok(url) => {
            println!("database (REDFENCE_MYSQL_URL): {url}");
            (url, None)
        }
        Err(_) => {
            // Starting a server sleeps while it polls for readiness.
            let server = tokio::task::spawn_blocking(|| {
                panic::catch_unwind(AssertUnwindSafe(MariaDbServer::start))
            })
            .await?
            .map_err(|_| "could not start MariaDB (see the message above)")?;
            println!("database: a local MariaDB on port {}", server.port());
            (server.url(), Some(server))
        }
    };
    let pool = MySqlPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url)
        .await?;
    Ok((pool, local))
}
