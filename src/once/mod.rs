//! Single-flight, a member of the lock family thin over the mutex: one
//! computation per expiry of a cached value across every client of the
//! same nodes. The computation runs under the mutex on `once:{key}`
//! (`mutex::request`); its result is written with the lock's fencing token
//! by the entry's fenced-write script, so a computer whose lease ran out
//! cannot overwrite a newer value; waiters wait with the mutex's waiting
//! acquire, woken by the computer's release notice. DESIGN.md,
//! "Single-flight", has the protocol and its failure rows.

mod batch;
mod entries;
mod entry;
mod error;
mod handle;
mod local;
mod scripts;
mod store;
mod user;

pub use error::OnceError;
pub use handle::SingleFlight;
pub use user::{OnceRecord, OnceStore};
