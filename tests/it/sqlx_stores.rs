//! The sqlx fenced stores against real servers: PostgreSQL (the harness's
//! own), MariaDB (the harness's own, `tests/support/mariadb.rs`) and SQLite
//! (a file in a temporary directory). One set of tests, run once per
//! backend by `backend_tests!`: the acceptance rule (first, higher and
//! equal tokens accepted, lower refused with both tokens and nothing
//! changed), writes inside rolled back transactions, two holders racing
//! (the old one's transaction open past its lease) ordered by the row lock,
//! a stale holder refused inside its transaction, the same race without
//! the fence check losing the newer update (the negative control),
//! concurrent insert-if-absent inserting once, the schema check, and the
//! typed errors. Tokens are built by hand: which token wins is the store's
//! business, not the lock's.
//!
//! Tests share one server per backend and process and isolate themselves by
//! table name (each backend's tables carry its prefix).

use std::any::Any;
use std::time::Instant;

use redfence::FencingToken;

use crate::helpers::{ms, secs};

fn t(n: u64) -> FencingToken {
    FencingToken::new(n)
}

/// What keeps a backend's server (or file) alive while a test runs.
type Keeper = Box<dyn Any + Send + Sync>;

#[cfg(feature = "sqlx-postgres")]
async fn postgres_pool() -> (Keeper, sqlx::PgPool) {
    let server = crate::support::postgres::PgServer::shared();
    let pool = tokio::time::timeout(
        secs(30),
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(24)
            .acquire_timeout(secs(20))
            .connect(&server.url()),
    )
    .await
    .expect("connecting to PostgreSQL timed out")
    .unwrap_or_else(|e| panic!("connecting to {}: {e}\n{}", server.url(), server.logs()));
    (Box::new(server), pool)
}

#[cfg(feature = "sqlx-mysql")]
async fn mysql_pool() -> (Keeper, sqlx::MySqlPool) {
    let server = crate::support::mariadb::MariaDbServer::shared();
    let pool = tokio::time::timeout(
        secs(30),
        sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(24)
            .acquire_timeout(secs(20))
            .connect(&server.url()),
    )
    .await
    .expect("connecting to MariaDB timed out")
    .unwrap_or_else(|e| panic!("connecting to {}: {e}\n{}", server.url(), server.logs()));
    (Box::new(server), pool)
}

#[cfg(feature = "sqlx-sqlite")]
async fn sqlite_pool() -> (Keeper, sqlx::SqlitePool) {
    let dir = crate::support::process::TempDir::new("sqlite");
    std::fs::create_dir(dir.path()).unwrap();
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.join("db.sqlite"))
        .create_if_missing(true)
        // Longer than sqlx's 5 s default: a loaded machine.
        .busy_timeout(secs(20));
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(24)
        .acquire_timeout(secs(20))
        .connect_with(options)
        .await
        .unwrap();
    (Box::new(dir), pool)
}

/// The backend error's source, downcast.
fn source<E: std::error::Error + 'static>(e: &redfence::StoreError) -> &E {
    match e {
        redfence::StoreError::Backend(source) => source
            .downcast_ref::<E>()
            .unwrap_or_else(|| panic!("unexpected backend error: {source:?}")),
        other => panic!("expected a backend error, got {other:?}"),
    }
}

macro_rules! backend_tests {
    (
        mod $name:ident;
        feature: $feature:literal;
        backend: $($backend:ident)::+;
        db: $db:ty;
        args: $args:ty;
        pool: $pool:ident;
        // The first placeholder in the dialect: `$1`, `?`, `?1`.
        p1: $p1:literal;
    ) => {
        #[cfg(feature = $feature)]
        mod $name {
            use super::*;
            use redfence::sqlx::{Inserted, SchemaError, Statement, StatementError};
            use $($backend)::+::{FencedStore, FencedTable};
            use sqlx::{Arguments, Pool};

            // `sqlite_` names are SQLite's own.
            const PREFIX: &str = concat!("t_", stringify!($name));

            fn name(table: &str) -> String {
                format!("{PREFIX}_{table}")
            }

            async fn exec(pool: &Pool<$db>, sql: &str) {
                sqlx::query(sql)
                    .execute(pool)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
            }

            /// A fresh user table `name(table)`: a text key, a value and a
            /// BIGINT fence, with one row `a` (fence 0).
            async fn user_table(pool: &Pool<$db>, table: &str) -> (String, FencedTable) {
                let table = name(table);
                exec(pool, &format!("DROP TABLE IF EXISTS {table}")).await;
                exec(
                    pool,
                    &format!(
                        "CREATE TABLE {table} (id VARCHAR(64) NOT NULL PRIMARY KEY, \
                         val VARCHAR(64) NOT NULL DEFAULT '', fence BIGINT NOT NULL DEFAULT 0)"
                    ),
                )
                .await;
                exec(pool, &format!("INSERT INTO {table} (id, val) VALUES ('a', 'v0')")).await;
                let fenced = FencedTable::new(&table, "id", "fence").unwrap().timeout(secs(20));
                fenced.check_schema(pool).await.unwrap();
                (table, fenced)
            }

            async fn row(pool: &Pool<$db>, table: &str, id: &str) -> Option<(String, i64)> {
                sqlx::query_as(&format!("SELECT val, fence FROM {table} WHERE id = '{id}'"))
                    .fetch_optional(pool)
                    .await
                    .unwrap()
            }

            async fn count(pool: &Pool<$db>, table: &str) -> i64 {
                sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }

            fn val(v: &str) -> $args {
                let mut args = <$args>::default();
                args.add(v.to_owned()).unwrap();
                args
            }

            fn set_val() -> String {
                format!("val = {}", $p1)
            }

            async fn store(pool: &Pool<$db>, table: &str) -> FencedStore {
                let table = name(table);
                exec(pool, &format!("DROP TABLE IF EXISTS {table}")).await;
                let store = FencedStore::new(&table).unwrap().timeout(secs(20));
                store.create_table(pool).await.unwrap();
                // Idempotent.
                store.create_table(pool).await.unwrap();
                store
            }

            /// The rule on one connection (so the MySQL upsert's reply is
            /// checked after each kind of statement on the same session):
            /// first, higher and equal tokens accepted, a lower one refused
            /// with both tokens and nothing changed; a token of 2^53 stored
            /// exactly.
            #[tokio::test]
            async fn store_accepts_first_higher_and_equal_and_refuses_lower() {
                let (_keep, pool) = $pool().await;
                let store = store(&pool, "store_rule").await;
                let mut conn = pool.acquire().await.unwrap();
                let c = &mut *conn;
                assert_eq!(store.read(&mut *c, "k").await.unwrap(), None);
                store.write(&mut *c, "k", b"one", t(5)).await.unwrap();
                store.write(&mut *c, "k", b"two", t(7)).await.unwrap();
                // Equal: the same holder again, also with the same value.
                store.write(&mut *c, "k", b"two", t(7)).await.unwrap();
                store.write(&mut *c, "k", b"three", t(7)).await.unwrap();
                // A new key right after an update on this session.
                store.write(&mut *c, "other", b"x", t(3)).await.unwrap();
                let e = store.write(&mut *c, "k", b"late", t(6)).await.unwrap_err();
                let stale = e.stale().unwrap_or_else(|| panic!("expected stale: {e:?}"));
                assert_eq!((stale.key.as_str(), stale.presented, stale.current), ("k", t(6), t(7)));
                let got = store.read(&mut *c, "k").await.unwrap().unwrap();
                assert_eq!((got.value, got.token), (b"three".to_vec(), t(7)));
                let got = store.read(&mut *c, "other").await.unwrap().unwrap();
                assert_eq!((got.value, got.token), (b"x".to_vec(), t(3)));

                let big = t(1 << 53);
                store.write(&mut *c, "big", b"b", big).await.unwrap();
                let e = store.write(&mut *c, "big", b"c", t((1 << 53) - 1)).await.unwrap_err();
                assert_eq!(e.stale().map(|s| s.current), Some(big));
                assert_eq!(store.read(&mut *c, "big").await.unwrap().unwrap().token, big);
                // Through the pool as well.
                store.write(&pool, "big", b"d", t((1 << 53) + 1)).await.unwrap();
                assert_eq!(store.read(&pool, "big").await.unwrap().unwrap().token, t((1 << 53) + 1));
            }

            #[tokio::test]
            async fn writes_in_a_rolled_back_transaction_leave_nothing() {
                let (_keep, pool) = $pool().await;
                let store = store(&pool, "store_rollback").await;
                let (table, fenced) = user_table(&pool, "table_rollback").await;
                let mut tx = pool.begin().await.unwrap();
                store.write(&mut *tx, "k", b"v", t(50)).await.unwrap();
                assert_eq!(fenced.update(&mut *tx, "a".to_owned(), &set_val(), val("tx"), t(50)).await.unwrap(), 1);
                let inserted = fenced
                    .insert_if_absent(&mut *tx, "b".to_owned(), "val", val("new"), t(50))
                    .await
                    .unwrap();
                assert_eq!(inserted, Inserted::New);
                assert_eq!(store.read(&mut *tx, "k").await.unwrap().unwrap().token, t(50));
                tx.rollback().await.unwrap();
                assert_eq!(store.read(&pool, "k").await.unwrap(), None);
                assert_eq!(row(&pool, &table, "a").await, Some(("v0".to_owned(), 0)));
                assert_eq!(row(&pool, &table, "b").await, None);
                // Nor did the fences advance: lower tokens are accepted.
                store.write(&pool, "k", b"v2", t(10)).await.unwrap();
                assert_eq!(fenced.update(&pool, "a".to_owned(), &set_val(), val("v2"), t(10)).await.unwrap(), 1);
            }

            #[tokio::test]
            async fn table_updates_follow_the_rule() {
                let (_keep, pool) = $pool().await;
                let (table, fenced) = user_table(&pool, "table_rule").await;
                let a = || "a".to_owned();
                assert_eq!(fenced.update(&pool, a(), &set_val(), val("x"), t(5)).await.unwrap(), 1);
                // Equal token and the same value: still one row (found rows
                // on MySQL).
                assert_eq!(fenced.update(&pool, a(), &set_val(), val("x"), t(5)).await.unwrap(), 1);
                // Only the token.
                assert_eq!(fenced.update(&pool, a(), "", <$args>::default(), t(7)).await.unwrap(), 1);
                let e = fenced.update(&pool, a(), &set_val(), val("late"), t(6)).await.unwrap_err();
                let stale = e.stale().unwrap_or_else(|| panic!("expected stale: {e:?}"));
                assert_eq!((stale.key.as_str(), stale.presented, stale.current), ("a", t(6), t(7)));
                assert_eq!(row(&pool, &table, "a").await, Some(("x".to_owned(), 7)));
                // No such row: 0, not stale.
                assert_eq!(fenced.update(&pool, "zz".to_owned(), &set_val(), val("y"), t(9)).await.unwrap(), 0);
            }

            #[tokio::test]
            async fn insert_if_absent_inserts_records_or_refuses() {
                let (_keep, pool) = $pool().await;
                let (table, fenced) = user_table(&pool, "table_insert").await;
                let b = || "b".to_owned();
                assert_eq!(fenced.insert_if_absent(&pool, b(), "val", val("first"), t(4)).await.unwrap(), Inserted::New);
                assert_eq!(row(&pool, &table, "b").await, Some(("first".to_owned(), 4)));
                assert_eq!(fenced.insert_if_absent(&pool, b(), "val", val("second"), t(4)).await.unwrap(), Inserted::Existing);
                assert_eq!(fenced.insert_if_absent(&pool, b(), "val", val("third"), t(8)).await.unwrap(), Inserted::Existing);
                // The existing row keeps its values; only the fence moves.
                assert_eq!(row(&pool, &table, "b").await, Some(("first".to_owned(), 8)));
                let e = fenced.insert_if_absent(&pool, b(), "val", val("late"), t(6)).await.unwrap_err();
                assert_eq!(e.stale().map(|s| (s.presented, s.current)), Some((t(6), t(8))));
                assert_eq!(row(&pool, &table, "b").await, Some(("first".to_owned(), 8)));
                // No other columns: key and fence only.
                assert_eq!(fenced.insert_if_absent(&pool, "c".to_owned(), "", <$args>::default(), t(1)).await.unwrap(), Inserted::New);
                assert_eq!(row(&pool, &table, "c").await, Some((String::new(), 1)));
                assert_eq!(count(&pool, &table).await, 3);
            }

            /// "The lock was released before the transaction committed": the
            /// old holder's fenced update came first and locks the row (the
            /// database, on SQLite) until its late commit; the newer holder's
            /// fenced update waits for that commit and follows it.
            #[tokio::test]
            async fn a_late_commit_is_ordered_before_the_newer_holders_write() {
                let (_keep, pool) = $pool().await;
                let (table, fenced) = user_table(&pool, "late_commit").await;
                let mut old = pool.begin().await.unwrap();
                assert_eq!(fenced.update(&mut *old, "a".to_owned(), &set_val(), val("old"), t(5)).await.unwrap(), 1);

                // The old holder's lease ends here; a newer holder writes.
                let (pool2, fenced2, started) = (pool.clone(), fenced.clone(), Instant::now());
                let newer = tokio::spawn(async move {
                    let outcome = fenced2.update(&pool2, "a".to_owned(), &set_val(), val("new"), t(6)).await;
                    (outcome, started.elapsed())
                });
                tokio::time::sleep(ms(400)).await;
                assert!(!newer.is_finished(), "the newer write did not wait for the old transaction");
                old.commit().await.unwrap();
                let (outcome, waited) = newer.await.unwrap();
                assert_eq!(outcome.unwrap(), 1);
                assert!(waited >= ms(400), "{waited:?}");
                assert_eq!(row(&pool, &table, "a").await, Some(("new".to_owned(), 6)));
            }

            /// The other order: the newer holder committed first, so the old
            /// holder's fenced update in its transaction is refused, and its
            /// rollback undoes the work it did before.
            #[tokio::test]
            async fn a_stale_holder_is_refused_inside_its_transaction_and_rolls_back() {
                let (_keep, pool) = $pool().await;
                let (table, fenced) = user_table(&pool, "stale_tx").await;
                let audit = name("stale_tx_audit");
                exec(&pool, &format!("DROP TABLE IF EXISTS {audit}")).await;
                exec(&pool, &format!("CREATE TABLE {audit} (note VARCHAR(64))")).await;
                fenced.update(&pool, "a".to_owned(), &set_val(), val("new"), t(6)).await.unwrap();

                let mut old = pool.begin().await.unwrap();
                sqlx::query(&format!("INSERT INTO {audit} VALUES ('old holder was here')"))
                    .execute(&mut *old)
                    .await
                    .unwrap();
                let e = fenced.update(&mut *old, "a".to_owned(), &set_val(), val("old"), t(5)).await.unwrap_err();
                assert_eq!(e.stale().map(|s| (s.presented, s.current)), Some((t(5), t(6))));
                old.rollback().await.unwrap();
                assert_eq!(row(&pool, &table, "a").await, Some(("new".to_owned(), 6)));
                assert_eq!(count(&pool, &audit).await, 0);
            }

            /// The negative control: the same two holders, the old one
            /// reading, pausing past its lease and writing after the newer
            /// one, with a plain UPDATE: the newer holder's update is lost
            /// (the row ends with the older token's value). With the fenced
            /// update in the same interleaving, the late write is refused.
            #[tokio::test]
            async fn without_the_fence_check_the_newer_update_is_lost() {
                let (_keep, pool) = $pool().await;
                let (table, fenced) = user_table(&pool, "lost_update").await;
                let plain = format!("UPDATE {table} SET val = {}, fence = 5 WHERE id = 'a'", $p1);

                // Unfenced: the old holder read, then paused past its lease.
                let seen = row(&pool, &table, "a").await.unwrap();
                assert_eq!(seen.0, "v0");
                fenced.update(&pool, "a".to_owned(), &set_val(), val("new"), t(6)).await.unwrap();
                sqlx::query(&plain).bind("old").execute(&pool).await.unwrap();
                let after = row(&pool, &table, "a").await.unwrap();
                assert_eq!(after, ("old".to_owned(), 5), "the control did not lose the update");

                // Fenced, same interleaving: the late write is refused.
                fenced.update(&pool, "a".to_owned(), &set_val(), val("new"), t(6)).await.unwrap();
                let e = fenced.update(&pool, "a".to_owned(), &set_val(), val("old"), t(5)).await.unwrap_err();
                assert!(e.is_stale(), "{e:?}");
                assert_eq!(row(&pool, &table, "a").await, Some(("new".to_owned(), 6)));
            }

            /// Many tasks insert the same absent key at once, each with its
            /// own token: one row, inserted once; every other task either
            /// records its token on it or is refused as stale; the largest
            /// token is never refused and ends as the fence.
            #[tokio::test]
            async fn concurrent_insert_if_absent_inserts_once() {
                let (_keep, pool) = $pool().await;
                let (table, fenced) = user_table(&pool, "insert_race").await;
                let tasks: Vec<_> = (1..=16_u64)
                    .map(|n| {
                        let (pool, fenced) = (pool.clone(), fenced.clone());
                        tokio::spawn(async move {
                            let outcome = fenced
                                .insert_if_absent(&pool, "m".to_owned(), "val", val(&format!("by {n}")), t(n))
                                .await;
                            (n, outcome)
                        })
                    })
                    .collect();
                let (mut new, mut existing, mut stale) = (Vec::new(), 0, 0);
                for task in tasks {
                    match task.await.unwrap() {
                        (n, Ok(Inserted::New)) => new.push(n),
                        (_, Ok(Inserted::Existing)) => existing += 1,
                        (16, Err(e)) => panic!("the largest token was refused: {e:?}"),
                        (_, Err(e)) if e.is_stale() => stale += 1,
                        (n, Err(e)) => panic!("task {n}: {e:?}"),
                    }
                }
                assert_eq!(new.len(), 1, "inserted by {new:?}");
                assert_eq!(1 + existing + stale, 16);
                let (value, fence) = row(&pool, &table, "m").await.unwrap();
                assert_eq!(value, format!("by {}", new[0]));
                assert_eq!(fence, 16);
                assert_eq!(count(&pool, &table).await, 2);
            }

            #[tokio::test]
            async fn the_schema_check_refuses_a_narrow_or_missing_fence_column() {
                let (_keep, pool) = $pool().await;
                let table = name("narrow");
                exec(&pool, &format!("DROP TABLE IF EXISTS {table}")).await;
                exec(&pool, &format!("CREATE TABLE {table} (id VARCHAR(64) PRIMARY KEY, fence REAL, small INT, big BIGINT)")).await;
                let e = FencedTable::new(&table, "id", "fence").unwrap().check_schema(&pool).await.unwrap_err();
                match source::<SchemaError>(&e) {
                    SchemaError::NarrowFence { column, found, .. } => {
                        assert_eq!(column, "fence");
                        assert!(!found.is_empty());
                    }
                    other => panic!("{other:?}"),
                }
                let e = FencedTable::new(&table, "id", "missing").unwrap().check_schema(&pool).await.unwrap_err();
                assert!(matches!(source::<SchemaError>(&e), SchemaError::NoSuchColumn { .. }), "{e:?}");
                let e = FencedTable::new(&name("no_such_table"), "id", "fence").unwrap().check_schema(&pool).await.unwrap_err();
                assert!(matches!(source::<SchemaError>(&e), SchemaError::NoSuchColumn { .. }), "{e:?}");
                FencedTable::new(&table, "id", "big").unwrap().check_schema(&pool).await.unwrap();
                if PREFIX != "t_sqlite" {
                    // SQLite's INT is 64-bit; elsewhere it stops at 2^31.
                    let e = FencedTable::new(&table, "id", "small").unwrap().check_schema(&pool).await.unwrap_err();
                    assert!(matches!(source::<SchemaError>(&e), SchemaError::NarrowFence { .. }), "{e:?}");
                }
            }

            #[tokio::test]
            async fn failures_name_the_statement_and_large_tokens_are_typed() {
                let (_keep, pool) = $pool().await;
                let missing = FencedTable::new(&name("missing_table"), "id", "fence").unwrap();
                let e = missing.update(&pool, "a".to_owned(), &set_val(), val("x"), t(1)).await.unwrap_err();
                let failed = source::<StatementError>(&e);
                assert_eq!(failed.statement, Statement::Update);
                assert_eq!(failed.table, name("missing_table"));
                let e = missing.insert_if_absent(&pool, "a".to_owned(), "", <$args>::default(), t(1)).await.unwrap_err();
                assert_eq!(source::<StatementError>(&e).statement, Statement::Insert);
                let store = FencedStore::new(&name("missing_store")).unwrap();
                let e = store.write(&pool, "k", b"v", t(1)).await.unwrap_err();
                assert_eq!(source::<StatementError>(&e).statement, Statement::Write);
                let e = store.read(&pool, "k").await.unwrap_err();
                assert_eq!(source::<StatementError>(&e).statement, Statement::Read);

                let store = store_for_range(&pool).await;
                let huge = t(u64::MAX);
                let e = store.write(&pool, "k", b"v", huge).await.unwrap_err();
                assert_eq!(
                    source::<redfence::sqlx::FenceRangeError>(&e),
                    &redfence::sqlx::FenceRangeError::TokenTooLarge(huge)
                );
                assert_eq!(store.read(&pool, "k").await.unwrap(), None);
                assert!(FencedTable::new("a; DROP TABLE x", "id", "fence").is_err());
            }

            /// Each call is bounded: a fenced update waiting on another
            /// transaction's lock (the database's, on SQLite) past the
            /// bound is `StoreError::Timeout`. The driver stops waiting but
            /// does not cancel: the statement may still land once the lock
            /// is free (it did on PostgreSQL and MariaDB here), still
            /// fenced, which is why a transaction is rolled back after a
            /// timeout.
            #[tokio::test]
            async fn a_fenced_update_blocked_by_a_lock_times_out() {
                let (_keep, pool) = $pool().await;
                let (table, fenced) = user_table(&pool, "blocked").await;
                let mut holder = pool.begin().await.unwrap();
                fenced.update(&mut *holder, "a".to_owned(), &set_val(), val("held"), t(3)).await.unwrap();
                let short = fenced.clone().timeout(ms(300));
                let started = Instant::now();
                let e = short.update(&pool, "a".to_owned(), &set_val(), val("blocked"), t(4)).await.unwrap_err();
                assert!(matches!(e, redfence::StoreError::Timeout(d) if d == ms(300)), "{e:?}");
                assert!(started.elapsed() < secs(10), "{:?}", started.elapsed());
                holder.rollback().await.unwrap();
                let after = row(&pool, &table, "a").await.unwrap();
                assert!(
                    after == ("v0".to_owned(), 0) || after == ("blocked".to_owned(), 4),
                    "{after:?}"
                );
            }

            /// `insert_if_absent` whose INSERT meets a duplicate in another
            /// unique index: typed, never a wrong `Existing`. MySQL's plain
            /// INSERT reports a duplicate whichever index it hit, and no
            /// row with the key is there: `Vanished`. PostgreSQL's and
            /// SQLite's `ON CONFLICT (key)` covers only the key: the other
            /// index's violation is the INSERT's error.
            #[tokio::test]
            async fn a_duplicate_in_another_unique_index_is_typed() {
                let (_keep, pool) = $pool().await;
                let table = name("other_unique");
                exec(&pool, &format!("DROP TABLE IF EXISTS {table}")).await;
                exec(&pool, &format!("CREATE TABLE {table} (id VARCHAR(64) PRIMARY KEY, email VARCHAR(64) UNIQUE, fence BIGINT NOT NULL DEFAULT 0)")).await;
                exec(&pool, &format!("INSERT INTO {table} (id, email) VALUES ('x', 'e@x')")).await;
                let fenced = FencedTable::new(&table, "id", "fence").unwrap();
                let e = fenced.insert_if_absent(&pool, "y".to_owned(), "email", val("e@x"), t(2)).await.unwrap_err();
                if PREFIX == "t_mysql" {
                    let vanished = source::<redfence::sqlx::Vanished>(&e);
                    assert_eq!((vanished.table.as_str(), vanished.key.as_str()), (table.as_str(), "y"));
                } else {
                    assert_eq!(source::<StatementError>(&e).statement, Statement::Insert);
                }
                assert_eq!(count(&pool, &table).await, 1);
            }

            async fn store_for_range(pool: &Pool<$db>) -> FencedStore {
                store(pool, "range").await
            }
        }
    };
}

backend_tests! {
    mod postgres;
    feature: "sqlx-postgres";
    backend: redfence::sqlx::postgres;
    db: sqlx::Postgres;
    args: sqlx::postgres::PgArguments;
    pool: postgres_pool;
    p1: "$1";
}

backend_tests! {
    mod mysql;
    feature: "sqlx-mysql";
    backend: redfence::sqlx::mysql;
    db: sqlx::MySql;
    args: sqlx::mysql::MySqlArguments;
    pool: mysql_pool;
    p1: "?";
}

backend_tests! {
    mod sqlite;
    feature: "sqlx-sqlite";
    backend: redfence::sqlx::sqlite;
    db: sqlx::Sqlite;
    args: sqlx::sqlite::SqliteArguments<'static>;
    pool: sqlite_pool;
    p1: "?1";
}

/// PostgreSQL under `REPEATABLE READ`: the old holder's transaction took its
/// snapshot before the newer holder committed; its fenced update of the
/// row the newer one changed is a serialization failure (a
/// `StatementError` naming the UPDATE, to retry as usual), not a write.
#[cfg(feature = "sqlx-postgres")]
#[tokio::test]
async fn postgres_repeatable_read_turns_the_refusal_into_a_serialization_failure() {
    use redfence::sqlx::postgres::FencedTable;
    use redfence::sqlx::{Statement, StatementError};
    use sqlx::Arguments;

    let (_keep, pool) = postgres_pool().await;
    sqlx::query("DROP TABLE IF EXISTS t_pg_rr")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "CREATE TABLE t_pg_rr (id text PRIMARY KEY, val text, fence bigint NOT NULL DEFAULT 0)",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO t_pg_rr (id, val) VALUES ('a', 'v0')")
        .execute(&pool)
        .await
        .unwrap();
    let fenced = FencedTable::new("t_pg_rr", "id", "fence").unwrap();
    let args = |v: &str| {
        let mut a = sqlx::postgres::PgArguments::default();
        a.add(v.to_owned()).unwrap();
        a
    };

    let mut old = pool.begin().await.unwrap();
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *old)
        .await
        .unwrap();
    let seen: String = sqlx::query_scalar("SELECT val FROM t_pg_rr WHERE id = 'a'")
        .fetch_one(&mut *old)
        .await
        .unwrap();
    assert_eq!(seen, "v0");
    fenced
        .update(&pool, "a", "val = $1", args("new"), t(6))
        .await
        .unwrap();
    let e = fenced
        .update(&mut *old, "a", "val = $1", args("old"), t(5))
        .await
        .unwrap_err();
    let failed = source::<StatementError>(&e);
    assert_eq!(failed.statement, Statement::Update);
    let code = failed
        .source
        .as_database_error()
        .and_then(|d| d.code())
        .unwrap_or_default();
    assert_eq!(code, "40001", "{e:?}"); // serialization_failure
    drop(old);
    let row: (String, i64) = sqlx::query_as("SELECT val, fence FROM t_pg_rr WHERE id = 'a'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(row, ("new".to_owned(), 6));
}

/// MySQL under InnoDB's default `REPEATABLE READ`: the old holder's
/// transaction read the row (its snapshot) before the newer holder
/// committed. Its fenced update is refused, and the fence lookup, a locking
/// read, reports the newest fence: `Stale` with 6. A plain `SELECT` there
/// would read the snapshot (fence 0) and answer "no row", 0.
#[cfg(feature = "sqlx-mysql")]
#[tokio::test]
async fn mysql_repeatable_read_refusal_reports_the_newest_fence() {
    use redfence::sqlx::mysql::FencedTable;
    use sqlx::Arguments;

    let (_keep, pool) = mysql_pool().await;
    sqlx::query("DROP TABLE IF EXISTS t_my_rr")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE t_my_rr (id VARCHAR(8) PRIMARY KEY, val TEXT, fence BIGINT NOT NULL DEFAULT 0)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO t_my_rr (id, val) VALUES ('a', 'v0')")
        .execute(&pool)
        .await
        .unwrap();
    let fenced = FencedTable::new("t_my_rr", "id", "fence").unwrap();
    let args = |v: &str| {
        let mut a = sqlx::mysql::MySqlArguments::default();
        a.add(v.to_owned()).unwrap();
        a
    };

    let mut old = pool.begin().await.unwrap();
    let isolation: String = sqlx::query_scalar("SELECT @@tx_isolation")
        .fetch_one(&mut *old)
        .await
        .unwrap();
    assert_eq!(isolation, "REPEATABLE-READ");
    let seen: i64 = sqlx::query_scalar("SELECT fence FROM t_my_rr WHERE id = 'a'")
        .fetch_one(&mut *old)
        .await
        .unwrap();
    assert_eq!(seen, 0);
    fenced
        .update(&pool, "a", "val = ?", args("new"), t(6))
        .await
        .unwrap();
    // The snapshot still shows the old fence...
    let snapshot: i64 = sqlx::query_scalar("SELECT fence FROM t_my_rr WHERE id = 'a'")
        .fetch_one(&mut *old)
        .await
        .unwrap();
    assert_eq!(snapshot, 0);
    // ...and the refusal reports the newest one.
    let e = fenced
        .update(&mut *old, "a", "val = ?", args("old"), t(5))
        .await
        .unwrap_err();
    assert_eq!(
        e.stale().map(|s| (s.presented, s.current)),
        Some((t(5), t(6))),
        "{e:?}"
    );
    old.rollback().await.unwrap();
}

/// SQLite in WAL mode: a deferred transaction that read before another
/// connection committed cannot write on its old snapshot. Its fenced update
/// fails at once (`SQLITE_BUSY_SNAPSHOT`, no waiting for `busy_timeout`):
/// a `StatementError` naming the UPDATE, to retry like a serialization
/// failure; hence "begin writing transactions with the fenced write, or
/// `BEGIN IMMEDIATE`".
#[cfg(feature = "sqlx-sqlite")]
#[tokio::test]
async fn sqlite_a_deferred_transaction_that_read_first_is_busy_at_once() {
    use redfence::sqlx::sqlite::FencedTable;
    use redfence::sqlx::{Statement, StatementError};
    use sqlx::Arguments;

    let dir = crate::support::process::TempDir::new("sqlite-wal");
    std::fs::create_dir(dir.path()).unwrap();
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.join("db.sqlite"))
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(secs(20));
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap();
    sqlx::query(
        "CREATE TABLE t_wal (id TEXT PRIMARY KEY, val TEXT, fence INTEGER NOT NULL DEFAULT 0)",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO t_wal (id, val) VALUES ('a', 'v0')")
        .execute(&pool)
        .await
        .unwrap();
    let fenced = FencedTable::new("t_wal", "id", "fence")
        .unwrap()
        .timeout(secs(30));
    let args = |v: &str| {
        let mut a = sqlx::sqlite::SqliteArguments::default();
        a.add(v.to_owned()).unwrap();
        a
    };

    let mut old = pool.begin().await.unwrap();
    let seen: String = sqlx::query_scalar("SELECT val FROM t_wal WHERE id = 'a'")
        .fetch_one(&mut *old)
        .await
        .unwrap();
    assert_eq!(seen, "v0");
    fenced
        .update(&pool, "a".to_owned(), "val = ?1", args("new"), t(6))
        .await
        .unwrap();
    let started = Instant::now();
    let e = fenced
        .update(&mut *old, "a".to_owned(), "val = ?1", args("old"), t(5))
        .await
        .unwrap_err();
    let failed = source::<StatementError>(&e);
    assert_eq!(failed.statement, Statement::Update);
    let code = failed
        .source
        .as_database_error()
        .and_then(|d| d.code())
        .unwrap_or_default();
    assert_eq!(code, "517", "{e:?}"); // SQLITE_BUSY_SNAPSHOT
    assert!(
        started.elapsed() < secs(10),
        "it waited: {:?}",
        started.elapsed()
    );
    drop(old);
    let row: (String, i64) = sqlx::query_as("SELECT val, fence FROM t_wal WHERE id = 'a'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(row, ("new".to_owned(), 6));
}
