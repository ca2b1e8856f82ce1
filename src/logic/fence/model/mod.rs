//! Exhaustive model check of the fencing-token protocol on N = 2 to 5
//! nodes and a handful of clients: with fences kept, with fence keys that
//! expire and are seeded again from a clock, with nodes that restart
//! without their data and are re-seeded by the restart guard, with
//! bucket-mates: fences are kept per bucket of resources; other
//! resources of the bucket move the shared fence; and with the fair
//! queue's pre-grant and handover, where leases make mutual exclusion
//! checkable too. Driven by the
//! real pure logic: [`merge`](super::merge),
//! [`Merge::needs_write_back`](super::Merge::needs_write_back) and
//! [`next_fence`](super::next_fence) from the parent module, `quorum` and
//! `Tally` from `quorum.rs`.
//!
//! Test-only. One concept per file: this one (what is modelled and why),
//! `vocab.rs` (bounds and encodings), `config.rs` (what a run checks),
//! `report.rs` (steps, effects, violations, the report), `reduced.rs` (the model that is explored, with
//! its reductions), `symmetry.rs` (symmetry classes and their
//! fingerprints), `search.rs` (exploring and judging), `literal.rs` (the
//! unreduced model that checks the reductions), `queue.rs` (the fair
//! queue's pre-grant, its notice and leases in the reduced model),
//! `tests.rs`, `mate_tests.rs` (bucket-mates) and `queue_tests.rs` (the
//! fair queue).
//!
//! # What is modelled
//!
//! * **Nodes** hold the lock key (free, or held by one attempt), the fence,
//!   and whether they vote. An acquire is one atomic step, the transaction
//!   `SET lock v NX`, `SET fence seed NX`, `INCR fence`: the fence is seeded
//!   first if it is absent (see the clock below), then moves to `fence + 1`;
//!   if the key is free the node takes it and answers `Granted(fence)`, else
//!   refuses. A refusal may move the fence too, or not: the
//!   implementation's `MULTI … INCR … EXEC` moves it on every attempt, a
//!   script that moves it only on grants does not, and the model allows
//!   either at each refusal, so it covers both. A write-back is one atomic
//!   step: if this attempt still holds the key there, `fence = max(fence,
//!   T)` (`T` if absent) and answer `Ok`, else answer `NotHeld`. All fences
//!   start present and equal (0), as if seeded together; unequal and
//!   absent ones are reached anyway.
//! * **A lock key may vanish at any moment**: TTL expiry, a node's clock
//!   jumping, eviction, and every compare-and-delete release. Releases are
//!   therefore not messages here: whatever a release can do, a key
//!   vanishing at the same moment does too. (How this is explored without
//!   a transition of its own: "keys vanish lazily", below.)
//! * **Clients** run their attempts one after the other, each under a fresh
//!   identity. An attempt sends an acquire to every node that votes and
//!   decides at the first certain outcome, like `Client::attempt` and
//!   `settle_token`: at a quorum of grants it merges their fences; if the
//!   maximum `T` was reported by a quorum it hands `T` out, otherwise it
//!   sends `WriteBack(T)` to the granting nodes that reported less (and
//!   still vote) and hands `T` out once the nodes that reported `T` plus the
//!   `Ok` write-backs make a quorum (nodes that did not grant count no, as
//!   in `FanOut::start_credited`). A client may give up on an attempt at
//!   any moment (its timeout); it then ignores every answer of that attempt
//!   and may start its next one. A handed-out token plays no further part
//!   in the protocol, so the client may start its next attempt at once.
//!   Concurrent acquires of one process are separate clients here, with
//!   separate channels, which allows more interleavings than one shared
//!   connection per node does.
//! * **The network**: one channel each way per (client, node) pair. A
//!   channel is FIFO, as one TCP connection is: messages arrive in the
//!   order sent, any of them may be lost, delays are arbitrary, and
//!   channels of different pairs interleave in every order. Loss is the
//!   transition "deliver the k-th message in flight; the ones before it
//!   were lost" (a message never delivered needs no transition). Messages
//!   of an attempt the client gave up on stay in flight and may land after
//!   its next attempt started. FIFO holds within one connection; after a
//!   reconnect, a segment of the old connection could in principle reach
//!   the server after the new one's, so [`Network::Unordered`] (any request
//!   in flight may land next) is checked too, in ignored tests.
//! * **Fence loss and the clock seed** (`Config::expiries` per run). Fences
//!   per bucket have no expiry; a loss now stands for an `allkeys-*`
//!   eviction, a hand, or the first use after an upgrade from per-resource
//!   fences (and the model keeps the retention's reading, when they had
//!   one). A node's fence key is lost at any moment, except while an
//!   attempt in progress counts
//!   the node toward its quorum (it was granted there, or its write-back
//!   there succeeded or is awaited). Such an attempt renewed the fence
//!   within its lock TTL, the retention is never shorter than that TTL,
//!   and an attempt hands out within its TTL. A lock key still there was
//!   extended by a holder that handed out long ago: it becomes anonymous
//!   (no write-back stays in flight for a retention). The next acquire that
//!   lands seeds the fence from its client's clock. **The clock**
//!   ([`Clock::Agrees`]): a seed is at least every token handed out before
//!   the acquire lands, the lowest value the assumption "clocks agree and
//!   no resource is acquired a million times a second" allows (the seed is
//!   read when the attempt starts, a node timeout at most before it lands,
//!   and tokens trail the clock by the microseconds since their first seed
//!   less the acquisitions since). Larger seeds are safe by the same
//!   argument (below) and not enumerated.
//! * **Restarts without data, the window and the re-seed**
//!   (`Config::restarts` per run). A node restarts empty at any moment: its
//!   fence and lock key are gone, what was sent to it is lost (the
//!   connection broke; an answer already on its way may still be read),
//!   and it is *down*: `Node::ready` refuses it every fenced request
//!   (acquire, write-back) locally, so none is sent. At most max(N − q, 1)
//!   nodes are down at once (q = ⌊N/2⌋ + 1; N − q is the model's
//!   assumption, and 1 for N = 2, see "Why these node counts"). Its
//!   restart-guard window is over once no attempt in progress counts it:
//!   the window (at least the TTL) starts at the restart and outlasts every
//!   attempt that began before; ending it at the earliest such moment is
//!   the most general. Then the **re-seed**, one step that reads the fences
//!   of a set of other nodes (its sources) and raises the node's fence to
//!   their maximum, after which the node votes again. The rule checked
//!   ([`Reseed::PROTOCOL`]): a source must vote in fenced requests itself (a
//!   node down is none); at least N − q + 1 sources (quorum intersection
//!   among the N − 1 others needs no more, below); the reads begin only
//!   once the window is over; and where some source lacks the fence (it
//!   expired there) while another has it, the copy is raised to at least
//!   the clock (the largest token handed out); where none has it, it stays
//!   absent and the next acquire seeds it. Optionally
//!   (`Config::late_clients`), a client that first meets the restarted
//!   server once its window is over takes it as it is, as the library
//!   does: the node votes again without a re-seed, its fences absent.
//! * **Bucket-mates** (`Config::bucket_mates` steps per run): fences are
//!   kept per bucket of resources; other resources of the
//!   bucket move the shared fence. "Our" resource is the one whose
//!   attempts the clients above make; a bucket-mate step is one atomic
//!   request of another resource at a node that votes (a node down or
//!   waiting gets none: the restart guard refuses it locally; one sent
//!   before a restart is lost, as ours are): (a) an acquire, which seeds
//!   the fence if absent (same clock rule) and moves it to `fence + 1`; or
//!   (b) a write-back of another resource's attempt, gated on *that*
//!   resource's lock key: `fence = max(fence, x)` for every `x` with
//!   `fence < x ≤ high`, where `high` (`State::high`) is the largest fence
//!   any node has ever held (restarts and expiries lower fences, so not
//!   the largest now), since `x` is a token some node's fence held. A
//!   re-seed's raise for another resource is a write-back of this kind.
//!   (b) lands only on a present fence: its lock key was set by a grant
//!   that made the fence present, and the fence is lost only by an expiry
//!   (after a retention with no grant, when a key still there belongs to
//!   a holder that handed out long ago, with no write-back in flight) or a
//!   restart (which loses the key). Bucket-mates' tokens are not judged,
//!   and may equal ours.
//! * **The fair queue's pre-grant** (`Config::pregrants` per run; DESIGN.md
//!   section 2, "Waiting acquire", step 3). A release on the queue's home
//!   node (`wire/lua/release.lua`, lines 47-60) deletes its holder's key
//!   and, in the same script, names the waiter at the head: it sets the
//!   home's lock key for that waiter (`SET NX PX`) and moves the home's
//!   fence as an acquire would (`INCR`, seeded from the releasing client's
//!   clock when absent: clocks agree), and publishes a notice carrying the
//!   new fence. In the model a pre-grant is one atomic step at any node as
//!   home (a fixed home is one choice of these, and nodes stay
//!   interchangeable) naming any idle client with an attempt left; that
//!   client's next attempt begins there (its floor is read then: the
//!   attempt's first vote, DESIGN.md section 6), the home's key holds its
//!   value, and the notice is a message home → client that may be delayed
//!   or lost (the client may give up meanwhile). Releases reach the home
//!   at any moment (a late one, an orphan's), and the home's key is free
//!   after a release deletes it or vanishes, so no holder is named. When
//!   the notice lands the client counts the home's vote without asking it,
//!   the notice's fence among the grants (`Waiter::pregranted`,
//!   `attempt_pregranted`, `FanOut::start_credited`), and sends its acquire
//!   to the other nodes that vote; or it does not count it (its view of
//!   the home, a long wait, a young subscription) and asks every node that
//!   votes, the home included, whose key holds its value and grants again
//!   (`acquire.lua`, lines 2-7). The token is settled as any other:
//!   merged, written back where the maximum is not held by a quorum (the
//!   home too, gated on its key). **The restart guard's rule**
//!   ([`PregrantFrom::VotingHome`], issue 31): only a home that votes in
//!   fenced requests pre-grants (`Server::run_script_vouched` sends the
//!   pre-granting form only when the releaser's verdict on that server is
//!   "votes": past its window, re-seeded); the notice may then be counted
//!   whenever it lands, also after a later restart of the home (a waiter
//!   whose connection has not seen that restart yet counts it; the window
//!   covers it, as it covers any grant read after a restart). The
//!   library's second half, the waiter counting it only where its own view
//!   says the home votes (`Server::votes_now`), is then a subset.
//! * **Leases** (`Config::leases`): the model above lets every key vanish
//!   at any moment and judges only the tokens. With leases it also checks
//!   mutual exclusion under Redlock's timing assumptions: a hand-out holds
//!   the lock (a lease) until a step ends it (its release, or its validity
//!   running out); the key of an attempt in progress or holding stays (a
//!   lease ends before its keys expire, and an attempt whose key expired
//!   cannot hand out any more, which the model reaches by giving up first),
//!   so an acquire landing on it is refused; other keys vanish at any
//!   moment as before. Only a restart loses a key that must stay, and the
//!   restart guard's window then outlasts every lease that counted the
//!   node (the nodes that granted it), not only the attempts. A pre-grant
//!   needs the home's key free, so not one that must stay.
//! * **The handover** (`Config::handover`): the release on the home, when
//!   it pre-granted and deleted its holder H's key, leaves H's keys on the
//!   other nodes to the named waiter, whose acquire replaces a key holding
//!   H's value (matched by the SHA1, `acquire.lua`, lines 2-7) as if it
//!   were free; anybody else's is refused until the key expires. The
//!   reduced model needs no transition for it: H's lease is over, so its
//!   keys may vanish at any moment anyway, and a replacement is that
//!   vanishing with the waiter's grant right after it, in one step. The
//!   literal model has it as a transition of its own (keys known by the
//!   attempt whose value they hold; others refused until an explicit
//!   expiry) and must reach the same hand-outs, which checks the argument.
//!   The races of the issue are there: H's key expiring before the
//!   waiter's acquire (the expiry step; another client may take the node,
//!   and the waiter is refused there), and H's stale extend, which needs
//!   no step: `extend.lua` only sets the expiry of a key holding H's value,
//!   and expiry has no time here (landing after the replacement it finds
//!   another value and does nothing; before, H's key stays until the
//!   waiter replaces it or it expires, as without it).
//!
//! # What is checked, on every transition
//!
//! * **Strict monotonicity**: a token handed out is larger than every token
//!   handed out, by anyone, before its attempt began.
//! * **Uniqueness**: no two hand-outs carry the same token, also while two
//!   attempts hold the lock at once because keys vanished early. Both are
//!   about our resource's hand-outs, with or without bucket-mates.
//! * **The re-seed's liveness**: in every reachable state where a node is
//!   down, its window over, and every other node kept its fences and
//!   answers, or all but q − 2 of them do (as many as N − q + 1 sources
//!   leave out: none on two or three nodes, one on four or five), the
//!   re-seed from those is enabled and leaves the node voting. Checked with
//!   the model's own transitions.
//! * **Mutual exclusion** (with leases): no hand-out while another client
//!   holds the lock.
//! * Sanity, so that the above are not vacuous: hand-outs happen, some of
//!   them after a write-back, and some write-backs lose their key; with
//!   expiries, fences expire and are seeded again; with restarts, nodes are
//!   re-seeded, tokens are handed out once every restarted node votes
//!   again, and the liveness check applies in some states; with
//!   bucket-mates, tokens are handed out after a bucket-mate step, and the
//!   run reaches hand-outs (who, which token) that the same run without
//!   bucket-mates does not; with pre-grants, hand-outs count a pre-granted
//!   vote unasked; with leases, leases end; and the literal model's
//!   acquires take handed-over keys.
//!
//! # The negative controls
//!
//! Each safeguard is removed in turn, and the checker must fail:
//!
//! * [`Variant::Naive`] (no write-back: hand out the maximum at once):
//!   decreasing and duplicate tokens.
//! * [`Variant::NoOwnerCheck`] (the write-back raises the fence even where
//!   the attempt no longer holds the key): duplicates, monotonicity holds.
//! * [`Clock::Behind`] (client c0's clock seeds 0, below earlier tokens): a
//!   decreasing token after one expiry; with late clients also after a
//!   restart. Without expiries and late clients the re-seed copies exactly
//!   and needs no clock: the same clock passes.
//! * Bug (a), `Reseed::unseeded_are_sources` (the first re-seed, caught by
//!   the 8-minute fault run): on five nodes with two restarted at once, one
//!   is re-seeded from the other and from two nodes that never held the
//!   largest token, and a quorum through it hands out a decreasing and
//!   duplicate token.
//! * Bug (b), `Reseed::needs_quorum` (q sources of the N − 1 others): on
//!   two nodes, and on four with one node not answering, the re-seed is
//!   stuck and the node never votes again (liveness); safety holds; on odd
//!   N the thresholds are equal.
//! * `Reseed::in_parallel` (the library before its fix, caught for real by
//!   `restart::the_reseed_reads_nothing_before_the_window_is_over`): the
//!   re-seed reads before the window is over, while an attempt the node
//!   granted before its restart still collects grants elsewhere; the node
//!   is re-seeded below the token that attempt hands out, and a later
//!   quorum through it repeats it.
//! * `Reseed::clock_floor` off (the library before its fix, caught for real
//!   by `restart::a_reseed_past_an_expired_fence_copies_at_least_the_clock`):
//!   a source whose fence expired answers without it, the copy comes from
//!   a source that missed the largest token, and a later token is lower.
//! * [`MateWriteBack::Set`] (a bucket-mate's write-back sets the fence to
//!   its token instead of raising it): it lowers a fence that stored our
//!   largest token, and a later quorum through it hands out that token
//!   again, not above it (15 steps; with two clients a duplicate in 14).
//! * [`MateWriteBack::Ungated`] (a bucket-mate's write-back lands on an
//!   absent fence too: not gated on a lock key, or a fence expiring under
//!   a live bucket-mate's key): an expired fence, whose next seed would be
//!   at least the clock, is set below our largest token: a duplicate
//!   token (16 steps).
//! * [`PregrantFrom::AnyHome`] (issue 31, the library before its fix): a
//!   home restarted empty and not re-seeded pre-grants, its absent fence
//!   seeded from the releaser's clock, and the named waiter counts it.
//!   While an attempt the home granted before its restart still collects
//!   votes elsewhere, the waiter is handed the same token (10 steps on
//!   three nodes); with leases, the two hold the lock at once. No
//!   decreasing token: the seed is at least every token handed out
//!   before. [`PregrantFrom::AnyHomeCheckedByWaiter`] (any home
//!   pre-grants, the waiter counts it only while the home votes) passes:
//!   with one view of the guard for all clients, a home that does not vote
//!   cannot vote again while a notice of it is in flight (the window).
//! * [`Handover::AnyKey`] (leases; the handed-over waiter's acquire
//!   replaces a key whatever value it holds): it takes a key of a holder
//!   that still holds, and two clients hold the lock.
//! * `Config::short_window` (leases; the restart guard's window ends with
//!   the attempts that counted the node, not their leases: a window
//!   shorter than another client's TTL): a node restarted empty under a
//!   lease is re-seeded and votes for a second holder (14 steps).
//!
//! # Why these node counts
//!
//! The proof counts nodes only through q, N − q + 1 and the number b of
//! nodes that do not vote (down). Let `H(T)` be the voting nodes whose
//! fence is at least a handed-out token `T`, or absent (an absent fence is
//! seeded at least at `T` once `T` is handed out). Invariant: |H(T)| ≥
//! q − b. It holds at the hand-out (|S| ≥ q; a node of `S` that restarted
//! before the hand-out is down until the attempt is over, and no fence of
//! `S` expires before); a restart removes at most one node from `H(T)` and
//! adds one to b; a fence of `H(T)` that expires stays in it; a re-seed
//! reads N − q + 1 sources among the N − b voting nodes, so it meets `H(T)`
//! ((q − b) + (N − q + 1) > N − b), copies at least `T` (or the clock floor,
//! or nothing: absent) and adds the node to `H(T)` as b shrinks. A later
//! grant quorum meets `H(T)` the same way (q + q − b > N − b), so its token
//! exceeds `T`, and uniqueness follows as in DESIGN.md. Bucket-mates
//! change no count: they only raise fences (an `INCR`, a `max`, a seed at
//! least the clock) and only at nodes that vote, so no node leaves `H(T)`;
//! uniqueness uses our resource's lock key alone. This holds for every b;
//! bounding b serves liveness: a re-seed finds N − q + 1 voting sources
//! among the others when b ≤ q − 1, and locks need b ≤ N − q. So N = 2 is
//! modelled with one node down (N − q = 0 would forbid every restart), and
//! N = 3 with two down at once passes too (an ignored test). The cases that
//! differ: N = 2 (q = N: every token is on every node, one source), N = 3
//! (N − q + 1 = q, one node down), N = 4 (N − q + 1 = q − 1: a source may
//! be silent, bug (b)), N = 5 (two nodes down at once, the smallest N where
//! a node down can stand where a source should, bug (a)). Larger N repeat
//! these relations with larger numbers.
//!
//! The pre-grant changes no count: it is the home's acquire run at the
//! attempt's beginning, by a node that votes, and the notice is its answer.
//! Mutual exclusion with leases rests on the same intersection: a holder's
//! keys stay on its q granting nodes until its lease ends, so a second
//! quorum must meet one of them, unless that node restarted, lost the key
//! and votes again; the window (at least the TTL, from the restart)
//! outlasts every lease that counted it, and a node down does not vote.
//! A pre-grant is a vote like any other there, which is why a home that
//! does not vote may not cast it.
//!
//! # Keeping the state space small
//!
//! Every reduction below merges states whose futures are the same as far as
//! hand-outs are concerned; none removes a behaviour.
//!
//! * **Keys vanish lazily.** Whether a key is still there is observed only
//!   when a request lands on its node, so instead of a "vanish" transition
//!   between any two steps, each landing may find the key gone. An acquire
//!   that lands is granted (whatever key was there having vanished), or,
//!   where some acquire was granted before, refused with the fence moved;
//!   a refusal that leaves the fence alone has the same effect as the
//!   acquire being lost, and a write-back finding its key gone has the
//!   same effect as being lost too (see the next point). The holder of a
//!   key is thus the attempt whose acquire was last granted there, and the
//!   model never relies on mutual exclusion, only on what the fences give.
//!   With leases the same holds for the keys that may vanish; a key that
//!   must stay refuses (its holder's identity is kept while it must), and
//!   a key holding the attempt's own value (a pre-grant's) grants again.
//! * **Answers that can only hasten a give-up are not sent**: `Refused`
//!   (the refusal's move of the fence is modelled), `NotHeld`, and the
//!   refusals of a node that does not vote (it is sent nothing). Their
//!   only effect on the client is to make a quorum impossible sooner, and
//!   the client may give up at any moment anyway. Likewise an attempt that
//!   can no longer reach a quorum (too few grants still possible, or too
//!   few write-backs that can still succeed) gives up at once: waiting,
//!   then timing out, changes nothing but when its next attempt may start,
//!   which is free anyway.
//! * **What can no longer matter is forgotten** (`Model::prune`): answers
//!   the client will ignore, write-backs that can neither raise a fence nor
//!   be waited for, the identity of a key holder or an acquire that no
//!   write-back can ask about (it becomes anonymous), the floor of an
//!   attempt whose token is certainly above it, and handed-out tokens below
//!   every token that can still be handed out (`Model::bounds`; with
//!   expiries or restarts a node's bound is its fence only once it can no
//!   longer lose it, and the largest token, which seeds and the clock floor
//!   read, is kept). Bucket-mates only raise fences, so the bounds stand
//!   (under the controls that lower fences, no fence bounds anything while
//!   a bucket-mate step is left, and no write-back of ours is dropped as
//!   useless); `high` is forgotten (0) once no bucket-mate step is left.
//!   While a pre-grant's notice is in flight, the attempt's bound counts
//!   the home at the notice's fence (or its own bound + 1, if lower: the
//!   waiter may ask it) and every other node as if asked. A lease keeps of
//!   its attempt only the nodes it counts. Deleting a message whose
//!   delivery would change nothing is the same as losing it.
//! * **Compact state**: after pruning at most one answer per channel can
//!   matter and a request channel holds a few messages, so a state is a few
//!   fixed arrays of small integers (22 bytes per node, 20 more).
//! * **Symmetry**: nodes are interchangeable, and so are clients with the
//!   same number of attempts (except a client whose clock is behind). The
//!   visited set holds a fingerprint of the class: nodes sorted together
//!   with their channels and with what each client knows about them,
//!   clients renamed everywhere (key holders included); `high` and the
//!   budgets are global, and part of it. A re-seed chooses
//!   and reads its sources in one step, and a pre-grant's home is any
//!   node, so no state names a node. The
//!   search continues from the state as reached, so names in a trace stay
//!   stable.
//! * **Hash compaction**: the visited set stores 128-bit fingerprints. Two
//!   different classes collide with probability about s²/2¹²⁹ for s states
//!   (below 10⁻²² for 10⁸); a collision could hide states, never invent a
//!   violation.
//!
//! # Checking the reductions
//!
//! * A literal model (`literal.rs`) has none of the above but dropping
//!   answers the client will ignore: an explicit "vanish" transition,
//!   refusals (moving the fence or not) and `NotHeld` answers, full attempt
//!   identities, no symmetry; and the same expiries, restarts, re-seeds,
//!   late clients, bucket-mates, pre-grants and leases, and the handover
//!   as a transition of its own. The reduced model must reach exactly
//!   the same hand-outs (who, which token, which verdicts): checked on
//!   three nodes for [1, 1] with each write-back variant, with an expiry (clocks agreeing and
//!   behind), with a restart, and with the re-seed in parallel with the
//!   window; with one bucket-mate step, also with a restart and under the
//!   lowering control, and for [2] with two and a restart; on two nodes
//!   with both and late clients, and for [1, 1] with two bucket-mate steps
//!   and a restart or an expiry; on four with a restart; and for [2, 1]
//!   (tens of millions of literal states). With the fair queue (where a
//!   verdict includes two holders or not), for [1, 1] with a pre-grant and
//!   handovers on three nodes, with and without leases and under the
//!   handover's control, and on two with a restart, with and without
//!   leases and under issue 31's control (larger: on three with a
//!   restart).
//! * Forgetting tokens rests on lower bounds (`Model::bounds`); an audit
//!   checks on every transition that they never shrink and that every
//!   hand-out respects them. Runs with and without forgetting and symmetry
//!   must reach the same hand-outs, also with expiries, restarts, late
//!   clients, a clock behind, bucket-mates, pre-grants and leases, on two
//!   to five nodes.
//! * Symmetry must keep the length of the shortest counterexample (also
//!   with a clock behind, the re-seed in parallel with the window, a
//!   bucket-mate lowering a fence, and the fair queue's three controls).
//!
//! # Not modelled
//!
//! * The clients' validity arithmetic: a client may give up at any moment,
//!   which covers every timeout.
//! * Seeds above the lowest the clock assumption allows: safe by the
//!   invariant above, not enumerated.
//! * The re-seed's reads one after another: the model reads every source
//!   and writes in one step. Between two reads fences only grow, but by an
//!   expiry (the source then answers without the fence: the clock floor)
//!   or a restart (the source then refuses: no source); the invariant
//!   above, not the model, covers the interleavings.
//! * Per-client re-seed state: each client re-seeds a restarted server for
//!   itself, with a raise-only script; the model re-seeds each restart
//!   once.
//! * Bucket-mates' own protocol: their attempts are single atomic steps
//!   (what their messages in flight can do is one of those steps at a later
//!   moment), a write-back's token ranges over every value up to `high`
//!   (more than the tokens they can really hold), and their seeds are the
//!   lowest the clock allows.
//! * The fair queue's order, its tickets, looks and timers, and what a
//!   waiter does between attempts: a release names any idle client, at
//!   any moment (safety does not depend on who is named). A naming that
//!   reaches a waiter in the middle of an attempt is used by its next one,
//!   which began at the naming: a concurrent client here.
//! * Per-client views of the restart guard: one view for all clients, so
//!   the releaser's vouching and the waiter's own check (issue 31's two
//!   halves) agree here; the model lets the waiter count a notice after a
//!   later restart of the home (a stale view), which covers the real
//!   rule's outcomes. The pre-grant's validity rule (counted unasked only
//!   with the lock's minimum validity left since the join) is a give-up
//!   or a notice not counted.
//! * The handover's restrictions that serve liveness only (the holder's
//!   acquire answered everywhere, nobody outside the queue listening, the
//!   ticket's `h`), and its cleanups (an orphan's, a failed waiter's): the
//!   model hands over whenever the home's key was a key that may vanish,
//!   and the cleanups are keys vanishing. Stale extends: see "The
//!   handover" above.
//! * Mutual exclusion without leases, and timing beyond them: a lease ends
//!   at any moment, keys that may vanish do so at any moment.
//! * More than three clients, three attempts per client, five nodes, or
//!   tokens above 31; the unordered network with expiries and restarts
//!   only for [2, 1].
//!
//! # Running it
//!
//! `cargo test --lib fence::model` runs the small configurations and every
//! negative control (about 7 s in a debug build on two cores before
//! bucket-mates, which add 7 to 8 s on a loaded machine); `cargo test
//! --release --lib -- --ignored model` the larger ones (2¼ to 2¾ minutes in
//! release before bucket-mates, which add about 25 s of CPU; 4 to 4¾
//! minutes on a loaded machine; CI runs the same tests with only this crate
//! optimised, see `.ci/run`);
//! `REDFENCE_MODEL_LARGE=1` adds the largest (and the literal model of
//! bucket-mates on three nodes) and `REDFENCE_LITERAL_2_1=1`
//! the literal comparison of [2, 1]. The fair queue's tests add about 7 s
//! of CPU to the first, 45 s to the second and 17 minutes to the largest.
//! DESIGN.md ("The model check") has the state counts.

use std::collections::BTreeSet;
use std::time::Duration;

/// Appends to a trace line; formats only when a trace is being written.
macro_rules! note {
    ($log:expr, $($arg:tt)*) => {
        if let Some(line) = $log.as_mut() {
            let _ = write!(line, $($arg)*);
        }
    };
}

mod config;
mod literal;
mod mate_tests;
mod queue;
mod queue_tests;
mod reduced;
mod report;
mod search;
mod symmetry;
mod tests;
mod vocab;

// The shared vocabulary, for the children's `use super::*`.
use config::*;
use report::*;
use vocab::*;
