//! Resource names, the Redis keys derived from them, and lock values.
//!
//! All key naming lives here so that later features (fence counters,
//! release channels) derive their names from the same place.

use std::sync::Arc;

use crate::limits::MAX_RESOURCE_LEN;

/// Checks a resource name; the message becomes [`Error::InvalidResource`](crate::Error::InvalidResource).
pub(crate) fn validate(resource: &str) -> Result<(), &'static str> {
    if resource.is_empty() {
        return Err("must not be empty");
    }
    if resource.len() > MAX_RESOURCE_LEN {
        return Err("longer than 1024 bytes");
    }
    Ok(())
}

/// The Redis key of a resource's lock.
pub(crate) fn lock_key(prefix: &str, resource: &str) -> Arc<str> {
    key(prefix, "lock:", resource)
}

/// The key of a resource's fence: `{prefix}fence:{resource}`.
pub(crate) fn fence_key(prefix: &str, resource: &str) -> Arc<str> {
    key(prefix, "fence:", resource)
}

fn key(prefix: &str, kind: &str, resource: &str) -> Arc<str> {
    let mut key = String::with_capacity(prefix.len() + kind.len() + resource.len());
    key.push_str(prefix);
    key.push_str(kind);
    key.push_str(resource);
    key.into()
}

/// A fresh lock value: the client's id (to tell owners apart when
/// inspecting keys) and 128 bits from a CSPRNG (`rand`'s thread RNG, ChaCha
/// seeded from the OS), so that nobody can guess another owner's value and
/// release or extend its lock. A new value is drawn for every attempt; see
/// DESIGN.md ("Why a new value per attempt").
pub(crate) fn lock_value(client_id: &uuid::Uuid) -> Arc<str> {
    let secret: u128 = rand::random();
    format!("{client_id}:{secret:032x}").into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        assert_eq!(validate(""), Err("must not be empty"));
        assert_eq!(validate("a"), Ok(()));
        assert_eq!(validate(&"x".repeat(MAX_RESOURCE_LEN)), Ok(()));
        assert!(validate(&"x".repeat(MAX_RESOURCE_LEN + 1)).is_err());
        // Multi-byte characters count in bytes, as Redis sees them.
        assert!(validate(&"é".repeat(MAX_RESOURCE_LEN / 2 + 1)).is_err());
    }

    #[test]
    fn keys_are_prefixed() {
        assert_eq!(
            &*lock_key("redfence:", "orders:42"),
            "redfence:lock:orders:42"
        );
        assert_eq!(&*lock_key("", "x"), "lock:x");
    }

    #[test]
    fn values_are_unique_and_long() {
        let id = uuid::Uuid::new_v4();
        let a = lock_value(&id);
        let b = lock_value(&id);
        assert_ne!(a, b);
        let secret = a.rsplit(':').next().unwrap();
        assert_eq!(secret.len(), 32, "128 bits as hex");
        assert!(a.starts_with(&id.to_string()));
    }
}
