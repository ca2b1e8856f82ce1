//! The fair queue in the reduced model: the pre-grant (a release on the
//! home node that names an idle client, sets the home's key for its next
//! attempt and moves the home's fence), its notice, and leases (a hand-out
//! holds the lock until its lease ends; keys that must stay refuse). The
//! handover needs no transition here: see "The fair queue" in the module
//! docs, and `literal.rs`, which has it.

use std::fmt::Write as _;

use super::super::next_fence;
use super::reduced::{fence_name, fence_u8, push, who, Model, Node, State};
use super::*;

impl<const N: usize> Model<'_, N> {
    /// Whether the key of `holder` must stay (leases): its attempt is in
    /// progress or holds the lock. A lease ends before its keys expire, and
    /// an attempt whose key expired can no longer hand out (its validity is
    /// gone), which the model reaches by giving up first. Only a restart
    /// loses such a key.
    pub(super) fn protected(&self, s: &State<N>, holder: u8) -> bool {
        self.config.leases
            && live_parts(holder).is_some_and(|(c, a)| {
                let cl = &s.clients[c];
                cl.attempt == a && cl.phase != IDLE
            })
    }

    /// Whether `msg` of client `c` landing on node `i` may be granted:
    /// always without leases (keys vanish at any moment); with them only
    /// where the key may have vanished, holds the attempt's own value (a
    /// pre-grant's), or, under [`Handover::AnyKey`], for a handed-over
    /// attempt whatever it holds.
    pub(super) fn may_grant(&self, s: &State<N>, c: usize, i: usize, msg: u8) -> bool {
        let holder = s.nodes[i].holder;
        let cl = &s.clients[c];
        write_back_parts(msg).is_some()
            || !self.protected(s, holder)
            || (msg == ACQ_LIVE
                && (holder == live(c, cl.attempt)
                    || (self.config.handover == Handover::AnyKey
                        && cl.named & NAMED_HANDOVER != 0)))
    }

    /// Whether node `i` may pre-grant now: it votes (the releasing
    /// connection vouches for it), or any node under the controls.
    fn may_pregrant(&self, node: &Node) -> bool {
        node.status == UP || self.config.pregrant_from != PregrantFrom::VotingHome
    }

    /// The pre-grants enabled in `s`: a release on any node as home names
    /// any idle client with an attempt left. The home is any node (a fixed
    /// home is one choice of these), so nodes stay interchangeable. The
    /// release deleted its holder's key or found the key gone (keys vanish
    /// lazily), so its `SET NX` succeeds, unless the key must stay.
    pub(super) fn pregrant_steps(&self, s: &State<N>, out: &mut Vec<Step>) {
        if s.pregrants == 0 {
            return;
        }
        let handovers: &[bool] = match self.config.handover {
            Handover::AnyKey => &[false, true],
            _ => &[false],
        };
        for c in 0..self.config.attempts.len() {
            let cl = &s.clients[c];
            if cl.phase != IDLE || cl.attempt >= self.budget(c) {
                continue;
            }
            for (h, node) in s.nodes.iter().enumerate() {
                if !self.may_pregrant(node) || self.protected(s, node.holder) {
                    continue;
                }
                for &handover in handovers {
                    out.push(Step::Pregrant {
                        node: h,
                        client: c,
                        handover,
                    });
                }
            }
        }
    }

    /// The ways the notice on (`c`, `h`) may land: counted without asking
    /// the home, or not (the client's view of the home, a long wait, a
    /// young subscription: it then asks the home too).
    pub(super) fn notice_steps(&self, s: &State<N>, c: usize, h: usize, out: &mut Vec<Step>) {
        let counts = match self.config.pregrant_from {
            PregrantFrom::AnyHomeCheckedByWaiter => s.nodes[h].status == UP,
            _ => true,
        };
        for counted in [true, false] {
            if counted && !counts {
                continue;
            }
            out.push(Step::Notice {
                client: c,
                node: h,
                counted,
            });
        }
    }

    /// Applies a pre-grant (`wire/lua/release.lua`, lines 47-60): the
    /// client's next attempt begins (its floor read now), the home's key
    /// holds its value, the home's fence moves (seeded from the releasing
    /// client's clock when absent: clocks agree), and the notice carries
    /// the fence. Returns whether it seeded an absent fence.
    pub(super) fn pregrant(
        &self,
        s: &mut State<N>,
        h: usize,
        c: usize,
        handover: bool,
        mut log: Option<&mut String>,
    ) -> bool {
        let floor = s.max_handed();
        let seed = s.max_handed();
        let cl = &mut s.clients[c];
        cl.attempt += 1;
        cl.phase = ACQUIRING;
        cl.floor = floor;
        cl.named = if handover { NAMED_HANDOVER } else { 0 };
        let attempt = cl.attempt;
        let node = &mut s.nodes[h];
        let before = node.fence;
        let fence = fence_u8(next_fence(u64::from(before.unwrap_or(seed))));
        node.fence = Some(fence);
        node.holder = live(c, attempt);
        node.links[c].reply = R_NOTICE | fence;
        s.pregrants -= 1;
        note!(
            log,
            "n{h} ← a release names {} (largest token so far {floor}){}: key set, \
             fence {} → {fence}",
            who(c, attempt),
            if handover { ", handing over" } else { "" },
            fence_name(before)
        );
        if before.is_none() {
            note!(log, " (seeded {seed})");
        }
        if node.status != UP {
            note!(log, "  <-- A HOME THAT DOES NOT VOTE");
        }
        before.is_none()
    }

    /// Lands the notice of client `c`'s pre-grant from home `h`
    /// (`Waiter::pregranted`, `attempt_pregranted`): with `counted`, the
    /// home's vote counts as a grant of the notice's fence
    /// (`FanOut::start_credited`), and the acquire goes to the other nodes
    /// that vote; else to every node that votes, the home included, whose
    /// key holds the attempt's value and grants again.
    pub(super) fn notice(
        &self,
        s: &mut State<N>,
        c: usize,
        h: usize,
        counted: bool,
        mut log: Option<&mut String>,
    ) {
        let reply = std::mem::take(&mut s.nodes[h].links[c].reply);
        let Some(fence) = notice_fence(reply) else {
            unreachable!("a notice step without a notice")
        };
        let attempt = s.clients[c].attempt;
        note!(log, "{} ← n{h} notice, fence {fence}: ", who(c, attempt));
        if counted {
            s.nodes[h].links[c].seen = R_GRANTED | fence;
            s.clients[c].named |= NAMED_COUNTED;
            note!(log, "counted unasked");
            if s.nodes[h].status != UP {
                note!(log, " (n{h} does not vote)");
            }
            note!(log, "; acquire to");
        } else {
            note!(log, "not counted; acquire to");
        }
        for (j, node) in s.nodes.iter_mut().enumerate() {
            if node.status == UP && (j != h || !counted) {
                push(&mut node.links[c].req, ACQ_LIVE);
                note!(log, " n{j}");
            }
        }
    }

    /// A hand-out with leases: the client holds the lock. The nodes that
    /// granted stay counted for the restart guard's window until the lease
    /// ends (not under the short-window control); the rest of the
    /// attempt's state is no longer needed.
    pub(super) fn hold(&self, s: &mut State<N>, c: usize) {
        let keep = !self.config.short_window;
        s.clients[c].phase = HOLDING;
        s.clients[c].floor = 0;
        s.clients[c].token = 0;
        for node in &mut s.nodes {
            let link = &mut node.links[c];
            link.seen = if link.seen != 0 && keep { S_HELD } else { 0 };
            link.reply = 0;
        }
    }
}
