//! Read batching: the callers of one client that read the same entry at
//! the same time share reads, without losing a reader's guarantee that it
//! sees every write a majority accepted before its call began.
//!
//! A caller never takes the result of a read that was already on the wire
//! when it arrived: with no read running it reads at once (and leads a
//! batch); with one running it joins the *next* batch, whose read starts
//! when the running one ends. The first caller of a next batch leads it;
//! the others follow on a `watch` channel. So a stampede of 250 callers of
//! one client costs at most two reads instead of 250, and each caller
//! waits at most about two reads (the problem measured by
//! `examples/product_cache.rs`: every caller's own read was most of the
//! waiters' latency).
//!
//! A std `Mutex`, not a tokio one: nothing awaits while it is held. The
//! map holds `Weak`s; a batch leaves it when its leader's [`Reading`]
//! drops (finished or cancelled), so the followers of a cancelled leader
//! see their channel close and start over, each in a batch that begins
//! after it.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::watch;

/// A batch's channel: `None` until its read ends.
type Sender<T> = watch::Sender<Option<T>>;

/// One name's batches: the read on the wire, and the one gathering callers.
struct Slot<T> {
    running: Weak<Sender<T>>,
    next: Weak<Sender<T>>,
}

/// The per-process map of batches, one per name (the client's tag and the
/// entry key).
pub(crate) struct Batches<T> {
    slots: Mutex<HashMap<String, Slot<T>>>,
}

/// A caller's part in a batch.
enum Turn<T: Clone + Send + Sync + 'static> {
    /// Nothing on the wire: read now.
    Lead(Reading<T>),
    /// A read on the wire: read when it ends, for the callers that join
    /// meanwhile.
    LeadNext {
        after: watch::Receiver<Option<T>>,
        reading: Reading<T>,
    },
    /// Gets the outcome of a read that starts after this call.
    Follow(watch::Receiver<Option<T>>),
}

/// A led batch; dropped, it leaves the map and its followers' channel
/// closes if nothing was shared.
pub(crate) struct Reading<T: Clone + Send + Sync + 'static> {
    batches: &'static Batches<T>,
    name: String,
    sender: Arc<Sender<T>>,
}

impl<T: Clone + Send + Sync + 'static> Batches<T> {
    pub(crate) fn new() -> Self {
        Self {
            slots: Mutex::new(HashMap::new()),
        }
    }

    fn join(&'static self, name: &str) -> Turn<T> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let slot = slots.entry(name.to_owned()).or_insert_with(|| Slot {
            running: Weak::new(),
            next: Weak::new(),
        });
        if let Some(next) = slot.next.upgrade() {
            return Turn::Follow(next.subscribe());
        }
        let sender = Arc::new(watch::channel(None).0);
        let reading = Reading {
            batches: self,
            name: name.to_owned(),
            sender: Arc::clone(&sender),
        };
        match slot.running.upgrade() {
            Some(running) => {
                slot.next = Arc::downgrade(&sender);
                Turn::LeadNext {
                    after: running.subscribe(),
                    reading,
                }
            }
            None => {
                slot.running = Arc::downgrade(&sender);
                Turn::Lead(reading)
            }
        }
    }

    /// `read()`'s outcome, or that of a read by another caller of `name`
    /// that began after this call did.
    pub(crate) async fn read<F, Fut>(&'static self, name: &str, read: F) -> T
    where
        F: Fn() -> Fut,
        Fut: Future<Output = T>,
    {
        loop {
            let reading = match self.join(name) {
                Turn::Lead(reading) => reading,
                Turn::LeadNext { mut after, reading } => {
                    // Ends with a value or with the running leader gone.
                    let _ = after.wait_for(Option::is_some).await;
                    reading.start();
                    reading
                }
                Turn::Follow(mut followed) => {
                    let shared = followed
                        .wait_for(Option::is_some)
                        .await
                        .ok()
                        .and_then(|got| got.clone());
                    match shared {
                        Some(got) => return got,
                        // Its leader was cancelled: join a later batch.
                        None => continue,
                    }
                }
            };
            let got = read().await;
            reading.sender.send_replace(Some(got.clone()));
            return got;
        }
    }
}

impl<T: Clone + Send + Sync + 'static> Reading<T> {
    /// The next batch goes on the wire: callers arriving from now on
    /// gather for a later one.
    fn start(&self) {
        let mut slots = self.batches.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = slots.get_mut(&self.name) {
            if slot.next.ptr_eq(&Arc::downgrade(&self.sender)) {
                slot.next = Weak::new();
            }
            slot.running = Arc::downgrade(&self.sender);
        }
    }
}

impl<T: Clone + Send + Sync + 'static> Drop for Reading<T> {
    fn drop(&mut self) {
        let mut slots = self.batches.slots.lock().unwrap_or_else(|e| e.into_inner());
        let ours = Arc::downgrade(&self.sender);
        let Some(slot) = slots.get_mut(&self.name) else {
            return;
        };
        // Only our own places: a later batch of the name may be there.
        if slot.running.ptr_eq(&ours) {
            slot.running = Weak::new();
        }
        if slot.next.ptr_eq(&ours) {
            slot.next = Weak::new();
        }
        if slot.running.strong_count() == 0 && slot.next.strong_count() == 0 {
            slots.remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::LazyLock;
    use std::time::Duration;

    use super::*;

    static TEST: LazyLock<Batches<usize>> = LazyLock::new(Batches::new);

    #[tokio::test]
    async fn a_caller_only_takes_a_read_that_began_after_it_arrived() {
        let reads = Arc::new(AtomicUsize::new(0));
        // The first read stays on the wire until the 9 later callers have
        // joined (no timing assumed: a loaded CI machine delays tasks).
        let (gate, joined) = (
            Arc::new(tokio::sync::Notify::new()),
            Arc::new(AtomicUsize::new(0)),
        );
        let first = tokio::spawn({
            let (reads, gate) = (Arc::clone(&reads), Arc::clone(&gate));
            async move {
                let read = move || {
                    let (reads, gate) = (Arc::clone(&reads), Arc::clone(&gate));
                    async move {
                        let n = reads.fetch_add(1, Ordering::SeqCst) + 1;
                        gate.notified().await;
                        n
                    }
                };
                TEST.read("k", read).await
            }
        });
        while reads.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let later: Vec<_> = (0..9)
            .map(|_| {
                let (reads, joined) = (Arc::clone(&reads), Arc::clone(&joined));
                tokio::spawn(async move {
                    let read = move || {
                        let reads = Arc::clone(&reads);
                        async move { reads.fetch_add(1, Ordering::SeqCst) + 1 }
                    };
                    // Counted in the same poll as the call's join below.
                    joined.fetch_add(1, Ordering::SeqCst);
                    TEST.read("k", read).await
                })
            })
            .collect();
        while joined.load(Ordering::SeqCst) < 9 {
            tokio::task::yield_now().await;
        }
        // One more turn of the runtime for the last joiner's first poll.
        tokio::task::yield_now().await;
        gate.notify_one();
        assert_eq!(first.await.unwrap(), 1);
        for task in later {
            assert_eq!(task.await.unwrap(), 2, "a read that began after the call");
        }
        assert_eq!(reads.load(Ordering::SeqCst), 2);
        // Only this test's name: the other test of the shared map may be
        // running beside this one (a CI run failed on `is_empty()`).
        assert!(
            TEST.slots.lock().unwrap().get("k").is_none(),
            "nothing left behind"
        );
    }

    #[tokio::test]
    async fn followers_of_a_cancelled_leader_start_over() {
        let slow = || async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            0
        };
        let leader = tokio::spawn(async move { TEST.read("c", slow).await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        // Leads the next batch (waits for the running read), then this one
        // follows it.
        let next = tokio::spawn(async move { TEST.read("c", || async { 7 }).await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let follower = tokio::spawn(async move { TEST.read("c", || async { 8 }).await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        next.abort();
        let _ = next.await;
        leader.abort();
        let _ = leader.await;
        // The follower's batch closed: it starts over and reads itself.
        assert_eq!(follower.await.unwrap(), 8);
        assert!(TEST.slots.lock().unwrap().get("c").is_none());
    }
}
