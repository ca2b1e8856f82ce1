//! The PostgreSQL fenced store and fenced table against a real server
//! (feature `postgres`): the acceptance rule (first, higher and equal
//! tokens accepted, lower refused with both tokens and nothing changed),
//! concurrent writers, writes inside transactions (rolled back; a late
//! commit ordered by the row lock; a stale holder refused), and every
//! documented error provoked. Tokens are built by hand: which token wins is
//! the store's business, not the lock's.
//!
//! The tests share one server per process (`PgServer::shared`) and isolate
//! themselves by table name, so every test's table name is its own.

use std::sync::Arc;
use std::time::Instant;

use redfence::postgres::{FenceRangeError, FencedTable, NameProblem, PgFencedStore};
use redfence::{FencingToken, StoreError};
// Through the re-export: the version the store is built on.
use redfence::tokio_postgres::{self, Client, NoTls};

use crate::helpers::{assert_message_style, ms, secs};
use crate::support::postgres::PgServer;

fn t(n: u64) -> FencingToken {
    FencingToken::new(n)
}

/// A connection of its own, as a separate host would have. Bounded: the
/// server is local, so a slow connect is a broken test setup.
async fn connect(server: &PgServer) -> Client {
    let (client, connection) =
        tokio::time::timeout(secs(10), tokio_postgres::connect(&server.url(), NoTls))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "connecting to {} timed out\n{}",
                    server.url(),
                    server.logs()
                )
            })
            .unwrap_or_else(|e| panic!("connecting to {}: {e}\n{}", server.url(), server.logs()));
    // Ends when `client` is dropped (or the server stops).
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// The shared server and a connection to it.
async fn connected() -> (Arc<PgServer>, Client) {
    let server = PgServer::shared();
    let client = connect(&server).await;
    (server, client)
}

/// The shared server, a connection, and a fresh store on `table`.
async fn setup(table: &str) -> (Arc<PgServer>, Client, PgFencedStore) {
    let (server, client) = connected().await;
    let store = PgFencedStore::new(table).unwrap().timeout(secs(5));
    store.create_table(&client).await.unwrap();
    (server, client, store)
}

async fn read(store: &PgFencedStore, client: &Client, id: &str) -> Option<(Vec<u8>, u64)> {
    store
        .read(client, id)
        .await
        .unwrap()
        .map(|f| (f.value, f.token.get()))
}

fn backend_source(e: &StoreError) -> &(dyn std::error::Error + Send + Sync + 'static) {
    match e {
        StoreError::Backend(source) => source.as_ref(),
        other => panic!("expected a backend error, got {other:?}"),
    }
}

#[tokio::test]
async fn create_table_is_idempotent_and_makes_the_documented_columns() {
    let (_server, client, store) = setup("pg_create").await;
    store.create_table(&client).await.unwrap();
    let rows = client
        .query(
            "SELECT column_name::text, data_type::text, is_nullable::text \
             FROM information_schema.columns WHERE table_name = 'pg_create' \
             ORDER BY ordinal_position",
            &[],
        )
        .await
        .unwrap();
    let columns: Vec<(String, String, String)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let expect = |name: &str, ty: &str| (name.to_owned(), ty.to_owned(), "NO".to_owned());
    assert_eq!(
        columns,
        [
            expect("id", "text"),
            expect("value", "bytea"),
            expect("fence", "bigint")
        ]
    );
    assert_eq!(store.table(), "pg_create");
}

#[tokio::test]
async fn first_write_is_accepted_and_read_back() {
    let (_server, client, store) = setup("pg_first").await;
    assert_eq!(read(&store, &client, "k").await, None);
    store.write(&client, "k", b"v1", t(10)).await.unwrap();
    assert_eq!(read(&store, &client, "k").await, Some((b"v1".to_vec(), 10)));
    // Keys are independent: a new key accepts any token, even a lower one.
    store.write(&client, "other", b"x", t(3)).await.unwrap();
    assert_eq!(
        read(&store, &client, "other").await,
        Some((b"x".to_vec(), 3))
    );
    // Arbitrary bytes survive the round trip.
    let bytes: Vec<u8> = (0..=255).collect();
    store.write(&client, "bytes", &bytes, t(1)).await.unwrap();
    assert_eq!(read(&store, &client, "bytes").await, Some((bytes, 1)));
}

#[tokio::test]
async fn higher_token_is_accepted() {
    let (_server, client, store) = setup("pg_higher").await;
    store.write(&client, "k", b"v1", t(10)).await.unwrap();
    store.write(&client, "k", b"v2", t(11)).await.unwrap();
    assert_eq!(read(&store, &client, "k").await, Some((b"v2".to_vec(), 11)));
    // Gaps are fine: tokens are increasing, not consecutive.
    store.write(&client, "k", b"v3", t(1 << 52)).await.unwrap();
    assert_eq!(
        read(&store, &client, "k").await,
        Some((b"v3".to_vec(), 1 << 52))
    );
}

/// Tokens are unique per acquisition, so an equal token is the same holder
/// writing again within its critical section.
#[tokio::test]
async fn equal_token_is_accepted_again() {
    let (_server, client, store) = setup("pg_equal").await;
    store.write(&client, "k", b"v1", t(10)).await.unwrap();
    store.write(&client, "k", b"v2", t(10)).await.unwrap();
    assert_eq!(read(&store, &client, "k").await, Some((b"v2".to_vec(), 10)));
}

#[tokio::test]
async fn lower_token_is_refused_with_both_tokens_and_changes_nothing() {
    let (_server, client, store) = setup("pg_lower").await;
    store.write(&client, "k", b"new", t(11)).await.unwrap();
    let e = store.write(&client, "k", b"late", t(10)).await.unwrap_err();
    assert!(e.is_stale(), "{e:?}");
    let stale = e.stale().unwrap();
    assert_eq!(
        (stale.key.as_str(), stale.presented, stale.current),
        ("k", t(10), t(11))
    );
    assert_eq!(
        e.to_string(),
        "stale fencing token 10 for \"k\": it has already accepted 11"
    );
    assert_message_style(&e.to_string());
    assert_eq!(
        read(&store, &client, "k").await,
        Some((b"new".to_vec(), 11))
    );
    // Refused again after the refusal: the refusal did not lower anything.
    assert!(store
        .write(&client, "k", b"late", t(10))
        .await
        .unwrap_err()
        .is_stale());
    store.write(&client, "k", b"newer", t(11)).await.unwrap();
}

/// Many hosts write the same key at once, with tokens in random order: the
/// highest token's write is accepted wherever it falls, every refusal
/// names a larger token, and the row ends with the highest token's value.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_end_with_the_highest_tokens_value() {
    const WRITERS: u64 = 12;
    const ROUNDS: usize = 5;
    let (server, client, store) = setup("pg_concurrent").await;
    let mut clients = Vec::new();
    for _ in 0..WRITERS {
        clients.push(Arc::new(connect(&server).await));
    }
    for round in 0..ROUNDS {
        let key = format!("round-{round}");
        let mut tokens: Vec<u64> = (1..=WRITERS).map(|i| 100 * i).collect();
        shuffle(&mut tokens, round);
        let barrier = Arc::new(tokio::sync::Barrier::new(tokens.len()));
        let mut tasks = Vec::new();
        for (token, client) in tokens.iter().copied().zip(&clients) {
            let (store, client, barrier, key) =
                (store.clone(), client.clone(), barrier.clone(), key.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let value = format!("written with {token}");
                (
                    token,
                    store.write(client.as_ref(), &key, value, t(token)).await,
                )
            }));
        }
        for task in tasks {
            match task.await.unwrap() {
                (_, Ok(())) => {}
                (token, Err(StoreError::Stale(s))) => {
                    assert_eq!(s.presented, t(token));
                    assert!(s.current > s.presented, "{s:?}");
                    assert_ne!(token, 100 * WRITERS, "the highest token was refused");
                }
                (token, Err(e)) => panic!("writer {token}: {e:?}"),
            }
        }
        let last = 100 * WRITERS;
        assert_eq!(
            read(&store, &client, &key).await,
            Some((format!("written with {last}").into_bytes(), last)),
            "round {round}"
        );
    }
}

/// A small deterministic shuffle, so that a failing order can be replayed.
fn shuffle(items: &mut [u64], seed: usize) {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ (seed as u64);
    for i in (1..items.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        items.swap(i, (state % (i as u64 + 1)) as usize);
    }
}

#[tokio::test]
async fn a_write_in_a_rolled_back_transaction_leaves_nothing() {
    let (server, mut client, store) = setup("pg_rollback").await;
    let other = connect(&server).await;
    let tx = client.transaction().await.unwrap();
    store.write(&tx, "k", b"v", t(50)).await.unwrap();
    // Visible inside the transaction, not outside before the commit.
    assert_eq!(store.read(&tx, "k").await.unwrap().unwrap().token, t(50));
    assert_eq!(read(&store, &other, "k").await, None);
    tx.rollback().await.unwrap();
    assert_eq!(read(&store, &client, "k").await, None);
    // Nor did the fence advance: a lower token is still accepted.
    store.write(&client, "k", b"v2", t(10)).await.unwrap();
    assert_eq!(read(&store, &other, "k").await, Some((b"v2".to_vec(), 10)));
}

/// "The lock was released before the transaction committed": the old
/// holder's fenced write came first, so it row-locks the row until its
/// commit; the new holder's write waits for that commit and then follows
/// it. The row's history is in token order.
#[tokio::test]
async fn a_late_commit_is_ordered_before_the_newer_holders_write() {
    let (server, mut client, store) = setup("pg_late_commit").await;
    store.write(&client, "k", b"v0", t(1)).await.unwrap();
    let old = client.transaction().await.unwrap();
    store.write(&old, "k", b"old holder", t(5)).await.unwrap();

    // The old holder's lease ends here; a new holder writes with token 6.
    let newer = connect(&server).await;
    let (store2, started) = (store.clone(), Instant::now());
    let new_write = tokio::spawn(async move {
        let outcome = store2.write(&newer, "k", b"new holder", t(6)).await;
        (outcome, started.elapsed())
    });
    tokio::time::sleep(ms(300)).await;
    assert!(
        !new_write.is_finished(),
        "the newer write did not wait for the row lock"
    );
    old.commit().await.unwrap();

    let (outcome, waited) = new_write.await.unwrap();
    outcome.unwrap();
    assert!(waited >= ms(300), "{waited:?}");
    assert_eq!(
        read(&store, &client, "k").await,
        Some((b"new holder".to_vec(), 6))
    );
}

/// The other order: the newer holder committed first, so the old holder's
/// fenced write inside its transaction is refused, and its rollback also
/// undoes the work it did before.
#[tokio::test]
async fn a_stale_holder_is_refused_inside_its_transaction_and_rolls_back() {
    let (server, mut client, store) = setup("pg_stale_tx").await;
    client
        .batch_execute("CREATE TABLE pg_stale_tx_audit (note text)")
        .await
        .unwrap();
    let newer = connect(&server).await;
    store.write(&newer, "k", b"new holder", t(6)).await.unwrap();

    let old = client.transaction().await.unwrap();
    old.execute(
        "INSERT INTO pg_stale_tx_audit VALUES ('old holder was here')",
        &[],
    )
    .await
    .unwrap();
    let e = store
        .write(&old, "k", b"old holder", t(5))
        .await
        .unwrap_err();
    let stale = e.stale().unwrap_or_else(|| panic!("expected stale: {e:?}"));
    assert_eq!((stale.presented, stale.current), (t(5), t(6)));
    old.rollback().await.unwrap();

    assert_eq!(
        read(&store, &client, "k").await,
        Some((b"new holder".to_vec(), 6))
    );
    let audit = client
        .query_one("SELECT count(*) FROM pg_stale_tx_audit", &[])
        .await
        .unwrap();
    assert_eq!(audit.get::<_, i64>(0), 0);
}

#[tokio::test]
async fn invalid_table_names_are_typed_errors_not_sql() {
    let cases = [
        ("", NameProblem::Empty),
        ("public.", NameProblem::Empty),
        ("t; DROP TABLE pg_victim; --", NameProblem::Character(';')),
        ("t\"; DROP TABLE pg_victim; --", NameProblem::Character('"')),
        ("a.b.c", NameProblem::Character('.')),
        ("9lives", NameProblem::LeadingDigit),
    ];
    for (name, problem) in cases {
        let e = PgFencedStore::new(name).unwrap_err();
        assert_eq!((e.name.as_str(), e.problem), (name, problem));
        assert_message_style(&e.to_string());
        let e = FencedTable::new(name, "id", "fence").unwrap_err();
        assert_eq!(e.problem, problem, "{name:?}");
    }
    let e = PgFencedStore::new(&"x".repeat(64)).unwrap_err();
    assert_eq!(e.problem, NameProblem::TooLong);
    let e = FencedTable::new("t", "id; --", "fence").unwrap_err();
    assert_eq!(
        (e.name.as_str(), e.problem),
        ("id; --", NameProblem::Character(';'))
    );
    let e = FencedTable::new("t", "id", "").unwrap_err();
    assert_eq!(e.problem, NameProblem::Empty);

    // Valid names are quoted, so a reserved word works, and mean what they
    // would unquoted: folded to lowercase.
    let (_server, client) = connected().await;
    let store = PgFencedStore::new("Public.Order").unwrap();
    store.create_table(&client).await.unwrap();
    store.write(&client, "k", b"v", t(1)).await.unwrap();
    let row = client
        .query_one("SELECT fence FROM public.\"order\" WHERE id = 'k'", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 1);
}

#[tokio::test]
async fn a_token_above_i64_max_is_a_typed_error_and_writes_nothing() {
    let (_server, client, store) = setup("pg_too_large").await;
    let too_large = t(i64::MAX.unsigned_abs() + 1);
    let e = store
        .write(&client, "k", b"v", too_large)
        .await
        .unwrap_err();
    assert_eq!(
        backend_source(&e).downcast_ref::<FenceRangeError>(),
        Some(&FenceRangeError::TokenTooLarge(too_large))
    );
    assert_message_style(&backend_source(&e).to_string());
    assert_eq!(read(&store, &client, "k").await, None);

    client
        .batch_execute("CREATE TABLE pg_too_large_orders (id bigint PRIMARY KEY, fence bigint)")
        .await
        .unwrap();
    let orders = FencedTable::new("pg_too_large_orders", "id", "fence").unwrap();
    let e = orders
        .update(&client, &1_i64, "", &[], t(u64::MAX))
        .await
        .unwrap_err();
    assert!(matches!(
        backend_source(&e).downcast_ref::<FenceRangeError>(),
        Some(FenceRangeError::TokenTooLarge(_))
    ));
    // The largest bigint itself is a valid token.
    store
        .write(&client, "k", b"max", t(i64::MAX.unsigned_abs()))
        .await
        .unwrap();
}

/// A negative fence is no token. The store's own table forbids one with a
/// CHECK, so this one is created by hand, as a table of the same shape
/// made before `create_table` would be.
#[tokio::test]
async fn a_negative_fence_is_a_typed_error() {
    let (_server, client) = connected().await;
    client
        .batch_execute(
            "CREATE TABLE pg_negative (id text PRIMARY KEY, value bytea NOT NULL, fence bigint NOT NULL); \
             INSERT INTO pg_negative VALUES ('k', 'v', -1)",
        )
        .await
        .unwrap();
    let store = PgFencedStore::new("pg_negative").unwrap();
    let e = store.read(&client, "k").await.unwrap_err();
    assert_eq!(
        backend_source(&e).downcast_ref::<FenceRangeError>(),
        Some(&FenceRangeError::NegativeFence {
            key: "k".into(),
            fence: -1
        })
    );
    assert_message_style(&backend_source(&e).to_string());
}

/// The server fails (here: no such table): a backend error carrying the
/// driver's error, with its SQLSTATE.
#[tokio::test]
async fn a_server_error_is_a_backend_error() {
    let (_server, client) = connected().await;
    let store = PgFencedStore::new("pg_never_created").unwrap();
    let e = store.write(&client, "k", b"v", t(1)).await.unwrap_err();
    let db = backend_source(&e)
        .downcast_ref::<tokio_postgres::Error>()
        .and_then(tokio_postgres::Error::as_db_error)
        .unwrap_or_else(|| panic!("expected a database error: {e:?}"));
    assert_eq!(db.code(), &tokio_postgres::error::SqlState::UNDEFINED_TABLE);
    assert_eq!(e.to_string(), "fenced store backend error");
}

/// Another session holds the row lock (as an open transaction of a slow
/// holder would): the write is bounded by the store's timeout. The
/// statement was not cancelled, so it lands once the lock is gone: "may or
/// may not have been applied", as documented.
#[tokio::test]
async fn a_write_blocked_by_a_row_lock_times_out() {
    let (server, client, store) = setup("pg_timeout").await;
    store.write(&client, "k", b"v1", t(1)).await.unwrap();
    let mut blocker = connect(&server).await;
    let lock = blocker.transaction().await.unwrap();
    lock.query("SELECT 1 FROM pg_timeout WHERE id = 'k' FOR UPDATE", &[])
        .await
        .unwrap();

    let short = store.clone().timeout(ms(200));
    let started = Instant::now();
    let e = short.write(&client, "k", b"v2", t(2)).await.unwrap_err();
    let elapsed = started.elapsed();
    assert!(matches!(e, StoreError::Timeout(d) if d == ms(200)), "{e:?}");
    assert!(elapsed >= ms(200) && elapsed < secs(2), "{elapsed:?}");
    assert_eq!(e.to_string(), "fenced store did not answer within 200ms");

    lock.rollback().await.unwrap();
    // The connection is still usable, and the write landed after all.
    let deadline = Instant::now() + secs(5);
    loop {
        let now = read(&store, &client, "k").await;
        if now == Some((b"v2".to_vec(), 2)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the timed-out write never landed: {now:?}"
        );
        tokio::time::sleep(ms(20)).await;
    }
}

/// A table of the user's own, with a key of another type and a fence
/// column: the recipe run by `FencedTable::update`.
#[tokio::test]
async fn fenced_table_updates_follow_the_same_rule() {
    let (server, client) = connected().await;
    client
        .batch_execute(
            "CREATE TABLE pg_orders (id bigint PRIMARY KEY, status text NOT NULL, note text, \
             fence bigint NOT NULL DEFAULT 0); \
             INSERT INTO pg_orders (id, status) VALUES (1, 'new'), (2, 'new')",
        )
        .await
        .unwrap();
    let orders = FencedTable::new("pg_orders", "id", "fence")
        .unwrap()
        .timeout(secs(5));
    let row = |id: i64| {
        let client = &client;
        async move {
            let r = client
                .query_one(
                    "SELECT status, note, fence FROM pg_orders WHERE id = $1",
                    &[&id],
                )
                .await
                .unwrap();
            (
                r.get::<_, String>(0),
                r.get::<_, Option<String>>(1),
                r.get::<_, i64>(2),
            )
        }
    };

    // Accepted: the caller's parameters, then the token.
    let n = orders
        .update(
            &client,
            &1_i64,
            "status = $1, note = $2",
            &[&"paid", &"first"],
            t(10),
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(row(1).await, ("paid".into(), Some("first".into()), 10));
    // Equal and higher accepted; an empty assignment list only records
    // the token.
    orders
        .update(&client, &1_i64, "note = $1", &[&"again"], t(10))
        .await
        .unwrap();
    orders
        .update(&client, &1_i64, "", &[], t(12))
        .await
        .unwrap();
    assert_eq!(row(1).await, ("paid".into(), Some("again".into()), 12));

    // Stale: refused with both tokens, nothing changed.
    let e = orders
        .update(&client, &1_i64, "status = $1", &[&"refunded"], t(11))
        .await
        .unwrap_err();
    let stale = e.stale().unwrap_or_else(|| panic!("expected stale: {e:?}"));
    assert_eq!(
        (stale.key.as_str(), stale.presented, stale.current),
        ("1", t(11), t(12))
    );
    assert_eq!(row(1).await, ("paid".into(), Some("again".into()), 12));

    // No such row: zero rows, not an error.
    let n = orders
        .update(&client, &99_i64, "status = $1", &[&"paid"], t(1))
        .await
        .unwrap();
    assert_eq!(n, 0);
    // Other rows are untouched by all of the above.
    assert_eq!(row(2).await, ("new".into(), None, 0));

    // Inside a transaction that rolls back: nothing stays.
    let mut own = connect(&server).await;
    let tx = own.transaction().await.unwrap();
    orders
        .update(&tx, &2_i64, "status = $1", &[&"paid"], t(20))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(row(2).await, ("new".into(), None, 0));
}

/// A fence column that allows NULL (added without a default) counts a NULL
/// as never written; a text key works like any other.
#[tokio::test]
async fn fenced_table_accepts_a_null_fence_and_text_keys() {
    let (_server, client) = connected().await;
    client
        .batch_execute(
            "CREATE TABLE pg_members (email text PRIMARY KEY, state text, version bigint); \
             INSERT INTO pg_members VALUES ('a@example.com', 'invited', NULL)",
        )
        .await
        .unwrap();
    let members = FencedTable::new("pg_members", "email", "version").unwrap();
    let n = members
        .update(&client, &"a@example.com", "state = $1", &[&"active"], t(3))
        .await
        .unwrap();
    assert_eq!(n, 1);
    let e = members
        .update(&client, &"a@example.com", "state = $1", &[&"left"], t(2))
        .await
        .unwrap_err();
    assert_eq!(
        e.stale().map(|s| (s.key.as_str(), s.current)),
        Some(("a@example.com", t(3)))
    );
}

#[tokio::test]
async fn a_fenced_update_blocked_by_a_row_lock_times_out() {
    let (server, client) = connected().await;
    client
        .batch_execute(
            "CREATE TABLE pg_update_timeout (id int PRIMARY KEY, fence bigint NOT NULL DEFAULT 0); \
             INSERT INTO pg_update_timeout VALUES (1)",
        )
        .await
        .unwrap();
    let mut blocker = connect(&server).await;
    let lock = blocker.transaction().await.unwrap();
    lock.query(
        "SELECT 1 FROM pg_update_timeout WHERE id = 1 FOR UPDATE",
        &[],
    )
    .await
    .unwrap();
    let table = FencedTable::new("pg_update_timeout", "id", "fence")
        .unwrap()
        .timeout(ms(150));
    let started = Instant::now();
    let e = table
        .update(&client, &1_i32, "", &[], t(1))
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Timeout(d) if d == ms(150)), "{e:?}");
    assert!(started.elapsed() < secs(2), "{:?}", started.elapsed());
    lock.rollback().await.unwrap();
}

/// Kleppmann's scenario end to end, with real tokens from a 3-node lock:
/// holder 1 stalls past its lease, holder 2 acquires and writes, holder 1
/// wakes and writes with its older token: PostgreSQL refuses it, and the
/// row keeps holder 2's value.
#[tokio::test]
async fn paused_lock_holder_is_refused_by_postgres() {
    let (_server, pg, store) = setup("kleppmann_pg").await;
    let cluster = crate::support::Cluster::start(3);
    let one = crate::helpers::warm_client(&cluster).await;
    let two = crate::helpers::warm_client(&cluster).await;

    let g1 = one.acquire("membership:42", ms(300)).await.unwrap();
    let t1 = g1.token().unwrap();
    tokio::time::sleep(ms(400)).await;
    assert!(!g1.lease().is_valid());

    let g2 = two.acquire("membership:42", secs(10)).await.unwrap();
    let t2 = g2.token().unwrap();
    assert!(t2 > t1);
    store.write(&pg, "42", b"from-2", t2).await.unwrap();

    let err = store.write(&pg, "42", b"from-1", t1).await.unwrap_err();
    let stale = err.stale().unwrap_or_else(|| panic!("{err}"));
    assert_eq!((stale.presented, stale.current), (t1, t2));
    let row = store.read(&pg, "42").await.unwrap().unwrap();
    assert_eq!((row.value.as_slice(), row.token), (&b"from-2"[..], t2));
    g2.release().await;
    drop(g1);
}

/// Two holders at once: holder 1's keys vanish early on a majority (a clock
/// jump there), so holder 2 is granted while holder 1 still trusts its
/// validity. Mutual exclusion is broken; the tokens still order them, and
/// PostgreSQL refuses the older holder's write that comes after the newer
/// one's.
#[tokio::test]
async fn two_holders_at_once_postgres_keeps_the_newer() {
    let (_server, pg, store) = setup("two_holders_pg").await;
    let cluster = crate::support::Cluster::start(3);
    let one = crate::helpers::warm_client(&cluster).await;
    let two = crate::helpers::warm_client(&cluster).await;

    let g1 = one.acquire("order:7", secs(30)).await.unwrap();
    let t1 = g1.token().unwrap();
    // Holder 1 may still be queued on the third node: wait until it holds
    // all three, then jump the clocks of two.
    let key = crate::helpers::lock_key("order:7");
    assert!(crate::helpers::landed(&cluster.nodes, "order:7", secs(5)).await);
    for node in &cluster.nodes[..2] {
        node.cli(&["DEL", &key]);
    }
    let g2 = two.try_acquire("order:7", secs(30)).await.unwrap().unwrap();
    let t2 = g2.token().unwrap();
    assert!(
        g1.lease().is_valid() && g2.lease().is_valid(),
        "two holders"
    );
    assert!(t2 > t1);

    store.write(&pg, "7", b"from-2", t2).await.unwrap();
    let err = store.write(&pg, "7", b"from-1", t1).await.unwrap_err();
    assert!(err.is_stale(), "{err}");
    let row = store.read(&pg, "7").await.unwrap().unwrap();
    assert_eq!(row.value, b"from-2");
    g2.release().await;
    g1.release().await;
}

/// The PostgreSQL stores' operations have the spans of the Redis one
/// (`fenced_write`, `fenced_read`) and `fenced_update`, with the outcome
/// and never the value written.
#[tokio::test]
async fn writes_reads_and_updates_have_spans_without_the_value() {
    let capture = crate::spans::Capture::default();
    let subscriber = capture.install();
    let (_server, client, store) = setup("pg_spans").await;
    let payload = "pg-payload-91ce";
    store.write(&client, "row-1", payload, t(5)).await.unwrap();
    let stale = store.write(&client, "row-1", payload, t(4)).await;
    assert!(stale.unwrap_err().is_stale());
    assert!(read(&store, &client, "row-1").await.is_some());
    client
        .batch_execute(
            "CREATE TABLE pg_spans_orders (id bigint PRIMARY KEY, note text, \
             fence bigint NOT NULL DEFAULT 0); \
             INSERT INTO pg_spans_orders (id) VALUES (1)",
        )
        .await
        .unwrap();
    let orders = FencedTable::new("pg_spans_orders", "id", "fence").unwrap();
    let updated = orders
        .update(&client, &1_i64, "note = $1", &[&payload], t(7))
        .await
        .unwrap();
    assert_eq!(updated, 1);
    drop(subscriber);

    let c = capture.captured();
    let writes = c.spans("fenced_write");
    let outcomes: Vec<Option<&str>> = writes.iter().map(|s| s.get("outcome")).collect();
    assert_eq!(outcomes, [Some("ok"), Some("stale")], "{}", c.text);
    let read = c.spans("fenced_read").pop().expect("the fenced_read span");
    assert_eq!(read.get("key"), Some("row-1"));
    assert_eq!(read.get("outcome"), Some("ok"));
    let update = c
        .spans("fenced_update")
        .pop()
        .expect("the fenced_update span");
    // The table as the SQL names it (a quoted identifier).
    assert_eq!(update.get("table"), Some("\"pg_spans_orders\""));
    assert_eq!(update.get("key"), Some("1"));
    assert_eq!(update.get("token"), Some("7"));
    assert_eq!(update.get("outcome"), Some("ok"));
    assert!(update.get("elapsed").is_some());
    assert!(!c.text.contains(payload), "a fenced value was traced");
}
