//! The Sentinel failover nemesis: every lock node is a Redis Sentinel
//! group (its master, one replica, three Sentinels, all started by the rig
//! on loopback), the clients know only the Sentinels' addresses
//! (`redis+sentinel://`), and the Sentinels promote replicas that missed
//! the last writes. What `failover` does to an address that moves, this
//! does through the real thing: discovery, config epochs, demoted masters.
//!
//! A round fails over 3–4 groups, a majority, so that a lease granted on
//! all five nodes is left on a minority:
//!
//! 1. The victims' replicas are cut off from replication at once
//!    (`REPLICAOF NO ONE`: the Sentinels still list them as replicas, and
//!    would turn them back only after 8 s). The round then waits, for at
//!    least its quiet period of 50–250 ms, for a lease granted after the
//!    cut that every victim's master holds and its replica lacks, and
//!    whose holder keeps it (as `failover` waits; see there).
//! 2. Each victim, 10–60 ms after the last, by one of three kinds, the
//!    rounds taking them in turn (the fastest first, so that even a short
//!    run has a round whose promoted replicas answer while the missed
//!    lease is valid): one of its Sentinels is told `SENTINEL FAILOVER` (a
//!    forced failover: no `down-after-milliseconds`, no election) and the
//!    master is SIGKILLed the moment that Sentinel names the replica; or
//!    the same with SIGSTOP; or the master is SIGKILLed and the Sentinels
//!    left to see it down (`down-after-milliseconds` 2 s), agree and elect
//!    a leader. Killed before a forced failover, the masters would leave
//!    the lease's holders a second without a majority before any replica
//!    answers: an extending holder learns of the loss at its next
//!    extension, and the control showed nothing in a third of short runs.
//!    Taken away at the switch, they go as if they had died just after a
//!    failover finished; the few ms between the switch and the kill are
//!    Sentinel's own split window (DESIGN.md, section 3b), far inside the
//!    guard's margin.
//! 3. Once all three Sentinels of a group name the promoted replica, the
//!    old master becomes its replica: a killed one is restarted empty on
//!    its port and told `REPLICAOF`; a paused one is resumed 1.5 s later
//!    (every client's watch of the Sentinels, every 500 ms, has seen the
//!    new config epoch by then and left it) and told `REPLICAOF` at once.
//!    A fault's stop is recorded one guard window after the switch; the
//!    next round waits for the new replicas to be in sync and known to
//!    the Sentinels.
//!
//! With the guard the promoted replica counts as started at its
//! promotion (a new `run_id` for every client, which had all seen the old
//! master; and an uptime of at most the Sentinel's `role-reported-time`),
//! so it is out of every quorum for one window, longer than the lease it
//! missed. Without the guard it votes at once, its fences one or more
//! moves behind: a contender whose quorum is promoted replicas is granted
//! while the missed lease is valid, with a token at or below its own.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use rand::RngExt;

use super::failover::{cut_off, queue_homes, replica_in_sync, still_held, wait_missed};
use super::{connect, Faults};
use crate::sentinel::MASTER_NAME;

/// A missed lease held this long without an extension is one its holder
/// lets run out (a quick holder releases within tens of ms): with a 2 s
/// TTL it is still valid for about 1.8 s, past the promotions.
const HELD: Duration = Duration::from_millis(200);
/// How long the round may wait for a lease the replicas missed: at most
/// what a run has left, and more than a TTL. The holders that keep a
/// lease to its end took theirs when the run began, together; a round
/// whose cut came after that waits for them to end and the next to begin.
const MISSED_WAIT: Duration = Duration::from_secs(3);
/// Between rounds: the least time from the cut to the first failover.
const QUIET: (u64, u64) = (50, 250);
/// Between two groups' failovers in a round.
const GAP: (u64, u64) = (10, 60);
/// The longest wait for every Sentinel of a group to name the promoted
/// replica; the group is then given back its old master (see the notes).
const SWITCH_WAIT: Duration = Duration::from_secs(12);
/// A group left to its Sentinels that has not failed over after this long
/// is forced (`SENTINEL FAILOVER`): an election can fail and the next
/// waits twice the failover timeout.
const DETECT_FORCE_AFTER: Duration = Duration::from_secs(8);
/// A paused master is resumed this long after every Sentinel named its
/// successor: two of the clients' watch intervals (500 ms) and a margin.
const RESUME_AFTER: Duration = Duration::from_millis(1500);
/// How long the next round waits for a group's new replica.
const READY_WAIT: Duration = Duration::from_secs(5);
/// How often the schedule looks at the Sentinels while it waits.
const POLL: Duration = Duration::from_millis(10);

/// How a round takes the masters away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `SENTINEL FAILOVER`; SIGKILL once the replica is promoted.
    Kill,
    /// `SENTINEL FAILOVER`; SIGSTOP once the replica is promoted, resumed
    /// later.
    Pause,
    /// SIGKILL; the Sentinels see it down and fail over by themselves.
    Detect,
}

/// In turn, from the first round of every run.
const KINDS: [Kind; 3] = [Kind::Kill, Kind::Pause, Kind::Detect];

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Kill => "SENTINEL FAILOVER, SIGKILL at the switch",
            Kind::Pause => "SENTINEL FAILOVER, SIGSTOP at the switch",
            Kind::Detect => "SIGKILL, the Sentinels decide",
        }
    }

    /// How long the switch usually takes on loopback: a forced failover
    /// about a second (measured 1.0–1.2 s to the last Sentinel), one
    /// decided by the Sentinels `down-after-milliseconds`, the agreement
    /// and the election on top.
    fn expected(self) -> Duration {
        match self {
            Kind::Kill | Kind::Pause => Duration::from_millis(1200),
            Kind::Detect => Duration::from_secs(5),
        }
    }
}

/// One group's failover in a round.
struct Group {
    node: usize,
    started: Instant,
    /// The Sentinel that took `SENTINEL FAILOVER`, if one did.
    by: Option<usize>,
    /// Whether the old master was killed or paused.
    taken: bool,
    switched: Option<Instant>,
    /// A paused old master still to resume.
    paused: bool,
}

pub(super) fn run(f: &mut Faults<'_>) -> Result<(), String> {
    let window = f.window;
    let (mut rounds, mut without_missed, mut missed_gone) = (0usize, 0, 0);
    let mut switch_ms: Vec<u128> = Vec::new();
    loop {
        // Every draw of the round first, in a fixed order: the seed fixes
        // the schedule whatever the timing.
        let kind = KINDS[rounds % KINDS.len()];
        let quiet = f.ms(QUIET);
        let room = kind.expected() + window + Duration::from_millis(100);
        if crate::interrupted() || f.left() <= quiet + room + HELD {
            break;
        }
        let k = f.rng.random_range(3..=4);
        let mut order: Vec<usize> = (0..f.nodes.nodes.len()).collect();
        order.shuffle(&mut f.rng);
        let gaps: Vec<Duration> = (0..k).map(|_| f.ms(GAP)).collect();

        // The homes of the fair queues first: a waiter asks its home
        // whether the lock is free, and a promoted home says it is.
        let homes = queue_homes(f);
        order.sort_by_key(|v| !homes.contains(v));
        let victims: Vec<usize> = order
            .into_iter()
            .filter(|&v| group_ready(f, v))
            .take(k)
            .collect();
        if victims.len() < k {
            f.notes.push(format!(
                "a round skipped: {} groups ready, {k} needed",
                victims.len()
            ));
            f.sleep(quiet);
            continue;
        }

        for &v in &victims {
            cut_off(f, v);
        }
        let cut = Instant::now();
        let wait = MISSED_WAIT.max(quiet).min(f.left().saturating_sub(room));
        let missed = wait_missed(f, &victims, quiet, wait, HELD);
        if missed.is_empty() {
            without_missed += 1;
        }

        if !missed.is_empty() && !still_held(f, &victims, &missed) {
            missed_gone += 1;
        }
        let mut groups: Vec<Group> = Vec::new();
        for (i, &v) in victims.iter().enumerate() {
            if i > 0 && !f.sleep(gaps[i]) {
                return Ok(());
            }
            let detail = format!(
                "node {v}: {}, its replica cut off {} ms before{}",
                kind.label(),
                cut.elapsed().as_millis(),
                if homes.contains(&v) {
                    " (queue home)"
                } else {
                    ""
                }
            );
            let mut g = Group {
                node: v,
                started: Instant::now(),
                by: None,
                taken: false,
                switched: None,
                paused: kind == Kind::Pause,
            };
            if kind == Kind::Detect {
                f.nodes.node(v).kill();
                g.taken = true;
            } else {
                g.by = force(f, v);
            }
            f.start("sentinel-failover", detail);
            groups.push(g);
        }

        // Each group as its failover goes on: the old master is taken
        // away the moment the Sentinel that runs a forced failover names
        // the replica; once every Sentinel names it, the promoted replica
        // is the node's server and a killed old master its replica.
        let until = Instant::now() + SWITCH_WAIT;
        while groups.iter().any(|g| g.switched.is_none())
            && Instant::now() < until
            && !crate::interrupted()
        {
            for g in groups.iter_mut().filter(|g| g.switched.is_none()) {
                let v = g.node;
                let promoted = f.replicas[v].port();
                if !g.taken {
                    let named = g.by.and_then(|s| named_master(f.sentinels[v][s].port()));
                    if named == Some(promoted) {
                        if g.paused {
                            f.nodes.node(v).pause();
                        } else {
                            f.nodes.node(v).kill();
                        }
                        g.taken = true;
                    }
                } else if switched_everywhere(f, v) {
                    g.switched = Some(Instant::now());
                    switch_ms.push(g.started.elapsed().as_millis());
                    std::mem::swap(&mut f.nodes.nodes[v], &mut f.replicas[v]);
                    if !g.paused {
                        f.replicas[v].restart();
                        follow(f, v);
                    }
                } else if g.by.is_none() && g.started.elapsed() > DETECT_FORCE_AFTER {
                    f.notes.push(format!(
                        "node {v}: no failover by the Sentinels after {DETECT_FORCE_AFTER:?}: forced"
                    ));
                    g.by = force(f, v);
                }
            }
            std::thread::sleep(POLL);
        }

        // Resumes and stops, in time order.
        let mut plan: Vec<(Instant, usize, bool)> = Vec::new();
        for (i, g) in groups.iter().enumerate() {
            match g.switched {
                Some(at) => {
                    if g.paused {
                        plan.push((at + RESUME_AFTER, i, false));
                    }
                    plan.push((at + window, i, true));
                }
                None => {
                    // No failover: the group gets its old master back
                    // (empty if it was killed, which the guard sees as a
                    // restart) and the cut replica follows it again.
                    let v = g.node;
                    f.notes.push(format!(
                        "node {v}: the Sentinels did not all name the replica within {SWITCH_WAIT:?}"
                    ));
                    if g.paused {
                        f.nodes.node(v).resume();
                    } else if g.taken {
                        f.nodes.node(v).restart();
                    }
                    follow(f, v);
                    plan.push((Instant::now(), i, true));
                }
            }
        }
        plan.sort_by_key(|&(at, _, _)| at);
        for (at, i, stop) in plan {
            f.sleep(at.saturating_duration_since(Instant::now()));
            let v = groups[i].node;
            if stop {
                let detail = match groups[i].switched {
                    Some(at) => format!(
                        "node {v}: promoted {} ms after the fault, window over",
                        at.duration_since(groups[i].started).as_millis()
                    ),
                    None => format!("node {v}: no failover, the old master back"),
                };
                f.stop("sentinel-failover", detail);
            } else {
                // The old master, demoted, becomes the new one's replica.
                f.replicas[v].resume();
                follow(f, v);
            }
        }
        rounds += 1;
        for &v in &victims {
            let until = Instant::now() + READY_WAIT;
            while !group_ready(f, v) && Instant::now() < until && !crate::interrupted() {
                std::thread::sleep(POLL);
            }
        }
    }
    let kinds: Vec<&str> = (0..rounds)
        .map(|r| KINDS[r % KINDS.len()].label())
        .collect();
    f.notes.push(format!(
        "{rounds} rounds ({}); every Sentinel named the promoted replica {} after the fault",
        kinds.join("; "),
        match (switch_ms.iter().min(), switch_ms.iter().max()) {
            (Some(lo), Some(hi)) => format!("{lo}-{hi} ms"),
            _ => String::from("never"),
        }
    ));
    if without_missed > 0 {
        f.notes.push(format!(
            "{without_missed} round(s) found no lease missed by every cut-off replica in time"
        ));
    }
    if missed_gone > 0 {
        f.notes.push(format!(
            "{missed_gone} round(s): the missed lease had ended before the first failover"
        ));
    }
    Ok(())
}

/// `SENTINEL FAILOVER` to the group's Sentinels in turn until one takes
/// it (a forced failover: no agreement, no election); which one did.
/// `None`, with a note, when none did.
fn force(f: &mut Faults<'_>, v: usize) -> Option<usize> {
    let mut errors = Vec::new();
    for (i, s) in f.sentinels[v].iter().enumerate() {
        let reply = connect(s.port()).and_then(|mut c| {
            redis::cmd("SENTINEL")
                .arg("FAILOVER")
                .arg(MASTER_NAME)
                .query::<()>(&mut c)
        });
        match reply {
            Ok(()) => return Some(i),
            Err(e) => errors.push(e.to_string()),
        }
    }
    f.notes.push(format!(
        "node {v}: SENTINEL FAILOVER refused by every Sentinel: {}",
        errors.join("; ")
    ));
    None
}

/// The port the Sentinel at `port` names as the group's master.
fn named_master(port: u16) -> Option<u16> {
    let mut c = connect(port).ok()?;
    let addr: Vec<String> = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(MASTER_NAME)
        .query(&mut c)
        .ok()?;
    addr.get(1)?.parse().ok()
}

/// Every Sentinel of node `v`'s group names its replica (the one the
/// round promotes) as the master.
fn switched_everywhere(f: &Faults<'_>, v: usize) -> bool {
    let promoted = f.replicas[v].port();
    f.sentinels[v]
        .iter()
        .all(|s| named_master(s.port()) == Some(promoted))
}

/// The server in `f.replicas[v]` replicates from node `v`'s master.
fn follow(f: &mut Faults<'_>, v: usize) {
    let (replica, master) = (f.replicas[v].port(), f.port(v));
    let done = connect(replica).and_then(|mut c| {
        redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(master)
            .query::<()>(&mut c)
    });
    if let Err(e) = done {
        f.notes
            .push(format!("node {v}: REPLICAOF on the old master failed: {e}"));
    }
}

/// Node `v`'s group can fail over: its replica is in sync, and every
/// Sentinel names the node's master and knows the replica, reachable.
/// A failover the Sentinels made by themselves (a master slow to answer
/// on a loaded machine) is taken as it is: the servers swap places.
fn group_ready(f: &mut Faults<'_>, v: usize) -> bool {
    let named: Vec<Option<u16>> = f.sentinels[v]
        .iter()
        .map(|s| named_master(s.port()))
        .collect();
    if named.iter().all(|&p| p == Some(f.replicas[v].port())) {
        f.notes.push(format!(
            "node {v}: the Sentinels failed over on their own; following them"
        ));
        std::mem::swap(&mut f.nodes.nodes[v], &mut f.replicas[v]);
    }
    let (master, replica) = (f.port(v), f.replicas[v].port());
    replica_in_sync(replica)
        && f.sentinels[v]
            .iter()
            .all(|s| named_master(s.port()) == Some(master) && knows_replica(s.port(), replica))
}

/// The Sentinel at `port` lists the replica on `replica` as a reachable
/// replica (flags exactly `slave`: not down, not disconnected).
fn knows_replica(port: u16, replica: u16) -> bool {
    let Ok(mut c) = connect(port) else {
        return false;
    };
    let replicas: Vec<HashMap<String, String>> = match redis::cmd("SENTINEL")
        .arg("REPLICAS")
        .arg(MASTER_NAME)
        .query(&mut c)
    {
        Ok(r) => r,
        Err(_) => return false,
    };
    let port = replica.to_string();
    replicas.iter().any(|r| {
        r.get("port") == Some(&port) && r.get("flags").map(String::as_str) == Some("slave")
    })
}
