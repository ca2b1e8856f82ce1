//! The fenced acquire as a transaction on our own connections (issue 32):
//! `MULTI`, `SET lock value NX PX ttl`, `INCR fence`, `EXEC`, where the
//! script (`lua/acquire.lua`) would run the same two commands inside Lua.
//!
//! Both are atomic; the transaction costs Redis a third of the script's
//! CPU (measured on Redis 7.0.15, DESIGN.md section 2, step 4). What it
//! cannot do is seed an absent fence (a transaction has no branches), so
//! the client does: a fence the transaction moved to below
//! [`SEEDED_FROM`](crate::logic::fence::SEEDED_FROM) was absent or never
//! seeded, its value is never a token, and the attempt asks that node
//! again with the script, which seeds it (`protocol::attempt`). Every
//! script that moves a fence treats a fence below that floor as absent.
//!
//! Connections that are not ours (TLS, RESP3, a cluster's routing) take
//! the script's `EVALSHA` ([`Outgoing::cmd`]); the reply parser
//! (`commands::parse_fenced`) reads either shape.

use std::sync::{Arc, OnceLock};

use redis::Cmd;

use super::outgoing::Outgoing;
use super::scripts::{ACQUIRE, SEED};
use crate::logic::resource::decimal;

/// Replies a transaction's `EXEC` comes after: `MULTI`'s `OK` and the
/// `QUEUED`s of `SET` and `INCR`.
const BEFORE_EXEC: usize = 3;

/// The fenced acquire of a first attempt, for every node of a round: the
/// transaction, packed once when several nodes share it, and the script's
/// `EVALSHA`, built only for a connection that is not ours.
pub(crate) struct Transacted {
    lock: Arc<str>,
    fence: Arc<str>,
    value: Arc<str>,
    ttl_ms: u64,
    /// The fence's seed, for the script.
    seed: u64,
    /// A waiter's attempt: a refusal reports the key's `PTTL` (a fourth
    /// command in the transaction, the script's fourth argument).
    probe: bool,
    shared: bool,
    packed: OnceLock<Box<[u8]>>,
    evalsha: OnceLock<Cmd>,
}

impl Transacted {
    /// The acquire of `value` on `lock` for `ttl_ms`, moving `fence`
    /// (seeded with `seed` by the script), sent to `nodes` nodes.
    pub(crate) fn new(
        lock: Arc<str>,
        fence: Arc<str>,
        value: Arc<str>,
        ttl_ms: u64,
        seed: u64,
        probe: bool,
        nodes: usize,
    ) -> Self {
        Transacted {
            lock,
            fence,
            value,
            ttl_ms,
            seed,
            probe,
            shared: nodes > 1,
            packed: OnceLock::new(),
            evalsha: OnceLock::new(),
        }
    }

    /// `EVALSHA` of the acquire script, with the fourth argument (probe)
    /// and, asked `again`, the fifth: our own value counts as granted
    /// (re-set with a fresh TTL).
    fn script(&self, again: bool) -> Cmd {
        let mut evalsha = ACQUIRE.evalsha_keys(&[&self.lock, &self.fence], self.value.len() + 48);
        evalsha.arg(&*self.value).arg(self.ttl_ms).arg(self.seed);
        if again {
            evalsha.arg(if self.probe { "1" } else { "" }).arg(1);
        } else if self.probe {
            evalsha.arg(1);
        }
        evalsha
    }

    /// The script, asked again for the key the transaction set: our own
    /// value counts as granted (re-set with a fresh TTL), and an absent or
    /// unseeded fence is seeded and moved (`ACQUIRE`'s fifth argument).
    pub(crate) fn again(&self) -> Cmd {
        self.script(true)
    }

    /// The fence's seed alone, for a node whose transaction answered
    /// after the round decided (`SEED`: no lock key touched).
    pub(crate) fn seed_only(&self) -> Cmd {
        let mut seed = [0u8; 20];
        SEED.evalsha(&[&self.fence], &[decimal(self.seed, &mut seed)])
    }

    fn write_transaction(&self, out: &mut Vec<u8>) {
        let (lock, fence, value) = (
            self.lock.as_bytes(),
            self.fence.as_bytes(),
            self.value.as_bytes(),
        );
        let mut ttl = [0u8; 20];
        let ttl = decimal(self.ttl_ms, &mut ttl);
        out.reserve(90 + 2 * lock.len() + fence.len() + value.len());
        out.extend_from_slice(b"*1\r\n$5\r\nMULTI\r\n*6\r\n$3\r\nSET\r\n");
        bulk(out, lock);
        bulk(out, value);
        out.extend_from_slice(b"$2\r\nNX\r\n$2\r\nPX\r\n");
        bulk(out, ttl);
        out.extend_from_slice(b"*2\r\n$4\r\nINCR\r\n");
        bulk(out, fence);
        if self.probe {
            out.extend_from_slice(b"*2\r\n$4\r\nPTTL\r\n");
            bulk(out, lock);
        }
        out.extend_from_slice(b"*1\r\n$4\r\nEXEC\r\n");
    }
}

/// `$len\r\nbytes\r\n`.
fn bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    let mut len = [0u8; 20];
    out.push(b'$');
    out.extend_from_slice(decimal(bytes.len() as u64, &mut len));
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

impl Outgoing for Transacted {
    fn cmd(&self) -> &Cmd {
        self.evalsha.get_or_init(|| self.script(false))
    }

    fn write_packed(&self, out: &mut Vec<u8>) {
        if !self.shared {
            self.write_transaction(out);
            return;
        }
        let packed = self.packed.get_or_init(|| {
            let mut bytes = Vec::new();
            self.write_transaction(&mut bytes);
            bytes.into_boxed_slice()
        });
        out.extend_from_slice(packed);
    }

    fn skip(&self) -> usize {
        BEFORE_EXEC + usize::from(self.probe)
    }
}

impl std::fmt::Debug for Transacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transacted")
            .field("probe", &self.probe)
            .field("shared", &self.shared)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evalsha(value: &str, probe: bool) -> Cmd {
        let mut cmd = ACQUIRE.evalsha_keys(&["lock:{r}", "fence:{r}"], 0);
        cmd.arg(value).arg(10_000u64).arg(1_765_000_000_000_000u64);
        if probe {
            cmd.arg(1);
        }
        cmd
    }

    fn transacted(value: &str, probe: bool, nodes: usize) -> Transacted {
        Transacted::new(
            Arc::from("lock:{r}"),
            Arc::from("fence:{r}"),
            Arc::from(value),
            10_000,
            1_765_000_000_000_000,
            probe,
            nodes,
        )
    }
    /// The transaction is redis-rs's own encoding of its commands (with
    /// the `PTTL` when probing), shared or not, appended to what the
    /// buffer held; the script for other connections is the `EVALSHA`
    /// given, and asked again it counts our own key as granted.
    #[test]
    fn the_transaction_is_its_commands_as_redis_rs_packs_them() {
        let long = "v".repeat(1234);
        for probe in [false, true] {
            for value in ["value-é", "", long.as_str()] {
                let mut pipe = redis::pipe();
                pipe.atomic()
                    .cmd("SET")
                    .arg("lock:{r}")
                    .arg(value)
                    .arg("NX")
                    .arg("PX")
                    .arg(10_000u64)
                    .cmd("INCR")
                    .arg("fence:{r}");
                if probe {
                    pipe.cmd("PTTL").arg("lock:{r}");
                }
                let one = pipe.get_packed_pipeline();
                for nodes in [1, 2, 5] {
                    let tx = transacted(value, probe, nodes);
                    let mut out = b"*1\r\n$4\r\nPING\r\n".to_vec();
                    let mut expected = out.clone();
                    for _ in 0..nodes {
                        tx.write_packed(&mut out);
                        expected.extend_from_slice(&one);
                    }
                    assert_eq!(
                        out, expected,
                        "{nodes} nodes, probe {probe}, value {value:?}"
                    );
                    assert_eq!(tx.packed.get().is_some(), nodes > 1);
                    assert_eq!(tx.skip(), 3 + usize::from(probe));
                    let script = evalsha(value, probe);
                    assert_eq!(tx.cmd().get_packed_command(), script.get_packed_command());
                    let mut again = evalsha(value, false);
                    again.arg(if probe { "1" } else { "" }).arg(1);
                    assert_eq!(tx.again().get_packed_command(), again.get_packed_command());
                }
            }
        }
    }
}
