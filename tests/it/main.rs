//! Integration tests against real `redis-server` processes. One test binary
//! (one link step) with a module per topic.

#[path = "../support/mod.rs"]
mod support;

mod acl;
mod audit;
mod basic;
mod cancellation;
mod cluster;
mod contention;
mod election;
mod errors;
mod failover;
mod fair;
mod faults;
mod fencing;
mod hardening;
mod helpers;
mod hot;
mod inspect;
mod lifecycle;
#[cfg(feature = "metrics")]
mod metrics;
mod modes;
mod multi;
mod once;
#[cfg(feature = "postgres")]
mod postgres;
mod pregrant;
mod proxy;
mod resp3;
mod restart;
mod rwlock;
mod semaphore;
mod sentinel;
mod sockets;
mod spans;
#[cfg(any(
    feature = "sqlx-postgres",
    feature = "sqlx-mysql",
    feature = "sqlx-sqlite"
))]
mod sqlx_stores;
#[cfg(feature = "tls")]
mod tls;
mod waiting;
