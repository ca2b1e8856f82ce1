//! `redfence status --permits K NAME…`: each semaphore's K slots, read at
//! once with [`Semaphore::inspect`](redfence::Semaphore::inspect): held or
//! free, the holder's client tag, on how many nodes, the time it holds for
//! at least, and the slot's fence, as a table or JSON. Self-contained, so
//! that the other family members' views sit beside it in `status`.

use redfence::{Client, Inspection};
use serde_json::{json, Value};

use crate::cli::{EXIT_UNAVAILABLE, EXIT_USAGE};
use crate::duration::{millis, show};
use crate::fail;
use crate::status::{holder, print_rows};

/// Inspects the semaphores `names` of `permits` permits each and prints
/// them; the exit status as `status`'s: 69 when a slot was read from fewer
/// than a majority of nodes.
pub(crate) async fn run(client: &Client, permits: u32, names: &[String], json: bool) -> i32 {
    let mut semaphores = Vec::new();
    for name in names {
        let slots = match client.semaphore(name, permits) {
            Ok(semaphore) => semaphore.inspect().await,
            Err(e) => Err(e),
        };
        match slots {
            Ok(slots) => semaphores.push((name, slots)),
            Err(e) => return fail(EXIT_USAGE, &format!("{name:?}: {e}")),
        }
    }
    if json {
        let all: Vec<Value> = semaphores
            .iter()
            .map(|(name, slots)| to_json(name, slots))
            .collect();
        println!("{}", Value::Array(all));
    } else {
        for (n, (name, slots)) in semaphores.iter().enumerate() {
            if n > 0 {
                println!();
            }
            print_table(name, slots);
        }
    }
    let short = semaphores
        .iter()
        .flat_map(|(_, slots)| slots)
        .any(|i| i.answered() < i.quorum);
    if short {
        EXIT_UNAVAILABLE
    } else {
        0
    }
}

fn print_table(name: &str, slots: &[Inspection]) {
    let held = slots.iter().filter(|i| i.is_held()).count();
    println!("{name}: {held} of {} permits held", slots.len());
    let rows: Vec<[String; 6]> = slots
        .iter()
        .enumerate()
        .map(|(slot, i)| {
            let nodes = format!("{}/{}", i.held_on, i.nodes.len());
            let (state, ttl) = match &i.holder {
                Some(h) => (
                    holder(h),
                    i.valid_for_at_least
                        .map_or_else(|| "no expiry".into(), show),
                ),
                None => ("free".into(), "-".into()),
            };
            let fence = i.fence.map_or_else(|| "-".into(), |f| f.to_string());
            [
                slot.to_string(),
                i.resource.clone(),
                state,
                nodes,
                ttl,
                fence,
            ]
        })
        .collect();
    print_rows(
        ["SLOT", "RESOURCE", "HOLDER", "NODES", "TTL", "FENCE"],
        &rows,
    );
}

fn to_json(name: &str, slots: &[Inspection]) -> Value {
    let rows: Vec<Value> = slots
        .iter()
        .enumerate()
        .map(|(slot, i)| {
            json!({
                "slot": slot,
                "resource": i.resource,
                "held": i.is_held(),
                "holder": i.holder.as_ref().map(holder),
                "held_on": i.held_on,
                "quorum": i.quorum,
                "answered": i.answered(),
                "valid_for_at_least_ms": i.valid_for_at_least.map(millis),
                "fence": i.fence,
            })
        })
        .collect();
    json!({
        "semaphore": name,
        "permits": slots.len(),
        "held": slots.iter().filter(|i| i.is_held()).count(),
        "slots": rows,
    })
}
