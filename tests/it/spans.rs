//! Tracing: every public operation has a span whose outcome fields
//! (resource, attempts, granted, quorum, elapsed, outcome, reason) are
//! recorded at its end, a lost lease is a `warn` event with its reason, and
//! neither the lock value (the secret that authorises release) nor a
//! password from a node URL ever reaches a subscriber.
//!
//! The capture is a small `Layer` installed as this thread's default
//! subscriber: the tests run on a current-thread runtime, so every task the
//! client spawns (the watchdog, the connections, the background releases)
//! runs on this thread and reports to it, and tests running in parallel on
//! other threads do not.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use redfence::{AutoExtend, FencedStore, LossReason, Retry};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use crate::helpers::{builder, eventually, lock_key, ms, secs, warm_up};
use crate::support::{Cluster, ServerOptions};

/// One span: its name and every field value recorded on it, in order (a
/// field recorded twice appears twice; [`SpanRec::get`] takes the last).
#[derive(Debug, Clone)]
pub struct SpanRec {
    pub name: &'static str,
    pub fields: Vec<(String, String)>,
}

impl SpanRec {
    pub fn get(&self, field: &str) -> Option<&str> {
        self.fields
            .iter()
            .rev()
            .find(|(name, _)| name == field)
            .map(|(_, value)| value.as_str())
    }
}

/// One event: level, fields (the message is the field `message`) and the
/// names of the spans it happened in, innermost first.
#[derive(Debug, Clone)]
pub struct EventRec {
    pub level: Level,
    pub fields: SpanRec,
    pub scope: Vec<&'static str>,
}

#[derive(Debug, Default)]
pub struct Captured {
    open: HashMap<u64, SpanRec>,
    closed: Vec<SpanRec>,
    pub events: Vec<EventRec>,
    /// Every name and value a subscriber was given, as text: what any
    /// formatter could have printed.
    pub text: String,
}

impl Captured {
    /// The spans named `name`, closed ones first.
    pub fn spans(&self, name: &str) -> Vec<SpanRec> {
        self.closed
            .iter()
            .chain(self.open.values())
            .filter(|s| s.name == name)
            .cloned()
            .collect()
    }

    fn log(&mut self, what: &str, fields: &[(String, String)]) {
        self.text.push_str(what);
        for (name, value) in fields {
            self.text.push_str(&format!(" {name}={value}"));
        }
        self.text.push('\n');
    }
}

/// The capturing layer; clones share what was captured.
#[derive(Debug, Clone, Default)]
pub struct Capture(Arc<Mutex<Captured>>);

impl Capture {
    pub fn captured(&self) -> std::sync::MutexGuard<'_, Captured> {
        self.0.lock().unwrap()
    }

    /// Makes this capture the current thread's default subscriber until the
    /// guard is dropped.
    pub fn install(&self) -> tracing::subscriber::DefaultGuard {
        scoped(tracing_subscriber::registry().with(self.clone()))
    }
}

/// `set_default` that other test threads cannot undo. `tracing` caches
/// one interest per callsite for the whole process, computed when the
/// callsite is first reached; while a single dispatcher is registered it
/// asks the reaching thread's default only, so a test thread without a
/// subscriber reaching a span first disables it everywhere, this capture
/// included (`postgres::writes_reads_and_updates_have_spans_without_the_value`
/// lost its `fenced_read` span once with six test threads). A second
/// dispatcher kept alive for the process makes every later callsite ask all
/// of them, and the rebuild re-asks those reached before.
pub fn scoped<S>(subscriber: S) -> tracing::subscriber::DefaultGuard
where
    S: tracing::Subscriber + Send + Sync + 'static,
{
    static PINNED: std::sync::OnceLock<tracing::Dispatch> = std::sync::OnceLock::new();
    PINNED.get_or_init(|| tracing::Dispatch::new(tracing_subscriber::registry()));
    let guard = tracing::subscriber::set_default(subscriber);
    tracing::callsite::rebuild_interest_cache();
    guard
}

struct Fields<'a>(&'a mut Vec<(String, String)>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
}

impl<S> Layer<S> for Capture
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = Vec::new();
        attrs.record(&mut Fields(&mut fields));
        let name = attrs.metadata().name();
        let mut c = self.captured();
        c.log(name, &fields);
        c.open.insert(id.into_u64(), SpanRec { name, fields });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut fields = Vec::new();
        values.record(&mut Fields(&mut fields));
        let mut c = self.captured();
        c.log("record", &fields);
        if let Some(span) = c.open.get_mut(&id.into_u64()) {
            span.fields.extend(fields);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Vec::new();
        event.record(&mut Fields(&mut fields));
        let scope = ctx
            .event_scope(event)
            .map(|scope| scope.map(|span| span.name()).collect())
            .unwrap_or_default();
        let mut c = self.captured();
        c.log(event.metadata().name(), &fields);
        c.events.push(EventRec {
            level: *event.metadata().level(),
            fields: SpanRec {
                name: event.metadata().name(),
                fields,
            },
            scope,
        });
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        let mut c = self.captured();
        if let Some(span) = c.open.remove(&id.into_u64()) {
            c.closed.push(span);
        }
    }
}

/// Whether `text` shows the lock value `value` (`{client id}:{secret}`):
/// the whole of it, or its secret part alone.
fn leaks(text: &str, value: &str) -> bool {
    let secret = value.rsplit(':').next().unwrap_or(value);
    assert!(secret.len() >= 16, "not a lock value: {value:?}");
    text.contains(value) || text.contains(secret)
}

const PASSWORD: &str = "obs-pa55-7d1e";

/// The span table of docs/operations.md: (span names, fields) per row.
fn readme_spans() -> Vec<(Vec<String>, Vec<String>)> {
    let readme = include_str!("../../docs/operations.md");
    let section = readme
        .split("## Observability")
        .nth(1)
        .expect("docs/operations.md has the Observability section");
    let rows: Vec<(Vec<String>, Vec<String>)> = section
        .lines()
        .skip_while(|l| !l.starts_with("| span"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (backticked(cells[1]), backticked(cells[3]))
        })
        .collect();
    assert!(rows.len() >= 8, "{rows:?}");
    rows
}

/// The words in backticks in `cell`, up to the first parenthesis of each
/// comma-separated item (`outcome` (`ok` / …) is the field `outcome`).
fn backticked(cell: &str) -> Vec<String> {
    cell.split(", ")
        .filter_map(|item| {
            let item = item.split(" (").next()?;
            Some(item.trim().trim_matches('`').to_owned())
        })
        .filter(|w| !w.is_empty())
        .collect()
}

/// Three nodes with an ACL user whose password is in the client's URLs.
fn cluster_with_password() -> (Cluster, Vec<String>) {
    let cluster = Cluster::start_with(3, |_| ServerOptions {
        acl_user: Some(("obs".into(), PASSWORD.into())),
        ..ServerOptions::default()
    });
    let urls = cluster
        .nodes
        .iter()
        .map(|n| format!("redis://obs:{PASSWORD}@127.0.0.1:{}", n.port()))
        .collect();
    (cluster, urls)
}

fn get(cluster: &Cluster, resource: &str) -> String {
    let value = cluster.nodes[0].cli(&["GET", &lock_key(resource)]);
    assert!(value.contains(':'), "lock value of {resource}: {value:?}");
    value
}

fn assert_outcome_fields(span: &SpanRec) {
    for field in ["resource", "granted", "quorum", "elapsed", "outcome"] {
        assert!(span.get(field).is_some(), "{field} missing: {span:?}");
    }
}

#[tokio::test]
async fn every_operation_has_a_span_with_its_outcome_and_no_secret() {
    let (cluster, urls) = cluster_with_password();
    let capture = Capture::default();
    let subscriber = capture.install();
    let client = builder(urls.clone()).node_timeout(secs(1)).build().unwrap();
    warm_up(&client, &cluster).await;

    // Acquire, extend, a refused try, release.
    let guard = client.acquire("obs-spans", secs(5)).await.unwrap();
    let value = get(&cluster, "obs-spans");
    guard.extend(secs(5)).await.unwrap();
    assert!(client
        .try_acquire("obs-spans", secs(5))
        .await
        .unwrap()
        .is_none());
    let err = client
        .lock("obs-spans", secs(5))
        .retry(Retry::once())
        .acquire()
        .await
        .unwrap_err();
    assert!(err.is_contended(), "{err}");
    let token = guard.token().unwrap();
    guard.release().await;

    // A fenced write (its value must not be a field either) and an audit.
    let conn = redis::Client::open(urls[0].as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let payload = "payload-3b9f0c";
    let store = FencedStore::new(conn);
    store.write("obs-data", payload, token).await.unwrap();
    assert!(store.read("obs-data").await.unwrap().is_some());
    client.audit().await;
    // A guard dropped without a release: released in the background.
    drop(client.acquire("obs-dropped", secs(5)).await.unwrap());
    let dropped = get(&cluster, "obs-dropped");
    assert!(
        eventually(secs(5), || cluster.count_keys(&lock_key("obs-dropped"))
            == [0, 0, 0])
        .await,
        "the dropped guard was not released"
    );

    // A lost lease: the watchdog finds the keys gone on a majority.
    let watched = builder(urls.clone()).node_timeout(ms(200)).build().unwrap();
    // Connected everywhere first: a fresh client's straggling SET could
    // land after the DEL below.
    warm_up(&watched, &cluster).await;
    let lost_guard = watched
        .lock("obs-lost", secs(3))
        .auto_extend(AutoExtend::new())
        .acquire()
        .await
        .unwrap();
    // Every write of the acquire has run: the deletes are the last word.
    assert!(crate::helpers::landed(&cluster.nodes, "obs-lost", secs(5)).await);
    let lost_value = get(&cluster, "obs-lost");
    for node in &cluster.nodes[..2] {
        node.cli(&["DEL", &lock_key("obs-lost")]);
    }
    let lost = tokio::time::timeout(secs(10), lost_guard.lost())
        .await
        .unwrap();
    assert_eq!(lost.reason, LossReason::NotHeld, "{lost}");
    lost_guard.release().await;
    drop(subscriber);

    let c = capture.captured();
    let acquire = c
        .spans("acquire")
        .into_iter()
        .find(|s| s.get("resource") == Some("obs-spans") && s.get("outcome") == Some("acquired"))
        .expect("the acquire span");
    assert_outcome_fields(&acquire);
    assert_eq!(acquire.get("outcome"), Some("acquired"), "{acquire:?}");
    assert_eq!(acquire.get("attempts"), Some("1"), "{acquire:?}");
    assert_eq!(acquire.get("quorum"), Some("2"), "{acquire:?}");
    let granted: usize = acquire.get("granted").unwrap().parse().unwrap();
    assert!((2..=3).contains(&granted), "{acquire:?}");
    assert!(
        acquire.get("elapsed").unwrap().ends_with('s'),
        "{acquire:?}"
    );

    let extend = c
        .spans("extend")
        .into_iter()
        .find(|s| s.get("by") == Some("caller"))
        .expect("the extend span");
    assert_outcome_fields(&extend);
    assert_eq!(extend.get("outcome"), Some("extended"), "{extend:?}");
    assert_eq!(extend.get("quorum"), Some("2"), "{extend:?}");

    let refused = c
        .spans("acquire")
        .into_iter()
        .find(|s| s.get("outcome") == Some("failed"))
        .expect("the failed acquire's span");
    assert_eq!(refused.get("reason"), Some("held by another owner"));
    assert_eq!(refused.get("attempts"), Some("1"), "{refused:?}");
    let tried = c.spans("try_acquire").pop().expect("the try_acquire span");
    assert_outcome_fields(&tried);
    assert_eq!(tried.get("outcome"), Some("failed"), "{tried:?}");
    assert_eq!(tried.get("granted"), Some("0"), "{tried:?}");
    assert_eq!(tried.get("attempts"), Some("1"), "{tried:?}");
    assert_eq!(tried.get("reason"), Some("held by another owner"));

    let release = c
        .spans("release")
        .into_iter()
        .find(|s| s.get("resource") == Some("obs-spans"))
        .expect("the release span");
    assert_eq!(release.get("nodes"), Some("3"), "{release:?}");
    assert!(release.get("confirmed").is_some() && release.get("elapsed").is_some());

    let write = c
        .spans("fenced_write")
        .pop()
        .expect("the fenced_write span");
    assert_eq!(write.get("key"), Some("obs-data"));
    assert_eq!(write.get("outcome"), Some("ok"));
    assert!(write.get("elapsed").is_some());
    let audit = c.spans("audit").pop().expect("the audit span");
    assert_eq!(audit.get("nodes"), Some("3"));
    assert!(audit.get("errors").is_some() && audit.get("elapsed").is_some());

    // The watchdog's extends: one per round, inside the watchdog's span;
    // the last one found the keys gone.
    let watchdog: Vec<SpanRec> = c
        .spans("extend")
        .into_iter()
        .filter(|s| s.get("by") == Some("watchdog"))
        .collect();
    let failed = watchdog
        .iter()
        .find(|s| s.get("outcome") == Some("failed"))
        .unwrap_or_else(|| panic!("no failed watchdog extend: {watchdog:?}"));
    assert_outcome_fields(failed);
    assert_eq!(failed.get("resource"), Some("obs-lost"));
    assert_eq!(
        failed.get("reason"),
        Some("lock no longer held by this owner")
    );
    let warned: Vec<&EventRec> = c
        .events
        .iter()
        .filter(|e| e.level == Level::WARN && e.fields.get("message") == Some("lease lost"))
        .collect();
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert_eq!(warned[0].fields.get("resource"), Some("obs-lost"));
    assert!(
        warned[0].fields.get("validity_left").is_some(),
        "{warned:?}"
    );
    assert!(warned[0].fields.get("token").is_some(), "{warned:?}");
    assert_eq!(
        warned[0].fields.get("reason"),
        Some(LossReason::NotHeld.to_string().as_str())
    );
    assert!(warned[0].scope.contains(&"watchdog"), "{warned:?}");
    // A release is not a loss: no other warning.
    assert!(
        c.events
            .iter()
            .all(|e| e.level > Level::WARN || e.fields.get("message") == Some("lease lost")),
        "{:?}",
        c.events
            .iter()
            .filter(|e| e.level <= Level::WARN)
            .collect::<Vec<_>>()
    );

    // Every span of the table of docs/operations.md, with every field it lists.
    for (names, fields) in readme_spans() {
        for name in names {
            let spans = c.spans(&name);
            assert!(!spans.is_empty(), "no {name} span");
            for field in &fields {
                assert!(
                    spans.iter().any(|s| s.get(field).is_some()),
                    "no {name} span has {field}: {spans:?}"
                );
            }
        }
    }

    // Nothing secret, anywhere in what the subscriber was given.
    assert!(c.text.contains("obs-spans") && c.text.contains("127.0.0.1"));
    assert!(!leaks(&c.text, &value), "the lock value was traced");
    assert!(!leaks(&c.text, &lost_value), "the lock value was traced");
    assert!(!leaks(&c.text, &dropped), "the lock value was traced");
    assert!(!c.text.contains(PASSWORD), "a password was traced");
    assert!(!c.text.contains(payload), "a fenced value was traced");
}

/// Everything but the lease-lost warning is `debug`: a subscriber at
/// `info` is given no span and no event by acquire, extend and release, and
/// the warning still comes through.
#[tokio::test]
async fn a_subscriber_at_info_gets_only_the_warning() {
    let cluster = Cluster::start(3);
    let capture = Capture::default();
    let subscriber = scoped(
        tracing_subscriber::registry()
            .with(tracing_subscriber::filter::LevelFilter::INFO)
            .with(capture.clone()),
    );
    let client = builder(cluster.urls())
        .node_timeout(secs(1))
        .build()
        .unwrap();
    warm_up(&client, &cluster).await;
    let guard = client.acquire("obs-quiet", secs(5)).await.unwrap();
    guard.extend(secs(5)).await.unwrap();
    assert!(client
        .try_acquire("obs-quiet", secs(5))
        .await
        .unwrap()
        .is_none());
    guard.release().await;
    // A lease that ran out, found by an extend.
    let guard = client.acquire("obs-quiet", ms(200)).await.unwrap();
    tokio::time::sleep(ms(300)).await;
    assert!(guard.extend(secs(1)).await.unwrap_err().is_lost());
    guard.release().await;
    drop(subscriber);
    let c = capture.captured();
    assert!(c.spans("acquire").is_empty(), "{}", c.text);
    let events: Vec<(Level, Option<&str>)> = c
        .events
        .iter()
        .map(|e| (e.level, e.fields.get("message")))
        .collect();
    assert_eq!(events, [(Level::WARN, Some("lease lost"))], "{}", c.text);
    assert_eq!(
        c.events[0].fields.get("reason"),
        Some(LossReason::Expired.to_string().as_str())
    );
}

/// The negative control of `every_operation_has_a_span_with_its_outcome_and_no_secret`: the same capture and checks do
/// find a lock value and a password when something traces them.
#[tokio::test]
async fn the_secret_checks_find_what_is_traced() {
    let value = "0123abcd:00112233445566778899aabbccddeeff";
    let capture = Capture::default();
    {
        let _subscriber = capture.install();
        let span = tracing::debug_span!("planted", url = tracing::field::Empty);
        span.record(
            "url",
            tracing::field::display(format!("redis://obs:{PASSWORD}@127.0.0.1:1")),
        );
        span.in_scope(|| tracing::debug!(secret = %"00112233445566778899aabbccddeeff", "planted"));
    }
    let c = capture.captured();
    assert!(leaks(&c.text, value), "{}", c.text);
    assert!(c.text.contains(PASSWORD), "{}", c.text);
    assert!(!leaks("acquire resource=obs-spans granted=3", value));
}
