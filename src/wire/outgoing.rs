//! A request as it goes onto a node's connection, and the one request of a
//! round that every node gets: packed into RESP once for all of them
//! (issue 32).
//!
//! A round sends the same command to every node (the acquire's `EVALSHA`,
//! the release's). Packed per node, redis-rs's encoder ran once per node
//! and request: about 1,360 instructions each, 14 % of a five-node cycle
//! (callgrind, BENCHMARKS.md "Instructions per cycle"). [`PackedOnce`]
//! packs on the first node's send and copies the bytes for the others.
//! With one node there is nothing to share, and it packs straight into the
//! connection's buffer, as a plain [`Cmd`] does (no allocation more).
//!
//! Connections that are not ours (TLS and RESP3 nodes on redis-rs's, a
//! cluster's routing) take the [`Cmd`] itself.

use std::sync::{Arc, OnceLock};

use redis::Cmd;

/// What a node's connection sends: the command, and its RESP bytes.
pub(crate) trait Outgoing: Sync {
    /// The command (redis-rs's connections, error messages, the `EVAL`
    /// fallback).
    fn cmd(&self) -> &Cmd;

    /// Appends the command's RESP encoding to `out`.
    fn write_packed(&self, out: &mut Vec<u8>);

    /// Replies to read past before the one kept, on our own connections:
    /// a transaction's `MULTI` and `QUEUED`s (`wire::transacted`).
    fn skip(&self) -> usize {
        0
    }
}

impl Outgoing for Cmd {
    fn cmd(&self) -> &Cmd {
        self
    }

    fn write_packed(&self, out: &mut Vec<u8>) {
        self.write_packed_command(out);
    }
}

/// A request shared by a round's per-node futures.
impl<T: Outgoing + Send + ?Sized> Outgoing for Arc<T> {
    fn cmd(&self) -> &Cmd {
        (**self).cmd()
    }

    fn write_packed(&self, out: &mut Vec<u8>) {
        (**self).write_packed(out);
    }

    fn skip(&self) -> usize {
        (**self).skip()
    }
}

/// A command sent to several nodes, packed once.
pub(crate) struct PackedOnce {
    cmd: Cmd,
    /// Whether it is shared: packed once and kept, or packed on each send.
    shared: bool,
    packed: OnceLock<Box<[u8]>>,
}

impl PackedOnce {
    /// `cmd`, to be sent to `nodes` nodes: kept packed when more than one.
    pub(crate) fn new(cmd: Cmd, nodes: usize) -> Self {
        PackedOnce {
            cmd,
            shared: nodes > 1,
            packed: OnceLock::new(),
        }
    }
}

impl Outgoing for PackedOnce {
    fn cmd(&self) -> &Cmd {
        &self.cmd
    }

    fn write_packed(&self, out: &mut Vec<u8>) {
        if !self.shared {
            self.cmd.write_packed_command(out);
            return;
        }
        let packed = self
            .packed
            .get_or_init(|| self.cmd.get_packed_command().into_boxed_slice());
        out.extend_from_slice(packed);
    }
}

impl std::fmt::Debug for PackedOnce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedOnce")
            .field("shared", &self.shared)
            .field("packed", &self.packed.get().is_some())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evalsha() -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg("0123456789abcdef")
            .arg(2)
            .arg("lock:{r}")
            .arg("fence:{r}");
        cmd.arg("value-é").arg(10_000u64).arg(-3i64).arg(&b""[..]);
        cmd
    }

    #[test]
    fn every_send_writes_redis_rs_own_encoding_shared_or_not() {
        let want = evalsha().get_packed_command();
        for nodes in [1, 2, 5] {
            let once = PackedOnce::new(evalsha(), nodes);
            // Appended to whatever the buffer held, once per node.
            let mut out = b"*1\r\n$4\r\nPING\r\n".to_vec();
            for _ in 0..nodes {
                once.write_packed(&mut out);
            }
            let mut expected = b"*1\r\n$4\r\nPING\r\n".to_vec();
            for _ in 0..nodes {
                expected.extend_from_slice(&want);
            }
            assert_eq!(out, expected, "{nodes} nodes");
            assert_eq!(once.packed.get().is_some(), nodes > 1, "{nodes} nodes");
            assert_eq!(once.cmd().get_packed_command(), want);
        }
        let mut out = Vec::new();
        evalsha().write_packed(&mut out);
        assert_eq!(out, want);
    }
}
