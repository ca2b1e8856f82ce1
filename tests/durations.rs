//! Every `Duration` a user can pass, at the values that break arithmetic:
//! 0, 1 ns, 1 ms, `MAX_TTL`, `MAX_TTL` + 1 s and `Duration::MAX`, through
//! every setter (builder, lock request, extend, retry, auto-extension,
//! restart guard, fenced store), driving a real acquire, extend, release
//! and auto-extension against real nodes, on both runtime flavours. Each
//! case ends in a typed error or a working lock, never a panic: a panic
//! hook counts panics on every thread, including the runtime's workers and
//! destructors (a panic there once aborted the whole process), and every
//! case is bounded in time.
//!
//! In its own binary: a panic inside a destructor during unwinding aborts
//! the process, and must not take the other tests with it.

#[path = "support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use redfence::limits::MAX_TTL;
use redfence::{AutoExtend, Builder, Client, FencedStore, RestartGuard, Retry};

use support::Cluster;

const VALUES: [Duration; 6] = [
    Duration::ZERO,
    Duration::from_nanos(1),
    Duration::from_millis(1),
    MAX_TTL,
    MAX_TTL.saturating_add(Duration::from_secs(1)),
    Duration::MAX,
];

/// Every case must finish within this (its waits are bounded by a short
/// retry policy unless the case sets the policy itself).
const CASE_BOUND: Duration = Duration::from_secs(20);

/// A setter under test, applied to the builder, the request, or the call.
#[derive(Clone, Copy, Debug)]
enum Setter {
    NodeTimeout,
    ConnectTimeout,
    ReconnectBackoff,
    MinValidity,
    RestartWindow,
    ClientRetryMaxWait,
    RetryMaxWait,
    RetryDelay,
    RetryJitter,
    RetryMaxJitter,
    AutoExtendInterval,
    AutoExtendMaxHold,
    ClientAutoExtendMaxHold,
    Ttl,
    ExtendTtl,
    StoreTimeout,
}

const SETTERS: [Setter; 16] = [
    Setter::NodeTimeout,
    Setter::ConnectTimeout,
    Setter::ReconnectBackoff,
    Setter::MinValidity,
    Setter::RestartWindow,
    Setter::ClientRetryMaxWait,
    Setter::RetryMaxWait,
    Setter::RetryDelay,
    Setter::RetryJitter,
    Setter::RetryMaxJitter,
    Setter::AutoExtendInterval,
    Setter::AutoExtendMaxHold,
    Setter::ClientAutoExtendMaxHold,
    Setter::Ttl,
    Setter::ExtendTtl,
    Setter::StoreTimeout,
];

/// A short policy, so that a case that cannot get the lock (a node timeout
/// of 1 ns, a restart window of a year) ends quickly with its typed error.
fn short() -> Retry {
    Retry::new()
        .with_max_wait(Duration::from_millis(150))
        .with_delay(Duration::from_millis(10))
        .with_jitter(Duration::from_millis(10))
}

fn builder(urls: Vec<String>, setter: Setter, value: Duration) -> Builder {
    let b = Client::builder(urls)
        .restart_guard(RestartGuard::off())
        .retry(short());
    match setter {
        Setter::NodeTimeout => b.node_timeout(value),
        Setter::ConnectTimeout => b.connect_timeout(value),
        Setter::ReconnectBackoff => b.reconnect_backoff_max(value),
        Setter::MinValidity => b.min_validity(value),
        Setter::RestartWindow => b.restart_guard(RestartGuard::new().with_window(value)),
        Setter::ClientRetryMaxWait => b.retry(short().with_max_wait(value)),
        Setter::ClientAutoExtendMaxHold => b.auto_extend(AutoExtend::new().with_max_hold(value)),
        _ => b,
    }
}

/// One case: build, acquire (waiting), extend, auto-extend, fenced write,
/// release. Returns what happened, for the failure message; panics are
/// counted by the hook.
async fn case(
    urls: Vec<String>,
    data_url: String,
    setter: Setter,
    value: Duration,
    n: usize,
) -> String {
    let client = match builder(urls, setter, value).build() {
        Ok(client) => client,
        Err(e) => return format!("build: {e}"),
    };
    let resource = format!("case-{n}");
    let ttl = match setter {
        Setter::Ttl => value,
        _ => Duration::from_secs(5),
    };
    let mut request = client.lock(resource.as_str(), ttl);
    request = match setter {
        Setter::RetryMaxWait => request.retry(short().with_max_wait(value)),
        Setter::RetryDelay => request.retry(short().with_delay(value)),
        Setter::RetryJitter => request.retry(short().with_jitter(value)),
        Setter::RetryMaxJitter => request.retry(short().with_max_jitter(value)),
        Setter::AutoExtendInterval => request.auto_extend(AutoExtend::new().with_interval(value)),
        Setter::AutoExtendMaxHold => request.auto_extend(AutoExtend::new().with_max_hold(value)),
        _ => request,
    };
    let guard = match request.acquire().await {
        Ok(guard) => guard,
        Err(e) => return format!("acquire: {e}"),
    };
    // A second acquire of the held lock waits under the policy: its
    // deadline, pauses and the holder's expiry all go through the setters'
    // values (bounded by the short policy where the case does not set it).
    let mut waiter = client
        .lock(resource.as_str(), Duration::from_secs(1))
        .retry(short());
    waiter = match setter {
        Setter::RetryDelay => waiter.retry(short().with_delay(value)),
        Setter::RetryJitter => waiter.retry(short().with_jitter(value)),
        Setter::RetryMaxJitter => waiter.retry(short().with_max_jitter(value)),
        _ => waiter,
    };
    let second = waiter.acquire().await;
    let extend_ttl = match setter {
        Setter::ExtendTtl => value,
        _ => ttl,
    };
    let extended = guard.extend(extend_ttl).await;
    if let Some(token) = guard.token() {
        let store_timeout = match setter {
            Setter::StoreTimeout => value,
            _ => Duration::from_secs(1),
        };
        if let Ok(conn) = redis::Client::open(data_url.as_str()) {
            if let Ok(conn) = conn.get_multiplexed_async_connection().await {
                let store = FencedStore::new(conn).timeout(store_timeout);
                let _ = store.write(&resource, b"v", token).await;
            }
        }
    }
    // Let a watchdog run once or twice.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let released = guard.release().await;
    format!(
        "held; second {}; extend {}; released {}/{}",
        match &second {
            Ok(_) => "granted".to_owned(),
            Err(e) => format!("refused ({e})"),
        },
        match &extended {
            Ok(v) => format!("ok {v:?}"),
            Err(e) => format!("refused ({e})"),
        },
        released.confirmed,
        released.nodes
    )
}

fn run_all(runtime: tokio::runtime::Runtime, flavour: &str, panics: &AtomicUsize) {
    let cluster = Cluster::start(3);
    let data = support::RedisServer::start();
    let before = panics.load(Ordering::SeqCst);
    // Eight cases at a time (each on its own resource): one after the
    // other they took 15 s a flavour, most of it the second acquire's
    // bounded wait; all 96 at once, on the current-thread runtime, most
    // connects outlasted the short policy's 150 ms. A panic is counted for
    // the flavour; the hook's own message names where it happened.
    let outcomes: Vec<(Setter, Duration, String)> = runtime.block_on(async {
        let cases = SETTERS
            .into_iter()
            .flat_map(|setter| VALUES.into_iter().map(move |value| (setter, value)))
            .enumerate()
            .map(|(n, (setter, value))| {
                let case = case(cluster.urls(), data.url(), setter, value, n + 1);
                async move {
                    let outcome = tokio::time::timeout(CASE_BOUND, case)
                        .await
                        .unwrap_or_else(|_| format!("did not finish within {CASE_BOUND:?}"));
                    (setter, value, outcome)
                }
            });
        let outcomes: Vec<_> = futures::stream::iter(cases).buffered(8).collect().await;
        // Background work (releases, watchdogs being stopped) gets a moment
        // to run and, if it panics, to be counted.
        tokio::time::sleep(Duration::from_millis(200)).await;
        outcomes
    });
    drop(runtime);
    let panicked = panics.load(Ordering::SeqCst) - before;
    let bad: Vec<String> = outcomes
        .iter()
        .filter(|(_, _, outcome)| outcome.starts_with("did not"))
        .map(|(s, v, o)| format!("{flavour} {s:?}({v:?}): {o}"))
        .collect();
    let held = outcomes
        .iter()
        .filter(|(_, _, o)| o.starts_with("held"))
        .count();
    let typed = outcomes.len() - held;
    println!("{flavour}: {held} cases held a lock, {typed} ended in a typed error");
    assert_eq!(
        panicked, 0,
        "{flavour}: {panicked} panics (their messages are above)"
    );
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    // Not vacuous: most cases work, and some values are refused.
    assert!(held >= outcomes.len() / 2, "{held} of {}", outcomes.len());
    assert!(typed > 0);
}

fn panic_counter() -> Arc<AtomicUsize> {
    static COUNT: std::sync::OnceLock<Arc<AtomicUsize>> = std::sync::OnceLock::new();
    COUNT
        .get_or_init(|| {
            let count = Arc::new(AtomicUsize::new(0));
            let seen = Arc::clone(&count);
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                seen.fetch_add(1, Ordering::SeqCst);
                previous(info);
            }));
            count
        })
        .clone()
}

/// Both flavours in one test, one after the other: the panic hook is
/// process-wide, so the cases must not run concurrently with others.
#[test]
fn every_duration_setter_at_its_extremes() {
    let panics = panic_counter();
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    run_all(current, "current_thread", &panics);
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    run_all(multi, "multi_thread", &panics);
}
