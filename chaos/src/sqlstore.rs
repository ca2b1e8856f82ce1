//! `--store`: where the workers' fenced writes go. `redis` (the default) is
//! the crate's `FencedStore` on the data node; `mysql`, `postgres` and
//! `sqlite` are the sqlx stores (`redfence::sqlx`) on a MariaDB or
//! PostgreSQL server this process starts once for the whole suite (on a
//! free port, through the test harness), or on an SQLite file in its
//! history directory. Each nemesis run writes to a table of its own, made
//! by the parent before its workers start. With fencing off (the
//! `no-fencing` control) the write is the same table's plain upsert: what
//! an application without tokens does.

use std::path::Path;
use std::time::Duration;

use redfence::FencingToken;
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

use crate::history::WriteOutcome;
use crate::BoxError;

/// Bounds each SQL write, like the Redis store's `DATA_TIMEOUT`.
const SQL_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    Redis,
    Mysql,
    Postgres,
    Sqlite,
}

impl StoreKind {
    pub fn parse(s: &str) -> Result<StoreKind, String> {
        match s {
            "redis" => Ok(StoreKind::Redis),
            "mysql" => Ok(StoreKind::Mysql),
            "postgres" => Ok(StoreKind::Postgres),
            "sqlite" => Ok(StoreKind::Sqlite),
            other => Err(format!(
                "--store {other:?}: expected redis, mysql, postgres or sqlite"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Redis => "redis",
            StoreKind::Mysql => "mysql",
            StoreKind::Postgres => "postgres",
            StoreKind::Sqlite => "sqlite",
        }
    }
}

/// The SQL server of the suite, kept alive while it runs (stopped on
/// drop), and its URL. `None` for the Redis store.
pub struct SqlServer {
    pub url: String,
    _keep: Box<dyn std::any::Any>,
}

impl SqlServer {
    pub fn start(kind: StoreKind, dir: &Path) -> Result<Option<SqlServer>, BoxError> {
        let started = std::panic::catch_unwind(|| match kind {
            StoreKind::Redis => None,
            StoreKind::Mysql => {
                let s = crate::mariadb::MariaDbServer::start();
                Some(SqlServer {
                    url: s.url(),
                    _keep: Box::new(s),
                })
            }
            StoreKind::Postgres => {
                let s = crate::postgres::PgServer::start();
                Some(SqlServer {
                    url: s.url(),
                    _keep: Box::new(s),
                })
            }
            StoreKind::Sqlite => Some(SqlServer {
                url: format!("sqlite://{}", dir.join("fenced.sqlite").display()),
                _keep: Box::new(()),
            }),
        });
        started.map_err(|_| format!("could not start the {} store (see above)", kind.name()).into())
    }
}

/// Where one run's fenced writes go: the kind, its URL (`redis` for the
/// data node) and the run's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreSpec {
    pub kind: StoreKind,
    pub url: String,
    pub table: String,
}

impl StoreSpec {
    /// `kind|url|table`, for a worker process's arguments.
    pub fn to_arg(&self) -> String {
        format!("{}|{}|{}", self.kind.name(), self.url, self.table)
    }

    pub fn parse(arg: &str) -> Result<StoreSpec, String> {
        let mut parts = arg.splitn(3, '|');
        let (Some(kind), Some(url), Some(table)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("worker: bad store={arg}"));
        };
        Ok(StoreSpec {
            kind: StoreKind::parse(kind)?,
            url: url.to_owned(),
            table: table.to_owned(),
        })
    }
}

/// A worker's connection to the store.
pub enum DataStore {
    Redis {
        store: redfence::FencedStore<MultiplexedConnection>,
        conn: MultiplexedConnection,
    },
    Mysql(sqlx::MySqlPool, redfence::sqlx::mysql::FencedStore),
    Postgres(sqlx::PgPool, redfence::sqlx::postgres::FencedStore),
    Sqlite(sqlx::SqlitePool, redfence::sqlx::sqlite::FencedStore),
}

impl DataStore {
    /// Connects to `spec`; `redis` is the data node's connection `conn`.
    pub async fn connect(
        spec: &StoreSpec,
        conn: MultiplexedConnection,
    ) -> Result<DataStore, BoxError> {
        let timeout = SQL_TIMEOUT;
        Ok(match spec.kind {
            StoreKind::Redis => DataStore::Redis {
                store: redfence::FencedStore::new(conn.clone()).timeout(timeout),
                conn,
            },
            StoreKind::Mysql => DataStore::Mysql(
                sqlx::mysql::MySqlPoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect(&spec.url)
                    .await?,
                redfence::sqlx::mysql::FencedStore::new(&spec.table)?.timeout(timeout),
            ),
            StoreKind::Postgres => DataStore::Postgres(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect(&spec.url)
                    .await?,
                redfence::sqlx::postgres::FencedStore::new(&spec.table)?.timeout(timeout),
            ),
            StoreKind::Sqlite => DataStore::Sqlite(
                sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect_with(sqlite_options(&spec.url)?)
                    .await?,
                redfence::sqlx::sqlite::FencedStore::new(&spec.table)?.timeout(timeout),
            ),
        })
    }

    /// Creates the run's table (the parent, before the workers start).
    pub async fn create(spec: &StoreSpec) -> Result<(), BoxError> {
        match spec.kind {
            StoreKind::Redis => {}
            StoreKind::Mysql => {
                let pool = sqlx::MySqlPool::connect(&spec.url).await?;
                redfence::sqlx::mysql::FencedStore::new(&spec.table)?
                    .create_table(&pool)
                    .await?;
            }
            StoreKind::Postgres => {
                let pool = sqlx::PgPool::connect(&spec.url).await?;
                redfence::sqlx::postgres::FencedStore::new(&spec.table)?
                    .create_table(&pool)
                    .await?;
            }
            StoreKind::Sqlite => {
                let pool = sqlx::SqlitePool::connect_with(sqlite_options(&spec.url)?).await?;
                redfence::sqlx::sqlite::FencedStore::new(&spec.table)?
                    .create_table(&pool)
                    .await?;
            }
        }
        Ok(())
    }

    /// The lease's write to `key`: fenced with `token`, or (fencing off)
    /// the plain write an application without tokens makes.
    pub async fn write(
        &mut self,
        key: &str,
        lease: u64,
        token: Option<FencingToken>,
    ) -> WriteOutcome {
        let value = lease.to_string();
        let fenced = match (self, token) {
            (DataStore::Redis { store, .. }, Some(token)) => store.write(key, value, token).await,
            (DataStore::Redis { conn, .. }, None) => {
                let set: Result<redis::RedisResult<()>, _> =
                    tokio::time::timeout(SQL_TIMEOUT, conn.set(key, lease)).await;
                return match set {
                    Ok(Ok(())) => WriteOutcome::Accepted,
                    _ => WriteOutcome::Error,
                };
            }
            (DataStore::Mysql(pool, store), Some(token)) => {
                store.write(&*pool, key, value.as_bytes(), token).await
            }
            (DataStore::Postgres(pool, store), Some(token)) => {
                store.write(&*pool, key, value.as_bytes(), token).await
            }
            (DataStore::Sqlite(pool, store), Some(token)) => {
                store.write(&*pool, key, value.as_bytes(), token).await
            }
            (DataStore::Mysql(pool, store), None) => {
                let sql = format!(
                    "INSERT INTO {} (id, value, fence) VALUES (?, ?, 0) \
                     ON DUPLICATE KEY UPDATE value = VALUES(value)",
                    store.table()
                );
                return plain(
                    sqlx::query(&sql)
                        .bind(key)
                        .bind(value.into_bytes())
                        .execute(&*pool),
                )
                .await;
            }
            (DataStore::Postgres(pool, store), None) => {
                let sql = format!(
                    "INSERT INTO {} (id, value, fence) VALUES ($1, $2, 0) \
                     ON CONFLICT (id) DO UPDATE SET value = EXCLUDED.value",
                    store.table()
                );
                return plain(
                    sqlx::query(&sql)
                        .bind(key)
                        .bind(value.into_bytes())
                        .execute(&*pool),
                )
                .await;
            }
            (DataStore::Sqlite(pool, store), None) => {
                let sql = format!(
                    "INSERT INTO {} (id, value, fence) VALUES (?1, ?2, 0) \
                     ON CONFLICT (id) DO UPDATE SET value = excluded.value",
                    store.table()
                );
                return plain(
                    sqlx::query(&sql)
                        .bind(key)
                        .bind(value.into_bytes())
                        .execute(&*pool),
                )
                .await;
            }
        };
        match fenced {
            Ok(()) => WriteOutcome::Accepted,
            Err(e) if e.is_stale() => WriteOutcome::Rejected,
            Err(_) => WriteOutcome::Error,
        }
    }
}

async fn plain<T>(
    write: impl std::future::Future<Output = Result<T, sqlx::Error>>,
) -> WriteOutcome {
    match tokio::time::timeout(SQL_TIMEOUT, write).await {
        Ok(Ok(_)) => WriteOutcome::Accepted,
        _ => WriteOutcome::Error,
    }
}

/// Several processes share the file: WAL, and a busy timeout above the
/// write's bound so that a wait ends as the store's timeout.
fn sqlite_options(url: &str) -> Result<sqlx::sqlite::SqliteConnectOptions, BoxError> {
    let path = url.strip_prefix("sqlite://").ok_or("not a sqlite:// URL")?;
    Ok(sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(2)))
}
