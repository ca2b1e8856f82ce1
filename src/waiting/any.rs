//! Waiting for a release of any of several resources, through the
//! notices `notify` hears: a semaphore waits for any of its K slots, a
//! multi-resource lock for any resource of its set.

use std::time::Instant;

use crate::waiting::notify::Place;

/// Sleeps until a release of any of several resources is heard by a place
/// at its queue's head, or until `until`: a semaphore's K slots, a
/// multi-resource lock's set. A place that is not head (another task of
/// this client waits before it on that resource) is left to that task:
/// one release costs one retry per waiting client, not per task.
///
/// Returns the index of the place whose release ended the wait (`None`
/// when `until` came first), so that the next pass can start with the
/// resource that was released.
///
/// `began` is when the caller's refused attempt began: a release its
/// queue heard after that (a queue that lingers after its last waiter
/// hears releases while nobody waits, for instance between the attempt
/// and the join) means the resource may be free already, and returns at
/// once.
pub(crate) async fn wait_any(places: &[Place], until: Instant, began: Instant) -> Option<usize> {
    // The counter each head compares against: releases known done on a
    // majority (`Queue::settled`), not a notice's first copy (a retry then
    // can meet nodes that have not deleted yet, and a second retry per
    // release from every waiting client is a herd).
    let mut seen: Vec<Option<u64>> = places.iter().map(|p| p.head().map(|h| h.settled)).collect();
    loop {
        for (i, (place, seen)) in places.iter().zip(seen.iter_mut()).enumerate() {
            match (place.head(), *seen) {
                (Some(head), _) if head.last_settled.is_some_and(|t| t > began) => return Some(i),
                (Some(head), Some(before)) if head.settled != before => return Some(i),
                (Some(head), None) => {
                    // Became head since: a release heard since then counts.
                    if head.heard != head.since {
                        return Some(i);
                    }
                    *seen = Some(head.settled);
                }
                (None, _) => *seen = None,
                _ => {}
            }
        }
        if Instant::now() >= until {
            return None;
        }
        let waits = places.iter().map(|p| Box::pin(p.wait(until)));
        let _ = futures::future::select_all(waits).await;
    }
}
