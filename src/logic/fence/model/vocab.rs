//! The model's vocabulary: its bounds and how node, message and client
//! states are packed into bytes.

/// Room for clients; a configuration uses the first few.
pub(super) const C: usize = 3;
/// Room in one client → node channel: the current attempt's message, a
/// write-back of an older attempt that still holds the key there, and
/// acquires of given-up attempts. Running out is reported, never truncated.
pub(super) const QCAP: usize = 4;
/// Fences are 5-bit fields (an absent fence is `None`). The largest fence
/// grows by at most one per acquire that lands (a seed is at most the
/// largest token handed out, and copies and write-backs never exceed what
/// a fence held), so N × (all attempts) + bucket-mate steps ≤ 31 bounds
/// the configurations.
pub(super) const MAX_FENCE: u8 = 31;
/// Attempt numbers are 2-bit fields.
pub(super) const MAX_ATTEMPTS: u8 = 3;
/// "No bound": larger than every token.
pub(super) const UNBOUNDED: u8 = u8::MAX;

// The holder of a node's lock key: the attempt whose acquire was granted
// there last (see "keys vanish lazily" in the module docs).
/// No key can be there: none was granted since the start or the node's
/// restart, so no acquire can be refused.
pub(super) const FREE: u8 = 0;
/// An attempt no write-back can ask about any more.
pub(super) const ANON: u8 = 1;
/// `attempt` (≥ 1) of `client`, which a write-back may still ask about.
pub(super) const fn live(client: usize, attempt: u8) -> u8 {
    2 + (client as u8) * 4 + attempt
}
pub(super) const fn live_parts(holder: u8) -> Option<(usize, u8)> {
    if holder < 2 {
        None
    } else {
        Some((((holder - 2) / 4) as usize, (holder - 2) % 4))
    }
}

// Client → node requests; 0 is an empty slot.
/// An acquire nobody awaits: its attempt is over or past acquiring.
pub(super) const ACQ_ANON: u8 = 1;
/// An acquire of the client's current attempt, which is still acquiring.
pub(super) const ACQ_LIVE: u8 = 2;
/// `WriteBack(token)` of `attempt`.
pub(super) const fn write_back(attempt: u8, token: u8) -> u8 {
    0x80 | (attempt << 5) | token
}
pub(super) const fn write_back_parts(msg: u8) -> Option<(u8, u8)> {
    if msg & 0x80 == 0 {
        None
    } else {
        Some(((msg >> 5) & 0x3, msg & 0x1F))
    }
}

// Node → client answers; 0 is none.
pub(super) const R_WB_OK: u8 = 1;
/// `Granted(fence)` is `R_GRANTED | fence`.
pub(super) const R_GRANTED: u8 = 0x40;
pub(super) const fn granted_fence(msg: u8) -> Option<u8> {
    if msg & 0xE0 == R_GRANTED {
        Some(msg & 0x1F)
    } else {
        None
    }
}
/// The notice of a pre-grant, `R_NOTICE | fence`: the release on the home
/// named the client and moved the home's fence to `fence` for it.
pub(super) const R_NOTICE: u8 = 0x20;
pub(super) const fn notice_fence(msg: u8) -> Option<u8> {
    if msg & 0xE0 == R_NOTICE {
        Some(msg & 0x1F)
    } else {
        None
    }
}

// Client phases.
pub(super) const IDLE: u8 = 0;
pub(super) const ACQUIRING: u8 = 1;
pub(super) const WRITING_BACK: u8 = 2;
/// With leases: the attempt handed its token out and holds the lock.
pub(super) const HOLDING: u8 = 3;

// What the current attempt owes to a naming (`ClientState::named`).
/// It counted the home's pre-granted vote without asking the home.
pub(super) const NAMED_COUNTED: u8 = 1;
/// The naming release handed the lock over: its acquires may replace the
/// released holder's keys.
pub(super) const NAMED_HANDOVER: u8 = 2;

// What the current attempt knows about a node (`Link::seen`). Acquiring:
// 0 nothing yet, or `R_GRANTED | fence`. Writing back: 0 not asked (it did
// not grant, or the write-back lost its key), or one of these.
pub(super) const S_STORED: u8 = 1;
pub(super) const S_PENDING: u8 = 2;
// Holding (leases): 0, or the node counts toward the lease (it granted).
pub(super) const S_HELD: u8 = 3;

// A node's standing in fenced votes (`Node::status`).
/// Votes: it kept its fences, or they were re-seeded and its window is over.
pub(super) const UP: u8 = 0;
/// Restarted without its data and not re-seeded: refuses fenced votes and
/// is no source for a re-seed.
pub(super) const DOWN: u8 = 1;
/// Re-seeded, but its restart-guard window is not over (only when the
/// re-seed runs in parallel with the window): refuses fenced votes.
pub(super) const WAITING: u8 = 2;
