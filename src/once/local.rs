//! One flight per process: the callers of one client that miss the same
//! key at the same time share one pass through the lock. The first becomes
//! the flight's leader and runs the distributed protocol; the others
//! follow it, each under its own deadline, and get its value (or its
//! computation's error, as text). Without this every waiter of a process
//! would take the lock in turn only to find the value there: 500 waiters,
//! 500 acquire–read–release rounds one after the other.
//!
//! A std `Mutex`, not a tokio one: nothing awaits while it is held. The map
//! holds `Weak`s; a flight is removed by its leader's `Drop`, so a
//! cancelled leader's followers see the channel close and start over.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use tokio::sync::watch;

/// What a flight's leader shares: the value, or its computation's error.
pub(crate) type Shared = Option<Result<Vec<u8>, String>>;

type Flights = Mutex<HashMap<String, Weak<watch::Sender<Shared>>>>;

static FLIGHTS: LazyLock<Flights> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// A caller's part in its process's flight.
pub(crate) enum Role {
    /// Runs the protocol and shares the outcome.
    Leader(Flight),
    /// Waits for the leader's outcome.
    Follower(watch::Receiver<Shared>),
}

/// Joins the flight of `name` (the client's tag and the entry key), leading
/// it when there is none.
pub(crate) fn join(name: String) -> Role {
    let mut flights = FLIGHTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(sender) = flights.get(&name).and_then(Weak::upgrade) {
        return Role::Follower(sender.subscribe());
    }
    let sender = Arc::new(watch::channel(None).0);
    flights.insert(name.clone(), Arc::downgrade(&sender));
    Role::Leader(Flight { name, sender })
}

/// A led flight; dropped (finished or cancelled), it leaves the map and
/// its followers' channel closes.
pub(crate) struct Flight {
    name: String,
    sender: Arc<watch::Sender<Shared>>,
}

impl Flight {
    /// Gives the followers the outcome.
    pub(crate) fn share(&self, outcome: Result<Vec<u8>, String>) {
        self.sender.send_replace(Some(outcome));
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        let mut flights = FLIGHTS.lock().unwrap_or_else(|e| e.into_inner());
        // Only our own entry: a later flight of the same name may be there.
        let ours = flights
            .get(&self.name)
            .is_some_and(|w| w.ptr_eq(&Arc::downgrade(&self.sender)));
        if ours {
            flights.remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_leads_the_others_follow_and_a_dropped_leader_frees_the_name() {
        let name = "test:flight".to_owned();
        let Role::Leader(flight) = join(name.clone()) else {
            panic!("first caller leads")
        };
        let Role::Follower(mut rx) = join(name.clone()) else {
            panic!("second caller follows")
        };
        flight.share(Ok(b"v".to_vec()));
        assert_eq!(rx.borrow_and_update().clone(), Some(Ok(b"v".to_vec())));
        drop(flight);
        assert!(rx.has_changed().is_err(), "closed for the followers");
        assert!(matches!(join(name.clone()), Role::Leader(_)));
    }
}
