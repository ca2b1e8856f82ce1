//! The handle's entry I/O as one trait: where the value lives. On the
//! lock's nodes by default ([`Nodes`]: majority reads and fenced majority
//! writes, the first read batched per process), or in the user's store
//! (`user.rs`). The protocol in `handle.rs` is the same over both.

use std::time::Duration;

use crate::protocol::shared::Shared;
use crate::store::StoreError;

use super::entry::Entry;
use super::store::{read_entry, read_entry_batched, write_entry, Short, WriteFailed, Written};

/// Why an entry read or write failed.
#[derive(Debug)]
pub(crate) enum Failed {
    /// Fewer than a majority of the nodes answered or accepted.
    Short(Short),
    /// The entry holds this higher token: the write was refused.
    Stale(u64),
    /// The user's store failed.
    Store(StoreError),
}

/// Reads and fenced writes of one key's entry.
pub(crate) trait Entries {
    /// Where the entry lives, in the process's flight names.
    fn kind(&self) -> &'static str;
    /// A caller's first read; may share a read that began after the call.
    async fn look(&self) -> Result<Option<Entry>, Failed>;
    /// A read of one's own (under the lock).
    async fn read(&self) -> Result<Option<Entry>, Failed>;
    /// The computer's write with `token`; `keep` is how long the entry
    /// outlives its freshness where the store expires keys.
    async fn write(&self, token: u64, what: Written<'_>, keep: Duration) -> Result<(), Failed>;
}

/// The entry on the lock's nodes.
pub(crate) struct Nodes<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) key: &'a str,
}

impl Entries for Nodes<'_> {
    fn kind(&self) -> &'static str {
        "nodes"
    }

    async fn look(&self) -> Result<Option<Entry>, Failed> {
        read_entry_batched(self.shared, self.key)
            .await
            .map_err(Failed::Short)
    }

    async fn read(&self) -> Result<Option<Entry>, Failed> {
        read_entry(self.shared, self.key)
            .await
            .map_err(Failed::Short)
    }

    async fn write(&self, token: u64, what: Written<'_>, keep: Duration) -> Result<(), Failed> {
        write_entry(self.shared, self.key, token, what, keep)
            .await
            .map_err(|failed| match failed {
                WriteFailed::Stale(current) => Failed::Stale(current),
                WriteFailed::Short(short) => Failed::Short(short),
            })
    }
}
