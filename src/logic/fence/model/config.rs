//! What one run checks: the protocol variant, the network, the clock, the
//! fault and feature switches ([`Config`]).

use super::*;

/// The protocol variant under check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Variant {
    /// The protocol as implemented.
    WriteBack,
    /// Negative control: hand out the maximum of the granted fences at
    /// once, never writing back.
    Naive,
    /// Negative control: the write-back raises the fence, and answers `Ok`,
    /// whether or not the attempt still holds the key there.
    NoOwnerCheck,
}

/// Ordering of the client → node channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Network {
    /// One TCP connection per pair: in order, with loss.
    Fifo,
    /// Any request in flight may land next.
    Unordered,
}

/// The clocks that seed absent fences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Clock {
    /// Every seed is at least every token handed out before it lands (and
    /// so is the re-seed's clock floor): the assumption "clocks agree and
    /// no resource is acquired a million times a second".
    Agrees,
    /// Negative control: client c0's clock is far behind; its acquires
    /// seed an absent fence with 0, below every token.
    Behind,
}

/// How a restarted node's fences are re-seeded. [`Reseed::PROTOCOL`] is
/// the rule the model checks; each field set the other way is a negative
/// control.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Reseed {
    /// Bug (a), the first version: nodes restarted empty and not yet
    /// re-seeded count as sources (answering with the fences they lack).
    pub(super) unseeded_are_sources: bool,
    /// Bug (b), the even-N threshold: a quorum q of the N − 1 others must
    /// be sources, instead of N − q + 1.
    pub(super) needs_quorum: bool,
    /// The re-seed reads its sources at once after the restart, in
    /// parallel with the restart-guard window (the library before its fix),
    /// instead of once the window is over.
    pub(super) in_parallel: bool,
    /// A value copied from the sources is raised to at least the clock
    /// when some source lacks the fence (it expired there). Without it (the
    /// library before its fix), an expired fence on a source that held the largest
    /// token lets a lower one be copied.
    pub(super) clock_floor: bool,
}

/// How a bucket-mate's write-back changes the shared fence (fences are
/// kept per bucket of resources; see "Bucket-mates" in the
/// module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MateWriteBack {
    /// The protocol: `F := max(F, x)`, gated on the bucket-mate's lock key,
    /// so only where the fence is present.
    Max,
    /// Negative control: `F := x`, which can lower the fence.
    Set,
    /// Negative control: not gated on a lock key (or a fence that expires
    /// under a live bucket-mate's key): `F := max(F, x)`, `x` where absent,
    /// so an absent fence can be set below the clock.
    Ungated,
}

/// Which home may pre-grant its vote to a named waiter, and when the
/// waiter counts it without asking the home (see "The fair queue" in the
/// module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PregrantFrom {
    /// The protocol (issue 31): only a home that votes in fenced requests
    /// (its restart-guard window over, re-seeded) pre-grants: the
    /// releasing connection vouches for it. The named waiter may count the
    /// notice whenever it lands, also after a later restart of the home (a
    /// waiter whose connection has not seen that restart yet counts it; the
    /// window covers it, as it covers any grant read after a restart).
    VotingHome,
    /// Any home pre-grants, but the named waiter counts the notice only
    /// while the home votes: the waiter's half of the rule alone.
    AnyHomeCheckedByWaiter,
    /// Negative control (the library before issue 31's fix): any home
    /// pre-grants, also one restarted empty and not re-seeded, and the
    /// named waiter counts the notice.
    AnyHome,
}

/// What the named waiter's acquire may replace on the other nodes when
/// the release that named it handed the lock over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Handover {
    /// No handover: releases delete everywhere.
    Off,
    /// The protocol: the released holder's key (matched by its value's
    /// SHA1), as if it were free, and nobody else's. The reduced model
    /// needs no transition for it (module docs); the literal model has it.
    ReleasedHolder,
    /// Negative control: any key, a holder's that still holds too.
    AnyKey,
}

impl Reseed {
    pub(super) const PROTOCOL: Self = Self {
        unseeded_are_sources: false,
        needs_quorum: false,
        in_parallel: false,
        clock_floor: true,
    };
}

/// What to check, and how.
#[derive(Debug, Clone, Copy)]
pub(super) struct Config<'a> {
    pub(super) variant: Variant,
    pub(super) network: Network,
    /// Attempts per client.
    pub(super) attempts: &'a [u8],
    /// Breadth-first up to the first violation (whose trace is then the
    /// shortest), instead of depth-first through every state.
    pub(super) first_violation: bool,
    /// With `first_violation`: up to the first violation of this property.
    pub(super) seek: Option<Broken>,
    /// Reduce by node and client symmetry.
    pub(super) symmetry: bool,
    /// Forget floors and handed-out tokens that can no longer matter.
    pub(super) forget_tokens: bool,
    /// Check on every transition that the bounds behind `forget_tokens`
    /// hold (see `Model::audit`).
    pub(super) audit: bool,
    pub(super) clock: Clock,
    /// Fence expiries a run may contain.
    pub(super) expiries: u8,
    /// Restarts without data a run may contain.
    pub(super) restarts: u8,
    /// At most this many nodes restarted empty and not yet re-seeded at
    /// once; 0 means the model's assumption, max(N − q, 1).
    pub(super) max_down: u8,
    pub(super) reseed: Reseed,
    /// A client that first meets a restarted server once its window is
    /// over takes it as it is (the library does): the node may vote again
    /// without a re-seed, its fences absent.
    pub(super) late_clients: bool,
    /// Bucket-mate steps a run may contain: other resources of the bucket
    /// acquiring (`INCR`, seeded if absent) or writing back at a node that
    /// votes.
    pub(super) bucket_mates: u8,
    pub(super) mate_write_back: MateWriteBack,
    /// Pre-grants a run may contain: releases on a home node that name an
    /// idle client, set the home's key and move its fence for the client's
    /// next attempt.
    pub(super) pregrants: u8,
    pub(super) pregrant_from: PregrantFrom,
    pub(super) handover: Handover,
    /// Leases: a hand-out holds the lock until its lease ends, keys of an
    /// attempt in progress or holding stay (the timing assumptions), and
    /// mutual exclusion is checked.
    pub(super) leases: bool,
    /// Negative control (with leases): the restart guard's window ends
    /// with the attempts that counted the node, not with their leases (a
    /// window shorter than another client's TTL).
    pub(super) short_window: bool,
}

impl<'a> Config<'a> {
    pub(super) const fn new(variant: Variant, attempts: &'a [u8]) -> Self {
        Self {
            variant,
            network: Network::Fifo,
            attempts,
            first_violation: false,
            seek: None,
            symmetry: true,
            forget_tokens: true,
            audit: false,
            clock: Clock::Agrees,
            expiries: 0,
            restarts: 0,
            max_down: 0,
            reseed: Reseed::PROTOCOL,
            late_clients: false,
            bucket_mates: 0,
            mate_write_back: MateWriteBack::Max,
            pregrants: 0,
            pregrant_from: PregrantFrom::VotingHome,
            handover: Handover::Off,
            leases: false,
            short_window: false,
        }
    }

    /// The protocol with `pregrants` pre-grants (handovers among them),
    /// `expiries` fence expiries and `restarts` restarts.
    pub(super) const fn queue(
        attempts: &'a [u8],
        pregrants: u8,
        expiries: u8,
        restarts: u8,
    ) -> Self {
        Self {
            pregrants,
            handover: Handover::ReleasedHolder,
            ..Self::protocol(attempts, expiries, restarts)
        }
    }

    /// The same configuration with leases.
    pub(super) const fn leased(self) -> Self {
        Self {
            leases: true,
            ..self
        }
    }

    /// The protocol with `bucket_mates` bucket-mate steps, `expiries` fence
    /// expiries and `restarts` restarts.
    pub(super) const fn mates(
        attempts: &'a [u8],
        bucket_mates: u8,
        expiries: u8,
        restarts: u8,
    ) -> Self {
        Self {
            bucket_mates,
            ..Self::protocol(attempts, expiries, restarts)
        }
    }

    /// The protocol with `expiries` fence expiries and `restarts` restarts.
    pub(super) const fn protocol(attempts: &'a [u8], expiries: u8, restarts: u8) -> Self {
        Self {
            expiries,
            restarts,
            ..Self::new(Variant::WriteBack, attempts)
        }
    }

    /// Whether a seed or the clock floor can read the largest token.
    pub(super) const fn clock_matters(&self) -> bool {
        self.expiries > 0 || self.restarts > 0
    }
}
