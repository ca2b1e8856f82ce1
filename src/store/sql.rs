//! What the SQL fenced stores share: table and column names checked to be
//! plain identifiers, then quoted for the dialect; tokens as `bigint`.

use std::future::Future;
use std::time::Duration;

use crate::logic::fence::FencingToken;
use crate::store::StoreError;

/// How a dialect quotes (and folds) identifiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)] // each feature uses its own
pub(crate) enum Dialect {
    /// `"name"`, folded to lowercase as unquoted names are.
    Postgres,
    /// `` `name` ``, as given (MySQL's unquoted names are not folded).
    MySql,
    /// `"name"`, as given (SQLite compares names case-insensitively).
    Sqlite,
}

/// PostgreSQL's longest identifier (NAMEDATALEN − 1 bytes); longer ones
/// are silently truncated by the server, so two long names could collide.
/// MySQL's limit (64) is above it and SQLite has none, so one limit serves
/// all.
pub(crate) const MAX_IDENT_LEN: usize = 63;

/// A table or column name that is not a plain SQL identifier.
///
/// Names are restricted to what could be written unquoted (ASCII letters,
/// digits, `_`, not starting with a digit; a table may be
/// `schema.table`, or `database.table` on MySQL), and mean what they would
/// mean unquoted: on PostgreSQL, ASCII letters are folded to lowercase (on
/// MySQL and SQLite they are kept as given). They are then quoted anyway,
/// so reserved words such as `order` or `user` work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid SQL name {name:?}: {problem}")]
#[non_exhaustive]
pub struct InvalidName {
    /// The name as given.
    pub name: String,
    /// What is wrong with it.
    pub problem: NameProblem,
}

/// What is wrong with an [`InvalidName`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameProblem {
    /// The name, or its schema or table part, is empty.
    #[error("empty, or an empty part around a `.`")]
    Empty,
    /// A part is longer than PostgreSQL's 63-byte limit.
    #[error("a part is longer than {MAX_IDENT_LEN} bytes")]
    TooLong,
    /// A character outside ASCII letters, digits and `_` (or a second `.`;
    /// column names take none).
    #[error("character {0:?} is not allowed (ASCII letters, digits and `_` only)")]
    Character(char),
    /// A part starts with a digit.
    #[error("a part starts with a digit")]
    LeadingDigit,
}

pub(crate) fn quote_table(name: &str, dialect: Dialect) -> Result<String, InvalidName> {
    let invalid = |problem| InvalidName {
        name: name.to_owned(),
        problem,
    };
    match name.split_once('.') {
        Some((schema, table)) => Ok(format!(
            "{}.{}",
            quote_ident(schema, dialect).map_err(invalid)?,
            quote_ident(table, dialect).map_err(invalid)?
        )),
        None => quote_ident(name, dialect).map_err(invalid),
    }
}

pub(crate) fn quote_column(name: &str, dialect: Dialect) -> Result<String, InvalidName> {
    quote_ident(name, dialect).map_err(|problem| InvalidName {
        name: name.to_owned(),
        problem,
    })
}

/// Validates one identifier and returns it quoted (and folded, on
/// PostgreSQL). The
/// character set leaves nothing that quoting would have to escape; quoting
/// is there for reserved words.
fn quote_ident(part: &str, dialect: Dialect) -> Result<String, NameProblem> {
    let first = part.chars().next().ok_or(NameProblem::Empty)?;
    if let Some(bad) = part
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_'))
    {
        return Err(NameProblem::Character(bad));
    }
    if first.is_ascii_digit() {
        return Err(NameProblem::LeadingDigit);
    }
    if part.len() > MAX_IDENT_LEN {
        return Err(NameProblem::TooLong);
    }
    Ok(match dialect {
        Dialect::Postgres => format!("\"{}\"", part.to_ascii_lowercase()),
        Dialect::MySql => format!("`{part}`"),
        Dialect::Sqlite => format!("\"{part}\""),
    })
}

/// A token or a fence that does not fit the other side's integer type.
/// Arrives inside [`StoreError::Backend`]; downcast to inspect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FenceRangeError {
    /// The token is above `i64::MAX`, the largest `bigint`. Tokens from this
    /// crate stay below 2^53; this catches tokens built by hand.
    #[error("fencing token {0} does not fit in a bigint (at most 2^63 - 1)")]
    TokenTooLarge(FencingToken),
    /// A fence column holds a negative number, which no fencing token is: the
    /// row was written outside the fencing protocol.
    #[error("row {key:?} has fence {fence}, which is not a fencing token")]
    NegativeFence {
        /// The row's key.
        key: String,
        /// The value found.
        fence: i64,
    },
}

pub(crate) fn to_bigint(token: FencingToken) -> Result<i64, StoreError> {
    i64::try_from(token.get())
        .map_err(|_| StoreError::backend(FenceRangeError::TokenTooLarge(token)))
}

pub(crate) fn from_bigint(fence: i64, key: &str) -> Result<FencingToken, StoreError> {
    u64::try_from(fence).map(FencingToken::new).map_err(|_| {
        StoreError::backend(FenceRangeError::NegativeFence {
            key: key.to_owned(),
            fence,
        })
    })
}

/// Runs `work` under `timeout`.
pub(crate) async fn bounded<T>(
    timeout: Duration,
    work: impl Future<Output = T>,
) -> Result<T, StoreError> {
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| StoreError::Timeout(timeout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_dialect_quotes_its_way() {
        assert_eq!(
            quote_table("Shop.Order", Dialect::Postgres).unwrap(),
            "\"shop\".\"order\""
        );
        assert_eq!(
            quote_table("Shop.Order", Dialect::MySql).unwrap(),
            "`Shop`.`Order`"
        );
        assert_eq!(quote_table("Order", Dialect::Sqlite).unwrap(), "\"Order\"");
        assert_eq!(
            quote_column("a`b", Dialect::MySql).unwrap_err().problem,
            NameProblem::Character('`')
        );
    }
}
