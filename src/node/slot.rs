//! Redis Cluster's key space, as pure functions: the hash slot of a key
//! (CRC16 of its hash tag, mod 16,384) and the slot map read from
//! `CLUSTER SLOTS`. `cluster.rs` routes with them; nothing here does I/O.

use redis::Value;

/// Hash slots in a Redis Cluster.
pub(crate) const SLOTS: usize = 16_384;

/// CRC16-CCITT (XMODEM), the checksum Redis Cluster hashes keys with.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The part of `key` that is hashed: the hash tag (between the first `{`
/// and the first `}` after it) when that is not empty, else the whole key.
pub(crate) fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// The hash slot of `key`.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) % (SLOTS as u16)
}

/// Which master serves each slot: `owner[slot]` indexes `masters`
/// (`host:port`); `None` for a slot no master serves (a cluster being set
/// up, or a failed shard without replica).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlotMap {
    pub(crate) masters: Vec<String>,
    owner: Vec<Option<u16>>,
    /// Every replica the reply listed.
    replicas: Vec<String>,
}

impl SlotMap {
    /// The `host:port` of the master serving `slot`.
    pub(crate) fn master_of(&self, slot: u16) -> Option<&str> {
        let index = (*self.owner.get(usize::from(slot))?)?;
        self.masters.get(usize::from(index)).map(String::as_str)
    }

    /// The slots `master` serves.
    pub(crate) fn slots_of<'a>(&'a self, master: &'a str) -> impl Iterator<Item = u16> + 'a {
        let index = self.masters.iter().position(|m| m == master);
        self.owner
            .iter()
            .enumerate()
            .filter(move |(_, o)| index.is_some() && o.map(usize::from) == index)
            .map(|(slot, _)| slot as u16)
    }

    /// Every replica listed.
    pub(crate) fn replicas(&self) -> impl Iterator<Item = &String> {
        self.replicas.iter()
    }

    /// Slots with no master.
    #[cfg(test)]
    pub(crate) fn unserved(&self) -> usize {
        self.owner.iter().filter(|o| o.is_none()).count()
    }

    /// Records a `MOVED` answer: `slot` is now served by `master`.
    pub(crate) fn moved(&mut self, slot: u16, master: &str) {
        let index = match self.masters.iter().position(|m| m == master) {
            Some(i) => i,
            None => {
                self.masters.push(master.to_owned());
                self.masters.len() - 1
            }
        };
        if let (Some(owner), Ok(index)) =
            (self.owner.get_mut(usize::from(slot)), u16::try_from(index))
        {
            *owner = Some(index);
        }
    }

    /// Parses a `CLUSTER SLOTS` reply: `[[start, end, [host, port, id, …],
    /// replica…], …]`. An empty host (a node that does not know its own
    /// address) is `seed_host`, the host the reply came from. `None` for a
    /// reply of another shape.
    pub(crate) fn from_cluster_slots(reply: &Value, seed_host: &str) -> Option<SlotMap> {
        let Value::Array(ranges) = reply else {
            return None;
        };
        let mut map = SlotMap {
            masters: Vec::new(),
            owner: vec![None; SLOTS],
            replicas: Vec::new(),
        };
        for range in ranges {
            let Value::Array(fields) = range else {
                return None;
            };
            let (start, end) = (int(fields.first()?)?, int(fields.get(1)?)?);
            let addr = address(fields.get(2)?, seed_host)?;
            for replica in fields.iter().skip(3) {
                let replica = address(replica, seed_host)?;
                if !map.replicas.contains(&replica) {
                    map.replicas.push(replica);
                }
            }
            let (start, end) = (u16::try_from(start).ok()?, u16::try_from(end).ok()?);
            if start > end || usize::from(end) >= SLOTS {
                return None;
            }
            for slot in start..=end {
                map.moved(slot, &addr);
            }
        }
        Some(map)
    }
}

/// `host:port` from a `CLUSTER SLOTS` node entry `[host, port, id, …]`.
fn address(node: &Value, seed_host: &str) -> Option<String> {
    let Value::Array(node) = node else {
        return None;
    };
    let host = match node.first()? {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        _ => return None,
    };
    let host = if host.is_empty() || host == "?" {
        seed_host.to_owned()
    } else {
        host
    };
    Some(format!("{host}:{}", int(node.get(1)?)?))
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn crc16_and_slots_match_the_cluster_spec() {
        // The check value of CRC16/XMODEM, quoted by the cluster spec.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        // `CLUSTER KEYSLOT` on Redis 7.0.15.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
        assert_eq!(hash_tag(b"{"), b"{");
        assert_eq!(hash_tag(b""), b"");
        assert!(usize::from(key_slot(b"anything")) < SLOTS);
    }

    pub(crate) fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    pub(crate) fn range(start: i64, end: i64, host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![bulk(host), Value::Int(port), bulk("id")]),
            Value::Array(vec![bulk(host), Value::Int(port + 100), bulk("id2")]),
        ])
    }

    #[test]
    fn slot_maps_parse_and_follow_moves() {
        let reply = Value::Array(vec![
            range(0, 5460, "127.0.0.1", 7000),
            range(5461, 10922, "", 7001),
            range(10923, 16383, "127.0.0.1", 7002),
        ]);
        let mut map = SlotMap::from_cluster_slots(&reply, "10.0.0.9").unwrap();
        assert_eq!(map.master_of(0), Some("127.0.0.1:7000"));
        assert_eq!(map.master_of(5461), Some("10.0.0.9:7001"));
        assert_eq!(map.master_of(16383), Some("127.0.0.1:7002"));
        assert_eq!(map.master_of(16384), None);
        assert_eq!(map.unserved(), 0);
        assert_eq!(map.slots_of("127.0.0.1:7000").count(), 5461);
        map.moved(3, "127.0.0.1:7003");
        assert_eq!(map.master_of(3), Some("127.0.0.1:7003"));
        assert_eq!(map.slots_of("127.0.0.1:7000").count(), 5460);
        assert_eq!(map.slots_of("nobody:1").count(), 0);
        assert!(map.replicas().any(|r| r == "127.0.0.1:7100"));
        assert!(!map.replicas().any(|r| r == "127.0.0.1:7000"));
        // A cluster whose shard lost its only master: slots unserved.
        let partial = Value::Array(vec![range(0, 99, "h", 1)]);
        let map = SlotMap::from_cluster_slots(&partial, "h").unwrap();
        assert_eq!(map.unserved(), SLOTS - 100);
        assert_eq!(map.master_of(100), None);
        // Other shapes: no map, no panic.
        for bad in [
            Value::Nil,
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![range(5, 2, "h", 1)]),
            Value::Array(vec![range(0, 16384, "h", 1)]),
        ] {
            assert_eq!(SlotMap::from_cluster_slots(&bad, "h"), None, "{bad:?}");
        }
    }
}
