//! The sqlx fenced store and fenced table on PostgreSQL (feature
//! `sqlx-postgres`). The rule, the row-lock argument and the recipe are
//! those of [`crate::postgres`] (tokio-postgres); only the driver differs.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool, guard: redfence::LockGuard)
//! # -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use redfence::sqlx::postgres::FencedTable;
//! use sqlx::postgres::PgArguments;
//! use sqlx::Arguments;
//!
//! // CREATE TABLE orders (id bigint PRIMARY KEY, status text, fence bigint NOT NULL DEFAULT 0)
//! let orders = FencedTable::new("orders", "id", "fence")?;
//! orders.check_schema(&pool).await?; // refuses a fence column narrower than bigint
//! let token = guard.token().expect("fencing is on by default");
//! let mut tx = pool.begin().await?;
//! let mut args = PgArguments::default();
//! args.add("paid")?;
//! match orders.update(&mut *tx, 42_i64, "status = $1", args, token).await {
//!     Ok(1) => {}
//!     Ok(_) => return Err("no order 42".into()),
//!     Err(e) if e.is_stale() => return Ok(()), // `tx` rolls back on drop
//!     Err(e) => return Err(e.into()),
//! }
//! sqlx::query("INSERT INTO receipts (order_id) VALUES ($1)").bind(42_i64).execute(&mut *tx).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```
//!
//! The DDL [`FencedStore::create_table`] runs:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS <table> (
//!     id text PRIMARY KEY, value bytea NOT NULL, fence bigint NOT NULL CHECK (fence >= 0))
//! ```
//!
//! and for a table of yours: `ALTER TABLE orders ADD COLUMN fence bigint
//! NOT NULL DEFAULT 0` (a `NULL` fence also counts as never written).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ::sqlx::postgres::{PgArguments, Postgres};
use ::sqlx::{Acquire, Arguments, Encode, Type};
use tracing::field::Empty;

use super::{
    bind_failed, failed, refusal, Inserted, Placeholder, SchemaError, Statement, TableSql,
};
use crate::logic::fence::FencingToken;
use crate::logic::limits::DEFAULT_STORE_TIMEOUT;
use crate::store::sql::{self, bounded, from_bigint, to_bigint, Dialect, InvalidName};
use crate::store::{traced, Fenced, StaleToken, StoreError};

/// A fenced key-value table of the crate's own (`id text`, `value bytea`,
/// `fence bigint`): the sqlx counterpart of
/// [`PgFencedStore`](crate::postgres::PgFencedStore). Holds no connection;
/// cheap to clone.
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
    /// A store on `table` (`name` or `schema.name`, folded to lowercase as
    /// unquoted names are). Checks the name only.
    pub fn new(table: &str) -> Result<Self, InvalidName> {
        let t = sql::quote_table(table, Dialect::Postgres)?;
        Ok(Self {
            table: table.into(),
            sql: Arc::new(StoreSql {
                create: format!(
                    "CREATE TABLE IF NOT EXISTS {t} (id text PRIMARY KEY, value bytea NOT NULL, \
                     fence bigint NOT NULL CHECK (fence >= 0))"
                ),
                // As in `crate::postgres`: a stale write takes the update
                // branch but keeps the row, and returns the refusing fence
                // from the same atomic step.
                write: format!(
                    "INSERT INTO {t} AS cur (id, value, fence) VALUES ($1, $2, $3) \
                     ON CONFLICT (id) DO UPDATE SET \
                     value = CASE WHEN cur.fence <= EXCLUDED.fence \
                     THEN EXCLUDED.value ELSE cur.value END, \
                     fence = GREATEST(cur.fence, EXCLUDED.fence) \
                     RETURNING cur.fence"
                ),
                read: format!("SELECT value, fence FROM {t} WHERE id = $1"),
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
        A: Acquire<'c, Database = Postgres> + Send,
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
        A: Acquire<'c, Database = Postgres> + Send,
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
        A: Acquire<'c, Database = Postgres> + Send,
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
/// or another unique column) and a `bigint` fence column. Cheap to clone.
#[derive(Debug, Clone)]
pub struct FencedTable {
    table: Arc<str>,
    fence_column: Arc<str>,
    sql: Arc<TableSql>,
    timeout: Duration,
}

impl FencedTable {
    /// The table `table` (`name` or `schema.name`), keyed by `key_column`,
    /// with its largest accepted token in `fence_column`. Names are folded
    /// to lowercase, as unquoted names are.
    pub fn new(table: &str, key_column: &str, fence_column: &str) -> Result<Self, InvalidName> {
        Ok(Self {
            table: table.into(),
            fence_column: fence_column.to_ascii_lowercase().into(),
            sql: Arc::new(TableSql {
                table: sql::quote_table(table, Dialect::Postgres)?,
                key: sql::quote_column(key_column, Dialect::Postgres)?,
                fence: sql::quote_column(fence_column, Dialect::Postgres)?,
                placeholder: Placeholder::Dollar,
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

    /// Checks at setup that the fence column exists and is a `bigint`,
    /// which holds every token exactly; anything else fails with
    /// [`StoreError::Backend`] holding a [`SchemaError`].
    pub async fn check_schema<'c, A>(&self, db: A) -> Result<(), StoreError>
    where
        A: Acquire<'c, Database = Postgres> + Send,
    {
        let work = async {
            let mut conn = db
                .acquire()
                .await
                .map_err(failed(Statement::Acquire, &self.table))?;
            let found: Option<String> = ::sqlx::query_scalar(
                "SELECT format_type(atttypid, atttypmod) FROM pg_attribute \
                 WHERE attrelid = to_regclass($1) AND attname = $2 AND attnum > 0 \
                 AND NOT attisdropped",
            )
            .bind(&self.sql.table)
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
    /// with placeholders `$1`..`$n` bound to `args` (SQL text: never build
    /// it from untrusted input); it may be empty to only record the token.
    ///
    /// Returns the number of rows updated: 1, or 0 when no row has the key.
    /// A row with a larger fence fails with [`StoreError::Stale`] carrying
    /// it, having changed nothing.
    pub async fn update<'c, A, K>(
        &self,
        db: A,
        key: K,
        set: &str,
        args: PgArguments,
        token: FencingToken,
    ) -> Result<u64, StoreError>
    where
        A: Acquire<'c, Database = Postgres> + Send,
        K: for<'e> Encode<'e, Postgres> + Type<Postgres> + Clone + fmt::Display + Send,
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
    pub async fn insert_if_absent<'c, A, K>(
        &self,
        db: A,
        key: K,
        columns: &str,
        args: PgArguments,
        token: FencingToken,
    ) -> Result<Inserted, StoreError>
    where
        A: Acquire<'c, Database = Postgres> + Send,
        K: for<'e> Encode<'e, Postgres> + Type<Postgres> + Clone + fmt::Display + Send,
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
        conn: &mut ::sqlx::PgConnection,
        key: K,
    ) -> Result<Option<FencingToken>, StoreError>
    where
        K: for<'e> Encode<'e, Postgres> + Type<Postgres> + fmt::Display + Send,
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

/// `bigint` (`int8`) only: `integer` stops at 2^31, `numeric` and
/// `double precision` are not what the binds send.
fn check_type(table: &str, column: &str, found: Option<String>) -> Result<(), StoreError> {
    match found {
        None => Err(StoreError::backend(SchemaError::NoSuchColumn {
            table: table.to_owned(),
            column: column.to_owned(),
        })),
        Some(t) if t == "bigint" => Ok(()),
        Some(found) => Err(StoreError::backend(SchemaError::NarrowFence {
            table: table.to_owned(),
            column: column.to_owned(),
            found,
        })),
    }
}
