//! One admission attempt of a reader or a writer: the rw script on all N
//! nodes as one quorum round (the mutex's `round`: one deadline, decide at
//! the first certain outcome, validity from the round's start), then the
//! token settled by the mutex's `settle_token` (the largest fence among
//! the granting nodes, written back to those that reported less when
//! fewer than a majority reported it). A failed or cut-off attempt
//! releases its entry wherever it may have landed (`ReleaseOnDrop`).
//!
//! For a writer the fence moved (`INCR`) on each granting node; for a
//! reader it was only read: its token is the generation it saw, and the
//! write-back is what makes every later writer's token larger (DESIGN.md,
//! section 6b).

use std::sync::Arc;

use super::keys::RwKeys;
use super::scripts::parse_admit;
use super::target::{after_round, entry_held, RwMode};
use crate::error::failure::{Phase, QuorumFailure};
use crate::logic::fence::clock_seed;
use crate::logic::resource::lock_value;
use crate::observe::stats::Event;
use crate::protocol::release::ReleaseOnDrop;
use crate::protocol::reseed::reseed_if_wanted;
use crate::protocol::round::round;
use crate::protocol::settle::settle_token;
use crate::protocol::shared::{Grant, Shared, Target};
use crate::wire::outgoing::PackedOnce;
use crate::wire::scripts::{RW_READ, RW_WRITE};

/// One read in this many prunes the readers' index of names whose keys
/// are gone: the index of a lock only ever read holds about this many
/// dead names, and a read pays no walk (nor count) of it otherwise.
const PRUNE_ONE_IN: u32 = 8;

/// The waiting writer's marker to set where refused: its id and life.
#[derive(Debug, Clone)]
pub(crate) struct Mark {
    pub(crate) id: Arc<str>,
    pub(crate) life_ms: u64,
}

/// One attempt of `mode` on `target` (from `rw_target`).
pub(crate) async fn admit(
    shared: &Arc<Shared>,
    keys: &RwKeys,
    target: &Target,
    mode: RwMode,
    mark: Option<&Mark>,
) -> Result<Grant, QuorumFailure> {
    let mut held = entry_held(shared, target, lock_value(&shared.id_text));
    let mut cleanup = ReleaseOnDrop::new(shared, &held);
    shared.counters.count(Event::Attempt);
    let vote = shared.vote(true);
    let (ttl, seed) = (target.ttl.millis().to_string(), clock_seed().to_string());
    let fence = target.fence.as_deref();
    let (script, evalsha) = match mode {
        RwMode::Read => {
            let mut k: Vec<&str> = vec![&keys.writer, &keys.readers, &keys.waiting, &target.key];
            k.extend(fence);
            // One read in 8 prunes the readers' index (`wire/lua/rw_read.lua`).
            let prune: &[u8] = if rand::random_range(0..PRUNE_ONE_IN) == 0 {
                b"1"
            } else {
                b""
            };
            let args: [&[u8]; 4] = [
                held.value.as_bytes(),
                ttl.as_bytes(),
                seed.as_bytes(),
                prune,
            ];
            (&*RW_READ, RW_READ.evalsha(&k, &args))
        }
        RwMode::Write => {
            let mut k: Vec<&str> = vec![&keys.writer, &keys.readers, &keys.waiting];
            k.extend(fence);
            let life = mark.map_or(String::new(), |m| m.life_ms.to_string());
            let id = mark.map_or("", |m| &*m.id);
            let args: [&[u8]; 5] = [
                held.value.as_bytes(),
                ttl.as_bytes(),
                seed.as_bytes(),
                id.as_bytes(),
                life.as_bytes(),
            ];
            (&*RW_WRITE, RW_WRITE.evalsha(&k, &args))
        }
    };
    let evalsha = Arc::new(PackedOnce::new(evalsha, shared.nodes.len()));
    let round = round(
        shared,
        Phase::Acquire,
        target,
        &held,
        false,
        |node, settled| {
            let evalsha = Arc::clone(&evalsha);
            async move {
                parse_admit(
                    node.run_script_prepared(script, &evalsha, &settled, false, vote)
                        .await?,
                )
            }
        },
    )
    .await;
    after_round(&mut held, target, round.sent, round.deadline);
    cleanup.update(&held);
    reseed_if_wanted(shared);
    let start = round.outcome?;
    let token = match &target.fence {
        None => None,
        Some(_) => Some(settle_token(shared, target, &held, start, &round.values).await?),
    };
    cleanup.disarm();
    shared.counters.count(Event::Acquired);
    held.granted = true;
    Ok(Grant {
        valid_until: start + target.ttl.duration() - target.drift,
        held,
        token,
        granted: round.granted,
    })
}
