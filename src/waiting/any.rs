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
/// `began` is when the caller's refused attempt began: a release its
/// queue heard after that (a queue that lingers after its last waiter
/// hears releases while nobody waits, for instance between the attempt
/// and the join) means the resource may be free already, and returns at
/// once.
pub(crate) async fn wait_any(places: &[Place], until: Instant, began: Instant) {
    // The counters each head compares against (releases heard, notices
    // settled on a majority): a release heard after this point (or after
    // it became head) moves them. A retry woken by a notice's first copy
    // can meet nodes that have not deleted yet; the copy that completes a
    // majority wakes the waiter once more.
    let mut seen: Vec<Option<(u64, u64)>> = places
        .iter()
        .map(|p| p.head().map(|h| (h.heard, h.settled)))
        .collect();
    loop {
        for (place, seen) in places.iter().zip(seen.iter_mut()) {
            match (place.head(), *seen) {
                (Some(head), _) if head.last_heard.is_some_and(|t| t > began) => return,
                (Some(head), Some(before)) if (head.heard, head.settled) != before => return,
                (Some(head), None) => {
                    // Became head since: a release heard since then counts.
                    if head.heard != head.since {
                        return;
                    }
                    *seen = Some((head.since, head.settled));
                }
                (None, _) => *seen = None,
                _ => {}
            }
        }
        if Instant::now() >= until {
            return;
        }
        let waits = places.iter().map(|p| Box::pin(p.wait(until)));
        let _ = futures::future::select_all(waits).await;
    }
}
