//! The sqlx fenced store and fenced table on SQLite (feature
//! `sqlx-sqlite`).
//!
//! Where SQLite differs (DESIGN.md, "Fenced writes through sqlx"): there
//! are no row locks but one writer for the whole database file. A fenced
//! write inside a transaction takes the write lock, held until the commit;
//! another connection's fenced write waits for it (sqlx's `busy_timeout`,
//! 5 s by default) and then sees the committed fence, so the row's history
//! is in token order, as with PostgreSQL's row lock (but every writer
//! waits, not only those on the same row). Start a transaction that writes
//! with its fenced write, or with `BEGIN IMMEDIATE`: a deferred
//! transaction that read before another connection committed cannot write
//! on its old snapshot; in WAL mode its write fails at once with
//! `SQLITE_BUSY_SNAPSHOT` (no waiting), a
//! [`StatementError`](super::StatementError) to retry like a serialization
//! failure.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::SqlitePool, guard: redfence::LockGuard)
//! # -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use redfence::sqlx::sqlite::FencedStore;
//!
//! let store = FencedStore::new("fenced")?;
//! store.create_table(&pool).await?;
//! let token = guard.token().expect("fencing is on by default");
//! match store.write(&pool, "member:42", b"active", token).await {
//!     Ok(()) => {}
//!     Err(e) if e.is_stale() => { /* our lease ran out */ }
//!     Err(e) => return Err(e.into()),
//! }
//! # Ok(()) }
//! ```
//!
//! The DDL [`FencedStore::create_table`] runs:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS <table> (
//!     id TEXT PRIMARY KEY NOT NULL, value BLOB NOT NULL,
//!     fence INTEGER NOT NULL CHECK (fence >= 0))
//! ```
//!
//! and for a table of yours: `ALTER TABLE orders ADD COLUMN fence INTEGER
//! NOT NULL DEFAULT 0` (SQLite's integers are 64-bit).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ::sqlx::sqlite::{Sqlite, SqliteArguments};
use ::sqlx::{Acquire, Arguments, Encode, Type};
use tracing::field::Empty;

use super::{
    bind_failed, failed, refusal, Inserted, Placeholder, SchemaError, Statement, TableSql,
};
use crate::logic::fence::FencingToken;
use crate::logic::limits::DEFAULT_STORE_TIMEOUT;
use crate::store::sql::{self, bounded, from_bigint, to_bigint, Dialect, InvalidName};
use crate::store::{traced, Fenced, StaleToken, StoreError};

/// A fenced key-value table of the crate's own (`id TEXT`, `value BLOB`,
/// `fence INTEGER`). Holds no connection; cheap to clone.
#[derive(Debug, Clone)]
pub struct FencedStore {
    table: Arc<str>,
    sql: Arc<StoreSql>,
    timeout: Duration,
}

#[derive(Debug)]
struct StoreSql {
    create: String,
    write: String,
    read: String,
}

impl FencedStore {
    /// A store on `table` (`name` or `schema.name`, an attached database).
    /// Checks the name only.
    pub fn new(table: &str) -> Result<Self, InvalidName> {
        let t = sql::quote_table(table, Dialect::Sqlite)?;
        Ok(Self {
            table: table.into(),
            sql: Arc::new(StoreSql {
                create: format!(
                    "CREATE TABLE IF NOT EXISTS {t} (id TEXT PRIMARY KEY NOT NULL, \
                     value BLOB NOT NULL, fence INTEGER NOT NULL CHECK (fence >= 0))"
                ),
                // As on PostgreSQL: a stale write takes the update branch but
                // keeps the row, and RETURNING (SQLite 3.35; sqlx bundles a
                // newer one) reports the refusing fence. The SET expressions
                // all see the old row.
                write: format!(
                    "INSERT INTO {t} (id, value, fence) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (id) DO UPDATE SET \
                     value = CASE WHEN fence <= excluded.fence \
                     THEN excluded.value ELSE value END, \
                     fence = MAX(fence, excluded.fence) \
                     RETURNING fence"
                ),
                read: format!("SELECT value, fence FROM {t} WHERE id = ?1"),
            }),
            timeout: DEFAULT_STORE_TIMEOUT,
        })
    }

    /// Bounds each call (1 s by default; zero is raised to 1 ms).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The table name, as given.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Creates the table unless it exists. Run it once at startup.
    pub async fn create_table<'c, A>(&self, db: A) -> Result<(), StoreError>
    where
        A: Acquire<'c, Database = Sqlite> + Send,
    {
        let work = async {
            let mut conn = db
                .acquire()
                .await
                .map_err(failed(Statement::Acquire, &self.table))?;
            ::sqlx::query(&self.sql.create)
                .execute(&mut *conn)
                .await
                .map_err(failed(Statement::CreateTable, &self.table))?;
            Ok(())
        };
        bounded(self.timeout, work).await?
    }

    /// Stores `value` under `id` if `token` is at least the largest token
    /// `id` has accepted (or `id` is new); otherwise fails with
    /// [`StoreError::Stale`], changing nothing.
    pub async fn write<'c, A>(
        &self,
        db: A,
        id: &str,
        value: &[u8],
        token: FencingToken,
    ) -> Result<(), StoreError>
    where
        A: Acquire<'c, Database = Sqlite> + Send,
    {
        let span = tracing::debug_span!(
            "fenced_write",
            key = id,
            token = token.get(),
            outcome = Empty,
            elapsed = Empty
        );
        let work = async {
            let fence = to_bigint(token)?;
            let mut conn = db
                .acquire()
                .await
                .map_err(failed(Statement::Acquire, &self.table))?;
            let current: i64 = ::sqlx::query_scalar(&self.sql.write)
                .bind(id)
                .bind(value)
                .bind(fence)
                .fetch_one(&mut *conn)
                .await
                .map_err(failed(Statement::Write, &self.table))?;
            let current = from_bigint(current, id)?;
            if current == token {
                return Ok(());
            }
            Err(StaleToken {
                key: id.to_owned(),
                presented: token,
                current,
            }
            .into())
        };
        traced(span, async { bounded(self.timeout, work).await? }).await
    }

    /// The value under `id` and the token that wrote it.
    pub async fn read<'c, A>(&self, db: A, id: &str) -> Result<Option<Fenced<Vec<u8>>>, StoreError>
    where
        A: Acquire<'c, Database = Sqlite> + Send,
    {
        let work = async {
            let mut conn = db
                .acquire()
                .await
                .map_err(failed(Statement::Acquire, &self.table))?;
            let row: Option<(Vec<u8>, i64)> = ::sqlx::query_as(&self.sql.read)
                .bind(id)
                .fetch_optional(&mut *conn)
                .await
                .map_err(failed(Statement::Read, &self.table))?;
            row.map(|(value, fence)| {
                Ok(Fenced {
                    value,
                    token: from_bigint(fence, id)?,
                })
            })
            .transpose()
        };
        bounded(self.timeout, work).await?
    }
}

/// The fencing check on a table of yours with a key column (the primary key
/// or another unique column) and an `INTEGER` fence column. Cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct FencedTable {
    table: Arc<str>,
    fence_column: Arc<str>,
    sql: Arc<TableSql>,
    timeout: Duration,
}

impl FencedTable {
    /// The table `table` (`name` or `schema.name`), keyed by `key_column`,
    /// with its largest accepted token in `fence_column`.
    pub fn new(table: &str, key_column: &str, fence_column: &str) -> Result<Self, InvalidName> {
        Ok(Self {
            table: table.into(),
            fence_column: fence_column.into(),
            sql: Arc::new(TableSql {
                table: sql::quote_table(table, Dialect::Sqlite)?,
                key: sql::quote_column(key_column, Dialect::Sqlite)?,
                fence: sql::quote_column(fence_column, Dialect::Sqlite)?,
                placeholder: Placeholder::Numbered,
            }),
            timeout: DEFAULT_STORE_TIMEOUT,
        })
    }

    /// Bounds each call, all its statements together (1 s by default; zero
    /// is raised to 1 ms).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Checks at setup that the fence column exists with integer affinity
    /// (a declared type containing `INT`: a 64-bit integer); anything else fails with
    /// [`StoreError::Backend`] holding a [`SchemaError`].
    pub async fn check_schema<'c, A>(&self, db: A) -> Result<(), StoreError>
    where
        A: Acquire<'c, Database = Sqlite> + Send,
    {
        let work = async {
            let mut conn = db
                .acquire()
                .await
                .map_err(failed(Statement::Acquire, &self.table))?;
            let (schema, table) = match self.table.split_once('.') {
                Some((schema, table)) => (schema, table),
                None => ("main", &*self.table),
            };
            let found: Option<String> = ::sqlx::query_scalar(
                "SELECT type FROM pragma_table_info(?1, ?2) WHERE name = ?3 COLLATE NOCASE",
            )
            .bind(table)
            .bind(schema)
            .bind(&*self.fence_column)
            .fetch_optional(&mut *conn)
            .await
            .map_err(failed(Statement::CheckSchema, &self.table))?;
            check_type(&self.table, &self.fence_column, found)
        };
        bounded(self.timeout, work).await?
    }

    /// Runs `UPDATE table SET <set>, fence = <token> WHERE key = <key> AND
    /// (fence IS NULL OR fence <= <token>)`. `set` is your assignment list
    /// with placeholders `?1`..`?n` (or `?`) bound to `args` (SQL text: never build
    /// it from untrusted input); it may be empty to only record the token.
    ///
    /// Returns the number of rows updated: 1, or 0 when no row has the key.
    /// A row with a larger fence fails with [`StoreError::Stale`] carrying
    /// it, having changed nothing.
    pub async fn update<'c, 'q, A, K>(
        &self,
        db: A,
        key: K,
        set: &str,
        args: SqliteArguments<'q>,
        token: FencingToken,
    ) -> Result<u64, StoreError>
    where
        A: Acquire<'c, Database = Sqlite> + Send,
        K: for<'e> Encode<'e, Sqlite> + Type<Sqlite> + Clone + fmt::Display + Send,
    {
        let span = tracing::debug_span!(
            "fenced_update",
            table = %self.table,
            key = %key,
            token = token.get(),
            outcome = Empty,
            elapsed = Empty
        );
        let work = async {
            let fence = to_bigint(token)?;
            let mut args = args;
            let update = self.sql.update(set, args.len());
            args.add(fence).map_err(|e| bind_failed(&self.table, e))?;
            args.add(key.clone())
                .map_err(|e| bind_failed(&self.table, e))?;
            let mut conn = db
                .acquire()
                .await
                .map_err(failed(Statement::Acquire, &self.table))?;
            let updated = ::sqlx::query_with(&update, args)
                .execute(&mut *conn)
                .await
                .map_err(failed(Statement::Update, &self.table))?
                .rows_affected();
            if updated > 0 {
                return Ok(updated);
            }
            let current = self.lookup(&mut conn, key.clone()).await?;
            refusal(key.to_string(), token, current)?;
            Ok(0)
        };
        traced(span, async { bounded(self.timeout, work).await? }).await
    }

    /// Inserts a row with `key`, the token as its fence, and your `columns`
    /// (a comma-separated list, possibly empty) bound to `args`; the key
    /// column needs a unique index. When a row with `key` is there instead,
    /// records the token on it (`fence = token`, nothing else changed) and
    /// returns [`Inserted::Existing`], or fails with [`StoreError::Stale`]
    /// when its fence is larger, changing nothing.
    pub async fn insert_if_absent<'c, 'q, A, K>(
        &self,
        db: A,
        key: K,
        columns: &str,
        args: SqliteArguments<'q>,
        token: FencingToken,
    ) -> Result<Inserted, StoreError>
    where
        A: Acquire<'c, Database = Sqlite> + Send,
        K: for<'e> Encode<'e, Sqlite> + Type<Sqlite> + Clone + fmt::Display + Send,
    {
        let span = tracing::debug_span!(
            "fenced_insert",
            table = %self.table,
            key = %key,
            token = token.get(),
            outcome = Empty,
            elapsed = Empty
        );
        let work = async {
            let fence = to_bigint(token)?;
            let mut args = args;
            let suffix = format!(" ON CONFLICT ({}) DO NOTHING", self.sql.key);
            let insert = self.sql.insert(columns, args.len(), &suffix);
            args.add(key.clone())
                .map_err(|e| bind_failed(&self.table, e))?;
            args.add(fence).map_err(|e| bind_failed(&self.table, e))?;
            let mut conn = db
                .acquire()
                .await
                .map_err(failed(Statement::Acquire, &self.table))?;
            let inserted = ::sqlx::query_with(&insert, args)
                .execute(&mut *conn)
                .await
                .map_err(failed(Statement::Insert, &self.table))?
                .rows_affected();
            if inserted > 0 {
                return Ok(Inserted::New);
            }
            let updated = ::sqlx::query(&self.sql.update("", 0))
                .bind(fence)
                .bind(key.clone())
                .execute(&mut *conn)
                .await
                .map_err(failed(Statement::Update, &self.table))?
                .rows_affected();
            if updated > 0 {
                return Ok(Inserted::Existing);
            }
            let current = self.lookup(&mut conn, key.clone()).await?;
            refusal(key.to_string(), token, current)?;
            Err(StoreError::backend(super::Vanished {
                table: self.table.to_string(),
                key: key.to_string(),
            }))
        };
        traced(span, async { bounded(self.timeout, work).await? }).await
    }

    /// The largest fence among the rows with `key`.
    async fn lookup<K>(
        &self,
        conn: &mut ::sqlx::SqliteConnection,
        key: K,
    ) -> Result<Option<FencingToken>, StoreError>
    where
        K: for<'e> Encode<'e, Sqlite> + Type<Sqlite> + fmt::Display + Send,
    {
        let name = key.to_string();
        let fences: Vec<Option<i64>> = ::sqlx::query_scalar(&self.sql.fence_lookup(""))
            .bind(key)
            .fetch_all(conn)
            .await
            .map_err(failed(Statement::FenceLookup, &self.table))?;
        let mut current = None;
        for fence in fences.into_iter().flatten() {
            current = current.max(Some(from_bigint(fence, &name)?));
        }
        Ok(current)
    }
}

/// Integer affinity only (the declared type contains `INT`): stored as
/// 64-bit integers. `REAL`, `NUMERIC`, `TEXT` or no type would keep a token
/// as something else.
fn check_type(table: &str, column: &str, found: Option<String>) -> Result<(), StoreError> {
    match found {
        None => Err(StoreError::backend(SchemaError::NoSuchColumn {
            table: table.to_owned(),
            column: column.to_owned(),
        })),
        Some(t) if t.to_ascii_uppercase().contains("INT") => Ok(()),
        Some(found) => Err(StoreError::backend(SchemaError::NarrowFence {
            table: table.to_owned(),
            column: column.to_owned(),
            found,
        })),
    }
}
