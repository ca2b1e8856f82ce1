//! The symmetry reduction and hash compaction: the fingerprint of a
//! state's symmetry class (clients renamed, nodes sorted), stored in the
//! visited set instead of the state.

use super::reduced::{ClientState, Model, State};
use super::*;

impl<const N: usize> Model<'_, N> {
    /// The fingerprint of `s`'s symmetry class. The class representative:
    /// among the client renamings, those giving the smallest client array;
    /// of those, the smallest fingerprint with nodes sorted. Both choices
    /// depend only on the class. Sorting whole nodes carries each node's
    /// channels and each client's knowledge of it along. (A re-seed's
    /// sources are chosen and read in one step, so no state names a node.)
    pub(super) fn fingerprint(&self, s: &State<N>) -> u128 {
        if !self.config.symmetry {
            return hash_state(s);
        }
        let renamed = |p: &[usize; C]| {
            let mut clients = [ClientState::default(); C];
            for c in 0..C {
                clients[p[c]] = s.clients[c];
            }
            clients
        };
        let Some(least) = self.renamings.iter().map(renamed).min() else {
            unreachable!("the identity is a renaming")
        };
        let mut best = u128::MAX;
        for p in self.renamings.iter().filter(|p| renamed(p) == least) {
            let mut r = rename(s, p);
            r.nodes.sort_unstable();
            best = best.min(hash_state(&r));
        }
        best
    }
}

/// `s` with client `c` renamed `p[c]` everywhere: its state, its links, and
/// the key holders that name it.
fn rename<const N: usize>(s: &State<N>, p: &[usize; C]) -> State<N> {
    let mut r = *s;
    for (&to, &client) in p.iter().zip(&s.clients) {
        r.clients[to] = client;
    }
    for (rn, sn) in r.nodes.iter_mut().zip(&s.nodes) {
        for (&to, &link) in p.iter().zip(&sn.links) {
            rn.links[to] = link;
        }
        if let Some((c, a)) = live_parts(sn.holder) {
            rn.holder = live(p[c], a);
        }
    }
    r
}

/// A 128-bit fingerprint of the state: its fields packed without loss
/// into words (one per link, one per four nodes' holder, fence and status,
/// two for the clients and handed-out tokens, one for the budgets and the
/// largest fence ever held when any is non-zero), absorbed by two 64-bit lanes, each a chain of bijective
/// mixes (splitmix64's finaliser, with different constants per lane).
fn hash_state<const N: usize>(s: &State<N>) -> u128 {
    let (mut a, mut b) = (0x243F_6A88_85A3_08D3u64, 0x1319_8A2E_0370_7344u64);
    let mut absorb = |w: u64| {
        a = mix(a ^ w, 0xBF58_476D_1CE4_E5B9, 0x94D0_49BB_1331_11EB);
        b = mix(b ^ w, 0xFF51_AFD7_ED55_8CCD, 0xC4CE_B9FE_1A85_EC53);
    };
    let (mut heads, mut packed) = (0u64, 0);
    for node in &s.nodes {
        for link in &node.links {
            let req = link.req.iter().fold(0u64, |w, &m| w << 8 | u64::from(m));
            absorb(req | u64::from(link.reply) << 32 | u64::from(link.seen) << 40);
        }
        let fence = node.fence.map_or(0x3F, u64::from);
        heads = heads << 16 | u64::from(node.holder) << 8 | fence << 2 | u64::from(node.status);
        packed += 1;
        if packed == 4 {
            absorb(heads);
            (heads, packed) = (0, 0);
        }
    }
    if packed > 0 {
        absorb(heads);
    }
    let client = |c: &ClientState| {
        u64::from(c.attempt) << 24
            | u64::from(c.phase | c.named << 4) << 16
            | u64::from(c.floor) << 8
            | u64::from(c.token)
    };
    absorb(client(&s.clients[0]) << 32 | client(&s.clients[1]));
    absorb(client(&s.clients[2]) << 32 | u64::from(s.handed));
    if s.expiries != 0 || s.restarts != 0 || s.bucket_mates != 0 || s.high != 0 || s.pregrants != 0
    {
        absorb(
            u64::from(s.pregrants) << 32
                | u64::from(s.high) << 24
                | u64::from(s.bucket_mates) << 16
                | u64::from(s.expiries) << 8
                | u64::from(s.restarts),
        );
    }
    (u128::from(a) << 64) | u128::from(b)
}

// Packing four request bytes, three clients, 32 handed bits, 6-bit fences,
// 8-bit holders (at most `live(C - 1, MAX_ATTEMPTS)`), and a phase and the
// naming bits in one byte, as above.
const _: () = assert!(
    QCAP == 4
        && C == 3
        && MAX_FENCE < 0x3F
        && HOLDING < 0x10
        && NAMED_COUNTED < 0x10
        && NAMED_HANDOVER < 0x10
);

fn mix(mut x: u64, k1: u64, k2: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(k1);
    x ^= x >> 27;
    x = x.wrapping_mul(k2);
    x ^ (x >> 31)
}

/// The visited set's keys are fingerprints already: use their low bits.
#[derive(Default)]
pub(super) struct Prehashed(u64);

impl std::hash::Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}
