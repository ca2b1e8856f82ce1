//! Fenced writes through sqlx, on PostgreSQL, MySQL/MariaDB and SQLite
//! (features `sqlx-postgres`, `sqlx-mysql`, `sqlx-sqlite`; `sqlx` is all
//! three): the storage-side check that makes a fencing token worth having,
//! where most Rust services keep their data.
//!
//! The same rule as [`FencedStore`](crate::FencedStore) and
//! [`postgres`](crate::postgres): a write is accepted iff its token is at
//! least the largest the row has accepted (equal is the same holder writing
//! again), checked and applied in one statement; a stale write changes
//! nothing and fails with [`StoreError::Stale`](crate::StoreError::Stale)
//! carrying both tokens. Every other failure is
//! [`StoreError::Backend`](crate::StoreError::Backend) holding a
//! [`StatementError`] that names the statement that failed (or a
//! [`SchemaError`], or a [`FenceRangeError`]).
//!
//! Each backend module has the same two types:
//! - `FencedStore`: a key-value table of the crate's own (`id`, `value`,
//!   `fence`), the SQL counterpart of the Redis store;
//! - `FencedTable`: the check on a table of yours with a fence column:
//!   [`update`](postgres::FencedTable::update) (`UPDATE … WHERE key = ? AND
//!   fence <= ?`) and [`insert_if_absent`](postgres::FencedTable::insert_if_absent)
//!   (inserts the row with the token, or records the token on the row that
//!   is there, or refuses a stale token).
//!
//! Every call takes its executor **per call**, as any sqlx
//! [`Acquire`](::sqlx::Acquire): `&Pool`, `&mut Connection`, or `&mut
//! Transaction`; so the fenced write is part of your own transaction, and
//! the row lock it takes lasts until your commit. That is what orders a
//! late commit (a holder paused past its lease) before the newer holder's
//! write, or refuses it. See DESIGN.md, "Fenced writes through sqlx", for
//! the argument per backend and where the backends differ:
//!
//! - **PostgreSQL**: the fenced row is locked until commit; a newer
//!   holder's fenced write waits for it, then sees the committed fence
//!   (`READ COMMITTED`). Under `REPEATABLE READ`/`SERIALIZABLE` the waiter
//!   gets a serialization failure instead: retry its transaction.
//! - **MySQL/MariaDB (InnoDB)**: the same row lock. sqlx connects with
//!   `CLIENT_FOUND_ROWS`, so an accepted update that changes no value still
//!   counts as one row; the fence lookup after a refused update is a
//!   locking read (`FOR UPDATE`), so under `REPEATABLE READ` it reads the
//!   newest fence, not the transaction's snapshot. `insert_if_absent` in an
//!   explicit `REPEATABLE READ` transaction can deadlock with another
//!   inserter of the same key (InnoDB's gap and insert-intention locks);
//!   InnoDB rolls one back with error 1213: retry it.
//! - **SQLite**: one writer for the whole database, so the fenced write
//!   waits (`busy_timeout`, 5 s in sqlx) for the other writer's commit.
//!   Begin a transaction that will write with its fenced write (or `BEGIN
//!   IMMEDIATE`): a deferred transaction that read before another
//!   connection committed cannot write on its old snapshot (in WAL mode
//!   `SQLITE_BUSY_SNAPSHOT` at once, no waiting).
//!
//! Tokens are `BIGINT` (8-byte `INTEGER` in SQLite) in every backend, so
//! every token this crate hands out (below 2^53) is stored exactly;
//! [`check_schema`](postgres::FencedTable::check_schema) refuses a fence
//! column that is not a 64-bit integer.
//!
//! # Timeouts
//!
//! Each call is bounded (1 s unless changed) and fails with
//! [`StoreError::Timeout`](crate::StoreError::Timeout) at the bound. The
//! statement may still run on the server and land; in a transaction, roll
//! back after a timeout.

use std::fmt;

#[cfg(feature = "sqlx-mysql")]
pub mod mysql;
#[cfg(feature = "sqlx-postgres")]
pub mod postgres;
#[cfg(feature = "sqlx-sqlite")]
pub mod sqlite;

pub use crate::store::sql::{FenceRangeError, InvalidName, NameProblem};

/// A statement that failed, with what the database said.
/// Arrives inside [`StoreError::Backend`](crate::StoreError::Backend);
/// downcast to inspect.
#[derive(Debug, thiserror::Error)]
#[error("{statement} on {table} failed")]
#[non_exhaustive]
pub struct StatementError {
    /// Which statement.
    pub statement: Statement,
    /// The table it ran on, as given.
    pub table: String,
    /// The driver's error.
    #[source]
    pub source: ::sqlx::Error,
}

/// The statements of the sqlx stores, for [`StatementError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Statement {
    /// Getting a connection from the executor (a pool's acquire, or the
    /// `SAVEPOINT` of a nested transaction).
    Acquire,
    /// `CREATE TABLE` of the store.
    CreateTable,
    /// The store's fenced upsert.
    Write,
    /// The store's read.
    Read,
    /// The fenced `UPDATE` on your table.
    Update,
    /// The `INSERT` of `insert_if_absent`.
    Insert,
    /// The lookup of a row's fence after a refused update.
    FenceLookup,
    /// Binding a parameter (the token, the key or yours).
    Bind,
    /// The look at the fence column's type in the catalog.
    CheckSchema,
}

impl fmt::Display for Statement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Acquire => "acquiring a connection",
            Self::CreateTable => "CREATE TABLE",
            Self::Write => "the fenced write",
            Self::Read => "the read",
            Self::Update => "the fenced UPDATE",
            Self::Insert => "the INSERT",
            Self::FenceLookup => "the fence lookup",
            Self::Bind => "binding a parameter",
            Self::CheckSchema => "the fence column's type lookup",
        })
    }
}

/// A table that cannot carry fencing tokens, found by `check_schema`.
/// Arrives inside [`StoreError::Backend`](crate::StoreError::Backend).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// The table has no such column (or there is no such table).
    #[error("table {table} has no column {column}")]
    NoSuchColumn {
        /// The table, as given.
        table: String,
        /// The column, as given.
        column: String,
    },
    /// The fence column's type cannot hold every token exactly (tokens go
    /// up to 2^53; a 64-bit integer column is needed).
    #[error(
        "fence column {table}.{column} is {found}, which cannot hold every fencing token \
         (up to 2^53) exactly: make it BIGINT (INTEGER in SQLite)"
    )]
    NarrowFence {
        /// The table, as given.
        table: String,
        /// The column, as given.
        column: String,
        /// The column's declared type, as the catalog shows it.
        found: String,
    },
}

/// `insert_if_absent` found a row with the key (its insert did nothing, or
/// hit a duplicate), but the fenced update after it found none with that
/// key: the row was deleted in between, or (MySQL) another unique index
/// refused the insert. Arrives inside
/// [`StoreError::Backend`](crate::StoreError::Backend).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the INSERT into {table} met a duplicate, but no row with key {key} was there to record the token on")]
#[non_exhaustive]
pub struct Vanished {
    /// The table, as given.
    pub table: String,
    /// The key, as displayed.
    pub key: String,
}

/// `insert_if_absent`'s outcome when it was not refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Inserted {
    /// There was no row with the key: the row was inserted with the token.
    New,
    /// A row with the key was there: its fence was raised to the token
    /// (or already equal), and nothing else changed.
    Existing,
}

/// A failed statement as a store error.
pub(crate) fn failed(
    statement: Statement,
    table: &str,
) -> impl FnOnce(::sqlx::Error) -> crate::StoreError + '_ {
    move |source| {
        crate::StoreError::backend(StatementError {
            statement,
            table: table.to_owned(),
            source,
        })
    }
}

/// A parameter that could not be bound (sqlx's `Arguments::add`).
pub(crate) fn bind_failed(table: &str, e: ::sqlx::error::BoxDynError) -> crate::StoreError {
    failed(Statement::Bind, table)(::sqlx::Error::Encode(e))
}

/// How a dialect writes the `n`th (1-based) parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)] // each feature uses its own
pub(crate) enum Placeholder {
    /// `$n` (PostgreSQL).
    Dollar,
    /// `?n` (SQLite).
    Numbered,
    /// `?`, bound in order (MySQL): a parameter used twice is bound twice.
    Positional,
}

impl Placeholder {
    pub(crate) fn nth(self, n: usize) -> String {
        match self {
            Self::Dollar => format!("${n}"),
            Self::Numbered => format!("?{n}"),
            Self::Positional => "?".to_owned(),
        }
    }
}

/// The SQL of a `FencedTable`, from its quoted names.
#[derive(Debug)]
pub(crate) struct TableSql {
    pub(crate) table: String,
    pub(crate) key: String,
    pub(crate) fence: String,
    pub(crate) placeholder: Placeholder,
}

impl TableSql {
    /// `UPDATE t SET <set>, fence = T WHERE key = K AND (fence IS NULL OR
    /// fence <= T)`, after the caller's `n` parameters. Positional
    /// placeholders bind the token, the key and the token again.
    pub(crate) fn update(&self, set: &str, n: usize) -> String {
        let p = self.placeholder;
        let (token, key) = (p.nth(n + 1), p.nth(n + 2));
        let token_again = if p == Placeholder::Positional {
            p.nth(n + 3)
        } else {
            token.clone()
        };
        let fence = &self.fence;
        let assignments = if set.trim().is_empty() {
            format!("{fence} = {token}")
        } else {
            format!("{set}, {fence} = {token}")
        };
        format!(
            "UPDATE {table} SET {assignments} WHERE {key_column} = {key} \
             AND ({fence} IS NULL OR {fence} <= {token_again})",
            table = self.table,
            key_column = self.key,
        )
    }

    /// `INSERT INTO t (<columns>, key, fence) VALUES (<n>, K, T)` plus the
    /// dialect's `suffix` (`ON CONFLICT (key) DO NOTHING`, or nothing on
    /// MySQL, where a duplicate is error 1062).
    pub(crate) fn insert(&self, columns: &str, n: usize, suffix: &str) -> String {
        let p = self.placeholder;
        let mut names = Vec::new();
        let mut values: Vec<String> = (1..=n).map(|i| p.nth(i)).collect();
        if !columns.trim().is_empty() {
            names.push(columns.to_owned());
        }
        names.push(self.key.clone());
        names.push(self.fence.clone());
        values.push(p.nth(n + 1));
        values.push(p.nth(n + 2));
        format!(
            "INSERT INTO {table} ({names}) VALUES ({values}){suffix}",
            table = self.table,
            names = names.join(", "),
            values = values.join(", "),
        )
    }

    /// `SELECT fence FROM t WHERE key = K` plus `suffix` (` FOR UPDATE` on
    /// MySQL).
    pub(crate) fn fence_lookup(&self, suffix: &str) -> String {
        format!(
            "SELECT {fence} FROM {table} WHERE {key} = {p}{suffix}",
            fence = self.fence,
            table = self.table,
            key = self.key,
            p = self.placeholder.nth(1),
        )
    }
}

/// What the fence lookup after a refused update found: the largest fence
/// among the rows with the key (`None`: no row, or only `NULL` fences).
pub(crate) fn refusal(
    key: String,
    token: crate::FencingToken,
    current: Option<crate::FencingToken>,
) -> Result<(), crate::StoreError> {
    match current {
        Some(current) if current > token => Err(crate::StaleToken {
            key,
            presented: token,
            current,
        }
        .into()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sql(placeholder: Placeholder) -> TableSql {
        TableSql {
            table: "\"orders\"".into(),
            key: "\"id\"".into(),
            fence: "\"fence\"".into(),
            placeholder,
        }
    }

    #[test]
    fn updates_bind_the_token_and_key_after_the_callers_parameters() {
        assert_eq!(
            sql(Placeholder::Dollar).update("status = $1", 1),
            "UPDATE \"orders\" SET status = $1, \"fence\" = $2 WHERE \"id\" = $3 \
             AND (\"fence\" IS NULL OR \"fence\" <= $2)"
        );
        assert_eq!(
            sql(Placeholder::Numbered).update("", 0),
            "UPDATE \"orders\" SET \"fence\" = ?1 WHERE \"id\" = ?2 \
             AND (\"fence\" IS NULL OR \"fence\" <= ?1)"
        );
        assert_eq!(
            sql(Placeholder::Positional).update("a = ?, b = ?", 2),
            "UPDATE \"orders\" SET a = ?, b = ?, \"fence\" = ? WHERE \"id\" = ? \
             AND (\"fence\" IS NULL OR \"fence\" <= ?)"
        );
    }

    #[test]
    fn inserts_name_the_key_and_fence_last() {
        assert_eq!(
            sql(Placeholder::Dollar).insert("state, note", 2, " ON CONFLICT (\"id\") DO NOTHING"),
            "INSERT INTO \"orders\" (state, note, \"id\", \"fence\") VALUES ($1, $2, $3, $4) \
             ON CONFLICT (\"id\") DO NOTHING"
        );
        assert_eq!(
            sql(Placeholder::Positional).insert(" ", 0, ""),
            "INSERT INTO \"orders\" (\"id\", \"fence\") VALUES (?, ?)"
        );
        assert_eq!(
            sql(Placeholder::Positional).fence_lookup(" FOR UPDATE"),
            "SELECT \"fence\" FROM \"orders\" WHERE \"id\" = ? FOR UPDATE"
        );
    }

    #[test]
    fn errors_name_the_statement_and_the_table() {
        let e = StatementError {
            statement: Statement::FenceLookup,
            table: "orders".into(),
            source: ::sqlx::Error::RowNotFound,
        };
        assert_eq!(e.to_string(), "the fence lookup on orders failed");
        let e = SchemaError::NarrowFence {
            table: "orders".into(),
            column: "fence".into(),
            found: "int".into(),
        };
        assert!(e
            .to_string()
            .starts_with("fence column orders.fence is int, which cannot"));
    }
}
