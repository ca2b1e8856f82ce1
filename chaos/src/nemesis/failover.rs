//! The failover nemesis: a lock node's address moves to a promoted replica
//! that missed the latest writes, as a managed Redis endpoint's DNS name
//! or a Sentinel-managed VIP does when the master dies. The node's
//! `FaultProxy` is the address; every lock node has a replica
//! (`--replicaof`), started by the rig.
//!
//! A round is two faults, 10–60 ms apart, on disjoint victims (1–2 nodes
//! each, 3–4 in all):
//!
//! 1. The replicas of both faults' victims are cut off from replication
//!    at once (`REPLICAOF NO ONE`). The round then waits, for at least its
//!    quiet period of 50–250 ms, until every victim master holds a lease
//!    granted after the cut whose holder is seen to keep it: just
//!    extended (its key's time to live rose), or held [`HELD`] without an
//!    extension. That lease, and the fence moves that went with it, are
//!    the writes the replicas miss, as asynchronous replication misses the
//!    last writes before a crash.
//! 2. Each fault SIGKILLs its masters, repoints their proxies to the
//!    replicas, and drops every client connection (`CLIENT KILL TYPE
//!    normal` on the new master, then the proxy's `Reset`).
//! 3. Inside the restart guard's window, 3–5 more times, every connection
//!    to both faults' nodes is dropped again: the guard used to forget a
//!    server's quarantine on a reconnect, and let it vote on the second
//!    connection, which read its real uptime (issue 31).
//! 4. Right after the second fault each victim gets a new replica of its
//!    promoted server, which syncs during the windows; a fault's stop is
//!    recorded at the end of its window, and the next round begins once
//!    the new replicas are in sync.
//!
//! Why two faults with one cut: a lease granted on all five nodes keeps a
//! majority through the loss of any two, so one fault of 1–2 nodes cannot
//! take it away; the second fault, inside the lease, leaves it on 1–2
//! nodes, as the consecutive steps of `rolling_kill` do to a lease on
//! nodes restarted empty. Both sets of replicas are cut at once so that
//! the second fault's replicas lack the lease too (cut at its own fault,
//! they would have it). Victims are not chosen by the lock keys they hold
//! when the round begins, as `rolling_kill` chooses them: every grant
//! reaches every node that answers, and the keys that matter are those
//! granted after the cut, which the round waits for on every victim. They
//! are chosen by the fair queues they hold instead: see `run`.
//!
//! Without the guard the promoted servers vote at once, with their fences
//! as the cut left them: a contender whose quorum is promoted servers
//! only is granted the lock while the missed lease is valid, with a token
//! at or below the missed lease's. With the guard each promoted server is
//! out of every quorum for one window from the first connection that
//! reached it, on every later connection, and votes in fenced requests
//! only once its fences are re-seeded.

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::thread;
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use rand::RngExt;

use super::{connect, nodes_label, replica_options, Faults};
use crate::proxy::Fault;
use crate::server::RedisServer;

/// A lease the replicas missed, held this long after it was first seen
/// and never extended, is one its holder lets run out: quick holders (a
/// release 5–30 ms after a few ms of work) are gone long before, and with
/// a 400 ms TTL it is still valid for about 200 ms.
const HELD: Duration = Duration::from_millis(150);
/// A rise of a lock key's time to live by more than this between two
/// looks is an extension (between looks it falls by about [`POLL`]).
const RISE_MS: i64 = 20;
/// How often the round looks for a missed lease.
const POLL: Duration = Duration::from_millis(10);
/// The longest wait for a missed lease; the round goes on without one
/// after it (and says so in the notes).
const MISSED_WAIT: Duration = Duration::from_secs(1);
/// How long a proxy's `Reset` may take to close every connection.
const RESET_WAIT: Duration = Duration::from_millis(100);
/// The least time a `Reset` lasts: clients that reconnect at once meet it.
const RESET_HOLD: Duration = Duration::from_millis(5);
/// How long a new replica may take to finish its full sync.
const SYNC_WAIT: Duration = Duration::from_secs(5);
/// Between the two faults of a round: well inside the missed lease, which
/// was granted at least [`HELD`] before the first.
const GAP: (u64, u64) = (10, 60);
/// Between rounds, after the new replicas are in sync: the least time from
/// the cut to the first failover.
const QUIET: (u64, u64) = (50, 250);
/// Further drops of every connection to the round's nodes. One train for
/// both faults, not one per fault: each drop also fails the attempts in
/// flight on the promoted servers, a second holder's among them, and
/// with twice the drops the control missed its violation more often
/// (in 4 of 9 rounds at seed 11, hot lock, against 2 of 16).
const DROPS: (usize, usize) = (3, 5);
/// When they come, in ms after the second failover: inside the first
/// fault's window too (the gap is at most 60 ms).
const DROP_AT: (u64, u64) = (60, 420);

/// A lock key and the value a holder set.
pub(super) type Lease = (String, Vec<u8>);

/// One of a round's two faults.
struct Failover {
    nodes: Vec<usize>,
    drops: u32,
    killed: u64,
}

/// What a round does next: a failover or a stop of fault 0 or 1 of the
/// round, or a drop of every connection to both faults' nodes.
enum Step {
    FailOver(usize),
    Drop,
    Stop(usize),
}

pub(super) fn run(f: &mut Faults<'_>) -> Result<(), String> {
    let window = crate::rig::GUARD_WINDOW;
    // What a round needs after its wait: the gap and the second fault's
    // window (the new replicas may start after `heal_by`: they are no
    // fault).
    let room = Duration::from_millis(GAP.1) + window + Duration::from_millis(50);
    let (mut rounds, mut without_missed, mut missed_gone) = (0, 0, 0);
    let (mut drops, mut killed) = (0, 0);
    loop {
        // Every draw of the round comes first, in a fixed order, so that
        // the seed fixes the schedule whatever the timing. The quiet
        // period is spent waiting for the lease the replicas miss: the cut
        // comes at its start, the first failover not before its end.
        let quiet = f.ms(QUIET);
        if crate::interrupted() || f.left() <= quiet + room + HELD {
            break;
        }
        let (ka, kb) = [(1, 2), (2, 1), (2, 2)][f.rng.random_range(0..3)];
        let mut order: Vec<usize> = (0..f.nodes.nodes.len()).collect();
        order.shuffle(&mut f.rng);
        let gap = f.ms(GAP);
        let offsets = drop_offsets(f);

        // The homes of the fair queues first, and in the second fault: the
        // first waiter of a queue looks at its home when its timer fires,
        // and a home promoted by the second fault says the lock is free
        // while the lease it missed is on a minority. Promoted by the
        // first, it says so while the lease still holds a majority: the
        // waiter's attempt is refused and it sleeps until the lease's
        // expiry.
        let homes = queue_homes(f);
        order.sort_by_key(|v| !homes.contains(v));
        let mut victims: Vec<usize> = order
            .into_iter()
            .filter(|&v| replica_in_sync(f.replicas[v].port()))
            .take(ka + kb)
            .collect();
        if victims.len() < ka + kb {
            f.notes.push(format!(
                "a round skipped: {} replicas in sync, {} needed",
                victims.len(),
                ka + kb
            ));
            f.sleep(quiet);
            continue;
        }
        let first = victims.split_off(kb);
        let mut faults = [first, victims].map(|mut nodes| {
            nodes.sort_unstable();
            Failover {
                nodes,
                drops: 0,
                killed: 0,
            }
        });
        let all: Vec<usize> = faults.iter().flat_map(|x| x.nodes.clone()).collect();

        for &v in &all {
            cut_off(f, v);
        }
        let cut = Instant::now();
        let wait = MISSED_WAIT.max(quiet).min(f.left().saturating_sub(room));
        let missed = wait_missed(f, &all, quiet, wait, HELD);
        if missed.is_empty() {
            without_missed += 1;
        }

        let mut plan = vec![(Instant::now(), Step::FailOver(0))];
        while let Some(i) = (0..plan.len()).min_by_key(|&i| plan[i].0) {
            let (due, step) = plan.remove(i);
            if !f.sleep(due.saturating_duration_since(Instant::now())) {
                return Ok(());
            }
            match step {
                Step::FailOver(k) => {
                    let nodes = faults[k].nodes.clone();
                    if k == 1 && !missed.is_empty() && !still_held(f, &nodes, &missed) {
                        missed_gone += 1;
                    }
                    let home: Vec<usize> = nodes
                        .iter()
                        .copied()
                        .filter(|v| homes.contains(v))
                        .collect();
                    let detail = format!(
                        "{} to replicas cut off {} ms before{}",
                        nodes_label(&nodes),
                        cut.elapsed().as_millis(),
                        match home.as_slice() {
                            [] => String::new(),
                            h => format!(" (queue home: {})", nodes_label(h)),
                        }
                    );
                    for &v in &nodes {
                        faults[k].killed += promote(f, v);
                    }
                    faults[k].drops += 1;
                    let at = Instant::now();
                    f.start("failover", detail);
                    plan.push((at + window, Step::Stop(k)));
                    if k == 0 {
                        plan.push((at + gap, Step::FailOver(1)));
                    } else {
                        for &d in &offsets {
                            plan.push((at + d, Step::Drop));
                        }
                        // The next round needs replicas of the promoted
                        // servers; started now, they sync during the
                        // windows.
                        for &v in &all {
                            let master = f.port(v);
                            // Drops the old master's (dead) server.
                            f.replicas[v] = RedisServer::start_with(replica_options(master));
                        }
                    }
                }
                Step::Drop => {
                    for x in &mut faults {
                        for &v in &x.nodes {
                            x.killed += drop_connections(f, v);
                        }
                        x.drops += 1;
                    }
                }
                Step::Stop(k) => {
                    let x = &faults[k];
                    let detail = format!(
                        "{}, {} drops, {} client connections killed on the new masters",
                        nodes_label(&x.nodes),
                        x.drops,
                        x.killed
                    );
                    f.stop("failover", detail);
                }
            }
        }
        rounds += 1;
        drops += faults.iter().map(|x| x.drops).sum::<u32>();
        killed += faults.iter().map(|x| x.killed).sum::<u64>();
        for &v in &all {
            if !wait_in_sync(f.replicas[v].port()) {
                f.notes.push(format!(
                    "node {v}: new replica not in sync after {SYNC_WAIT:?}"
                ));
            }
        }
    }
    f.notes.push(format!(
        "{rounds} rounds of two failovers; {drops} connection drops, \
         {killed} client connections killed on promoted servers"
    ));
    if without_missed > 0 {
        f.notes.push(format!(
            "{without_missed} round(s) found no lease missed by every cut-off replica in time"
        ));
    }
    if missed_gone > 0 {
        f.notes.push(format!(
            "{missed_gone} round(s): the missed lease had ended before the second failover"
        ));
    }
    Ok(())
}

/// When the round drops every connection again, after its second
/// failover: 3–5 times, inside both faults' windows, sorted.
fn drop_offsets(f: &mut Faults<'_>) -> Vec<Duration> {
    let n = f.rng.random_range(DROPS.0..=DROPS.1);
    let mut offsets: Vec<Duration> = (0..n).map(|_| f.ms(DROP_AT)).collect();
    offsets.sort_unstable();
    offsets
}

/// The replica keeps what it has and stops following its master.
pub(super) fn cut_off(f: &mut Faults<'_>, v: usize) {
    let port = f.replicas[v].port();
    let done = connect(port).and_then(|mut c| {
        redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query::<()>(&mut c)
    });
    if let Err(e) = done {
        f.notes.push(format!(
            "REPLICAOF NO ONE on node {v}'s replica failed: {e}"
        ));
    }
}

/// Node `v`'s master dies and its address reaches the replica; every
/// connection through it is dropped. Returns the connections `CLIENT
/// KILL` closed.
fn promote(f: &mut Faults<'_>, v: usize) -> u64 {
    f.nodes.node(v).kill();
    std::mem::swap(&mut f.nodes.nodes[v], &mut f.replicas[v]);
    let to = SocketAddr::from((Ipv4Addr::LOCALHOST, f.port(v)));
    f.proxies[v].repoint(to);
    drop_connections(f, v)
}

/// Every client connection to node `v` is dropped: by the server (`CLIENT
/// KILL TYPE normal`, which leaves the caller's own connection alone: the
/// connections made since the last drop) and by the proxy (a load
/// balancer's reset, which also refuses new connections for a moment).
/// Returns the connections the server closed.
fn drop_connections(f: &mut Faults<'_>, v: usize) -> u64 {
    let killed = connect(f.port(v)).and_then(|mut c| {
        redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .query::<u64>(&mut c)
    });
    let proxy = &f.proxies[v];
    proxy.set(Fault::Reset);
    let (since, until) = (Instant::now(), Instant::now() + RESET_WAIT);
    while (proxy.open_connections() > 0 || since.elapsed() < RESET_HOLD) && Instant::now() < until {
        thread::sleep(Duration::from_millis(1));
    }
    proxy.set(Fault::Pass);
    match killed {
        Ok(n) => n,
        Err(e) => {
            f.notes
                .push(format!("CLIENT KILL on node {v}'s new master failed: {e}"));
            0
        }
    }
}

/// Every lock key on the server at `port`: its value and its time to
/// live in ms.
fn lock_values(port: u16) -> redis::RedisResult<HashMap<String, (Vec<u8>, i64)>> {
    let keys = super::lock_keys(port)?;
    if keys.is_empty() {
        return Ok(HashMap::new());
    }
    let mut c = connect(port)?;
    let mut pipe = redis::pipe();
    pipe.cmd("MGET").arg(&keys);
    for key in &keys {
        pipe.cmd("PTTL").arg(key);
    }
    let (values, ttls): (Vec<Option<Vec<u8>>>, Vec<i64>) = {
        let mut replies: Vec<redis::Value> = pipe.query(&mut c)?;
        let ttls = replies
            .split_off(1)
            .into_iter()
            .map(|v| redis::from_redis_value(v).unwrap_or(-2))
            .collect();
        let values = replies
            .pop()
            .map_or(Ok(Vec::new()), redis::from_redis_value)?;
        (values, ttls)
    };
    Ok(keys
        .into_iter()
        .zip(values.into_iter().zip(ttls))
        .filter_map(|(k, (v, ttl))| Some((k, (v?, ttl))))
        .collect())
}

/// Nodes holding a fair queue (`{prefix}queue:*`): the homes of the
/// resources with waiters.
pub(super) fn queue_homes(f: &Faults<'_>) -> Vec<usize> {
    let pattern = format!("{}queue:*", redfence::limits::DEFAULT_PREFIX);
    (0..f.nodes.nodes.len())
        .filter(|&v| {
            connect(f.port(v))
                .and_then(|mut c| {
                    redis::cmd("KEYS")
                        .arg(&pattern)
                        .query::<Vec<String>>(&mut c)
                })
                .is_ok_and(|keys| !keys.is_empty())
        })
        .collect()
}

/// Leases every victim's master holds and its replica lacks (the key
/// absent there, or another holder's value), with their time to live on
/// the first victim's master.
fn missed_by_all(f: &Faults<'_>, victims: &[usize]) -> BTreeMap<Lease, i64> {
    let mut common: Option<BTreeMap<Lease, i64>> = None;
    for &v in victims {
        let (Ok(master), Ok(replica)) = (lock_values(f.port(v)), lock_values(f.replicas[v].port()))
        else {
            return BTreeMap::new();
        };
        let missed: BTreeMap<Lease, i64> = master
            .into_iter()
            .filter(|(k, (value, _))| replica.get(k).is_none_or(|(r, _)| r != value))
            .map(|(k, (value, ttl))| ((k, value), ttl))
            .collect();
        common = Some(match common {
            None => missed,
            Some(c) => c
                .into_iter()
                .filter(|(lease, _)| missed.contains_key(lease))
                .collect(),
        });
    }
    common.unwrap_or_default()
}

/// A missed lease as the round watched it.
struct Watched {
    first_seen: Instant,
    ttl_ms: i64,
}

/// Waits up to `wait` for leases missed by every victim's replica whose
/// holder is seen to keep them: one just extended (its key's time to live
/// rose), or one held `held` ([`HELD`] in this nemesis) without an extension (a holder that lets it
/// run out). Either is valid well after the round's second fault, and an
/// extending holder learns of the loss only at its next extension, a
/// third of its validity later. Returns them, not before `quiet` has
/// passed; none when `wait` ran out.
pub(super) fn wait_missed(
    f: &Faults<'_>,
    victims: &[usize],
    quiet: Duration,
    wait: Duration,
    held: Duration,
) -> Vec<Lease> {
    let (quiet_until, until) = (Instant::now() + quiet, Instant::now() + wait);
    let mut watched: HashMap<Lease, Watched> = HashMap::new();
    loop {
        let now = Instant::now();
        let missed = missed_by_all(f, victims);
        watched.retain(|lease, _| missed.contains_key(lease));
        let mut kept = Vec::new();
        for (lease, ttl_ms) in missed {
            match watched.get_mut(&lease) {
                Some(w) => {
                    let extended = ttl_ms > w.ttl_ms + RISE_MS;
                    if extended || now.duration_since(w.first_seen) >= held {
                        kept.push(lease);
                    } else {
                        w.ttl_ms = ttl_ms;
                    }
                }
                None => {
                    watched.insert(
                        lease,
                        Watched {
                            first_seen: now,
                            ttl_ms,
                        },
                    );
                }
            }
        }
        if !kept.is_empty() && now >= quiet_until {
            return kept;
        }
        if now >= until || crate::interrupted() {
            return Vec::new();
        }
        thread::sleep(POLL);
    }
}

/// Whether one of `missed` is still held on every one of `nodes`.
pub(super) fn still_held(f: &Faults<'_>, nodes: &[usize], missed: &[Lease]) -> bool {
    let values: Vec<_> = nodes.iter().map(|&v| lock_values(f.port(v))).collect();
    missed.iter().any(|(key, value)| {
        values.iter().all(|m| {
            m.as_ref()
                .is_ok_and(|m| m.get(key).is_some_and(|(v, _)| v == value))
        })
    })
}

fn info_replication(port: u16) -> Option<String> {
    let mut c = connect(port).ok()?;
    redis::cmd("INFO").arg("replication").query(&mut c).ok()
}

/// The replica at `port` finished its full sync and follows its master.
pub(super) fn replica_in_sync(port: u16) -> bool {
    info_replication(port).is_some_and(|info| {
        info.lines().any(|l| l.trim() == "master_link_status:up")
            && info.lines().any(|l| l.trim() == "role:slave")
    })
}

fn wait_in_sync(port: u16) -> bool {
    let until = Instant::now() + SYNC_WAIT;
    while Instant::now() < until && !crate::interrupted() {
        if replica_in_sync(port) {
            return true;
        }
        thread::sleep(Duration::from_millis(20));
    }
    false
}
