//! The read-write workload (`--workload rw`): each worker loops: pick one
//! of the locks `r0`… (`--resources`; 1 unless told, so every worker
//! contends for one lock), draw the round's mode (a write with
//! probability `--writers-percent`, default 25: a read-mostly lock, with
//! writes often enough that every fault meets some), wait for the hold,
//! then end it by the worker's style (release, auto-extension past the
//! TTL, or run out), as the mutex workload does.
//!
//! A writer runs the mutex's critical section on the lock's counter and
//! fenced store key (the read-modify-write only its exclusion protects,
//! the write with its token); a reader writes nothing, it only holds.
//! Each write is recorded on resource `r0:write`, so the history
//! checker's per-resource checks are the writers' exclusion, their
//! tokens' order and the counter; each read on a resource of its own
//! (`r0:read:{lease}`, `bound::rw_resource`), which per-resource checks
//! leave alone (reads overlap and share tokens). `bound.rs` joins them
//! back into lock `r0`: a writer holds alone, and the tokens across modes
//! are what DESIGN.md, section 6b, promises.
//!
//! `--workload rw-unsafe` is the check's negative control, a bypass seen
//! in practice: the writers take a *mutex* of the lock's name
//! (`client.lock("r0")`, another lock, its key `lock:r0`) instead of the
//! write lock, so they still exclude each other, and their tokens still
//! come from the same fence, but no reader ever waits for them nor they
//! for a reader. Only the read-write check can see that.

use rand::RngExt;
use redfence::{AutoExtend, Client, LockGuard, RwMode};

use super::{short_reason, Style, Worker, Workload};
use crate::bound::rw_resource;

impl Worker {
    /// One waiting acquire of lock `r{resource}` in the round's mode and,
    /// when granted, the hold (a writer's with the critical section on
    /// the lock's cell). Returns whether it was granted.
    pub(super) async fn rw_round(&mut self, resource: u32, lease: u64, client: &Client) -> bool {
        let name = format!("r{resource}");
        let lock = &self.setup.lock;
        let write = self.rng.random_range(0..100) < lock.writers_percent;
        let (ttl, bound) = (lock.ttl, lock.max_wait * 2);
        let auto = self.style == Style::AutoExtend;
        let start_ns = self.now();
        let acquired: Result<LockGuard, String> = if write && lock.workload == Workload::RwUnsafe {
            let mut request = client.lock(name.clone(), ttl);
            if auto {
                request = request.auto_extend(AutoExtend::new());
            }
            // The library bounds the wait by `max_wait` plus one attempt;
            // the outer bound only guards the rig against a bug there.
            match tokio::time::timeout(bound, request.acquire()).await {
                Ok(Ok(guard)) => Ok(guard),
                Ok(Err(e)) => Err(short_reason(&e)),
                Err(_) => Err("rig timeout".to_owned()),
            }
        } else {
            match client.rw_lock(&name) {
                Err(e) => Err(short_reason(&e)),
                Ok(rw) => {
                    let mode = if write { RwMode::Write } else { RwMode::Read };
                    let mut request = rw.request(mode, ttl);
                    if auto {
                        request = request.auto_extend(AutoExtend::new());
                    }
                    match tokio::time::timeout(bound, request.acquire()).await {
                        Ok(Ok(guard)) => Ok(guard.into_guard()),
                        Ok(Err(e)) => Err(short_reason(&e)),
                        Err(_) => Err("rig timeout".to_owned()),
                    }
                }
            }
        };
        let held = rw_resource(&name, write, lease);
        let outcome = acquired.map(|guard| (held, guard));
        let cell = write.then_some(resource);
        self.settle(name, start_ns, outcome, cell, lease).await
    }
}
