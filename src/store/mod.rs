//! A fencing-aware store on Redis: a value per key, written only by a token
//! at least as large as the largest the key has accepted, compared and
//! written atomically in one script. Also the error type that every fenced
//! store (this one, and the PostgreSQL one behind the `postgres` feature)
//! returns.
//!
//! Why `≥` and not `>`: tokens are unique per acquisition (DESIGN.md, "Fencing
//! tokens"), so an equal token can only be the same holder writing again
//! within its critical section, which must succeed; any earlier holder's
//! token is strictly lower and is rejected.

#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(any(
    feature = "postgres",
    feature = "sqlx-postgres",
    feature = "sqlx-mysql",
    feature = "sqlx-sqlite"
))]
pub(crate) mod sql;
#[cfg(any(
    feature = "sqlx-postgres",
    feature = "sqlx-mysql",
    feature = "sqlx-sqlite"
))]
pub mod sqlx;

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

use redis::Value;
use tracing::field::{self, Empty};
use tracing::{Instrument, Span};

use crate::logic::fence::FencingToken;
use crate::logic::limits::DEFAULT_STORE_TIMEOUT;
use crate::wire::scripts::{FENCED_READ, FENCED_WRITE};

/// A write carried a token lower than one the key has already accepted: its
/// writer's lease ran out and someone else has taken over. Nothing was
/// changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {presented} for {key:?}: it has already accepted {current}")]
#[non_exhaustive]
pub struct StaleToken {
    /// The key (or row id) written.
    pub key: String,
    /// The token the write carried.
    pub presented: FencingToken,
    /// The largest token the key had accepted when the write was refused.
    pub current: FencingToken,
}

impl StaleToken {
    /// A refusal of `presented` by `key`, which holds `current`: for
    /// stores outside the crate (a [`OnceStore`](crate::OnceStore)).
    pub fn new(key: impl Into<String>, presented: FencingToken, current: FencingToken) -> Self {
        Self {
            key: key.into(),
            presented,
            current,
        }
    }
}

/// Why a fenced write or read failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The token is older than one already accepted; nothing was written.
    #[error(transparent)]
    Stale(#[from] StaleToken),
    /// The store did not answer within its timeout. The write may or may not
    /// have been applied; retrying with the same token is safe (it is
    /// accepted again only if no later token has been).
    #[error("fenced store did not answer within {0:?}")]
    Timeout(Duration),
    /// The storage backend failed (connection, server error, unexpected
    /// reply, or a token it cannot represent).
    #[error("fenced store backend error")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl StoreError {
    /// Whether the write was refused for a stale token.
    pub fn is_stale(&self) -> bool {
        matches!(self, Self::Stale(_))
    }

    /// The refusal, when the write was refused for a stale token.
    pub fn stale(&self) -> Option<&StaleToken> {
        match self {
            Self::Stale(s) => Some(s),
            _ => None,
        }
    }

    pub(crate) fn backend(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Backend(Box::new(e))
    }
}

/// A value read back with the token that wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Fenced<T> {
    /// The value.
    pub value: T,
    /// The token of the write that stored it.
    pub token: FencingToken,
}

/// A fenced key-value store on one Redis server (any server: it need not be
/// one of the lock's nodes). Each key is a hash holding `value` and `fence`,
/// the largest token accepted; writes compare and set both in one script.
///
/// ```no_run
/// # async fn demo(guard: redfence::LockGuard) -> Result<(), Box<dyn std::error::Error>> {
/// let conn = redis::Client::open("redis://127.0.0.1:6379")?
///     .get_multiplexed_async_connection()
///     .await?;
/// let store = redfence::FencedStore::new(conn);
/// let token = guard.token().expect("fencing is on by default");
/// match store.write("membership:42", b"active", token).await {
///     Ok(()) => {}
///     Err(e) if e.is_stale() => { /* our lease ran out: someone else owns it now */ }
///     Err(e) => return Err(e.into()),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct FencedStore<C> {
    conn: C,
    timeout: Duration,
}

impl<C> fmt::Debug for FencedStore<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencedStore")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl<C> FencedStore<C>
where
    C: redis::aio::ConnectionLike + Clone + Send,
{
    /// A store on `conn`: a `redis::aio::MultiplexedConnection` or
    /// `ConnectionManager` (both cheap to clone). Each call is bounded by
    /// [`DEFAULT_STORE_TIMEOUT`] (1 s) unless changed with
    /// [`timeout`](Self::timeout).
    pub fn new(conn: C) -> Self {
        Self {
            conn,
            timeout: DEFAULT_STORE_TIMEOUT,
        }
    }

    /// Bounds each call. Defaults to 1 second. A zero duration is raised to
    /// 1 ms.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Stores `value` under `key` if `token` is at least the largest token
    /// `key` has accepted (or `key` is new). Fails with
    /// [`StoreError::Stale`], changing nothing, otherwise.
    pub async fn write(
        &self,
        key: &str,
        value: impl AsRef<[u8]>,
        token: FencingToken,
    ) -> Result<(), StoreError> {
        let span = tracing::debug_span!(
            "fenced_write",
            key,
            token = token.get(),
            outcome = Empty,
            elapsed = Empty,
        );
        traced(span, self.write_inner(key, value.as_ref(), token)).await
    }

    async fn write_inner(
        &self,
        key: &str,
        value: &[u8],
        token: FencingToken,
    ) -> Result<(), StoreError> {
        let token_arg = token.get().to_string();
        let args: [&[u8]; 2] = [value, token_arg.as_bytes()];
        let reply = self.call(&FENCED_WRITE, key, &args).await?;
        match reply {
            Value::Int(1) => Ok(()),
            Value::Array(ref items) if items.len() == 2 => {
                let current = parse_token(&items[1]).ok_or_else(|| unexpected(&reply))?;
                Err(StaleToken {
                    key: key.to_owned(),
                    presented: token,
                    current,
                }
                .into())
            }
            other => Err(unexpected(&other)),
        }
    }

    /// The value under `key` and the token that wrote it; `None` when the
    /// key was never written.
    pub async fn read(&self, key: &str) -> Result<Option<Fenced<Vec<u8>>>, StoreError> {
        let span = tracing::debug_span!("fenced_read", key, outcome = Empty, elapsed = Empty);
        traced(span, self.read_inner(key)).await
    }

    async fn read_inner(&self, key: &str) -> Result<Option<Fenced<Vec<u8>>>, StoreError> {
        let reply = self.call(&FENCED_READ, key, &[]).await?;
        match reply {
            Value::Nil => Ok(None),
            Value::Array(ref items) if items.len() == 2 => {
                let token = parse_token(&items[1]).ok_or_else(|| unexpected(&reply))?;
                let value = match &items[0] {
                    Value::BulkString(b) => b.clone(),
                    _ => return Err(unexpected(&reply)),
                };
                Ok(Some(Fenced { value, token }))
            }
            other => Err(unexpected(&other)),
        }
    }

    async fn call(
        &self,
        script: &crate::wire::scripts::Script,
        key: &str,
        args: &[&[u8]],
    ) -> Result<Value, StoreError> {
        let mut conn = self.conn.clone();
        match tokio::time::timeout(self.timeout, script.invoke(&mut conn, &[key], args)).await {
            Err(_) => Err(StoreError::Timeout(self.timeout)),
            Ok(reply) => reply.map_err(StoreError::backend),
        }
    }
}

/// Runs a fenced store operation in `span` (which declares `outcome` and
/// `elapsed`) and records both at its end. The value written or read is
/// never a field.
pub(crate) async fn traced<T>(
    span: Span,
    op: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let started = Instant::now();
    let result = op.instrument(span.clone()).await;
    let outcome = match &result {
        Ok(_) => "ok",
        Err(StoreError::Stale(_)) => "stale",
        Err(StoreError::Timeout(_)) => "timeout",
        Err(StoreError::Backend(_)) => "backend",
    };
    span.record("outcome", outcome)
        .record("elapsed", field::debug(started.elapsed()));
    result
}

fn parse_token(v: &Value) -> Option<FencingToken> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok().map(FencingToken::new),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()?
            .parse::<u64>()
            .ok()
            .map(FencingToken::new),
        _ => None,
    }
}

fn unexpected(reply: &Value) -> StoreError {
    StoreError::backend(redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected fenced store reply",
        format!("{reply:?}"),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_parse_from_integers_and_strings() {
        assert_eq!(parse_token(&Value::Int(5)), Some(FencingToken::new(5)));
        assert_eq!(parse_token(&Value::Int(-1)), None);
        let big = Value::BulkString(b"1764505000000001".to_vec());
        assert_eq!(
            parse_token(&big),
            Some(FencingToken::new(1_764_505_000_000_001))
        );
        assert_eq!(parse_token(&Value::BulkString(b"1e15".to_vec())), None);
        assert_eq!(parse_token(&Value::Nil), None);
    }

    #[test]
    fn stale_errors_say_both_tokens() {
        let e = StoreError::from(StaleToken {
            key: "k".into(),
            presented: FencingToken::new(3),
            current: FencingToken::new(9),
        });
        assert!(e.is_stale());
        assert_eq!(e.stale().unwrap().current.get(), 9);
        assert_eq!(
            e.to_string(),
            "stale fencing token 3 for \"k\": it has already accepted 9"
        );
        assert!(!StoreError::Timeout(Duration::from_secs(1)).is_stale());
    }
}
