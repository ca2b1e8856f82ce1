//! The semaphore workload (`--workload semaphore --permits K`): each
//! worker loops: pick one of the semaphores `r0`… (`--resources`), wait for
//! one of its K permits, then the mutex workload's critical section and
//! lease ending (release, auto-extension past the TTL, or run out), on the
//! *slot's* counter and fenced store key.
//!
//! A permit is slot `i`'s lock, so its grant is recorded on the slot's
//! resource (`r0:permit:1`) with the slot's token: the history checker's
//! per-resource checks are then the slot's exclusion (no two holders of a
//! slot, no lost update of its counter) and its token order (strictly
//! increasing across the slot's holders; the store refuses a stale one).
//! The bound across slots, never more than K holders of one semaphore, is
//! `bound.rs`'s, from the same windows.
//!
//! The counters and store keys are per slot, numbered `cell` =
//! `resource × (K + 1) + slot` so that the mutex's key names serve: a
//! counter shared by the K holders of a semaphore would lose updates by
//! design. (K + 1: the overcommit control's spare slot.)
//!
//! `--workload semaphore-overcommit` is the bound's negative control: the
//! clients of the worker processes ask for K + 1 permits of the same names
//! (the misconfiguration `Semaphore`'s docs warn of: K is part of a name's
//! contract), the parent's tasks for K, the checker bounds at K. Every
//! slot still excludes, so only the bound check can see the K + 1 holders.

use redfence::{AutoExtend, Client};

use super::{short_reason, LockConfig, Sink, Style, Worker, Workload};

impl LockConfig {
    /// Counters and store keys per resource: one per slot, K + 1 (see the
    /// module docs); one for the other workloads.
    fn cells_per_resource(&self) -> u32 {
        match self.workload {
            Workload::Semaphore | Workload::SemaphoreOvercommit => self.permits + 1,
            _ => 1,
        }
    }

    /// How many counters the run's workers increment: the final counters
    /// the rig reads.
    pub fn counters(&self) -> u32 {
        self.resources * self.cells_per_resource()
    }
}

impl Worker {
    /// K of this worker's client: K + 1 in the worker processes of the
    /// overcommit control.
    fn permits(&self) -> u32 {
        let lock = &self.setup.lock;
        let overcommit = lock.workload == Workload::SemaphoreOvercommit
            && matches!(self.setup.sink, Sink::Pipe(_));
        lock.permits + u32::from(overcommit)
    }

    /// One waiting acquire of a permit of semaphore `r{resource}` and,
    /// when granted, the critical section on the slot's cell. Returns
    /// whether a permit was granted.
    pub(super) async fn permit_round(
        &mut self,
        resource: u32,
        lease: u64,
        client: &Client,
    ) -> bool {
        let name = format!("r{resource}");
        let lock = &self.setup.lock;
        let (ttl, bound) = (lock.ttl, lock.max_wait * 2);
        let stride = lock.cells_per_resource();
        let start_ns = self.now();
        let semaphore = match client.semaphore(&name, self.permits()) {
            Ok(s) => s,
            Err(e) => {
                let outcome = Err(short_reason(&e));
                return self.settle(name, start_ns, outcome, None, lease).await;
            }
        };
        let mut request = semaphore.permit(ttl);
        if self.style == Style::AutoExtend {
            request = request.auto_extend(AutoExtend::new());
        }
        // The library bounds the wait by `max_wait` plus one pass; the
        // outer bound only guards the rig against a bug there.
        let (outcome, cell) = match tokio::time::timeout(bound, request.acquire()).await {
            Ok(Ok(permit)) => {
                let cell = resource * stride + permit.slot();
                let held = permit.resource().to_owned();
                (Ok((held, permit.into_guard())), cell)
            }
            Ok(Err(e)) => (Err(short_reason(&e)), 0),
            Err(_) => (Err("rig timeout".to_owned()), 0),
        };
        self.settle(name, start_ns, outcome, Some(cell), lease)
            .await
    }
}
