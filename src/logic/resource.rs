//! Resource names, the Redis keys derived from them, and lock values.
//!
//! All key naming lives here so that later features (fence counters,
//! release channels) derive their names from the same place.

use std::sync::Arc;

use crate::logic::limits::{FENCE_BUCKETS, MAX_RESOURCE_LEN};

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

/// How a client names a resource's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Layout {
    /// `{prefix}lock:{resource}`: a client of plain nodes only (the names
    /// of every version so far).
    #[default]
    Plain,
    /// `{prefix}lock:{{bucket}}{resource}`: a client with a Redis Cluster
    /// among its nodes. The resource's fence bucket, in braces, is the
    /// hash tag of its lock key, queue key, fence key
    /// (`{prefix}fence:{{bucket}}`) and notice channels, so that each
    /// script and pipeline of ours touches one hash slot. The tag comes
    /// before the resource, so braces in a resource name do not matter;
    /// braces in the prefix would, so such a client refuses them.
    Tagged,
}

/// The Redis key of a resource's lock.
pub(crate) fn lock_key(prefix: &str, resource: &str, layout: Layout) -> Arc<str> {
    key(prefix, "lock:", resource, layout)
}

/// The Redis key of a resource's wait queue (the fair queue's hint, kept
/// on the resource's home node only; see `protocol::queue`).
#[cfg(test)]
pub(crate) fn queue_key(prefix: &str, resource: &str, layout: Layout) -> Arc<str> {
    key(prefix, "queue:", resource, layout)
}

/// The Redis key of a resource's waiting marker: a string key that clients
/// waiting for the resource keep alive on the nodes whose notices they
/// hear (the fair queue's home at its join and looks, every node for the
/// classic competition). A release reads it with the lock key in one
/// `MGET` and spends nothing more on notices, the queue or claims when it
/// is absent (issue 32: `PUBSUB NUMSUB` on every release).
#[cfg(test)]
pub(crate) fn wait_key(prefix: &str, resource: &str, layout: Layout) -> Arc<str> {
    key(prefix, "wait:", resource, layout)
}

/// The Redis key of a resource's outside claim (on its home node): a
/// client waiting outside the fair queue whose attempt was refused there
/// claims the next turn (DESIGN.md, section 2, fair queue, "Outside
/// turns").
#[cfg(test)]
pub(crate) fn claim_key(prefix: &str, resource: &str, layout: Layout) -> Arc<str> {
    key(prefix, "claim:", resource, layout)
}

/// Checks a prefix for the tagged layout: a brace in it would move or
/// split the hash tag.
pub(crate) fn validate_tagged_prefix(prefix: &str) -> Result<(), &'static str> {
    if prefix.contains(['{', '}']) {
        return Err("must not contain '{' or '}' with a Redis Cluster node (it would change the keys' hash tag)");
    }
    Ok(())
}

/// The kinds of key a client writes, each after the prefix.
const KINDS: [&str; 3] = ["lock:", "fence:", "queue:"];

/// Checks a key prefix. Two deployments keep apart only if neither can
/// name the other's keys. An empty prefix puts the keys at the top of the
/// key space (the re-seed would `SCAN fence:*` across the whole database
/// and raise any integer-valued key of that name). A prefix that extends
/// another by a kind names the other's keys: `a:lock:` + `fence:x` is
/// `a:` + `lock:` + `fence:x`, the lock key of resource `fence:x` under
/// `a:`. So a prefix must end with `:` and have no `:`-separated segment
/// `lock`, `fence` or `queue`; then a prefix `p + s` of another valid `p` starts `s`
/// at a segment, and `s` cannot begin with a kind (the unit test checks all
/// short prefixes of a small alphabet).
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), &'static str> {
    if prefix.is_empty() {
        return Err("must not be empty (keys would share the top of the key space)");
    }
    if !prefix.ends_with(':') {
        return Err("must end with ':'");
    }
    let is_kind = |segment: &str| KINDS.iter().any(|k| k.strip_suffix(':') == Some(segment));
    if prefix.split(':').any(is_kind) {
        return Err(
            "must not have a segment \"lock\", \"fence\" or \"queue\" (it would name another prefix's keys)",
        );
    }
    Ok(())
}

/// The fence bucket of a resource: FNV-1a (64-bit) of its bytes, modulo
/// [`FENCE_BUCKETS`]. Fixed forever: a client that mapped a resource to
/// another bucket would take its tokens from another counter.
pub(crate) fn fence_bucket(resource: &str) -> u16 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let hash = resource
        .bytes()
        .fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME));
    // The remainder is below FENCE_BUCKETS, a u16.
    u16::try_from(hash % u64::from(FENCE_BUCKETS)).unwrap_or(0)
}

/// The key of a resource's fence, shared with the other resources of its
/// bucket: `{prefix}fence:{b}`, braces included (on a Redis Cluster the
/// bucket is the hash tag).
pub(crate) fn fence_key(prefix: &str, resource: &str) -> Arc<str> {
    bucket_key(prefix, fence_bucket(resource))
}

/// The fence key of bucket `bucket`.
pub(crate) fn bucket_key(prefix: &str, bucket: u16) -> Arc<str> {
    format!("{prefix}fence:{{{bucket}}}").into()
}

/// Every fence key under `prefix`, in bucket order (the re-seed reads them).
pub(crate) fn fence_keys(prefix: &str) -> Vec<Arc<str>> {
    (0..FENCE_BUCKETS).map(|b| bucket_key(prefix, b)).collect()
}

/// The key of `kind` for `resource`: `{prefix}{kind}{resource}`, with the
/// resource's fence bucket as hash tag after the kind in the tagged layout.
/// The family's own kinds (`rwlock::keys`) are named through it too.
pub(crate) fn key(prefix: &str, kind: &str, resource: &str, layout: Layout) -> Arc<str> {
    arc_built(|key| {
        use std::fmt::Write as _;
        key.push_str(prefix);
        key.push_str(kind);
        if layout == Layout::Tagged {
            let _ = write!(key, "{{{}}}", fence_bucket(resource));
        }
        key.push_str(resource);
    })
}

/// The key of kind `kind` (`"queue:"`, `"wait:"`, `"claim:"`) of the
/// resource whose lock key is `lock`, under a prefix of `prefix_len`
/// bytes: the lock key with its kind replaced, as [`key`] would name it
/// (`queue_key`, `wait_key` and `claim_key`, which the tests keep as the
/// definitions: `sibling_keys_are_the_keys_the_resource_would_get`).
pub(crate) fn sibling_key(lock: &str, prefix_len: usize, kind: &str) -> Arc<str> {
    let (prefix, rest) = match (lock.get(..prefix_len), lock.get(prefix_len..)) {
        (Some(prefix), Some(rest)) => (prefix, rest),
        _ => ("", lock),
    };
    let rest = rest.strip_prefix("lock:").unwrap_or(rest);
    arc_built(|key| {
        key.push_str(prefix);
        key.push_str(kind);
        key.push_str(rest);
    })
}

/// An `Arc<str>` of what `write` writes, in one allocation: the text goes
/// into a buffer of this thread's first and is copied into the `Arc` once.
/// (A `String` turned into an `Arc<str>` is two allocations and a copy;
/// keys, lock values and notice ids are made on every cycle, and an
/// allocation and its free cost ~200 instructions with glibc's malloc,
/// issue 32.) `write` must not call this function again (it would get a
/// buffer of its own, and pay for it).
pub(crate) fn arc_built(write: impl FnOnce(&mut String)) -> Arc<str> {
    use std::cell::RefCell;
    thread_local! {
        static SCRATCH: RefCell<String> = const { RefCell::new(String::new()) };
    }
    let mut write = Some(write);
    let built = SCRATCH.try_with(|cell| {
        let mut scratch = cell.try_borrow_mut().ok()?;
        scratch.clear();
        (write.take()?)(&mut scratch);
        let built = Arc::from(scratch.as_str());
        // A long resource name does not keep its buffer.
        if scratch.capacity() > 4096 {
            *scratch = String::new();
        }
        Some(built)
    });
    match (built, write) {
        (Ok(Some(built)), _) => built,
        // Called from within `write`, or while the thread ends.
        (_, Some(write)) => {
            let mut text = String::new();
            write(&mut text);
            text.into()
        }
        // Never: `write` is taken only on the way to `Some`.
        (_, None) => Arc::from(""),
    }
}

/// The pub/sub channel of a lock key's release notices on a node using
/// database `db`: `{key}@{db}`. Channels are server-wide, not per database,
/// so deployments on different databases of one server would otherwise
/// wake each other's waiters. The database is a decimal suffix after the
/// last `@`, so the name is unique per (key, database).
pub(crate) fn notice_channel(key: &str, db: i64) -> String {
    // Sized up front: `format!` grows its buffer piece by piece, and this
    // runs on every release.
    let mut channel = String::with_capacity(key.len() + 21);
    push_notice_channel(&mut channel, key, db);
    channel
}

/// Appends [`notice_channel`]`(key, db)` to `channel`.
pub(crate) fn push_notice_channel(channel: &mut String, key: &str, db: i64) {
    channel.push_str(key);
    channel.push('@');
    if db < 0 {
        channel.push('-');
    }
    // Digits by hand, not `write!`: the formatting machinery was half of
    // this function's cost, on every release.
    push_decimal(channel, db.unsigned_abs());
}

/// Appends the low `digits` hex digits of `value` (lowercase, zero-padded),
/// without the formatting machinery: lock values and notice ids are written
/// on every attempt and every release.
pub(crate) fn push_hex(out: &mut String, value: u128, digits: u32) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for shift in (0..digits).rev() {
        let nibble = (value >> (shift * 4)) & 0xf;
        out.push(char::from(HEX[nibble as usize]));
    }
}

/// The lock key of a notice channel of database `db`; `None` for a channel
/// of another database or another kind.
pub(crate) fn notice_key(channel: &str, db: i64) -> Option<&str> {
    let (key, suffix) = channel.rsplit_once('@')?;
    // A fair queue's channels carry `/q` or `/{client tag}` after the
    // database.
    let suffix = suffix.split_once('/').map_or(suffix, |(db, _)| db);
    (suffix.parse::<i64>().ok()? == db).then_some(key)
}

/// A fair queue's channels of lock key `key` on database `db`: the marker
/// that fair waiters subscribe to so that the home node's release knows
/// the queue has listeners (`{channel}/q`, never published on), and this
/// client's own (`{channel}/{tag}`, `tag` the client's [`client_tag`]), on
/// which the release names the ticket whose turn it is: only the client
/// holding that ticket hears it.
pub(crate) fn fair_channels(key: &str, db: i64, tag: &str) -> [String; 2] {
    let channel = notice_channel(key, db);
    [format!("{channel}/q"), format!("{channel}/{tag}")]
}

/// Hex digits of a client's tag: 64 random bits.
pub(crate) const TAG_DIGITS: u32 = 16;

/// A fresh client tag: 64 bits from a CSPRNG as 16 hex digits. Lock values
/// and fair-queue tickets start with it, and a client hears the namings
/// of its tickets on the channel its tag names: two live clients with one
/// tag would take each other's namings for their own. Until issue 31 it
/// was the first 8 hex digits of a v4 UUID, 32 bits (a collision within
/// about 2^16 clients, which months of CLI processes reach).
pub(crate) fn client_tag() -> String {
    let mut tag = String::with_capacity(TAG_DIGITS as usize);
    push_hex(&mut tag, u128::from(rand::random::<u64>()), TAG_DIGITS);
    tag
}

/// A fair-queue ticket of the client tagged `tag`: `{tag}.{16 hex}`, its
/// 64 random bits unique per waiter. The `.` ends the tag, so the scripts
/// read it whatever its length (tickets of clients before issue 31 had no
/// `.`: their tag is their first 8 characters, `wire/lua/*.lua`). A waiter
/// that takes pre-grants adds `h-{ttl ms}` (`handover_ttl_ms`,
/// `protocol::fair`).
pub(crate) fn ticket(tag: &str, handover_ttl_ms: Option<u64>) -> Arc<str> {
    let random = rand::random::<u64>();
    arc_built(|ticket| {
        ticket.push_str(tag);
        ticket.push('.');
        push_hex(ticket, u128::from(random), 16);
        if let Some(ms) = handover_ttl_ms {
            ticket.push_str("h-");
            push_decimal(ticket, ms);
        }
    })
}

/// `n` in decimal, in the end of `buf`, without the formatting machinery.
pub(crate) fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[at..]
}

/// Appends `n` in decimal.
fn push_decimal(out: &mut String, n: u64) {
    let mut digits = [0u8; 20];
    for &d in decimal(n, &mut digits) {
        out.push(char::from(d));
    }
}

/// A ticket's client tag and the rest: split at its first `.`, or after 8
/// characters for a ticket of a client before issue 31.
pub(crate) fn ticket_parts(ticket: &str) -> (&str, &str) {
    match ticket.split_once('.') {
        Some(parts) => parts,
        None => {
            let at = ticket
                .char_indices()
                .nth(8)
                .map_or(ticket.len(), |(i, _)| i);
            ticket.split_at(at)
        }
    }
}

/// The alphabet of a lock value's secret: URL-safe base64, which has
/// neither `:` (a value's separator) nor `.` (a ticket's).
const SECRET_ALPHABET: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Characters of a lock value's secret: 22 of 6 bits, 128 random bits.
const SECRET_CHARS: u32 = 22;

/// A fresh lock value, 39 bytes: the client's tag (16 hex digits, to tell
/// owners apart when inspecting keys), `:`, and 128 bits from a CSPRNG as
/// 22 URL-safe base64 characters. At most 44 bytes, Redis stores the value
/// in one allocation with its header (embstr), which a held lock's memory
/// shows (`benches/scale.rs`, 100k and 1M locks held: 181–191 bytes per
/// held lock against 213–223 with the whole UUID); a 16-digit tag with the
/// secret in hex (49 bytes) would not fit. The 128 bits come from a
/// CSPRNG (`rand`'s thread RNG, ChaCha seeded from the OS), so that nobody
/// can guess another owner's value and release or extend its lock. A new
/// value is drawn for every attempt; see DESIGN.md ("Why a new value per
/// attempt").
pub(crate) fn lock_value(client_id: &str) -> Arc<str> {
    let secret: u128 = rand::random();
    arc_built(|value| {
        value.push_str(client_id);
        value.push(':');
        for i in 0..SECRET_CHARS {
            let sextet = (secret >> (i * 6)) & 0x3f;
            value.push(char::from(SECRET_ALPHABET[sextet as usize]));
        }
    })
}

/// The lock value of a fair waiter's pre-granted turn (DESIGN.md, section
/// 2, step 3): `{tag}:{rest of the ticket}:{notice}`, which the home's
/// release script builds from the ticket it names and its own notice id.
/// Unique per naming (the notice id is random per acquisition); it starts
/// like every lock value, with the client's tag and a `:`. Not secret: the
/// ticket is in the queue and the notice is published on the waiter's
/// channel (DESIGN.md, section 5).
pub(crate) fn pregrant_value(ticket: &str, notice: &str) -> Arc<str> {
    let (tag, rest) = ticket_parts(ticket);
    let mut value = String::with_capacity(ticket.len() + notice.len() + 2);
    value.push_str(tag);
    value.push(':');
    value.push_str(rest);
    value.push(':');
    value.push_str(notice);
    value.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pregranted_value_starts_with_the_tag() {
        let value = pregrant_value(
            "0123abcd0123abcd.89abcdef01234567h-30000",
            "fedcba9876543210",
        );
        assert_eq!(
            &*value,
            "0123abcd0123abcd:89abcdef01234567h-30000:fedcba9876543210"
        );
        // A ticket of a client before issue 31: an 8-digit tag, no `.`.
        let value = pregrant_value("0123abcd89abcdef01234567-30000", "fedcba9876543210");
        assert_eq!(&*value, "0123abcd:89abcdef01234567-30000:fedcba9876543210");
    }

    #[test]
    fn arc_built_gives_what_was_written_even_when_nested() {
        assert_eq!(&*arc_built(|s| s.push('a')), "a");
        // The buffer is cleared between uses.
        assert_eq!(&*arc_built(|s| s.push('b')), "b");
        // Nested: the inner call gets a buffer of its own.
        let outer = arc_built(|s| {
            s.push_str("out:");
            let inner = arc_built(|t| t.push_str("in"));
            s.push_str(&inner);
        });
        assert_eq!(&*outer, "out:in");
        // A long text does not stay as the thread's buffer, and is whole.
        let long = "x".repeat(5000);
        assert_eq!(&*arc_built(|s| s.push_str(&long)), long);
        assert_eq!(&*arc_built(|s| s.push('c')), "c");
    }

    #[test]
    fn tags_tickets_and_values_have_their_shapes() {
        let tag = client_tag();
        assert_eq!(tag.len(), TAG_DIGITS as usize);
        assert!(tag.bytes().all(|b| b.is_ascii_hexdigit()));
        let t = ticket(&tag, None);
        assert_eq!(ticket_parts(&t).0, tag);
        assert_eq!(ticket_parts(&t).1.len(), 16);
        let h = ticket(&tag, Some(30_000));
        assert_eq!(ticket_parts(&h).0, tag);
        assert_eq!(ticket_parts(&h).1.len(), 16 + "h-30000".len(), "{h}");
        assert!(h.ends_with("h-30000"), "{h}");
        let v = lock_value(&tag);
        assert_eq!(v.len(), 39, "{v}");
        assert!(v.len() <= 44, "embstr");
        let (head, secret) = v.split_once(':').unwrap();
        assert_eq!(head, tag);
        assert!(!secret.contains(':') && !secret.contains('.'));
        // Distinct draws (2^-128 to fail).
        assert_ne!(lock_value(&tag), lock_value(&tag));
        assert_ne!(client_tag(), client_tag());
    }

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
            &*lock_key("redfence:", "orders:42", Layout::Plain),
            "redfence:lock:orders:42"
        );
        // Tagged: the lock key, queue key, fence key and notice channels of
        // one resource share one hash slot, whatever braces the resource
        // has.
        for resource in ["orders:42", "a{b}c", "{x}", "}{"] {
            let lock = lock_key("redfence:", resource, Layout::Tagged);
            let b = fence_bucket(resource);
            assert!(
                lock.starts_with(&format!("redfence:lock:{{{b}}}")),
                "{lock}"
            );
            let slot = crate::node::slot::key_slot(fence_key("redfence:", resource).as_bytes());
            for name in [
                lock.to_string(),
                queue_key("redfence:", resource, Layout::Tagged).to_string(),
                notice_channel(&lock, 0),
                fair_channels(&lock, 0, "0badf00d")[0].clone(),
                fair_channels(&lock, 0, "0badf00d")[1].clone(),
            ] {
                assert_eq!(crate::node::slot::key_slot(name.as_bytes()), slot, "{name}");
            }
        }
        assert_eq!(validate_tagged_prefix("redfence:"), Ok(()));
        assert!(validate_tagged_prefix("a{b}:").is_err());
        assert_eq!(&*lock_key("", "x", Layout::Plain), "lock:x");
    }

    #[test]
    fn fence_buckets_are_fnv1a_and_fixed() {
        // FNV-1a 64 test vectors (the hash is part of the protocol).
        assert_eq!(fence_bucket(""), (0xcbf2_9ce4_8422_2325_u64 % 1024) as u16);
        assert_eq!(fence_bucket("a"), (0xaf63_dc4c_8601_ec8c_u64 % 1024) as u16);
        assert_eq!(
            fence_bucket("foobar"),
            (0x8594_4171_f739_67e8_u64 % 1024) as u16
        );
        assert_eq!(&*fence_key("redfence:", "a"), "redfence:fence:{140}");
        let keys = fence_keys("p:");
        assert_eq!(keys.len(), usize::from(FENCE_BUCKETS));
        assert_eq!(&*keys[0], "p:fence:{0}");
        assert_eq!(&*keys[1023], "p:fence:{1023}");
        // Resources spread over the buckets.
        let mut used = std::collections::HashSet::new();
        for i in 0..10_000 {
            used.insert(fence_bucket(&format!("orders:{i}")));
        }
        assert_eq!(used.len(), usize::from(FENCE_BUCKETS));
    }

    #[test]
    fn hex_is_lowercase_and_zero_padded() {
        for (value, digits) in [
            (0_u128, 16),
            (0xabc, 16),
            (u128::from(u64::MAX), 16),
            (u128::MAX, 32),
        ] {
            let mut out = String::new();
            push_hex(&mut out, value, digits);
            assert_eq!(out, format!("{value:0width$x}", width = digits as usize));
        }
        let mut out = String::from("x:");
        push_hex(&mut out, 0x1234_5678_9abc_def0_1122_3344_5566_7788, 8);
        assert_eq!(out, "x:55667788", "the low digits only");
    }

    #[test]
    fn sibling_keys_are_the_keys_the_resource_would_get() {
        for layout in [Layout::Plain, Layout::Tagged] {
            for prefix in ["redfence:", "", "app:lock:", "x"] {
                for resource in ["r", "lock:r", "a{b}c", "ünïcode", ""] {
                    let lock = lock_key(prefix, resource, layout);
                    let n = prefix.len();
                    assert_eq!(
                        sibling_key(&lock, n, "queue:"),
                        queue_key(prefix, resource, layout)
                    );
                    assert_eq!(
                        sibling_key(&lock, n, "wait:"),
                        wait_key(prefix, resource, layout)
                    );
                    assert_eq!(
                        sibling_key(&lock, n, "claim:"),
                        claim_key(prefix, resource, layout)
                    );
                }
            }
        }
    }

    #[test]
    fn notice_channels_name_their_database() {
        assert_eq!(notice_channel("redfence:lock:x", 0), "redfence:lock:x@0");
        assert_eq!(notice_channel("redfence:lock:x", 1), "redfence:lock:x@1");
        for (key, db) in [("redfence:lock:x", 0), ("redfence:lock:a@1", 0), ("k@", 15)] {
            let channel = notice_channel(key, db);
            assert_eq!(notice_key(&channel, db), Some(key));
            assert_eq!(notice_key(&channel, db + 1), None);
        }
        // A resource named like another database's channel stays apart.
        assert_ne!(
            notice_channel("redfence:lock:x@1", 0),
            notice_channel("redfence:lock:x", 1)
        );
        assert_eq!(notice_key("no-suffix", 0), None);
        // The digits written by hand are `format!`'s, at every width.
        for db in [9, 10, 99, 100, 123_456, -1, -70, i64::MAX, i64::MIN] {
            assert_eq!(notice_channel("k", db), format!("k@{db}"));
        }
        let [marker, own] = fair_channels("redfence:lock:x", 2, "0badf00d");
        assert_eq!(marker, "redfence:lock:x@2/q");
        assert_eq!(own, "redfence:lock:x@2/0badf00d");
        assert_eq!(notice_key(&marker, 2), Some("redfence:lock:x"));
        assert_eq!(notice_key(&own, 2), Some("redfence:lock:x"));
        assert_eq!(notice_key(&own, 0), None);
    }

    #[test]
    fn prefixes_that_could_collide_are_refused() {
        for bad in [
            "",
            "lock:",
            "a:lock:",
            "a:fence:",
            "a:queue:",
            "x:lock:y:",
            "fence:",
            "a",
            "redlock",
        ] {
            assert!(validate_prefix(bad).is_err(), "{bad:?}");
        }
        for good in ["redfence:", "a:", "a:locks:", "redlock:", "a:b:", "::"] {
            assert_eq!(validate_prefix(good), Ok(()), "{good:?}");
        }
        // Exhaustively over short prefixes from a small alphabet: two valid
        // prefixes never name one key with different kinds or resources.
        let alphabet = ["a", ":", "lock", "fence", "queue", "lock:", "queue:", "re"];
        let mut prefixes = vec![String::new()];
        for _ in 0..3 {
            let longer: Vec<String> = prefixes
                .iter()
                .flat_map(|p| alphabet.iter().map(move |c| format!("{p}{c}")))
                .collect();
            prefixes.extend(longer);
        }
        prefixes.retain(|p| validate_prefix(p).is_ok());
        prefixes.sort();
        prefixes.dedup();
        for p in &prefixes {
            for q in &prefixes {
                if p == q {
                    continue;
                }
                for kind_p in KINDS {
                    for kind_q in KINDS {
                        // p + kind_p + r == q + kind_q + r' for some r, r'
                        // iff one side is a prefix of the other.
                        let (a, b) = (format!("{p}{kind_p}"), format!("{q}{kind_q}"));
                        assert!(
                            !a.starts_with(&b) && !b.starts_with(&a),
                            "{p:?} and {q:?} collide: {a:?} / {b:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn values_are_unique_and_long() {
        let a = lock_value("0123abcd0123abcd");
        let b = lock_value("0123abcd0123abcd");
        assert_ne!(a, b);
        let secret = a.rsplit(':').next().unwrap();
        assert_eq!(secret.len(), 22, "128 bits in base64");
        assert!(secret.bytes().all(|b| SECRET_ALPHABET.contains(&b)));
        assert!(a.starts_with("0123abcd0123abcd:"));
        // Redis keeps strings of up to 44 bytes in one allocation with
        // their header (embstr): a held lock costs less.
        assert_eq!(a.len(), 39);
        // Every bit of the secret lands in it: the all-ones and all-zeros
        // secrets differ in every character.
        let ones = (0..SECRET_CHARS)
            .map(|i| SECRET_ALPHABET[((u128::MAX >> (i * 6)) & 0x3f) as usize])
            .collect::<Vec<u8>>();
        assert_eq!(ones.last(), Some(&SECRET_ALPHABET[3]), "the top two bits");
    }
}
