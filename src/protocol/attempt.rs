//! One Redlock attempt: a fresh value, `SET NX PX` (with the fence's move,
//! when fencing is on) on all N nodes at once, decide at the first certain
//! outcome, compute validity, settle the token. A fair waiter whose naming
//! release pre-granted the home node's vote sends the pre-granted value to
//! the other N − 1 only ([`attempt_pregranted`]). Also the one-node probe a
//! waiter sends before a full attempt.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{Pipeline, Value};

use crate::error::failure::{NodeErrorKind, Phase, QuorumFailure};
use crate::logic::fence::{clock_seed, SEEDED_FROM};
use crate::logic::resource::lock_value;
use crate::logic::validity::later;
use crate::node::Settled;
use crate::observe::stats::Event;
use crate::protocol::fanout::{all_nodes, node_set};
use crate::protocol::release::ReleaseOnDrop;
use crate::protocol::reseed::reseed_if_wanted;
use crate::protocol::round::{round_credited, Credited};
use crate::protocol::settle::settle_token;
use crate::protocol::shared::{Grant, Held, Shared, Target};
use crate::wire::commands::{
    parse_fenced, parse_held, parse_probed_set, parse_set, pttl, set_nx, set_nx_probed,
};
use crate::wire::outgoing::{Outgoing, PackedOnce};
use crate::wire::scripts::{ACQUIRE, SEED};
use crate::wire::transacted::Transacted;

/// The acquire as sent to each node.
enum Acquire {
    /// The `SET`, built and packed once for every node.
    Command(PackedOnce),
    Pipeline(Pipeline),
    /// The fenced acquire script's `EVALSHA`, built and packed once for
    /// every node (`Script::eval_of` derives the `EVAL` after a
    /// `NOSCRIPT`).
    Fenced(PackedOnce),
    /// A first attempt's fenced acquire: on our own connections the
    /// transaction, elsewhere the script (`wire::transacted`).
    Transacted(Transacted),
}

/// The parser of an acquire's reply: the node's new fence (0 without
/// fencing), or why it did not grant.
type Parse = fn(Value) -> Result<u64, NodeErrorKind>;

/// One attempt on `target`. With `probe`, each node also reports the key's
/// remaining TTL (`PTTL` in the same round trip), so a refused waiter knows
/// when the holder's keys run out.
pub(crate) async fn attempt(
    shared: &Arc<Shared>,
    target: &Target,
    probe: bool,
) -> Result<Grant, QuorumFailure> {
    attempt_pregranted(shared, target, probe, None, None, None).await
}

/// [`attempt`] of a client waiting outside the fair queue (polling, or by
/// notice with `fair(false)`): on a home that pre-grants, a refusal there
/// claims the next turn, and the release that follows reserves the home's
/// vote for this client for `reserve` (DESIGN.md, section 2, fair queue,
/// "Outside turns").
pub(crate) async fn attempt_outside(
    shared: &Arc<Shared>,
    target: &Target,
    probe: bool,
    reserve: Duration,
) -> Result<Grant, QuorumFailure> {
    attempt_pregranted(shared, target, probe, None, None, Some(reserve)).await
}

/// The home node's vote that the release naming a fair waiter pre-granted
/// (`fair.rs`; DESIGN.md, section 2, step 3): the key there holds `value`,
/// set with the waiter's TTL by the script that moved the home's fence to
/// `fence`.
#[derive(Debug, Clone)]
pub(crate) struct Pregranted {
    pub(crate) value: Arc<str>,
    pub(crate) fence: u64,
    /// `Some`: count the home's yes without asking it, validity counted
    /// from this instant (before any release could have set the key).
    /// `None`: ask every node, the home re-confirming the key it holds
    /// for `value` with a fresh TTL.
    pub(crate) since: Option<Instant>,
}

/// [`attempt`], with the value and the home's vote of a pre-grant when
/// given, and the value of the holder whose release handed the lock over
/// (`handed`: a key holding it counts as free; DESIGN.md, section 2, fair
/// queue, step 3, "Handover"). Fenced targets only.
pub(crate) async fn attempt_pregranted(
    shared: &Arc<Shared>,
    target: &Target,
    probe: bool,
    pregranted: Option<Pregranted>,
    handed: Option<&str>,
    claim: Option<Duration>,
) -> Result<Grant, QuorumFailure> {
    let pregranted = pregranted.filter(|_| target.fence.is_some());
    let credited = pregranted.as_ref().and_then(|p| {
        p.since.map(|since| Credited {
            node: target.home.index,
            since,
        })
    });
    let mut held = Held {
        key: target.key.clone(),
        value: pregranted
            .as_ref()
            .map_or_else(|| lock_value(&shared.id_text), |p| p.value.clone()),
        notice: rand::random(),
        granted: false,
        sent: all_nodes(shared.nodes.len()),
        ours: Arc::default(),
        // At the latest: a node may set the key as late as the round's
        // deadline, one node timeout away (`attempt_pregranted` narrows
        // it to the round's own deadline once sent). A release of this
        // attempt, cut off or failed, lives until then.
        expires_at: later(
            later(Instant::now(), shared.config.node_timeout),
            target.ttl.duration(),
        ),
        home: target.home.clone(),
        ticket: None,
    };
    // Armed until the attempt succeeds: a failed attempt, or this future
    // being dropped mid-flight, releases in the background wherever the SET
    // may have gone.
    let mut cleanup = ReleaseOnDrop::new(shared, &held);
    shared.counters.count(Event::Attempt);
    let vote = shared.vote(true);
    let (key, value, ttl_ms) = (&*held.key, &*held.value, target.ttl.millis());
    let nodes = shared.nodes.len();
    // The home's own request, when this attempt claims the next turn
    // there: the acquire with the claim key and this client's tag.
    let mut at_home = None;
    // An attempt from outside the fair queue claims the next turn on the
    // home (the script, with the claim key and this client's tag).
    // The claim key, named only for such an attempt.
    let claim_key = claim.and_then(|_| target.home.claim());
    if let (Some(fence_key), Some(reserve), Some(claim), None, None) =
        (&target.fence, claim, &claim_key, &pregranted, handed)
    {
        let marker = &*target.home.marker;
        let more = value.len() + 64;
        let mut home = ACQUIRE.evalsha_keys(&[key, fence_key, &**claim, marker], more);
        home.arg(value).arg(ttl_ms).arg(clock_seed());
        home.arg(if probe { "1" } else { "" }).arg("").arg("");
        home.arg(&*shared.id_text)
            .arg(reserve.as_millis().max(1) as u64);
        at_home = Some((target.home.index, home));
    }
    // One request per node and the parser of its reply (the node's new
    // fence; 0 without fencing).
    let (request, parse): (Acquire, Parse) = match &target.fence {
        // Without fencing, a plain SET: a Lua script costs the server ~5×
        // the CPU of the command it wraps.
        None if !probe => (
            Acquire::Command(PackedOnce::new(set_nx(key, value, ttl_ms), nodes)),
            |reply| parse_set(reply).map(|()| 0),
        ),
        // A waiter's retry: the same SET and a PTTL, pipelined.
        None => (
            Acquire::Pipeline(set_nx_probed(key, value, ttl_ms)),
            parse_probed_set,
        ),
        // With fencing, the SET NX and the fence's move in one atomic
        // step: a transaction on our own connections, the script elsewhere
        // (`wire::transacted`).
        Some(fence_key) if handed.is_none() && (pregranted.is_none() || credited.is_some()) => (
            Acquire::Transacted(Transacted::new(
                held.key.clone(),
                fence_key.clone(),
                held.value.clone(),
                ttl_ms,
                clock_seed(),
                probe,
                nodes,
            )),
            parse_fenced,
        ),
        // A fair waiter's: the script, which also takes the keys handed
        // over or pre-granted to it.
        Some(fence_key) => {
            // Built once for every node; numbers go in without a `String`.
            let more = value.len() + handed.map_or(0, str::len) + 48;
            let mut evalsha = ACQUIRE.evalsha_keys(&[key, fence_key], more);
            evalsha.arg(value).arg(ttl_ms).arg(clock_seed());
            // The home holds the key for this value already: it says yes
            // again, with a fresh TTL.
            let own = pregranted.is_some() && credited.is_none();
            evalsha
                .arg(if probe { "1" } else { "" })
                .arg(if own { "1" } else { "" });
            if let Some(handed) = handed {
                // The released holder's keys count as free.
                evalsha.arg(handed);
            }
            (
                Acquire::Fenced(PackedOnce::new(evalsha, nodes)),
                parse_fenced,
            )
        }
    };
    let (request, at_home) = (Arc::new(request), at_home.map(Arc::new));
    let ours = &held.ours;
    let round = round_credited(
        shared,
        Phase::Acquire,
        target,
        &held,
        false,
        credited,
        |node, settled| {
            let request = Arc::clone(&request);
            let home = at_home
                .as_ref()
                .filter(|h| h.0 == node.index())
                .map(Arc::clone);
            let ours = Arc::clone(ours);
            async move {
                let reply = match &*request {
                    Acquire::Command(cmd) => node.run_command(cmd, &settled, vote).await?,
                    Acquire::Fenced(evalsha) => {
                        let evalsha: &dyn Outgoing = match &home {
                            Some(home) => &home.1,
                            None => evalsha,
                        };
                        node.run_script_prepared(&ACQUIRE, evalsha, &settled, false, vote)
                            .await?
                    }
                    Acquire::Pipeline(pipe) => node.run_pipeline(pipe, &settled, vote).await?,
                    Acquire::Transacted(tx) => {
                        let evalsha: &dyn Outgoing = match &home {
                            Some(home) => &home.1,
                            None => tx,
                        };
                        let reply = node
                            .run_script_prepared(&ACQUIRE, evalsha, &settled, false, vote)
                            .await?;
                        match parse(reply)? {
                            // The fence was absent or unseeded: the
                            // transaction cannot seed it. The script, our
                            // own key counted as granted (re-set with a
                            // fresh TTL), seeds it and moves it again:
                            // the token comes from one atomic grant and
                            // move, as always (DESIGN.md, section 6).
                            fence if fence < SEEDED_FROM => {
                                let again = tx.again();
                                return match node
                                    .run_script_prepared(&ACQUIRE, &again, &settled, false, vote)
                                    .await
                                {
                                    Ok(reply) => parse(reply),
                                    // The round decided first: no vote is
                                    // wanted (and no late grant may land),
                                    // but the fence is seeded all the same,
                                    // so that this node stays level with
                                    // the others (no write-back later).
                                    // The transaction set our value there
                                    // and nothing of ours follows it: the
                                    // node counts as having held it (a
                                    // takeover is seen there).
                                    Err(NodeErrorKind::Skipped) => {
                                        ours.fetch_or(node_set([node.index()]), Ordering::Relaxed);
                                        let seed = tx.seed_only();
                                        let _ = node
                                            .run_script_prepared(
                                                &SEED,
                                                &seed,
                                                &Settled::NEVER,
                                                true,
                                                None,
                                            )
                                            .await;
                                        Err(NodeErrorKind::Skipped)
                                    }
                                    Err(e) => Err(e),
                                };
                            }
                            fence => return Ok(fence),
                        }
                    }
                };
                parse(reply)
            }
        },
    )
    .await;
    held.sent = round.sent;
    // When the keys expire at the latest: a node may set one as late as
    // the round's deadline, and the home's pre-granted key was set before
    // now. Releases live until then (DESIGN.md, "Releases outlive the
    // key"); validity counts from the round's start instead.
    held.expires_at = later(round.deadline.max(Instant::now()), target.ttl.duration());
    cleanup.update(&held);
    reseed_if_wanted(shared);
    let (start, granted) = (round.outcome?, round.granted);
    let mut values = round.values;
    if let (Some(c), Some(p)) = (credited, &pregranted) {
        // The home's fence, from the release's notice.
        for (i, fence) in &mut values {
            if *i == c.node {
                *fence = p.fence;
            }
        }
    }
    let token = match &target.fence {
        None => None,
        Some(_) => Some(settle_token(shared, target, &held, start, &values).await?),
    };
    cleanup.disarm();
    shared.counters.count(Event::Acquired);
    held.granted = true;
    Ok(Grant {
        valid_until: start + target.ttl.duration() - target.drift,
        held,
        token,
        granted,
    })
}

/// Whether `target`'s lock looks held, from one `PTTL` on one node picked
/// at random, bounded by the node timeout: `Some` with the remaining TTL
/// (`None` inside for a key without expiry) when held there, `None` when
/// free there or unknown (an error, a timeout). One node's view can be
/// wrong either way; it only decides whether a waiter sends a full attempt
/// now or waits for the next release.
pub(crate) async fn probe(shared: &Shared, target: &Target) -> Option<Option<Duration>> {
    let nodes = &shared.nodes;
    let node = nodes.get(rand::random_range(0..nodes.len()))?;
    let reply = tokio::time::timeout(
        shared.config.node_timeout,
        node.run_command(&pttl(&target.key), &Settled::NEVER, None),
    )
    .await;
    match reply {
        Ok(Ok(value)) => parse_held(&value),
        _ => None,
    }
}
