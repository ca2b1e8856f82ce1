//! The crate's limits and defaults, in one place: where a reader looks for
//! "how long may a TTL be" or "what prefix do keys get". Each setting that
//! has a default documents it on its setter too; these are the same values,
//! for code that wants to name them.

use std::time::Duration;

/// Most nodes a client may have. Node sets are bitmasks; a Redlock of more
/// than a handful of masters buys nothing anyway.
pub const MAX_NODES: usize = 64;

/// The longest TTL a lock may be given: one year.
///
/// Redis itself accepts expirations up to `i64::MAX` milliseconds from now,
/// but a lease longer than a year is a bug in the caller (a crashed holder
/// would block the resource for that long), and keeping the bound small keeps
/// every sum in the validity arithmetic far from overflow.
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Longest accepted resource name, in bytes.
pub const MAX_RESOURCE_LEN: usize = 1024;

/// Longest accepted key prefix, in bytes.
pub const MAX_PREFIX_LEN: usize = 256;

/// Default key prefix ([`Builder::key_prefix`](crate::Builder::key_prefix)).
/// Keys look like `redfence:lock:{resource}`.
pub const DEFAULT_PREFIX: &str = "redfence:";

/// Fences are kept per bucket of resources: resource `r` takes its tokens
/// from the fence key `{prefix}fence:{b}` (braces included), `b` = FNV-1a
/// (64-bit) of `r`'s bytes modulo this. So a node keeps at most this many
/// fence keys, however many distinct resources are ever locked, and they
/// never expire. Part of the protocol: every client of a deployment must
/// use the same value (DESIGN.md, "Fence state").
pub const FENCE_BUCKETS: u16 = 1024;

/// Default bound on one call of a fenced store
/// ([`FencedStore`](crate::FencedStore), and the PostgreSQL store).
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(1);

/// The constant part of the drift allowance, as the Redlock description
/// specifies: drift = TTL × factor + 2 ms. The 2 ms cover the granularity of
/// Redis expiry (milliseconds) on both ends.
pub const DRIFT_CONSTANT: Duration = Duration::from_millis(2);

/// Most resources one multi-resource lock
/// ([`Client::lock_all`](crate::Client::lock_all)) takes: each is two keys
/// (its lock and its fence) of one script call per node, and the script
/// holds the node for the whole set. Meant for a handful (the two accounts
/// of a transfer); 64 leaves room.
pub const MAX_RESOURCES: usize = 64;
