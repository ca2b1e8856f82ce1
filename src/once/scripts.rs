//! The single-flight entry's two scripts. They are the fenced store's
//! write and read (the same `≥` comparison of tokens, so a computer whose
//! lease ran out cannot overwrite a newer value) plus the entry's
//! freshness, measured on the node's own clock: the write stores
//! `TIME + fresh_ms`, the read returns what is left of it. No clock is ever
//! compared across machines; a node's clock only has to run at about the
//! right rate, as the lock's TTLs already assume.

use std::sync::LazyLock;

use crate::wire::scripts::Script;

/// The computer's write: `{0, fence}` when the entry holds a higher token,
/// else stores the value (or the error marker) and returns 1.
pub(crate) static ONCE_WRITE: LazyLock<Script> =
    LazyLock::new(|| Script::new("once-write", include_str!("lua/write.lua")));

/// The readers' read: nil, or `{value, fence, fresh ms left, delta ms,
/// error, error ms left}` (absent fields nil).
pub(crate) static ONCE_READ: LazyLock<Script> =
    LazyLock::new(|| Script::new("once-read", include_str!("lua/read.lua")));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands() {
        // `Script::commands` reads a command from `redis.call('X', …`: the
        // argument-less `TIME` is not listed (it needs no key permission).
        let write = ONCE_WRITE.commands();
        for command in ["HGET", "HSET", "HDEL", "PEXPIRE"] {
            assert!(write.contains(&command.to_owned()), "{write:?}");
        }
        assert!(ONCE_READ.commands().contains(&"HMGET".to_owned()));
        assert!(ONCE_WRITE.name.starts_with("once-"));
    }
}
