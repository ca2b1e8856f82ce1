//! The sqlx fenced store and fenced table on MySQL and MariaDB (feature
//! `sqlx-mysql`), InnoDB tables.
//!
//! Where MySQL differs from PostgreSQL (DESIGN.md, "Fenced writes through
//! sqlx"):
//! - **Affected rows.** MySQL counts only the rows an `UPDATE` changed,
//!   unless the client asks for found rows (`CLIENT_FOUND_ROWS`). sqlx
//!   always asks, so an accepted update that writes the values the row
//!   already had (the same holder writing again) counts as 1, not 0; the
//!   `update` result is the number of rows *matched*.
//! - **No `RETURNING`.** The store's upsert reports the row's fence through
//!   `LAST_INSERT_ID(expr)`, in the same statement's reply: one round trip,
//!   and the refusing fence comes from the same atomic step.
//! - **Snapshots.** Under InnoDB's default `REPEATABLE READ`, a plain
//!   `SELECT` reads the transaction's snapshot; the fence lookup after a
//!   refused update is `SELECT ... FOR UPDATE`, which reads the newest
//!   committed fence.
//! - **Gap locks.** `insert_if_absent` inserts first (a plain `INSERT`; a
//!   duplicate is error 1062, which rolls back that statement only) and
//!   then records the token with the fenced `UPDATE`. In explicit
//!   `REPEATABLE READ` transactions, two inserters of the same absent key
//!   can deadlock on InnoDB's gap and insert-intention locks: InnoDB rolls
//!   one transaction back (error 1213, a [`StatementError`](super::StatementError)):
//!   retry it, as with any deadlock.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::MySqlPool, guard: redfence::LockGuard)
//! # -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use redfence::sqlx::mysql::FencedTable;
//! use redfence::sqlx::Inserted;
//! use sqlx::mysql::MySqlArguments;
//! use sqlx::Arguments;
//!
//! // CREATE TABLE memberships (erp_id VARCHAR(64) PRIMARY KEY, level TEXT,
//! //                           fence BIGINT NOT NULL DEFAULT 0)
//! let memberships = FencedTable::new("memberships", "erp_id", "fence")?;
//! memberships.check_schema(&pool).await?;
//! let token = guard.token().expect("fencing is on by default");
//! let mut args = MySqlArguments::default();
//! args.add("gold")?;
//! match memberships.insert_if_absent(&pool, "E-1001", "level", args, token).await {
//!     Ok(Inserted::New) => println!("created"),
//!     Ok(Inserted::Existing) => println!("already a member"),
//!     Err(e) if e.is_stale() => println!("our lease ran out: refused"),
//!     Err(e) => return Err(e.into()),
//! }
//! # Ok(()) }
//! ```
//!
//! The DDL [`FencedStore::create_table`] runs:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS <table> (
//!     id VARCHAR(255) NOT NULL PRIMARY KEY, value LONGBLOB NOT NULL,
//!     fence BIGINT NOT NULL CHECK (fence >= 0)) ENGINE=InnoDB
//! ```
//!
//! and for a table of yours: `ALTER TABLE orders ADD COLUMN fence BIGINT
//! NOT NULL DEFAULT 0`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ::sqlx::mysql::{MySql, MySqlArguments};
use ::sqlx::{Acquire, Arguments, Encode, Type};
use tracing::field::Empty;

use super::{
    bind_failed, failed, refusal, Inserted, Placeholder, SchemaError, Statement, TableSql,
};
use crate::logic::fence::FencingToken;
use crate::logic::limits::DEFAULT_STORE_TIMEOUT;
use crate::store::sql::{self, bounded, from_bigint, to_bigint, Dialect, InvalidName};
use crate::store::{traced, Fenced, StaleToken, StoreError};

/// A fenced key-value table of the crate's own (`id VARCHAR(255)`, `value
/// LONGBLOB`, `fence BIGINT`), InnoDB. Holds no connection; cheap to
/// clone.
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
    /// A store on `table` (`name` or `database.name`, case kept as given).
    /// Checks the name only.
    pub fn new(table: &str) -> Result<Self, InvalidName> {
        let t = sql::quote_table(table, Dialect::MySql)?;
        Ok(Self {
            table: table.into(),
            sql: Arc::new(StoreSql {
                create: format!(
                    "CREATE TABLE IF NOT EXISTS {t} (id VARCHAR(255) NOT NULL PRIMARY KEY, \
                     value LONGBLOB NOT NULL, fence BIGINT NOT NULL CHECK (fence >= 0)) \
                     ENGINE=InnoDB"
                ),
                // One statement, no RETURNING: the row's fence after it
                // comes back as the reply's last-insert id, set by
                // LAST_INSERT_ID(expr) on the update branch (0 on the insert
                // branch: the table has no AUTO_INCREMENT). MySQL assigns
                // left to right, so `value` is decided on the old fence.
                // VALUES() is deprecated in MySQL 8.0.20 (still there) and
                // the only spelling MariaDB has.
                write: format!(
                    "INSERT INTO {t} (id, value, fence) VALUES (?, ?, ?) \
                     ON DUPLICATE KEY UPDATE \
                     value = IF(fence <= VALUES(fence), VALUES(value), value), \
                     fence = LAST_INSERT_ID(GREATEST(fence, VALUES(fence)))"
                ),
                read: format!("SELECT value, fence FROM {t} WHERE id = ?"),
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
        A: Acquire<'c, Database = MySql> + Send,
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
        A: Acquire<'c, Database = MySql> + Send,
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
            let done = ::sqlx::query(&self.sql.write)
                .bind(id)
                .bind(value)
                .bind(fence)
                .execute(&mut *conn)
                .await
                .map_err(failed(Statement::Write, &self.table))?;
            // Inserted: one row and no id. Updated (or refused): the
            // row's fence, through LAST_INSERT_ID(expr).
            let current = match (done.rows_affected(), done.last_insert_id()) {
                (1, 0) => token,
                (_, fence) => FencingToken::new(fence),
            };
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
        A: Acquire<'c, Database = MySql> + Send,
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
/// or another unique column) and a `BIGINT` fence column. Cheap to clone.
#[derive(Debug, Clone)]
pub struct FencedTable {
    table: Arc<str>,
    fence_column: Arc<str>,
    sql: Arc<TableSql>,
    timeout: Duration,
}

impl FencedTable {
    /// The table `table` (`name` or `database.name`), keyed by
    /// `key_column`, with its largest accepted token in `fence_column`.
    /// Names are kept as given.
    pub fn new(table: &str, key_column: &str, fence_column: &str) -> Result<Self, InvalidName> {
        Ok(Self {
            table: table.into(),
            fence_column: fence_column.into(),
            sql: Arc::new(TableSql {
                table: sql::quote_table(table, Dialect::MySql)?,
                key: sql::quote_column(key_column, Dialect::MySql)?,
                fence: sql::quote_column(fence_column, Dialect::MySql)?,
                placeholder: Placeholder::Positional,
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

    /// Checks at setup that the fence column exists and is a `BIGINT`
    /// (signed or not),
    /// which holds every token exactly; anything else fails with
    /// [`StoreError::Backend`] holding a [`SchemaError`].
    pub async fn check_schema<'c, A>(&self, db: A) -> Result<(), StoreError>
    where
        A: Acquire<'c, Database = MySql> + Send,
    {
        let work = async {
            let mut conn = db
                .acquire()
                .await
                .map_err(failed(Statement::Acquire, &self.table))?;
            let (schema, table) = match self.table.split_once('.') {
                Some((schema, table)) => (Some(schema), table),
                None => (None, &*self.table),
            };
            let found: Option<String> = ::sqlx::query_scalar(
                "SELECT CAST(DATA_TYPE AS CHAR) FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? \
                 AND COLUMN_NAME = ?",
            )
            .bind(schema)
            .bind(table)
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
    /// with `?` placeholders bound to `args` in order (SQL text: never build
    /// it from untrusted input); it may be empty to only record the token.
    ///
    /// Returns the number of rows matched (sqlx asks MySQL for found rows):
    /// 1, also when the values were already there, or 0 when no row has
    /// the key.
    /// A row with a larger fence fails with [`StoreError::Stale`] carrying
    /// it, having changed nothing.
    pub async fn update<'c, A, K>(
        &self,
        db: A,
        key: K,
        set: &str,
        args: MySqlArguments,
        token: FencingToken,
    ) -> Result<u64, StoreError>
    where
        A: Acquire<'c, Database = MySql> + Send,
        K: for<'e> Encode<'e, MySql> + Type<MySql> + Clone + fmt::Display + Send,
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
            // `?` binds in order: the token again, for the WHERE.
            args.add(fence).map_err(|e| bind_failed(&self.table, e))?;
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
        args: MySqlArguments,
        token: FencingToken,
    ) -> Result<Inserted, StoreError>
    where
        A: Acquire<'c, Database = MySql> + Send,
        K: for<'e> Encode<'e, MySql> + Type<MySql> + Clone + fmt::Display + Send,
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
            let insert = self.sql.insert(columns, args.len(), "");
            args.add(key.clone())
                .map_err(|e| bind_failed(&self.table, e))?;
            args.add(fence).map_err(|e| bind_failed(&self.table, e))?;
            let mut conn = db
                .acquire()
                .await
                .map_err(failed(Statement::Acquire, &self.table))?;
            // A plain INSERT: with found rows, `ON DUPLICATE KEY UPDATE`
            // reports 1 for both an insert and an unchanged duplicate, and
            // `INSERT IGNORE` would also turn data errors into warnings. A
            // duplicate (1062) rolls back this statement only, also inside a
            // transaction.
            match ::sqlx::query_with(&insert, args).execute(&mut *conn).await {
                Ok(_) => return Ok(Inserted::New),
                Err(e)
                    if e.as_database_error()
                        .is_some_and(|d| d.is_unique_violation()) => {}
                Err(e) => return Err(failed(Statement::Insert, &self.table)(e)),
            }
            let updated = ::sqlx::query(&self.sql.update("", 0))
                .bind(fence)
                .bind(key.clone())
                .bind(fence)
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

    /// The largest fence among the rows with `key`: a locking read, so
    /// the newest committed fence even under `REPEATABLE READ`.
    async fn lookup<K>(
        &self,
        conn: &mut ::sqlx::MySqlConnection,
        key: K,
    ) -> Result<Option<FencingToken>, StoreError>
    where
        K: for<'e> Encode<'e, MySql> + Type<MySql> + fmt::Display + Send,
    {
        let name = key.to_string();
        let fences: Vec<Option<i64>> = ::sqlx::query_scalar(&self.sql.fence_lookup(" FOR UPDATE"))
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

/// `bigint` (signed or unsigned) only: `int` stops at 2^31, `double` and
/// `decimal` are not what the binds send.
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
