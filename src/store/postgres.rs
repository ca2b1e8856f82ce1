//! Fenced writes to PostgreSQL (feature `postgres`, on `tokio-postgres`):
//! the storage-side check that makes a fencing token worth having.
//!
//! One concept (the PostgreSQL store, about 640 lines, half of it the
//! table-and-trigger setup and its tests), so one file.
//!
//! A lock lease can end while its holder still works: a GC pause, a slow
//! payment provider, or a transaction that commits after the lock was
//! released. The next holder gets a larger [`FencingToken`]; storage that
//! remembers the largest token it accepted can then refuse the late write.
//! Same rule as [`FencedStore`](crate::FencedStore): a write is accepted iff
//! its token is at least the largest the row has accepted (equal is the same
//! holder writing again), checked and applied in one statement, and a stale
//! write changes nothing and fails with [`StoreError::Stale`].
//!
//! Two ways in:
//! - [`PgFencedStore`]: a key-value table of its own (`id text`, `value
//!   bytea`, `fence bigint`), the SQL counterpart of the Redis store.
//! - [`FencedTable`]: the same check on a table of yours that has a fence
//!   column, for `UPDATE orders SET status = ... WHERE id = ...`.
//!
//! Both take the client **per call**, as any
//! [`GenericClient`]: a `Client`, a `Transaction`, or a pooled connection
//! (deadpool's and bb8's dereference to a `Client`). That is what lets the
//! fenced write be part of your own transaction, which is the fix for "the
//! lock was released before the transaction committed":
//!
//! ```no_run
//! # async fn demo(
//! #     client: &mut tokio_postgres::Client,
//! #     guard: redfence::LockGuard,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! use redfence::postgres::FencedTable;
//!
//! let orders = FencedTable::new("orders", "id", "fence")?;
//! let token = guard.token().expect("fencing is on by default");
//! let tx = client.transaction().await?;
//! // First where possible: a stale holder learns it before doing any work,
//! // and the row lock this takes until the commit makes a newer holder's
//! // fenced write wait for our commit, so its reads after it see our work.
//! match orders.update(&tx, &42_i64, "status = $1", &[&"paid"], token).await {
//!     Ok(0) => return Err("no order 42".into()),
//!     Ok(_) => {}
//!     // Our lease ran out and a newer holder has written: roll back.
//!     Err(e) if e.is_stale() => return Ok(()), // `tx` rolls back on drop
//!     Err(e) => return Err(e.into()),
//! }
//! tx.execute("INSERT INTO receipts (order_id) VALUES ($1)", &[&42_i64]).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```
//!
//! Why this holds even when the commit comes after the lease ended: the
//! fenced statement row-locks the row until the transaction ends. A newer
//! holder's fenced write on that row either came first (then ours is
//! refused and we roll back) or waits for our commit and then finds our
//! smaller token (then its write follows ours). Either way the row's
//! history is in token order. Under `REPEATABLE READ` or `SERIALIZABLE` the
//! waiting writer gets a serialization failure instead
//! ([`StoreError::Backend`]); retry its transaction as usual.
//!
//! # The recipe, for SQL you write yourself
//!
//! Add `fence bigint NOT NULL DEFAULT 0` to the table (instant since
//! PostgreSQL 11), bind the token as a `bigint`
//! (`i64::try_from(token.get())`; this crate's tokens are below 2^53), and
//! guard the write in the same statement that makes it:
//!
//! ```sql
//! UPDATE orders SET status = $2, fence = $1 WHERE id = $3 AND fence <= $1
//! ```
//!
//! One row updated: accepted. None: either there is no such row or the token
//! is stale; `SELECT fence FROM orders WHERE id = $1` tells which (a fence
//! above the token is a stale write: roll back). [`FencedTable::update`]
//! runs exactly this recipe; use it, or copy it. An insert-or-update is
//! guarded the same way, with no row returned for a stale token:
//!
//! ```sql
//! INSERT INTO memberships AS cur (id, state, fence) VALUES ($2, $3, $1)
//! ON CONFLICT (id) DO UPDATE SET state = EXCLUDED.state, fence = EXCLUDED.fence
//! WHERE cur.fence <= EXCLUDED.fence
//! RETURNING fence
//! ```
//!
//! ([`PgFencedStore`] uses a variant that also returns the refusing fence
//! from the same statement.)
//!
//! # Timeouts
//!
//! Each call is bounded (1 s unless changed) and fails with
//! [`StoreError::Timeout`] at the bound. The statement may still be running
//! on the server then, and land later: `tokio-postgres` stops waiting but
//! does not cancel it. In a transaction, roll back after a timeout. To make
//! the server give up too, set `lock_timeout` or `statement_timeout` on the
//! connection; its refusal then arrives as [`StoreError::Backend`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{GenericClient, Row};
use tracing::field::Empty;

use crate::logic::fence::FencingToken;
use crate::logic::limits::DEFAULT_STORE_TIMEOUT;
use crate::store::sql::{self, bounded, from_bigint, to_bigint, Dialect};
pub use crate::store::sql::{FenceRangeError, InvalidName, NameProblem};
use crate::store::{traced, Fenced, StaleToken, StoreError};

/// A fenced key-value table: rows of `id text PRIMARY KEY`, `value bytea`
/// and `fence bigint`, the largest token the row has accepted.
///
/// The store holds no connection: each call takes the client or
/// transaction to run on (see the [module docs](self)), so one store serves
/// every connection of a pool. Cheap to clone.
///
/// ```no_run
/// # async fn demo(
/// #     client: &tokio_postgres::Client,
/// #     guard: redfence::LockGuard,
/// # ) -> Result<(), Box<dyn std::error::Error>> {
/// use redfence::postgres::PgFencedStore;
///
/// let store = PgFencedStore::new("memberships")?;
/// store.create_table(client).await?;
/// let token = guard.token().expect("fencing is on by default");
/// match store.write(client, "member:42", b"active", token).await {
///     Ok(()) => {}
///     Err(e) if e.is_stale() => { /* our lease ran out: someone else owns it now */ }
///     Err(e) => return Err(e.into()),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgFencedStore {
    table: String,
    sql: Arc<StoreSql>,
    timeout: Duration,
}

/// The statements, built once from the validated, quoted table name.
#[derive(Debug)]
struct StoreSql {
    create: String,
    write: String,
    read: String,
}

impl StoreSql {
    fn new(table: &str) -> Self {
        Self {
            // The CHECK keeps the fence a valid token even for rows written
            // by hand, so reads never meet a negative one.
            create: format!(
                "CREATE TABLE IF NOT EXISTS {table} (\
                 id text PRIMARY KEY, \
                 value bytea NOT NULL, \
                 fence bigint NOT NULL CHECK (fence >= 0))"
            ),
            // A stale write still takes the ON CONFLICT branch, but keeps
            // the row's value and fence (it rewrites the row with its own
            // values), so `RETURNING` reports the fence that refused it from
            // the same atomic step: no second query, no window in which the
            // row could change or vanish. `WHERE cur.fence <= EXCLUDED.fence`
            // instead would return no row, and the follow-up SELECT for the
            // current fence would race with other writers. The row lock is
            // the same either way: ON CONFLICT DO UPDATE locks the row even
            // when its WHERE is false.
            write: format!(
                "INSERT INTO {table} AS cur (id, value, fence) VALUES ($1, $2, $3) \
                 ON CONFLICT (id) DO UPDATE SET \
                 value = CASE WHEN cur.fence <= EXCLUDED.fence \
                 THEN EXCLUDED.value ELSE cur.value END, \
                 fence = GREATEST(cur.fence, EXCLUDED.fence) \
                 RETURNING cur.fence"
            ),
            read: format!("SELECT value, fence FROM {table} WHERE id = $1"),
        }
    }
}

impl PgFencedStore {
    /// A store on table `table` (`name` or `schema.name`; see
    /// [`InvalidName`] for what is accepted). Each call is bounded by
    /// [`DEFAULT_STORE_TIMEOUT`] (1 s) unless changed with
    /// [`timeout`](Self::timeout). Checks the name only; the table is
    /// created by [`create_table`](Self::create_table).
    pub fn new(table: &str) -> Result<Self, InvalidName> {
        let quoted = quote_table(table)?;
        Ok(Self {
            table: table.to_owned(),
            sql: Arc::new(StoreSql::new(&quoted)),
            timeout: DEFAULT_STORE_TIMEOUT,
        })
    }

    /// Bounds each call. Defaults to 1 second. A zero duration is raised to
    /// 1 ms.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The table name, as given to [`new`](Self::new).
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Creates the table unless it exists (which is not checked for the
    /// right columns). Run it once at deployment or startup, not from
    /// several connections at the same moment: PostgreSQL's `IF NOT EXISTS`
    /// can still fail with a unique violation when two sessions race.
    pub async fn create_table<C>(&self, client: &C) -> Result<(), StoreError>
    where
        C: GenericClient + Sync,
    {
        let create = client.batch_execute(&self.sql.create);
        bounded(self.timeout, create)
            .await?
            .map_err(StoreError::backend)
    }

    /// Stores `value` under `id` if `token` is at least the largest token
    /// `id` has accepted (or `id` is new). Fails with
    /// [`StoreError::Stale`], changing nothing, otherwise; and with
    /// [`StoreError::Backend`] holding a [`FenceRangeError`] for a token
    /// above `i64::MAX`, without asking the server.
    pub async fn write<C>(
        &self,
        client: &C,
        id: &str,
        value: impl AsRef<[u8]>,
        token: FencingToken,
    ) -> Result<(), StoreError>
    where
        C: GenericClient + Sync,
    {
        let span = tracing::debug_span!(
            "fenced_write",
            key = id,
            token = token.get(),
            outcome = Empty,
            elapsed = Empty,
        );
        traced(span, self.write_inner(client, id, value.as_ref(), token)).await
    }

    async fn write_inner<C>(
        &self,
        client: &C,
        id: &str,
        value: &[u8],
        token: FencingToken,
    ) -> Result<(), StoreError>
    where
        C: GenericClient + Sync,
    {
        let fence = to_bigint(token)?;
        let params: [(&(dyn ToSql + Sync), Type); 3] = [
            (&id, Type::TEXT),
            (&value, Type::BYTEA),
            (&fence, Type::INT8),
        ];
        // `query_typed` sends the statement with its parameter types in one
        // round trip, with no prepared statement to cache per connection
        // (so it also works through transaction-mode poolers). It needs
        // tokio-postgres 0.7.12, hence the minimum in Cargo.toml.
        let rows = bounded(self.timeout, client.query_typed(&self.sql.write, &params))
            .await?
            .map_err(StoreError::backend)?;
        let current = single_fence(&rows, id)?;
        if current == token {
            return Ok(());
        }
        Err(StaleToken {
            key: id.to_owned(),
            presented: token,
            current,
        }
        .into())
    }

    /// The value under `id` and the token that wrote it; `None` when `id`
    /// was never written.
    pub async fn read<C>(&self, client: &C, id: &str) -> Result<Option<Fenced<Vec<u8>>>, StoreError>
    where
        C: GenericClient + Sync,
    {
        let span = tracing::debug_span!("fenced_read", key = id, outcome = Empty, elapsed = Empty);
        traced(span, self.read_inner(client, id)).await
    }

    async fn read_inner<C>(
        &self,
        client: &C,
        id: &str,
    ) -> Result<Option<Fenced<Vec<u8>>>, StoreError>
    where
        C: GenericClient + Sync,
    {
        let params: [(&(dyn ToSql + Sync), Type); 1] = [(&id, Type::TEXT)];
        let rows = bounded(self.timeout, client.query_typed(&self.sql.read, &params))
            .await?
            .map_err(StoreError::backend)?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let value: Vec<u8> = row.try_get(0).map_err(StoreError::backend)?;
        let fence: i64 = row.try_get(1).map_err(StoreError::backend)?;
        Ok(Some(Fenced {
            value,
            token: from_bigint(fence, id)?,
        }))
    }
}

/// The fencing check on a table of yours: one with a key column and a
/// `bigint` fence column (`ALTER TABLE orders ADD COLUMN fence bigint NOT
/// NULL DEFAULT 0`). [`update`](Self::update) runs the module's recipe, so
/// the guard cannot be forgotten. See the [module docs](self) for its use
/// inside a transaction. Cheap to clone.
#[derive(Debug, Clone)]
pub struct FencedTable {
    table: Arc<str>,
    key_column: Arc<str>,
    fence_column: Arc<str>,
    timeout: Duration,
}

impl FencedTable {
    /// The table `table` (`name` or `schema.name`), whose rows are found by
    /// `key_column` (the primary key, or another unique column) and which
    /// stores the largest accepted token in `fence_column`. Names as in
    /// [`InvalidName`]. Each call is bounded by [`DEFAULT_STORE_TIMEOUT`]
    /// (1 s) unless changed with [`timeout`](Self::timeout).
    pub fn new(table: &str, key_column: &str, fence_column: &str) -> Result<Self, InvalidName> {
        Ok(Self {
            table: quote_table(table)?.into(),
            key_column: quote_column(key_column)?.into(),
            fence_column: quote_column(fence_column)?.into(),
            timeout: DEFAULT_STORE_TIMEOUT,
        })
    }

    /// Bounds each call (both of its statements together). Defaults to 1
    /// second. A zero duration is raised to 1 ms.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Runs `UPDATE table SET <set>, fence = <token> WHERE key = <key> AND
    /// (fence IS NULL OR fence <= <token>)`. `set` is your assignment list
    /// with its own placeholders `$1`..`$n` bound to `params` (it is SQL
    /// text: never build it from untrusted input); it may be empty to only
    /// record the token. A `NULL` fence counts as never written.
    ///
    /// Returns the number of rows updated: 1, or 0 when no row had that key
    /// when the statement ran. When the row exists with a larger fence,
    /// fails with [`StoreError::Stale`] carrying it, having changed nothing
    /// (a follow-up `SELECT` of the fence tells the two apart; fences only
    /// grow, so the fence it reads is at least the one that refused the
    /// write). A token above `i64::MAX` fails with [`StoreError::Backend`]
    /// holding a [`FenceRangeError`], without asking the server.
    pub async fn update<C, K>(
        &self,
        client: &C,
        key: &K,
        set: &str,
        params: &[&(dyn ToSql + Sync)],
        token: FencingToken,
    ) -> Result<u64, StoreError>
    where
        C: GenericClient + Sync,
        K: ToSql + Sync + fmt::Display,
    {
        let span = tracing::debug_span!(
            "fenced_update",
            table = %self.table,
            key = %key,
            token = token.get(),
            outcome = Empty,
            elapsed = Empty,
        );
        traced(span, self.update_inner(client, key, set, params, token)).await
    }

    async fn update_inner<C, K>(
        &self,
        client: &C,
        key: &K,
        set: &str,
        params: &[&(dyn ToSql + Sync)],
        token: FencingToken,
    ) -> Result<u64, StoreError>
    where
        C: GenericClient + Sync,
        K: ToSql + Sync + fmt::Display,
    {
        let fence = to_bigint(token)?;
        let work = async {
            let update = self.update_sql(set, params.len());
            let mut all: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(params.len() + 2);
            all.extend_from_slice(params);
            all.push(&fence);
            all.push(key);
            let updated = client
                .execute(update.as_str(), &all)
                .await
                .map_err(StoreError::backend)?;
            if updated > 0 {
                return Ok(updated);
            }
            let select = format!(
                "SELECT {fence} FROM {table} WHERE {key} = $1",
                fence = self.fence_column,
                table = self.table,
                key = self.key_column,
            );
            let key_param: &(dyn ToSql + Sync) = key;
            let rows = client
                .query(select.as_str(), &[key_param])
                .await
                .map_err(StoreError::backend)?;
            let key = key.to_string();
            let mut current: Option<FencingToken> = None;
            for row in &rows {
                let found: Option<i64> = row.try_get(0).map_err(StoreError::backend)?;
                if let Some(found) = found {
                    let found = from_bigint(found, &key)?;
                    current = current.max(Some(found));
                }
            }
            match current {
                Some(current) if current > token => Err(StaleToken {
                    key,
                    presented: token,
                    current,
                }
                .into()),
                // No row, or (under READ COMMITTED) one inserted after the
                // UPDATE's snapshot was taken: there was nothing to update.
                _ => Ok(0),
            }
        };
        bounded(self.timeout, work).await?
    }

    fn update_sql(&self, set: &str, n_params: usize) -> String {
        let (token, key) = (n_params + 1, n_params + 2);
        let fence = &self.fence_column;
        let assignments = if set.trim().is_empty() {
            format!("{fence} = ${token}")
        } else {
            format!("{set}, {fence} = ${token}")
        };
        format!(
            "UPDATE {table} SET {assignments} WHERE {key_column} = ${key} \
             AND ({fence} IS NULL OR {fence} <= ${token})",
            table = self.table,
            key_column = self.key_column,
        )
    }
}

/// The fence of the one row an upsert returns.
fn single_fence(rows: &[Row], id: &str) -> Result<FencingToken, StoreError> {
    let [row] = rows else {
        return Err(StoreError::backend(UnexpectedRows(rows.len())));
    };
    let fence: i64 = row.try_get(0).map_err(StoreError::backend)?;
    from_bigint(fence, id)
}

/// An upsert with `RETURNING` yields exactly one row; anything else means
/// the table is not what [`PgFencedStore`] created (e.g. a rule on it).
#[derive(Debug, thiserror::Error)]
#[error("fenced write returned {0} rows instead of 1")]
struct UnexpectedRows(usize);

fn quote_table(name: &str) -> Result<String, InvalidName> {
    sql::quote_table(name, Dialect::Postgres)
}

fn quote_column(name: &str) -> Result<String, InvalidName> {
    sql::quote_column(name, Dialect::Postgres)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_checked_folded_and_quoted() {
        assert_eq!(quote_table("orders").unwrap(), "\"orders\"");
        assert_eq!(
            quote_table("Billing.Orders_2").unwrap(),
            "\"billing\".\"orders_2\""
        );
        assert_eq!(quote_table("order").unwrap(), "\"order\"");
        assert_eq!(quote_table(&"t".repeat(63)).unwrap().len(), 65);
        let problem = |name: &str| quote_table(name).unwrap_err().problem;
        assert_eq!(problem(""), NameProblem::Empty);
        assert_eq!(problem("public."), NameProblem::Empty);
        assert_eq!(problem(".t"), NameProblem::Empty);
        assert_eq!(problem("a.b.c"), NameProblem::Character('.'));
        assert_eq!(problem("t; DROP TABLE x"), NameProblem::Character(';'));
        assert_eq!(problem("t\"x"), NameProblem::Character('"'));
        assert_eq!(problem("tä"), NameProblem::Character('ä'));
        assert_eq!(problem("1t"), NameProblem::LeadingDigit);
        assert_eq!(problem(&"t".repeat(64)), NameProblem::TooLong);
        assert_eq!(
            quote_column("s.t").unwrap_err().problem,
            NameProblem::Character('.')
        );
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let e = PgFencedStore::new("t x").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid SQL name \"t x\": character ' ' is not allowed \
             (ASCII letters, digits and `_` only)"
        );
        let e = FenceRangeError::TokenTooLarge(FencingToken::new(u64::MAX));
        assert_eq!(
            e.to_string(),
            "fencing token 18446744073709551615 does not fit in a bigint (at most 2^63 - 1)"
        );
    }

    #[test]
    fn tokens_convert_at_the_bigint_boundary() {
        let max = i64::MAX.unsigned_abs();
        assert_eq!(to_bigint(FencingToken::new(max)).unwrap(), i64::MAX);
        let err = to_bigint(FencingToken::new(max + 1)).unwrap_err();
        let StoreError::Backend(source) = err else {
            panic!("expected a backend error: {err:?}");
        };
        assert_eq!(
            source.downcast_ref::<FenceRangeError>(),
            Some(&FenceRangeError::TokenTooLarge(FencingToken::new(max + 1)))
        );
        assert_eq!(from_bigint(7, "k").unwrap(), FencingToken::new(7));
        assert!(matches!(from_bigint(-1, "k"), Err(StoreError::Backend(_))));
    }

    #[test]
    fn the_update_binds_the_token_after_the_callers_parameters() {
        let t = FencedTable::new("Orders", "ID", "fence").unwrap();
        assert_eq!(
            t.update_sql("status = $1, note = $2", 2),
            "UPDATE \"orders\" SET status = $1, note = $2, \"fence\" = $3 \
             WHERE \"id\" = $4 AND (\"fence\" IS NULL OR \"fence\" <= $3)"
        );
        assert_eq!(
            t.update_sql(" ", 0),
            "UPDATE \"orders\" SET \"fence\" = $1 \
             WHERE \"id\" = $2 AND (\"fence\" IS NULL OR \"fence\" <= $1)"
        );
    }

    #[test]
    fn timeouts_have_a_floor() {
        let s = PgFencedStore::new("t").unwrap();
        assert_eq!(s.timeout, DEFAULT_STORE_TIMEOUT);
        assert_eq!(s.timeout(Duration::ZERO).timeout, Duration::from_millis(1));
        let t = FencedTable::new("t", "id", "fence").unwrap();
        assert_eq!(t.timeout(Duration::ZERO).timeout, Duration::from_millis(1));
    }

    #[test]
    fn stores_are_send_and_sync() {
        fn check<T: Send + Sync + 'static>() {}
        check::<PgFencedStore>();
        check::<FencedTable>();
        check::<InvalidName>();
        check::<FenceRangeError>();
    }
}
