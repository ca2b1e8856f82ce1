//! Steps, hand-outs and effects as the search records them, the broken
//! properties ([`Broken`], [`Violation`]), and the [`Report`] of a run.

use super::*;

/// One transition; indices are positions in the state it applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// The client starts its next attempt.
    Start(usize),
    /// The client's current attempt times out.
    GiveUp(usize),
    /// The request at `index` of the client → node channel lands; on a FIFO
    /// channel the ones before it were lost. An acquire is granted, or with
    /// `refused` finds the key still held and only moves the fence.
    Request {
        client: usize,
        node: usize,
        index: usize,
        refused: bool,
    },
    /// The node → client answer lands.
    Reply { client: usize, node: usize },
    /// The node's fence key expires (and its lock key with it).
    Expire(usize),
    /// The node restarts without its data.
    Restart(usize),
    /// The node's fences are re-seeded from the nodes in the bit mask
    /// `sources`, read and written in one step.
    Reseed { node: usize, sources: u8 },
    /// A client that met the restarted node only after its window votes
    /// there without a re-seed (`Config::late_clients`).
    Trust(usize),
    /// Another resource of the bucket acquires at the node: the shared
    /// fence is seeded if absent, then moves to `fence + 1`.
    MateAcquire(usize),
    /// Another resource of the bucket writes back `to` at the node (see
    /// [`MateWriteBack`]).
    MateWriteBack { node: usize, to: u8 },
    /// A release on the home `node` names the idle `client`: the client's
    /// next attempt begins here, the home's key is set for it and its fence
    /// moved, and the notice is sent. `handover`: the release handed the
    /// lock over (drawn only under [`Handover::AnyKey`]; module docs).
    Pregrant {
        node: usize,
        client: usize,
        handover: bool,
    },
    /// The notice of the client's pre-grant lands. `counted`: the client
    /// counts the home's vote without asking it; else it asks the home too.
    /// Either way it then sends its acquire to the other nodes that vote.
    Notice {
        client: usize,
        node: usize,
        counted: bool,
    },
    /// The client's lease ends (leases): it releases, or its validity ran
    /// out; its keys may vanish from now on.
    Release(usize),
}

/// A hand-out, with what the checker judges it by.
#[derive(Debug, Clone, Copy)]
pub(super) struct HandOut {
    pub(super) client: usize,
    pub(super) attempt: u8,
    pub(super) token: u8,
    pub(super) floor: u8,
    pub(super) duplicate: bool,
    pub(super) written_back: bool,
    /// Every node restarted so far has been re-seeded and votes again.
    pub(super) after_reseed: bool,
    /// A bucket-mate moved a fence earlier in the run.
    pub(super) after_mate: bool,
    /// The attempt counted a pre-granted vote without asking the home.
    pub(super) pregranted: bool,
    /// Leases: another client holds the lock at this hand-out.
    pub(super) overlaps: bool,
}

impl HandOut {
    pub(super) fn not_monotonic(&self) -> bool {
        self.token <= self.floor
    }
}

/// What a transition did that the report counts.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Effects {
    pub(super) hand_out: Option<HandOut>,
    /// Awaited write-backs cancelled because their key passed to another
    /// attempt, or their node restarted (they could only have failed).
    pub(super) lost_write_backs: u32,
    /// An acquire landed on an absent fence and seeded it.
    pub(super) seeded: bool,
    pub(super) expired: bool,
    pub(super) restarted: bool,
    pub(super) reseeded: bool,
    /// A bucket-mate step moved a fence.
    pub(super) mate: bool,
    pub(super) pregrant: bool,
    pub(super) released: bool,
}

/// Which property a run broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Broken {
    Monotonicity,
    Uniqueness,
    /// A restarted node whose window is over, with every other node keeping
    /// its fences and answering (up to q − 2 of them not answering), cannot
    /// complete its re-seed and vote again.
    Liveness,
    /// Leases: two clients hold the lock at once.
    Exclusion,
}

#[derive(Debug)]
pub(super) struct Violation {
    pub(super) broken: Broken,
    /// The transitions from the initial state, one line each.
    pub(super) trace: Vec<String>,
}

/// A hand-out as the cross-checks compare them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Event {
    pub(super) client: usize,
    pub(super) attempt: u8,
    pub(super) token: u8,
    pub(super) not_monotonic: bool,
    pub(super) duplicate: bool,
    pub(super) overlaps: bool,
}

/// The outcome of one exploration.
#[derive(Debug, Default)]
pub(super) struct Report {
    pub(super) states: usize,
    pub(super) transitions: u64,
    pub(super) hand_outs: u64,
    /// Hand-outs that needed a write-back.
    pub(super) written_back: u64,
    /// Awaited write-backs cancelled by their key passing to another attempt.
    pub(super) lost_write_backs: u64,
    /// Transitions that expired a fence, seeded one, restarted a node,
    /// re-seeded one; hand-outs once every restarted node votes again.
    pub(super) expiries: u64,
    pub(super) seeded: u64,
    pub(super) restarts: u64,
    pub(super) reseeds: u64,
    pub(super) after_reseed: u64,
    /// States in which the re-seed's liveness was checked.
    pub(super) liveness_checked: u64,
    /// Bucket-mate steps; hand-outs after one.
    pub(super) mate_steps: u64,
    pub(super) after_mate: u64,
    /// Pre-grants; hand-outs that counted one without asking the home;
    /// leases ended.
    pub(super) pregrants: u64,
    pub(super) pregranted: u64,
    pub(super) releases: u64,
    /// Longest path (depth-first) or counterexample length (breadth-first).
    pub(super) depth: usize,
    pub(super) elapsed: Duration,
    /// The first violation found of each property.
    pub(super) monotonicity: Option<Violation>,
    pub(super) uniqueness: Option<Violation>,
    pub(super) liveness: Option<Violation>,
    pub(super) exclusion: Option<Violation>,
    /// Every kind of hand-out seen.
    pub(super) events: BTreeSet<Event>,
}

impl Report {
    pub(super) fn record(&mut self, effects: &Effects) {
        self.transitions += 1;
        self.lost_write_backs += u64::from(effects.lost_write_backs);
        self.expiries += u64::from(effects.expired);
        self.seeded += u64::from(effects.seeded);
        self.restarts += u64::from(effects.restarted);
        self.reseeds += u64::from(effects.reseeded);
        self.mate_steps += u64::from(effects.mate);
        self.pregrants += u64::from(effects.pregrant);
        self.releases += u64::from(effects.released);
        if let Some(h) = effects.hand_out {
            self.hand_outs += 1;
            self.written_back += u64::from(h.written_back);
            self.after_reseed += u64::from(h.after_reseed);
            self.after_mate += u64::from(h.after_mate);
            self.pregranted += u64::from(h.pregranted);
            self.events.insert(Event {
                client: h.client,
                attempt: h.attempt,
                token: h.token,
                not_monotonic: h.not_monotonic(),
                duplicate: h.duplicate,
                overlaps: h.overlaps,
            });
        }
    }

    pub(super) fn summary(&self, config: &Config<'_>, nodes: usize) -> String {
        let mut out = format!(
            "N = {nodes} {:?}/{:?} attempts {:?}{}",
            config.variant,
            config.network,
            config.attempts,
            if config.symmetry {
                ""
            } else {
                " (no symmetry)"
            },
        );
        if config.clock != Clock::Agrees {
            out += &format!(", clock {:?}", config.clock);
        }
        if config.expiries > 0 {
            out += &format!(
                ", {} expir{}",
                config.expiries,
                plural(config.expiries, "y", "ies")
            );
        }
        if config.restarts > 0 {
            out += &format!(
                ", {} restart{}",
                config.restarts,
                plural(config.restarts, "", "s")
            );
            if config.max_down > 0 {
                out += &format!(" (up to {} down)", config.max_down);
            }
            if config.reseed != Reseed::PROTOCOL {
                out += &format!(", {:?}", config.reseed);
            }
            if config.late_clients {
                out += ", late clients";
            }
        }
        if config.pregrants > 0 {
            out += &format!(
                ", {} pre-grant{}",
                config.pregrants,
                plural(config.pregrants, "", "s")
            );
            if config.pregrant_from != PregrantFrom::VotingHome {
                out += &format!(" ({:?})", config.pregrant_from);
            }
        }
        if config.leases {
            out += ", leases";
            if config.handover != Handover::Off {
                out += &format!(", handover {:?}", config.handover);
            }
            if config.short_window {
                out += ", short window";
            }
        }
        if config.bucket_mates > 0 {
            out += &format!(
                ", {} bucket-mate step{}",
                config.bucket_mates,
                plural(config.bucket_mates, "", "s")
            );
            if config.mate_write_back != MateWriteBack::Max {
                out += &format!(" ({:?})", config.mate_write_back);
            }
        }
        out += &format!(
            ": {} states, {} transitions, depth {}, {} hand-outs ({} after a write-back), \
             {} write-backs lost their key",
            self.states,
            self.transitions,
            self.depth,
            self.hand_outs,
            self.written_back,
            self.lost_write_backs,
        );
        if config.clock_matters() {
            out += &format!(
                ", {} expiries, {} seeded, {} restarts, {} re-seeds, {} hand-outs after \
                 every re-seed, liveness checked in {} states",
                self.expiries,
                self.seeded,
                self.restarts,
                self.reseeds,
                self.after_reseed,
                self.liveness_checked,
            );
        }
        if config.bucket_mates > 0 {
            out += &format!(
                ", {} bucket-mate steps, {} hand-outs after one",
                self.mate_steps, self.after_mate
            );
        }
        if config.pregrants > 0 {
            out += &format!(
                ", {} pre-grants, {} hand-outs counting one unasked",
                self.pregrants, self.pregranted
            );
        }
        if config.leases {
            out += &format!(", {} leases ended", self.releases);
        }
        out += &format!(", {:.2?}", self.elapsed);
        for (broken, label) in [
            (self.monotonicity.is_some(), ", NOT MONOTONIC"),
            (self.uniqueness.is_some(), ", DUPLICATE TOKEN"),
            (self.liveness.is_some(), ", RE-SEED STUCK"),
            (self.exclusion.is_some(), ", TWO HOLDERS"),
        ] {
            if broken {
                out += label;
            }
        }
        out
    }
}

pub(super) fn plural(n: u8, one: &'static str, many: &'static str) -> &'static str {
    if n == 1 {
        one
    } else {
        many
    }
}

/// All permutations of `0..C`, the identity first.
pub(super) fn permutations() -> Vec<[usize; C]> {
    pub(super) fn extend(p: &mut [usize; C], k: usize, used: u32, out: &mut Vec<[usize; C]>) {
        if k == C {
            out.push(*p);
            return;
        }
        for v in 0..C {
            if used & (1 << v) == 0 {
                p[k] = v;
                extend(p, k + 1, used | (1 << v), out);
            }
        }
    }
    let mut out = Vec::new();
    extend(&mut [0; C], 0, 0, &mut out);
    out
}
