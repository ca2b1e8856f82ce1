//! The `metrics` feature: every metric the table of docs/operations.md lists, read back
//! after real operations on real servers.
//!
//! The recorder is a small one of this file that logs every operation in
//! order (a counter's increments, a gauge's every `set`, a histogram's
//! samples), so a gauge's history can be read, not just a last value that
//! a snapshot resets. It is installed as this thread's local recorder: the
//! tests run on a current-thread runtime, so every task the client spawns
//! (connections, the watchdog, the subscription tasks) records to it, and
//! the other tests, on other threads, record to nothing.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use redfence::{AutoExtend, Error, LossReason, RestartGuard, Retry};

use crate::helpers::{
    builder, client_with_timeout, hand_over_by_notice, lock_key, ms, secs, warm_up,
};
use crate::support::{Cluster, ServerOptions};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Counter(u64),
    Gauge(f64),
    Histogram(f64),
}

/// One operation on one metric.
#[derive(Debug, Clone)]
struct Entry {
    name: String,
    labels: Vec<(String, String)>,
    op: Op,
}

impl Entry {
    fn has(&self, labels: &[(&str, &str)]) -> bool {
        labels
            .iter()
            .all(|(k, v)| self.labels.iter().any(|(lk, lv)| lk == k && lv == v))
    }
}

#[derive(Debug, Clone, Default)]
struct Log(Arc<Mutex<Vec<Entry>>>);

impl Log {
    fn entries(&self, name: &str, labels: &[(&str, &str)]) -> Vec<Entry> {
        let log = self.0.lock().unwrap();
        log.iter()
            .filter(|e| e.name == name && e.has(labels))
            .cloned()
            .collect()
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.entries(name, labels)
            .iter()
            .map(|e| match e.op {
                Op::Counter(n) => n,
                other => panic!("{name} is not a counter: {other:?}"),
            })
            .sum()
    }

    /// Every value the gauge was set to, in order.
    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.entries(name, labels)
            .iter()
            .map(|e| match e.op {
                Op::Gauge(v) => v,
                other => panic!("{name} is not a gauge: {other:?}"),
            })
            .collect()
    }

    fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.entries(name, labels)
            .iter()
            .map(|e| match e.op {
                Op::Histogram(v) => v,
                other => panic!("{name} is not a histogram: {other:?}"),
            })
            .collect()
    }

    fn clear(&self) {
        self.0.lock().unwrap().clear();
    }

    fn all(&self) -> Vec<Entry> {
        self.0.lock().unwrap().clone()
    }

    /// Every metric recorded is a row of the table of docs/operations.md, with that
    /// type and exactly those labels.
    fn check_documented(&self) {
        let table = readme_metrics();
        for entry in self.all() {
            let Some((_, kind, labels)) = table.iter().find(|(name, ..)| *name == entry.name)
            else {
                panic!("{} is not in the table of docs/operations.md", entry.name);
            };
            let recorded = match entry.op {
                Op::Counter(_) => "counter",
                Op::Gauge(_) => "gauge",
                Op::Histogram(_) => "histogram",
            };
            assert_eq!(recorded, kind, "{entry:?}");
            let mut keys: Vec<&str> = entry.labels.iter().map(|(k, _)| k.as_str()).collect();
            keys.sort_unstable();
            let mut documented: Vec<&str> = labels.iter().map(String::as_str).collect();
            documented.sort_unstable();
            assert_eq!(keys, documented, "{entry:?}");
        }
    }
}

/// The metric table of docs/operations.md: (name, type, labels) per row.
fn readme_metrics() -> Vec<(String, String, Vec<String>)> {
    let readme = include_str!("../../docs/operations.md");
    let section = readme
        .split("## Observability")
        .nth(1)
        .expect("docs/operations.md has the Observability section");
    let rows: Vec<(String, String, Vec<String>)> = section
        .lines()
        .skip_while(|l| !l.starts_with("| metric"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let labels = cells[3]
                .split(", ")
                .map(|label| label.trim_matches('`').to_owned())
                .collect();
            (
                cells[1].trim_matches('`').to_owned(),
                cells[2].to_owned(),
                labels,
            )
        })
        .collect();
    assert!(rows.len() >= 10, "{rows:?}");
    rows
}

/// Each metric of the table of docs/operations.md is read back by a test of this file
/// (the other tests check that what they record is in the table).
#[test]
fn every_documented_metric_is_read_back() {
    let source = include_str!("metrics.rs");
    for (name, ..) in readme_metrics() {
        assert!(
            source.contains(&format!("\"{name}\"")),
            "{name} is documented but no test reads it"
        );
    }
}

struct Handle {
    log: Log,
    name: String,
    labels: Vec<(String, String)>,
}

impl Handle {
    fn push(&self, op: Op) {
        self.log.0.lock().unwrap().push(Entry {
            name: self.name.clone(),
            labels: self.labels.clone(),
            op,
        });
    }
}

impl CounterFn for Handle {
    fn increment(&self, value: u64) {
        self.push(Op::Counter(value));
    }
    fn absolute(&self, _: u64) {
        panic!("the crate only increments counters");
    }
}

impl GaugeFn for Handle {
    fn increment(&self, _: f64) {
        panic!("the crate only sets gauges");
    }
    fn decrement(&self, _: f64) {
        panic!("the crate only sets gauges");
    }
    fn set(&self, value: f64) {
        self.push(Op::Gauge(value));
    }
}

impl HistogramFn for Handle {
    fn record(&self, value: f64) {
        self.push(Op::Histogram(value));
    }
}

impl Log {
    fn handle(&self, key: &Key) -> Arc<Handle> {
        Arc::new(Handle {
            log: self.clone(),
            name: key.name().to_owned(),
            labels: key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect(),
        })
    }
}

impl Recorder for Log {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.handle(key))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.handle(key))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.handle(key))
    }
}

fn addr(cluster: &Cluster, i: usize) -> String {
    format!("127.0.0.1:{}", cluster.nodes[i].port())
}

/// Polls every 20 ms, for up to `within`, until `check` holds.
async fn until(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    crate::helpers::eventually(within, &mut check).await
}

const PASSWORD: &str = "m3trics-pa55-41c7";

#[tokio::test]
async fn acquisitions_extends_and_failures_are_counted() {
    let cluster = Cluster::start_with(3, |_| ServerOptions {
        acl_user: Some(("obs".into(), PASSWORD.into())),
        ..ServerOptions::default()
    });
    let urls: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("redis://obs:{PASSWORD}@127.0.0.1:{}", n.port()))
        .collect();
    let log = Log::default();
    let _recorder = ::metrics::set_default_local_recorder(&log);
    let client = builder(urls.clone()).node_timeout(secs(1)).build().unwrap();
    let other = builder(urls).node_timeout(secs(1)).build().unwrap();
    warm_up(&client, &cluster).await;
    warm_up(&other, &cluster).await;
    log.clear();

    let guard = client.acquire("m-acquire", secs(5)).await.unwrap();
    let seconds = log.histogram("redfence_acquire_seconds", &[("outcome", "acquired")]);
    assert_eq!(seconds.len(), 1, "{seconds:?}");
    assert!(seconds[0] > 0.0 && seconds[0] < 5.0, "{seconds:?}");
    assert_eq!(
        log.histogram("redfence_acquire_attempts", &[("outcome", "acquired")]),
        [1.0]
    );

    // Contended: a single try, then a waiting acquire of two attempts.
    assert!(other
        .try_acquire("m-acquire", secs(5))
        .await
        .unwrap()
        .is_none());
    let err = other
        .lock("m-acquire", secs(5))
        .retry(Retry::new().with_max_attempts(2).with_delay(ms(10)))
        .wake_on_release(false)
        .acquire()
        .await
        .unwrap_err();
    assert!(err.is_contended(), "{err}");
    assert_eq!(
        log.counter(
            "redfence_acquire_failures_total",
            &[("reason", "Contended")]
        ),
        2
    );
    assert_eq!(
        log.histogram("redfence_acquire_attempts", &[("outcome", "failed")]),
        [1.0, 2.0]
    );
    assert_eq!(
        log.histogram("redfence_acquire_seconds", &[("outcome", "failed")])
            .len(),
        2
    );
    // Answers about the lock are not node errors.
    assert_eq!(log.counter("redfence_node_errors_total", &[]), 0);
    // Refused before any round trip: the error variant is the reason.
    let err = client.acquire("", secs(5)).await.unwrap_err();
    assert!(matches!(err, Error::InvalidResource(_)), "{err}");
    assert_eq!(
        log.histogram("redfence_acquire_attempts", &[("outcome", "failed")]),
        [1.0, 2.0, 0.0]
    );
    assert_eq!(
        log.counter(
            "redfence_acquire_failures_total",
            &[("reason", "InvalidResource")]
        ),
        1
    );

    guard.extend(secs(5)).await.unwrap();
    assert_eq!(
        log.counter(
            "redfence_extends_total",
            &[("outcome", "extended"), ("by", "caller")]
        ),
        1
    );
    guard.release().await;
    assert_eq!(log.counter("redfence_leases_lost_total", &[]), 0);
    // Only what was asked for: two attempts' failures, one acquire.
    assert_eq!(log.counter("redfence_acquire_failures_total", &[]), 3);

    // No label holds a credential; node labels are the addresses.
    let nodes: Vec<String> = (0..3).map(|i| addr(&cluster, i)).collect();
    for entry in log.all() {
        for (key, value) in &entry.labels {
            assert!(!value.contains(PASSWORD), "{entry:?}");
            if key == "node" {
                assert!(nodes.contains(value), "{entry:?}");
            }
        }
    }
    log.check_documented();
}

#[tokio::test]
async fn lost_leases_and_the_watchdogs_extends_are_counted() {
    let cluster = Cluster::start(3);
    let log = Log::default();
    let _recorder = ::metrics::set_default_local_recorder(&log);
    let client = client_with_timeout(cluster.urls(), ms(200));
    warm_up(&client, &cluster).await;
    log.clear();

    let guard = client
        .lock("m-lost", secs(3))
        .auto_extend(AutoExtend::new())
        .acquire()
        .await
        .unwrap();
    let extended = [("outcome", "extended"), ("by", "watchdog")];
    assert!(
        until(secs(5), || log.counter("redfence_extends_total", &extended)
            >= 1)
        .await,
        "no extend by the watchdog"
    );
    for node in &cluster.nodes[..2] {
        node.cli(&["DEL", &lock_key("m-lost")]);
    }
    let lost = tokio::time::timeout(secs(10), guard.lost()).await.unwrap();
    assert_eq!(lost.reason, LossReason::NotHeld, "{lost}");
    assert_eq!(
        log.counter("redfence_leases_lost_total", &[("reason", "NotHeld")]),
        1
    );
    assert!(
        log.counter(
            "redfence_extends_total",
            &[("outcome", "failed"), ("by", "watchdog")]
        ) >= 1
    );
    // An extend of the lost lease: refused, counted as `lost`.
    assert!(guard.extend(secs(3)).await.unwrap_err().is_lost());
    assert_eq!(
        log.counter(
            "redfence_extends_total",
            &[("outcome", "lost"), ("by", "caller")]
        ),
        1
    );
    guard.release().await;

    // Without a watchdog, a lease that ran out is lost when next looked at.
    let guard = client.acquire("m-expired", ms(300)).await.unwrap();
    tokio::time::sleep(ms(400)).await;
    assert!(guard.extend(secs(1)).await.unwrap_err().is_lost());
    assert_eq!(
        log.counter("redfence_leases_lost_total", &[("reason", "Expired")]),
        1
    );
    guard.release().await;
    // Releases are not losses.
    assert_eq!(log.counter("redfence_leases_lost_total", &[]), 2);
    log.check_documented();
}

#[tokio::test]
async fn node_errors_and_health_gauges_follow_the_nodes() {
    let mut cluster = Cluster::start(3);
    let log = Log::default();
    let _recorder = ::metrics::set_default_local_recorder(&log);
    let client = client_with_timeout(cluster.urls(), ms(200));
    warm_up(&client, &cluster).await;
    for i in 0..3 {
        let up = log.gauge("redfence_node_up", &[("node", &addr(&cluster, i))]);
        assert_eq!(up, [1.0], "node {i}");
    }
    log.clear();

    // A killed node: its errors by kind, and down.
    let dead = addr(&cluster, 2);
    cluster.node(2).kill();
    let mut named = None;
    for _ in 0..20 {
        let guard = client.acquire("m-health", secs(5)).await.unwrap();
        let released = guard.release().await;
        if let Some(failure) = released.failures.iter().find(|f| f.index == 2) {
            named = Some(failure.addr.clone());
        }
        if !log.gauge("redfence_node_up", &[("node", &dead)]).is_empty() {
            break;
        }
    }
    assert_eq!(
        log.gauge("redfence_node_up", &[("node", &dead)]),
        [0.0],
        "{:?}",
        log.all()
    );
    if let Some(named) = named {
        assert_eq!(named, dead, "the label is the address errors show");
    }
    let errors = log.entries("redfence_node_errors_total", &[("node", &dead)]);
    assert!(!errors.is_empty(), "{:?}", log.all());
    for entry in &errors {
        let kind = entry.labels.iter().find(|(k, _)| k == "kind").unwrap();
        assert!(
            ["ConnectionLost", "Connect", "Backoff"].contains(&kind.1.as_str()),
            "{entry:?}"
        );
    }

    // A paused node: a timeout, then stalled; answering again clears it.
    let paused = addr(&cluster, 1);
    cluster.node(1).pause();
    let err = client.try_acquire("m-health", secs(5)).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    assert!(
        log.counter(
            "redfence_node_errors_total",
            &[("node", &paused), ("kind", "Timeout")]
        ) >= 1
    );
    assert_eq!(
        log.gauge("redfence_node_stalled", &[("node", &paused)]),
        [1.0]
    );
    assert!(
        log.counter(
            "redfence_acquire_failures_total",
            &[("reason", "Unavailable")]
        ) >= 1
    );
    cluster.node(1).resume();
    let mut acquired = false;
    for _ in 0..50 {
        if let Ok(Some(guard)) = client.try_acquire("m-health", secs(5)).await {
            guard.release().await;
            acquired = true;
            break;
        }
        tokio::time::sleep(ms(50)).await;
    }
    assert!(acquired, "never acquired after the resume");
    assert_eq!(
        log.gauge("redfence_node_stalled", &[("node", &paused)]),
        [1.0, 0.0]
    );
    log.check_documented();
}

#[tokio::test]
async fn the_restart_guard_quarantine_is_a_gauge() {
    let cluster = Cluster::start(3);
    let log = Log::default();
    let _recorder = ::metrics::set_default_local_recorder(&log);
    // The guard on (the servers just started, so every node is young), and
    // no fencing, so that a node votes as soon as its window is over.
    let client = redfence::Client::builder(cluster.urls())
        .restart_guard(RestartGuard::new())
        .fencing(false)
        .node_timeout(secs(1))
        .build()
        .unwrap();
    let ttl = ms(1500);
    let err = client.try_acquire("m-young", ttl).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    // The try decided once two nodes refused to vote: the third may not
    // have been asked.
    let quarantined: Vec<String> = (0..3)
        .map(|i| addr(&cluster, i))
        .filter(|node| log.gauge("redfence_node_quarantined", &[("node", node)]) == [1.0])
        .collect();
    assert!(quarantined.len() >= 2, "{:?}", log.all());
    for node in &quarantined {
        assert!(
            log.counter(
                "redfence_node_errors_total",
                &[("node", node), ("kind", "Restarted")]
            ) >= 1
        );
    }
    // After the window (the TTL, counted from the latest start the uptime
    // allows), the nodes vote again.
    let mut guard = None;
    for _ in 0..40 {
        tokio::time::sleep(ms(250)).await;
        if let Ok(Some(g)) = client.try_acquire("m-young", ttl).await {
            guard = Some(g);
            break;
        }
    }
    guard.expect("acquired after the window").release().await;
    let history: Vec<Vec<f64>> = (0..3)
        .map(|i| log.gauge("redfence_node_quarantined", &[("node", &addr(&cluster, i))]))
        .collect();
    assert!(
        history.iter().any(|h| h[..] == [1.0, 0.0]),
        "no node let out of quarantine: {history:?}"
    );
    let voting = history.iter().filter(|h| h.last() == Some(&0.0)).count();
    assert!(voting >= 2, "{:?}", log.all());
    log.check_documented();
}

#[tokio::test]
async fn release_notices_are_counted_per_node() {
    let cluster = Cluster::start(3);
    let log = Log::default();
    let _recorder = ::metrics::set_default_local_recorder(&log);
    let holder = client_with_timeout(cluster.urls(), secs(1));
    let waiting = client_with_timeout(cluster.urls(), secs(1));
    warm_up(&holder, &cluster).await;
    assert_eq!(log.counter("redfence_release_notices_total", &[]), 0);
    let guard = holder.acquire("m-notice", secs(30)).await.unwrap();
    let (next, after, _) = hand_over_by_notice(guard, waiting).await;
    assert!(after < secs(5), "not woken by the notice: {after:?}");
    next.release().await;
    let nodes: Vec<String> = (0..3).map(|i| addr(&cluster, i)).collect();
    let notices = log.entries("redfence_release_notices_total", &[]);
    assert!(!notices.is_empty(), "{:?}", log.all());
    for entry in &notices {
        assert!(
            entry
                .labels
                .iter()
                .any(|(k, v)| k == "node" && nodes.contains(v)),
            "{entry:?}"
        );
    }
    log.check_documented();
}

/// Without the feature the crate does not depend on `metrics`: the
/// library's dependency is optional and only the feature enables it (the
/// dev-dependency serves these tests).
#[test]
fn the_metrics_dependency_comes_with_the_feature_only() {
    let manifest = include_str!("../../Cargo.toml");
    let section = |name: &str| -> Vec<&str> {
        manifest
            .split(&format!("\n[{name}]\n"))
            .nth(1)
            .unwrap_or_else(|| panic!("no [{name}]"))
            .split("\n[")
            .next()
            .unwrap()
            .lines()
            .collect()
    };
    let dependency: Vec<&str> = section("dependencies")
        .into_iter()
        .filter(|l| l.starts_with("metrics "))
        .collect();
    assert_eq!(dependency.len(), 1, "{dependency:?}");
    assert!(dependency[0].contains("optional = true"), "{dependency:?}");
    assert!(dependency[0].contains("\"0.24\""), "{dependency:?}");
    let features = section("features");
    assert!(
        features.contains(&"metrics = [\"dep:metrics\"]"),
        "{features:?}"
    );
    assert!(features.contains(&"default = []"), "{features:?}");
    // No other feature pulls it in.
    let enabling: Vec<&&str> = features
        .iter()
        .filter(|l| l.contains("dep:metrics") || l.contains("\"metrics\""))
        .collect();
    assert_eq!(enabling.len(), 1, "{enabling:?}");
}
