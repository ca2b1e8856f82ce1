//! The pure part of a read-write lock: its Redis keys, each of a kind of
//! its own under the client's prefix (`rw:…`, never a mutex's `lock:`,
//! `queue:`, `wait:` or `claim:`), and the reader entries' names. No I/O;
//! tested here.

use std::sync::Arc;

use crate::logic::resource::{key, push_hex, Layout};

/// The writer's key: holds the writing holder's value, with its TTL.
const WRITER: &str = "rw:w:";
/// The readers' index: the names of the reader entries (a set).
const READERS: &str = "rw:r:";
/// The waiting writer's marker: while it lives, no new reader is admitted.
const WAITING: &str = "rw:x:";
/// A reader entry: `rw:e:{16 hex digits}:`, each holding one reader's
/// value with its TTL. The fixed-width id keeps names apart across locks.
const ENTRY: &str = "rw:e:";
/// The lock's "home" keys as the release script sees them: a queue and a
/// waiting marker that are never written, so a release of an rw entry
/// never names a waiter nor publishes (the rw lock has no fair queue).
const QUIET_QUEUE: &str = "rw:q:";
const QUIET_MARKER: &str = "rw:n:";

/// The keys of one read-write lock, named once.
#[derive(Debug, Clone)]
pub(crate) struct RwKeys {
    prefix: Arc<str>,
    layout: Layout,
    pub(crate) name: Arc<str>,
    pub(crate) writer: Arc<str>,
    pub(crate) readers: Arc<str>,
    pub(crate) waiting: Arc<str>,
    pub(crate) quiet_queue: Arc<str>,
    pub(crate) quiet_marker: Arc<str>,
}

impl RwKeys {
    pub(crate) fn new(prefix: &str, name: &str, layout: Layout) -> Self {
        Self {
            prefix: prefix.into(),
            layout,
            name: name.into(),
            writer: key(prefix, WRITER, name, layout),
            readers: key(prefix, READERS, name, layout),
            waiting: key(prefix, WAITING, name, layout),
            quiet_queue: key(prefix, QUIET_QUEUE, name, layout),
            quiet_marker: key(prefix, QUIET_MARKER, name, layout),
        }
    }

    /// The key of reader entry `id` (a random 64-bit number per attempt).
    pub(crate) fn entry(&self, id: u64) -> Arc<str> {
        let mut kind = String::with_capacity(ENTRY.len() + 17);
        kind.push_str(ENTRY);
        push_hex(&mut kind, u128::from(id), 16);
        kind.push(':');
        key(&self.prefix, &kind, &self.name, self.layout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logic::resource::{claim_key, lock_key, queue_key, wait_key};
    use std::collections::HashSet;

    #[test]
    fn keys_never_collide_with_a_mutex_or_another_rw_lock() {
        for layout in [Layout::Plain, Layout::Tagged] {
            let mut seen = HashSet::new();
            let names = [
                "a",
                "a:w",
                "w:a",
                "rw:w:a",
                "e:0000000000000000:a",
                "lock:a",
            ];
            for name in names {
                let keys = RwKeys::new("p:", name, layout);
                let mine = [
                    keys.writer.clone(),
                    keys.readers.clone(),
                    keys.waiting.clone(),
                    keys.quiet_queue.clone(),
                    keys.quiet_marker.clone(),
                    keys.entry(0),
                    keys.entry(u64::MAX),
                ];
                for k in mine {
                    assert!(k.starts_with("p:rw:"), "{k}");
                    assert!(seen.insert(k.to_string()), "{k} twice");
                }
            }
            // A mutex of any of those names, under the same prefix.
            for name in names {
                for k in [
                    lock_key("p:", name, layout),
                    queue_key("p:", name, layout),
                    wait_key("p:", name, layout),
                    claim_key("p:", name, layout),
                ] {
                    assert!(!seen.contains(&*k), "{k} is a mutex's and an rw lock's");
                }
            }
        }
    }

    #[test]
    fn tagged_keys_share_the_fence_bucket_tag() {
        let keys = RwKeys::new("p:", "prices", Layout::Tagged);
        let bucket = crate::logic::resource::fence_bucket("prices");
        let tag = format!("{{{bucket}}}");
        for k in [&keys.writer, &keys.readers, &keys.waiting, &keys.entry(7)] {
            assert!(k.contains(&tag), "{k}");
        }
        assert_eq!(
            &*keys.entry(255),
            "p:rw:e:00000000000000ff:prices"
                .replace("prices", &format!("{tag}prices"))
                .as_str()
        );
    }
}
