//! The reduced model: its compact state, its transitions (driven by the
//! crate's own `merge`, `needs_write_back`, `next_fence` and `Tally`), and
//! the reductions that keep it small (pruning, bounds; symmetry and hashing
//! are in `symmetry.rs`). One concept: every reduction is stated against
//! the transitions it reduces, so they live together.

use std::fmt::Write as _;

use super::super::{merge, next_fence};
use super::*;
use crate::logic::quorum::{quorum, Decision, Tally};

/// One client ↔ one node: both channels, and the client's knowledge of the
/// node. Kept inside the node so that permuting nodes carries it along.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(super) struct Link {
    /// Requests in flight, oldest first, empty slots (0) at the end.
    pub(super) req: [u8; QCAP],
    /// The answer in flight that still matters, or 0.
    pub(super) reply: u8,
    /// What the client's current attempt knows about this node.
    pub(super) seen: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(super) struct Node {
    pub(super) holder: u8,
    /// `None`: the fence key is absent (expired, or lost in a restart).
    pub(super) fence: Option<u8>,
    /// `UP`, `DOWN` or `WAITING`.
    pub(super) status: u8,
    pub(super) links: [Link; C],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(super) struct ClientState {
    /// Attempts started so far: the current one's number.
    pub(super) attempt: u8,
    pub(super) phase: u8,
    /// The largest token handed out before the current attempt began; 0
    /// once the attempt's token is certainly larger.
    pub(super) floor: u8,
    /// The token being written back.
    pub(super) token: u8,
    /// What the current attempt owes to a naming: `NAMED_COUNTED`,
    /// `NAMED_HANDOVER` (bits).
    pub(super) named: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct State<const N: usize> {
    pub(super) nodes: [Node; N],
    pub(super) clients: [ClientState; C],
    /// Bit `t`: token `t` was handed out (pruned to the bits that matter).
    pub(super) handed: u32,
    /// Fence expiries, restarts and bucket-mate steps the run may still
    /// make.
    pub(super) expiries: u8,
    pub(super) restarts: u8,
    pub(super) bucket_mates: u8,
    pub(super) pregrants: u8,
    /// The largest fence any node has held (monotone, unlike the largest
    /// fence now: restarts and expiries lose fences), which bounds what a
    /// bucket-mate can write back; 0 once no bucket-mate step is left.
    pub(super) high: u8,
}

impl<const N: usize> State<N> {
    pub(super) fn initial(config: &Config<'_>) -> Self {
        Self {
            nodes: [Node {
                fence: Some(0),
                ..Node::default()
            }; N],
            clients: [ClientState::default(); C],
            handed: 0,
            expiries: config.expiries,
            restarts: config.restarts,
            bucket_mates: config.bucket_mates,
            pregrants: config.pregrants,
            high: 0,
        }
    }

    /// The largest token handed out so far (0: none; tokens start at 1).
    pub(super) fn max_handed(&self) -> u8 {
        (32 - self.handed.leading_zeros()).saturating_sub(1) as u8
    }

    /// Whether an attempt in progress counts node `i` toward its quorum:
    /// it was granted there (and the answer landed or is in flight, a
    /// pre-grant's notice too), or its write-back there succeeded or is
    /// awaited; with leases, also a lease that counted the node. Such an
    /// attempt refreshed the node's fence within its lock TTL, so the fence
    /// cannot expire before the attempt is over; and a restart-guard window
    /// (at least the TTL) that began with a restart of the node outlasts
    /// it, and its lease.
    pub(super) fn touched(&self, i: usize) -> bool {
        self.clients
            .iter()
            .zip(&self.nodes[i].links)
            .any(|(cl, link)| cl.phase != IDLE && (link.seen != 0 || link.reply != 0))
    }

    fn down(&self) -> usize {
        self.nodes.iter().filter(|n| n.status == DOWN).count()
    }
}

pub(super) struct Model<'a, const N: usize> {
    pub(super) config: Config<'a>,
    pub(super) quorum: usize,
    max_down: usize,
    /// Client renamings that map every client to one with as many attempts
    /// (the identity first).
    pub(super) renamings: Vec<[usize; C]>,
}

impl<'a, const N: usize> Model<'a, N> {
    pub(super) fn new(config: Config<'a>) -> Self {
        assert!((1..=C).contains(&config.attempts.len()), "1 to {C} clients");
        assert!(
            config.attempts.iter().all(|&a| a <= MAX_ATTEMPTS),
            "at most {MAX_ATTEMPTS} attempts per client"
        );
        assert!((2..=8).contains(&N), "2 to 8 nodes");
        let total: usize = config.attempts.iter().map(|&a| usize::from(a)).sum();
        assert!(
            total * N + usize::from(config.bucket_mates) <= usize::from(MAX_FENCE),
            "fences must fit in 5 bits"
        );
        assert!(
            !(config.clock_matters() && config.variant == Variant::NoOwnerCheck),
            "write-backs that land anywhere could lower an absent fence's bound"
        );
        assert!(
            !config.leases || config.variant == Variant::WriteBack,
            "leases need the holders' identities, which the write-back variants forget"
        );
        let quorum = quorum(N);
        let max_down = match config.max_down {
            0 => (N - quorum).max(1),
            m => usize::from(m),
        };
        let mut model = Self {
            config,
            quorum,
            max_down,
            renamings: Vec::new(),
        };
        model.renamings = permutations()
            .into_iter()
            .filter(|p| config.symmetry || *p == [0, 1, 2])
            .filter(|p| (0..C).all(|c| model.budget(p[c]) == model.budget(c)))
            // A client whose clock is behind is not interchangeable.
            .filter(|p| config.clock == Clock::Agrees || p[0] == 0)
            .collect();
        model
    }

    pub(super) fn budget(&self, client: usize) -> u8 {
        self.config.attempts.get(client).copied().unwrap_or(0)
    }

    fn checks_owner(&self) -> bool {
        self.config.variant == Variant::WriteBack
    }

    /// Whether a bucket-mate may still lower a fence, or set an absent one
    /// below the clock (the negative controls only): then no fence bounds
    /// later grants, and no write-back of ours is certain to change nothing.
    fn mates_may_lower(&self, s: &State<N>) -> bool {
        s.bucket_mates > 0 && self.config.mate_write_back != MateWriteBack::Max
    }

    /// Sources a re-seed of node `r` needs.
    fn reseed_threshold(&self) -> usize {
        if self.config.reseed.needs_quorum {
            self.quorum
        } else {
            N - self.quorum + 1
        }
    }

    /// Whether the re-seed of `r` may run now from the nodes in `sources`.
    pub(super) fn reseed_enabled(&self, s: &State<N>, r: usize, sources: u8) -> bool {
        let rule = self.config.reseed;
        s.nodes[r].status == DOWN
            && (rule.in_parallel || !s.touched(r))
            && sources & (1 << r) == 0
            && sources.count_ones() as usize >= self.reseed_threshold()
            && (0..N).all(|j| {
                sources & (1 << j) == 0
                    || s.nodes[j].status == UP
                    || (rule.unseeded_are_sources && s.nodes[j].status == DOWN)
            })
    }

    /// Every transition enabled in `s`.
    pub(super) fn steps(&self, s: &State<N>, out: &mut Vec<Step>) {
        out.clear();
        let clients = self.config.attempts.len();
        for c in 0..clients {
            match s.clients[c].phase {
                IDLE if s.clients[c].attempt < self.budget(c) => out.push(Step::Start(c)),
                IDLE => {}
                HOLDING => out.push(Step::Release(c)),
                _ => out.push(Step::GiveUp(c)),
            }
        }
        for (n, node) in s.nodes.iter().enumerate() {
            for (c, link) in node.links[..clients].iter().enumerate() {
                for (index, &msg) in link.req.iter().take_while(|&&m| m != 0).enumerate() {
                    let step = |refused| Step::Request {
                        client: c,
                        node: n,
                        index,
                        refused,
                    };
                    // With leases, a key that must stay refuses.
                    if self.may_grant(s, c, n, msg) {
                        out.push(step(false));
                    }
                    // A refusal needs a key there, and differs from a grant
                    // unless both leave an anonymous holder. A key holding
                    // the attempt's own value (a pre-grant's) grants again.
                    let own = msg == ACQ_LIVE && node.holder == live(c, s.clients[c].attempt);
                    if node.holder != FREE && (msg == ACQ_LIVE || node.holder != ANON) && !own {
                        out.push(step(true));
                    }
                }
                if notice_fence(link.reply).is_some() {
                    self.notice_steps(s, c, n, out);
                } else if link.reply != 0 {
                    out.push(Step::Reply { client: c, node: n });
                }
            }
        }
        if s.expiries > 0 {
            for (n, node) in s.nodes.iter().enumerate() {
                if node.status == UP
                    && node.fence.is_some()
                    && !s.touched(n)
                    && !self.protected(s, node.holder)
                {
                    out.push(Step::Expire(n));
                }
            }
        }
        if s.restarts > 0 && s.down() < self.max_down {
            for (n, node) in s.nodes.iter().enumerate() {
                if node.status != DOWN {
                    out.push(Step::Restart(n));
                }
            }
        }
        for r in 0..N {
            if s.nodes[r].status != DOWN {
                continue;
            }
            if self.config.late_clients && !s.touched(r) {
                out.push(Step::Trust(r));
            }
            for sources in 1..(1u8 << N) {
                if self.reseed_enabled(s, r, sources) {
                    out.push(Step::Reseed { node: r, sources });
                }
            }
        }
        if s.bucket_mates > 0 {
            // Bucket-mates send fenced requests only to nodes that vote
            // (`Node::ready` refuses the others locally).
            for (n, node) in s.nodes.iter().enumerate() {
                if node.status != UP {
                    continue;
                }
                out.push(Step::MateAcquire(n));
                for to in mate_write_backs(self.config.mate_write_back, node.fence, s.high) {
                    out.push(Step::MateWriteBack { node: n, to });
                }
            }
        }
        self.pregrant_steps(s, out);
    }

    /// The seed an acquire of client `c` puts into an absent fence.
    fn seed(&self, s: &State<N>, c: usize) -> u8 {
        match self.config.clock {
            Clock::Behind if c == 0 => 0,
            _ => s.max_handed(),
        }
    }

    /// Applies `step` to `s`, then prunes. With `log`, also describes the
    /// step in one line (formatting only then: this is the hot path).
    pub(super) fn apply(
        &self,
        s: &State<N>,
        step: Step,
        mut log: Option<&mut String>,
    ) -> (State<N>, Effects) {
        let mut n = *s;
        let mut effects = Effects::default();
        match step {
            Step::Start(c) => {
                let floor = n.max_handed();
                let cl = &mut n.clients[c];
                cl.attempt += 1;
                cl.phase = ACQUIRING;
                cl.floor = floor;
                let attempt = cl.attempt;
                // A node that does not vote gets nothing (`Node::ready`).
                for node in n.nodes.iter_mut().filter(|node| node.status == UP) {
                    push(&mut node.links[c].req, ACQ_LIVE);
                }
                note!(
                    log,
                    "{} starts (largest token so far {floor})",
                    who(c, attempt)
                );
            }
            Step::GiveUp(c) => {
                n.clients[c].phase = IDLE;
                note!(log, "{} gives up", who(c, s.clients[c].attempt));
            }
            Step::Request {
                client: c,
                node: i,
                index,
                refused,
            } => {
                let req = &mut n.nodes[i].links[c].req;
                let msg = req[index];
                // FIFO: the ones before it were lost. Unordered: only it
                // leaves the channel.
                let from = match self.config.network {
                    Network::Fifo => 0,
                    Network::Unordered => index,
                };
                let removed = index + 1 - from;
                req.copy_within(index + 1.., from);
                req[QCAP - removed..].fill(0);
                if removed > 1 {
                    note!(log, "({} lost) ", removed - 1);
                }
                effects.seeded =
                    self.deliver_request(&mut n, c, i, msg, refused, reborrow(&mut log));
            }
            Step::Reply { client: c, node: i } => {
                let reply = std::mem::take(&mut n.nodes[i].links[c].reply);
                effects.hand_out = self.deliver_reply(&mut n, c, i, reply, reborrow(&mut log));
            }
            Step::Expire(i) => {
                let node = &mut n.nodes[i];
                note!(
                    log,
                    "n{i}: fence {} expires (and any lock key there)",
                    node.fence.unwrap_or(0)
                );
                node.fence = None;
                // The lock key's TTL is at most the fence's retention, and
                // every grant renews both: a key still there was extended
                // by a holder that handed out long ago, whose write-backs
                // are no longer in flight.
                if node.holder != FREE {
                    node.holder = ANON;
                }
                n.expiries -= 1;
                effects.expired = true;
            }
            Step::Restart(i) => {
                note!(log, "n{i} restarts without its data");
                let clients = n.clients;
                let node = &mut n.nodes[i];
                node.fence = None;
                node.holder = FREE;
                node.status = DOWN;
                for (link, cl) in node.links.iter_mut().zip(&clients) {
                    // The connection broke: what was sent is lost. An
                    // answer already on its way may still be read.
                    link.req = [0; QCAP];
                    if cl.phase == WRITING_BACK && link.seen == S_PENDING && link.reply != R_WB_OK {
                        link.seen = 0;
                        effects.lost_write_backs += 1;
                    }
                }
                n.restarts -= 1;
                effects.restarted = true;
            }
            Step::Reseed { node: r, sources } => {
                let (mut max, mut lacks) = (None::<u8>, false);
                for (j, node) in n.nodes.iter().enumerate() {
                    if sources & (1 << j) != 0 {
                        match node.fence {
                            Some(f) => max = Some(max.map_or(f, |m| m.max(f))),
                            None => lacks = true,
                        }
                    }
                }
                let clock = n.max_handed();
                let value = match max {
                    Some(m) if lacks && self.config.reseed.clock_floor => Some(m.max(clock)),
                    other => other,
                };
                note!(log, "n{r} re-seeded from");
                for j in (0..N).filter(|j| sources & (1 << j) != 0) {
                    match n.nodes[j].fence {
                        Some(f) => note!(log, " n{j} ({f})"),
                        None => note!(log, " n{j} (none)"),
                    }
                }
                match value {
                    Some(v) if max != value => note!(log, ": fence {v} (clock floor)"),
                    Some(v) => note!(log, ": fence {v}"),
                    None => note!(log, ": no fence"),
                }
                assert!(
                    n.nodes[r].fence.is_none()
                        || self.config.pregrant_from != PregrantFrom::VotingHome,
                    "a node down kept a fence"
                );
                // Raise-only (`reseed.lua`): a fence the node holds (a
                // pre-grant's, under the controls) is kept if larger.
                n.nodes[r].fence = n.nodes[r].fence.max(value);
                n.nodes[r].status = if n.touched(r) { WAITING } else { UP };
                if n.nodes[r].status == WAITING {
                    note!(log, ", votes once its window is over");
                } else {
                    note!(log, ", votes again");
                }
                effects.reseeded = true;
            }
            Step::Trust(r) => {
                note!(
                    log,
                    "n{r} votes again without a re-seed (a client that met it late)"
                );
                n.nodes[r].status = UP;
            }
            Step::MateAcquire(i) => {
                // Bucket-mates' clocks agree: the seed is the clock.
                let seed = n.max_handed();
                let node = &mut n.nodes[i];
                let before = node.fence;
                node.fence = Some(fence_u8(next_fence(u64::from(before.unwrap_or(seed)))));
                note!(
                    log,
                    "n{i} ← bucket-mate acquire: fence {} → {}",
                    fence_name(before),
                    fence_name(node.fence)
                );
                if before.is_none() {
                    note!(log, " (seeded {seed})");
                }
                n.bucket_mates -= 1;
                effects.mate = true;
            }
            Step::MateWriteBack { node: i, to } => {
                let node = &mut n.nodes[i];
                let before = node.fence;
                node.fence = Some(match self.config.mate_write_back {
                    MateWriteBack::Set => to,
                    _ => before.map_or(to, |f| f.max(to)),
                });
                note!(
                    log,
                    "n{i} ← bucket-mate write-back {to}: fence {} → {}",
                    fence_name(before),
                    fence_name(node.fence)
                );
                n.bucket_mates -= 1;
                effects.mate = true;
            }
            Step::Pregrant {
                node: h,
                client: c,
                handover,
            } => {
                effects.seeded = self.pregrant(&mut n, h, c, handover, reborrow(&mut log));
                effects.pregrant = true;
            }
            Step::Notice {
                client: c,
                node: h,
                counted,
            } => self.notice(&mut n, c, h, counted, reborrow(&mut log)),
            Step::Release(c) => {
                n.clients[c].phase = IDLE;
                note!(
                    log,
                    "{}'s lease ends (released, or its validity ran out)",
                    who(c, s.clients[c].attempt)
                );
                effects.released = true;
            }
        }
        effects.lost_write_backs += self.prune(&mut n);
        if let (Some(log), true) = (log, effects.lost_write_backs > 0) {
            let _ = write!(
                log,
                " [{} write-back(s) can no longer succeed]",
                effects.lost_write_backs
            );
        }
        (n, effects)
    }

    /// Lands a request; returns whether it seeded an absent fence.
    fn deliver_request(
        &self,
        s: &mut State<N>,
        c: usize,
        i: usize,
        msg: u8,
        refused: bool,
        mut log: Option<&mut String>,
    ) -> bool {
        assert_eq!(
            s.nodes[i].status, UP,
            "a request reached a node that does not vote"
        );
        let attempt = s.clients[c].attempt;
        let seed = self.seed(s, c);
        let node = &mut s.nodes[i];
        let mut reply = 0;
        let mut seeded = false;
        if let Some((a, token)) = write_back_parts(msg) {
            let ok = !self.checks_owner() || node.holder == live(c, a);
            let before = node.fence;
            if ok {
                node.fence = Some(node.fence.map_or(token, |f| f.max(token)));
                let cl = &s.clients[c];
                if a == cl.attempt && cl.phase == WRITING_BACK {
                    reply = R_WB_OK;
                }
                note!(
                    log,
                    "n{i} ← {} write-back {token}: ok, fence {} → {token}",
                    who(c, a),
                    before.map_or("none".to_string(), |f| f.to_string()),
                );
                if node.fence != Some(token) {
                    note!(log, " (kept {})", node.fence.unwrap_or(0));
                }
            } else {
                // Pruning removes such a write-back as soon as the key is
                // not its attempt's: it never lands.
                unreachable!("a write-back that fails the ownership check was kept");
            }
        } else {
            // Either way the fence moves (see "refusals" in the module
            // docs), seeded first if it is absent. Granted: whatever key
            // was there had vanished.
            let is_live = msg == ACQ_LIVE;
            note!(
                log,
                "n{i} ← {} acquire: ",
                if is_live {
                    who(c, attempt)
                } else {
                    format!("c{c} (abandoned)")
                }
            );
            let base = match node.fence {
                Some(f) => f,
                None => {
                    seeded = true;
                    note!(log, "no fence, seeded {seed}; ");
                    seed
                }
            };
            node.fence = Some(fence_u8(next_fence(u64::from(base))));
            let fence = node.fence.unwrap_or(0);
            if refused {
                note!(log, "refused, fence {fence}");
            } else {
                let own = is_live && node.holder == live(c, attempt);
                match live_parts(node.holder) {
                    _ if own => note!(log, "its own key (pre-granted) again; "),
                    Some((h, a))
                        if self.config.leases && s.clients[c].named & NAMED_HANDOVER != 0 =>
                    {
                        note!(log, "key of {} replaced (handover); ", who(h, a))
                    }
                    Some((h, a)) => note!(log, "key of {} vanished; ", who(h, a)),
                    None => {}
                }
                node.holder = if is_live { live(c, attempt) } else { ANON };
                // With leases an acquire of the current attempt stays live
                // past its phase (its key must stay): only the acquiring
                // phase awaits the answer.
                if is_live && s.clients[c].phase == ACQUIRING {
                    reply = R_GRANTED | fence;
                }
                note!(log, "granted, fence {fence}");
            }
        }
        if reply != 0 {
            let slot = &mut s.nodes[i].links[c].reply;
            // An attempt awaits one answer per node at a time and sends the
            // node its next request only after that answer landed.
            assert_eq!(*slot, 0, "two answers that matter on one channel");
            *slot = reply;
        }
        seeded
    }

    fn deliver_reply(
        &self,
        s: &mut State<N>,
        c: usize,
        i: usize,
        reply: u8,
        mut log: Option<&mut String>,
    ) -> Option<HandOut> {
        let attempt = s.clients[c].attempt;
        note!(log, "{} ← n{i} ", who(c, attempt));
        let mut hand_out = None;
        if let Some(fence) = granted_fence(reply) {
            note!(log, "granted {fence}");
            s.nodes[i].links[c].seen = reply;
            let mut tally = Tally::new(N);
            let mut fences = [0u64; N];
            let mut granted = 0;
            for node in &s.nodes {
                if let Some(f) = granted_fence(node.links[c].seen) {
                    tally.record(true);
                    fences[granted] = u64::from(f);
                    granted += 1;
                }
            }
            if tally.decision() == Decision::Reached {
                let Some(m) = merge(&fences[..granted]) else {
                    unreachable!("a quorum without grants")
                };
                let token = fence_u8(m.token);
                note!(log, " → token {token}, reported by {}", m.stored);
                if self.config.variant == Variant::Naive || !m.needs_write_back(self.quorum) {
                    hand_out = Some(self.hand_out(s, c, token, false));
                } else {
                    note!(log, "; write back to");
                    s.clients[c].phase = WRITING_BACK;
                    s.clients[c].token = token;
                    for (j, node) in s.nodes.iter_mut().enumerate() {
                        let votes = node.status == UP;
                        let link = &mut node.links[c];
                        link.seen = match granted_fence(link.seen) {
                            None => 0,
                            Some(f) if f == token => S_STORED,
                            // Restarted since it granted: refused locally.
                            Some(_) if !votes => 0,
                            Some(_) => {
                                push(&mut link.req, write_back(attempt, token));
                                note!(log, " n{j}");
                                S_PENDING
                            }
                        };
                    }
                }
            }
        } else {
            assert_eq!(reply, R_WB_OK, "unknown answer");
            note!(log, "write-back ok");
            s.nodes[i].links[c].seen = S_STORED;
            if self.write_back_tally(s, c) == Decision::Reached {
                let token = s.clients[c].token;
                note!(log, " → token {token}");
                hand_out = Some(self.hand_out(s, c, token, true));
            }
        }
        if let Some(h) = hand_out {
            note!(
                log,
                " HANDED OUT (floor {}){}{}",
                h.floor,
                if h.not_monotonic() {
                    "  <-- NOT ABOVE AN EARLIER TOKEN"
                } else {
                    ""
                },
                if h.duplicate { "  <-- DUPLICATE" } else { "" },
            );
        }
        hand_out
    }

    /// The write-back's decision, as `FanOut::start_credited` counts it:
    /// nodes that reported the token (or answered `Ok`) are yes, nodes not
    /// asked are no, the rest are pending.
    fn write_back_tally(&self, s: &State<N>, c: usize) -> Decision {
        let mut tally = Tally::new(N);
        for node in &s.nodes {
            match node.links[c].seen {
                S_PENDING => {}
                seen => {
                    tally.record(seen == S_STORED);
                }
            }
        }
        tally.decision()
    }

    fn hand_out(&self, s: &mut State<N>, c: usize, token: u8, written_back: bool) -> HandOut {
        let h = HandOut {
            client: c,
            attempt: s.clients[c].attempt,
            token,
            floor: s.clients[c].floor,
            duplicate: s.handed & (1 << token) != 0,
            written_back,
            after_reseed: s.restarts < self.config.restarts
                && s.nodes.iter().all(|n| n.status == UP),
            after_mate: s.bucket_mates < self.config.bucket_mates,
            pregranted: s.clients[c].named & NAMED_COUNTED != 0,
            overlaps: self.config.leases && (0..C).any(|o| o != c && s.clients[o].phase == HOLDING),
        };
        s.handed |= 1 << token;
        if self.config.leases {
            self.hold(s, c);
        } else {
            s.clients[c].phase = IDLE;
        }
        h
    }

    /// Forgets whatever can no longer influence a hand-out, and gives up
    /// attempts that can no longer reach a quorum (see the module docs).
    /// Every rule tests a condition that cannot become false again, which
    /// is what makes forgetting safe. Returns the number of awaited
    /// write-backs cancelled because their key is no longer theirs.
    fn prune(&self, s: &mut State<N>) -> u32 {
        let checks_owner = self.checks_owner();
        let may_lower = self.mates_may_lower(s);
        let mut lost = 0;

        // The largest fence ever held: raised only by an `INCR` (seeds,
        // copies and write-backs never exceed it), so tracking the fences
        // after every step is enough. Unused once no bucket-mate is left.
        s.high = if s.bucket_mates > 0 {
            s.nodes.iter().filter_map(|n| n.fence).fold(s.high, u8::max)
        } else {
            0
        };

        // A write-back that fails the ownership check would change nothing
        // but the client's count: drop it, and un-await its node. (The
        // attempt's acquire landed before the write-back was sent, so once
        // the key is not the attempt's it never will be again.)
        if checks_owner {
            for node in &mut s.nodes {
                let holder = node.holder;
                for (c, link) in node.links.iter_mut().enumerate() {
                    let cl = &s.clients[c];
                    let before = link.req;
                    retain(&mut link.req, |m| {
                        write_back_parts(m).is_none_or(|(a, _)| holder == live(c, a))
                    });
                    if link.req != before && cl.phase == WRITING_BACK && link.seen == S_PENDING {
                        let still = link
                            .req
                            .iter()
                            .any(|&m| write_back_parts(m).is_some_and(|(a, _)| a == cl.attempt));
                        if !still && link.reply != R_WB_OK {
                            link.seen = 0;
                            lost += 1;
                        }
                    }
                }
            }
        }

        // Attempts that can no longer reach a quorum give up now.
        for c in 0..C {
            let giving_up = match s.clients[c].phase {
                ACQUIRING => self.acquire_bound(s, c) == UNBOUNDED,
                WRITING_BACK => self.write_back_tally(s, c) == Decision::Impossible,
                _ => false,
            };
            if giving_up {
                s.clients[c].phase = IDLE;
            }
        }

        // Per-attempt state of idle clients, answers nobody awaits,
        // acquires nobody awaits, write-backs that change nothing.
        let clients = s.clients;
        for (c, cl) in clients.iter().enumerate() {
            if cl.phase == IDLE {
                s.clients[c] = ClientState {
                    attempt: cl.attempt,
                    ..ClientState::default()
                };
            }
        }
        for node in &mut s.nodes {
            let (holder, fence) = (node.holder, node.fence);
            for (c, cl) in clients.iter().enumerate() {
                let link = &mut node.links[c];
                let awaited = match cl.phase {
                    ACQUIRING => {
                        (granted_fence(link.reply).is_some() || notice_fence(link.reply).is_some())
                            && link.seen == 0
                    }
                    WRITING_BACK => link.reply == R_WB_OK && link.seen == S_PENDING,
                    _ => false,
                };
                if !awaited {
                    link.reply = 0;
                }
                if cl.phase == IDLE {
                    link.seen = 0;
                }
                let pending = cl.phase == WRITING_BACK && link.seen == S_PENDING;
                // With leases, the current attempt's acquires stay its own
                // while it is in progress or holds: the keys they set must
                // stay.
                let live_acquire =
                    cl.phase == ACQUIRING || (self.config.leases && cl.phase != IDLE);
                for m in &mut link.req {
                    if *m == ACQ_LIVE && !live_acquire {
                        *m = ACQ_ANON;
                    }
                }
                retain(&mut link.req, |m| match write_back_parts(m) {
                    None => true,
                    Some((a, token)) => {
                        let waited_for = pending && a == cl.attempt;
                        let raises = may_lower
                            || fence.is_none_or(|f| f < token)
                                && (!checks_owner || holder == live(c, a));
                        waited_for || raises
                    }
                });
            }
            // A holder's identity only matters to a write-back of its
            // attempt: one in flight, or one its attempt may still send.
            if let Some((c, a)) = live_parts(holder) {
                let cl = &clients[c];
                let in_flight = node.links[c]
                    .req
                    .iter()
                    .any(|&m| write_back_parts(m).is_some_and(|(w, _)| w == a));
                let may_send = cl.attempt == a && cl.phase == ACQUIRING;
                // With leases, also the key of an attempt in progress or
                // holding: it must stay.
                let stays = self.config.leases && cl.attempt == a && cl.phase != IDLE;
                if !checks_owner || !(in_flight || may_send || stays) {
                    node.holder = ANON;
                }
            }
        }

        // A re-seeded node votes as soon as its window is over: once no
        // attempt in progress counts it (the earliest is the most general).
        for i in 0..N {
            if s.nodes[i].status == WAITING && !s.touched(i) {
                s.nodes[i].status = UP;
            }
        }

        if !self.config.forget_tokens {
            return lost;
        }
        // No token below `least` can be handed out any more: forget those
        // (but keep the largest, which later attempts' floors read, and
        // seeds and the re-seed's clock floor), and the floor of an attempt
        // whose token is certainly above it.
        let (bounds, least) = self.bounds(s);
        for (cl, bound) in s.clients.iter_mut().zip(bounds) {
            if bound > cl.floor {
                cl.floor = 0;
            }
        }
        let more_attempts = (0..C).any(|c| s.clients[c].attempt < self.budget(c));
        let keep_max = if more_attempts || self.config.clock_matters() {
            1u32 << s.max_handed()
        } else {
            0
        };
        let at_least = if least >= 32 { 0 } else { u32::MAX << least };
        s.handed &= at_least | (keep_max & s.handed);
        lost
    }

    /// Lower bounds on the tokens still to be handed out: per client, by
    /// its current attempt; and overall (`least`), by any attempt, current
    /// or future. Both only grow along every transition (the audit checks
    /// it), which is what makes forgetting below them safe.
    pub(super) fn bounds(&self, s: &State<N>) -> ([u8; C], u8) {
        let mut bounds = [UNBOUNDED; C];
        let mut least = UNBOUNDED;
        for (c, bound) in bounds.iter_mut().enumerate() {
            let cl = &s.clients[c];
            *bound = match cl.phase {
                ACQUIRING => self.acquire_bound(s, c),
                WRITING_BACK => cl.token,
                _ => UNBOUNDED,
            };
            least = least.min(*bound);
            if cl.attempt < self.budget(c) {
                least = least.min(self.fresh_bound(s));
            }
        }
        (bounds, least)
    }

    /// A lower bound on the fence an acquire landing on node `i` finds
    /// (an absent fence counting as its seed), now and at every later
    /// moment. Without expiries and restarts, the fence itself: fences
    /// never decrease. An absent fence is seeded at least at the largest
    /// token handed out (which is never forgotten then); a fence that may
    /// still expire is bounded by that too, and one that may still be lost
    /// in a restart, or is down, only by 0 (a re-seed is not trusted here).
    fn lower(&self, s: &State<N>, i: usize) -> u8 {
        let node = &s.nodes[i];
        if self.mates_may_lower(s) {
            return 0;
        }
        if !self.config.clock_matters() {
            return node.fence.unwrap_or(0);
        }
        let seed = match self.config.clock {
            Clock::Agrees => s.max_handed(),
            Clock::Behind => 0,
        };
        if node.status != UP || s.restarts > 0 {
            return 0;
        }
        match node.fence {
            None => seed,
            Some(f) if s.expiries > 0 => f.min(seed),
            Some(f) => f,
        }
    }

    /// The smallest token the client's acquiring attempt can still hand
    /// out: the quorum-th smallest of what each node can still contribute
    /// (a grant seen or in flight, or at least its lower bound + 1 while
    /// the acquire is in flight). `UNBOUNDED` when a quorum is out of reach.
    /// While a pre-grant's notice is in flight, the home can contribute its
    /// notice's fence or, asked, more than its lower bound, and every other
    /// node, asked once the notice lands, more than its lower bound.
    pub(super) fn acquire_bound(&self, s: &State<N>, c: usize) -> u8 {
        let mut values = [UNBOUNDED; N];
        let notice = s
            .nodes
            .iter()
            .any(|node| notice_fence(node.links[c].reply).is_some());
        for (i, (v, node)) in values.iter_mut().zip(&s.nodes).enumerate() {
            let link = &node.links[c];
            if let Some(f) = granted_fence(link.seen).or(granted_fence(link.reply)) {
                *v = f;
            } else if let Some(f) = notice_fence(link.reply) {
                *v = f.min(self.lower(s, i) + 1);
            } else if notice || link.req.contains(&ACQ_LIVE) {
                *v = self.lower(s, i) + 1;
            }
        }
        values.sort_unstable();
        values[self.quorum - 1]
    }

    /// The smallest token an attempt not yet started can hand out: a
    /// quorum of grants, each above its node's lower bound.
    fn fresh_bound(&self, s: &State<N>) -> u8 {
        let mut values = [0; N];
        for (i, v) in values.iter_mut().enumerate() {
            *v = self.lower(s, i) + 1;
        }
        values.sort_unstable();
        values[self.quorum - 1]
    }
}

/// Keeps the messages of a channel that pass `keep`, in order.
fn retain(req: &mut [u8; QCAP], keep: impl Fn(u8) -> bool) {
    let mut kept = [0; QCAP];
    let mut len = 0;
    for &m in req.iter().take_while(|&&m| m != 0) {
        if keep(m) {
            kept[len] = m;
            len += 1;
        }
    }
    *req = kept;
}

fn reborrow<'b>(log: &'b mut Option<&mut String>) -> Option<&'b mut String> {
    log.as_mut().map(|l| &mut **l)
}

/// Appends `msg` to a channel.
pub(super) fn push(req: &mut [u8; QCAP], msg: u8) {
    let Some(slot) = req.iter_mut().find(|m| **m == 0) else {
        panic!("a channel holds more than {QCAP} messages that matter: raise QCAP");
    };
    *slot = msg;
}

pub(super) fn fence_u8(fence: u64) -> u8 {
    match u8::try_from(fence) {
        Ok(f) if f <= MAX_FENCE => f,
        _ => panic!("fence {fence} outside the model's bound {MAX_FENCE}"),
    }
}

/// The values a bucket-mate's write-back can bring to a fence: its token
/// `x` is a value some node's fence held, so `x ≤ high`, and `x ≥ 1`. The
/// protocol's `max` lands only where the fence is present (the write-back
/// is gated on the bucket-mate's lock key, set by a grant that made the
/// fence present; an expiry or restart since has made the key anonymous or
/// lost it), and only a value above the fence changes anything.
pub(super) fn mate_write_backs(
    rule: MateWriteBack,
    fence: Option<u8>,
    high: u8,
) -> impl Iterator<Item = u8> {
    (1..=high).filter(move |&x| match (rule, fence) {
        (MateWriteBack::Max, None) => false,
        (MateWriteBack::Set, None) => false,
        (MateWriteBack::Set, Some(f)) => x != f,
        (_, Some(f)) => x > f,
        (MateWriteBack::Ungated, None) => true,
    })
}

pub(super) fn fence_name(fence: Option<u8>) -> String {
    fence.map_or("none".to_string(), |f| f.to_string())
}

pub(super) fn who(client: usize, attempt: u8) -> String {
    format!("c{client}#{attempt}")
}
