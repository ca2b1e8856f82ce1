//! One all-or-nothing attempt on a set of resources: a fresh value, one
//! `ACQUIRE_ALL` script per node carrying every key (the node sets all of
//! them or none), the mutex's quorum round over it, then each resource's
//! token settled as the mutex settles one. A failed or cut-off attempt
//! releases every resource wherever its script may have landed, through
//! the mutex's own cleanup.

use std::sync::Arc;
use std::time::Instant;

use crate::error::failure::{Phase, QuorumFailure};
use crate::logic::fence::clock_seed;
use crate::logic::resource::lock_value;
use crate::logic::validity::later;
use crate::observe::stats::Event;
use crate::protocol::fanout::all_nodes;
use crate::protocol::release::ReleaseOnDrop;
use crate::protocol::reseed::reseed_if_wanted;
use crate::protocol::round::round;
use crate::protocol::settle::settle_token;
use crate::protocol::shared::{Grant, Held, Shared, Target};
use crate::wire::commands::parse_all;
use crate::wire::outgoing::PackedOnce;
use crate::wire::scripts::ACQUIRE_ALL;

/// The validated resources of one multi-resource request, in the caller's
/// order, and the target a round reports under (the first resource's TTL
/// and drift, which every resource shares, and the names joined).
#[derive(Clone)]
pub(crate) struct Set {
    pub(crate) targets: Vec<Target>,
    pub(crate) whole: Target,
}

impl Set {
    pub(crate) fn new(targets: Vec<Target>) -> Option<Self> {
        let mut whole = targets.first()?.clone();
        let names: Vec<&str> = targets.iter().map(|t| &*t.resource).collect();
        whole.resource = names.join(", ").into();
        Some(Self { targets, whole })
    }
}

/// One attempt on every resource of `set`; the grants in the set's order.
/// With `probe`, a refusing node also reports the held key's `PTTL`.
pub(crate) async fn attempt_all(
    shared: &Arc<Shared>,
    set: &Set,
    probe: bool,
) -> Result<Vec<Grant>, QuorumFailure> {
    let whole = &set.whole;
    let value = lock_value(&shared.id_text);
    // All or nothing on each node: a node holds every key of the set or
    // none of ours, so one record of where our value is serves them all.
    let ours = Arc::default();
    let expires_at = later(
        later(Instant::now(), shared.config.node_timeout),
        whole.ttl.duration(),
    );
    let mut helds: Vec<Held> = set
        .targets
        .iter()
        .map(|target| Held {
            key: target.key.clone(),
            value: value.clone(),
            notice: rand::random(),
            granted: false,
            sent: all_nodes(shared.nodes.len()),
            ours: Arc::clone(&ours),
            expires_at,
            home: target.home.clone(),
            ticket: None,
        })
        .collect();
    // Armed until every token is settled: a failed attempt, or this future
    // dropped mid-flight, releases each resource in the background (the
    // mutex's compare-and-delete, so only our value goes).
    let mut cleanups: Vec<ReleaseOnDrop<'_>> = helds
        .iter()
        .map(|held| ReleaseOnDrop::new(shared, held))
        .collect();
    shared.counters.count(Event::Attempt);
    let vote = shared.vote(true);
    let fenced: Vec<&str> = set
        .targets
        .iter()
        .filter_map(|t| t.fence.as_deref())
        .collect();
    let mut keys: Vec<&str> = set.targets.iter().map(|t| &*t.key).collect();
    if fenced.len() == keys.len() {
        keys.extend(fenced);
    }
    let mut evalsha = ACQUIRE_ALL.evalsha_keys(&keys, value.len() + 48);
    evalsha
        .arg(&*value)
        .arg(whole.ttl.millis())
        .arg(clock_seed())
        .arg(set.targets.len())
        .arg(if probe { "1" } else { "" });
    let evalsha = Arc::new(PackedOnce::new(evalsha, shared.nodes.len()));
    let round = round(
        shared,
        Phase::Acquire,
        whole,
        &helds[0],
        false,
        |node, settled| {
            let evalsha = Arc::clone(&evalsha);
            async move {
                parse_all(
                    node.run_script_prepared(&ACQUIRE_ALL, &evalsha, &settled, false, vote)
                        .await?,
                )
            }
        },
    )
    .await;
    let expires_at = later(round.deadline.max(Instant::now()), whole.ttl.duration());
    for (held, cleanup) in helds.iter_mut().zip(&mut cleanups) {
        held.sent = round.sent;
        held.expires_at = expires_at;
        cleanup.update(held);
    }
    reseed_if_wanted(shared);
    let (start, granted) = (round.outcome?, round.granted);
    // Each resource's token, settled as the mutex settles one (the
    // write-back, when needed, per resource), all at once.
    let tokens = futures::future::join_all(set.targets.iter().zip(&helds).enumerate().map(
        |(i, (target, held))| {
            let fences: Vec<(usize, u64)> = round
                .values
                .iter()
                .filter_map(|(node, fences)| fences.get(i).map(|&f| (*node, f)))
                .collect();
            async move {
                match &target.fence {
                    None => Ok(None),
                    Some(_) => settle_token(shared, target, held, start, &fences)
                        .await
                        .map(Some),
                }
            }
        },
    ))
    .await;
    let mut grants = Vec::with_capacity(helds.len());
    for (held, token) in helds.into_iter().zip(tokens) {
        let mut held = held;
        held.granted = true;
        grants.push(Grant {
            valid_until: start + whole.ttl.duration() - whole.drift,
            held,
            token: token?,
            granted,
        });
    }
    for cleanup in &mut cleanups {
        cleanup.disarm();
    }
    shared.counters.count(Event::Acquired);
    Ok(grants)
}
