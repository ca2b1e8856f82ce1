//! What a fenced write costs through sqlx: the fenced statement against the
//! same unfenced statement on the same server and connection, side by side
//! in one run, per backend (PostgreSQL and MariaDB started here on free
//! ports, SQLite in a temporary file in WAL mode with `synchronous=NORMAL`).
//!
//! `cargo bench --features sqlx --bench sqlx_fence`. Two rows per backend,
//! each a plain and a fenced statement alternating one by one (which goes
//! first alternates too), in slices of 200 pairs, so that a machine's drift
//! and the server's background work hit both alike:
//! - update: `FencedTable::update` (`UPDATE … SET val = ?, fence = T WHERE
//!   id = ? AND (fence IS NULL OR fence <= T)`, accepted) against `UPDATE …
//!   SET val = ? WHERE id = ?`, over 100 rows;
//! - store write: `FencedStore::write` (the fenced upsert) against the same
//!   table's plain upsert of the value, over 100 keys.
//!
//! One connection (a pool of one), autocommit, sequential: the latency of
//! one statement as a caller sees it. Prints the median and p99 of each and
//! the ratio of medians. Every fenced write must be accepted (exit 1
//! otherwise). `REDFENCE_BENCH_SECS` sets each backend's total window
//! (default 4 s).

#[path = "../tests/support/mariadb.rs"]
mod mariadb;
#[path = "../tests/support/postgres.rs"]
mod postgres;
#[path = "../tests/support/process.rs"]
mod process;

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use redfence::FencingToken;
use sqlx::Arguments;

const SLICE: usize = 200;
const ROWS: u64 = 100;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> ExitCode {
    let secs: f64 = match std::env::var("REDFENCE_BENCH_SECS") {
        Ok(s) => match s.parse() {
            Ok(v) if v > 0.0 => v,
            _ => {
                eprintln!("REDFENCE_BENCH_SECS={s:?} is not a positive number");
                return ExitCode::FAILURE;
            }
        },
        Err(_) => 4.0,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(run(Duration::from_secs_f64(secs))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One operation: (row id, value, token).
type OpFn = Box<dyn Fn(i64, i64, FencingToken) -> Op>;
type Op = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;

/// The four rows' operations of one backend, in the order printed:
/// plain update, fenced update, plain upsert, fenced store write.
macro_rules! ops {
    ($pool:expr, $fenced:path, $args:ty, $set:literal, $update:literal, $upsert:literal) => {{
        use $fenced as b;
        let table = b::FencedTable::new("bench_rows", "id", "fence")?;
        let store = b::FencedStore::new("bench_store")?;
        store.create_table(&$pool).await?;
        let (p1, p2, p3, p4) = ($pool.clone(), $pool.clone(), $pool.clone(), $pool.clone());
        let ops: [OpFn; 4] = [
            Box::new(move |id, v, _| {
                let p = p1.clone();
                Box::pin(async move {
                    sqlx::query($update).bind(v).bind(id).execute(&p).await?;
                    Ok(())
                })
            }),
            Box::new(move |id, v, token| {
                let (p, t) = (p2.clone(), table.clone());
                Box::pin(async move {
                    let mut args = <$args>::default();
                    args.add(v)?;
                    accepted(t.update(&p, id, $set, args, token).await?)
                })
            }),
            Box::new(move |id, v, _| {
                let p = p3.clone();
                Box::pin(async move {
                    sqlx::query($upsert)
                        .bind(id.to_string())
                        .bind(v.to_le_bytes().to_vec())
                        .execute(&p)
                        .await?;
                    Ok(())
                })
            }),
            Box::new(move |id, v, token| {
                let (p, s) = (p4.clone(), store.clone());
                Box::pin(async move {
                    Ok(s.write(&p, &id.to_string(), &v.to_le_bytes(), token)
                        .await?)
                })
            }),
        ];
        ops
    }};
}

async fn run(window: Duration) -> Result<(), BoxError> {
    println!(
        "fenced vs plain statements through sqlx, one connection, {window:?} per backend; load {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    println!(
        "{:<10} {:<12} {:>12} {:>12} {:>12} {:>12} {:>7}",
        "backend", "row", "plain p50", "fenced p50", "plain p99", "fenced p99", "ratio"
    );
    let ddl = "CREATE TABLE bench_rows (id BIGINT PRIMARY KEY, val BIGINT, fence BIGINT NOT NULL DEFAULT 0)";

    let pg = tokio::task::spawn_blocking(postgres::PgServer::start).await?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&pg.url())
        .await?;
    sqlx::query(ddl).execute(&pool).await?;
    sqlx::query("INSERT INTO bench_rows (id, val) SELECT g, 0 FROM generate_series(0, 99) g")
        .execute(&pool)
        .await?;
    let ops = ops!(
        pool,
        redfence::sqlx::postgres,
        sqlx::postgres::PgArguments,
        "val = $1",
        "UPDATE bench_rows SET val = $1 WHERE id = $2",
        "INSERT INTO bench_store (id, value, fence) VALUES ($1, $2, 0) \
         ON CONFLICT (id) DO UPDATE SET value = EXCLUDED.value"
    );
    measure("postgres", window, &ops).await?;
    drop((ops, pool, pg));

    let maria = tokio::task::spawn_blocking(mariadb::MariaDbServer::start).await?;
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&maria.url())
        .await?;
    sqlx::query(ddl).execute(&pool).await?;
    for id in 0..ROWS {
        sqlx::query("INSERT INTO bench_rows (id, val) VALUES (?, 0)")
            .bind(id as i64)
            .execute(&pool)
            .await?;
    }
    let ops = ops!(
        pool,
        redfence::sqlx::mysql,
        sqlx::mysql::MySqlArguments,
        "val = ?",
        "UPDATE bench_rows SET val = ? WHERE id = ?",
        "INSERT INTO bench_store (id, value, fence) VALUES (?, ?, 0) \
         ON DUPLICATE KEY UPDATE value = VALUES(value)"
    );
    measure("mariadb", window, &ops).await?;
    drop((ops, pool, maria));

    let dir = process::TempDir::new("sqlite-bench");
    std::fs::create_dir(dir.path())?;
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.join("bench.sqlite"))
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .synchronous(sqlx::sqlite::SqliteSynchronous::Normal);
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await?;
    sqlx::query(ddl).execute(&pool).await?;
    for id in 0..ROWS {
        sqlx::query("INSERT INTO bench_rows (id, val) VALUES (?1, 0)")
            .bind(id as i64)
            .execute(&pool)
            .await?;
    }
    let ops = ops!(
        pool,
        redfence::sqlx::sqlite,
        sqlx::sqlite::SqliteArguments<'static>,
        "val = ?1",
        "UPDATE bench_rows SET val = ?1 WHERE id = ?2",
        "INSERT INTO bench_store (id, value, fence) VALUES (?1, ?2, 0) \
         ON CONFLICT (id) DO UPDATE SET value = excluded.value"
    );
    measure("sqlite", window, &ops).await?;
    Ok(())
}

fn accepted(rows: u64) -> Result<(), BoxError> {
    if rows == 1 {
        Ok(())
    } else {
        Err(format!("a fenced update changed {rows} rows, not 1").into())
    }
}

/// Runs the four rows in turn, a slice each, until the window is spent
/// (at least one slice each).
async fn measure(name: &str, window: Duration, ops: &[OpFn; 4]) -> Result<(), BoxError> {
    // Tokens grow with every fenced write, as successive holders' would.
    let mut token = 1_u64 << 40;
    let mut samples: [Vec<Duration>; 4] = Default::default();
    let started = Instant::now();
    let mut n = 0_i64;
    // Warm-up: prepared statements cached, pages in memory.
    for op in ops {
        for id in 0..ROWS as i64 {
            token += 1;
            op(id, 0, FencingToken::new(token)).await?;
        }
    }
    while samples[0].is_empty() || started.elapsed() < window {
        // Each pair in turn, its plain and fenced statements alternating
        // one by one (which goes first alternates too), so that background
        // work of the server (InnoDB's purge and flush) falls on both alike.
        for pair in [0, 2] {
            for i in 0..SLICE {
                for k in [i % 2, 1 - i % 2] {
                    n += 1;
                    token += 1;
                    let t = Instant::now();
                    ops[pair + k](n % ROWS as i64, n, FencingToken::new(token)).await?;
                    samples[pair + k].push(t.elapsed());
                }
            }
        }
    }
    for (label, plain, fenced) in [("update", 0, 1), ("store write", 2, 3)] {
        let (p50p, p99p) = quantiles(&mut samples[plain]);
        let (p50f, p99f) = quantiles(&mut samples[fenced]);
        println!(
            "{name:<10} {label:<12} {:>10.1}µs {:>10.1}µs {:>10.1}µs {:>10.1}µs {:>6.2}x  (n={})",
            us(p50p),
            us(p50f),
            us(p99p),
            us(p99f),
            us(p50f) / us(p50p),
            samples[plain].len(),
        );
    }
    Ok(())
}

fn quantiles(samples: &mut [Duration]) -> (Duration, Duration) {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
