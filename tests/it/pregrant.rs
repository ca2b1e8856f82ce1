//! The fair queue's pre-grant (DESIGN.md, section 2, step 3): the home
//! node's release sets the lock key there for the waiter it names, with
//! the fence's move, and the named waiter counts the home's vote without
//! asking it. Counted here in scripts run per node, tokens, and how soon
//! the lock reaches the waiter; and the cases where the vote is not
//! counted unasked (a subscription younger than the restart guard's
//! window) or where nobody will use it (an orphaned ticket). Also the
//! handover (step 4): a contended holder's release leaves its keys on the
//! other nodes to the named waiter, whose acquire replaces them.

use std::time::Duration;

use crate::fair::{
    client, homed_at, queue_key, queued, release_and_wait, release_and_wait_reporting,
    spawn_notice_waiter, spawn_notice_waiter_with,
};
use crate::helpers::{calls, eventually, fence_key, lock_key, ms, secs, warm_up};
use crate::support::Cluster;
use redfence::Client;

/// Scripts (`EVALSHA`) and transactions (`EXEC`: a fenced first attempt,
/// `wire::transacted`) each node of `cluster` has run.
fn scripts(cluster: &Cluster) -> Vec<u64> {
    cluster
        .nodes
        .iter()
        .map(|n| calls(n, "evalsha") + calls(n, "exec"))
        .collect()
}

/// The script counts once no node has run one for 100 ms (at most 5 s):
/// the previous round's background work (a release's stragglers, a failed
/// attempt's cleanup) must not land in the next round's count, as it did
/// once with six test threads and a busy core ([1, 2, 3]).
async fn scripts_at_rest(cluster: &Cluster) -> Vec<u64> {
    let mut last = scripts(cluster);
    for _ in 0..50 {
        tokio::time::sleep(ms(100)).await;
        let now = scripts(cluster);
        if now == last {
            break;
        }
        last = now;
    }
    last
}

/// Every fence's value before a handoff: a seeded one (at least 2^40, or
/// the acquire would seed it from the clock).
const BASE: u64 = (1 << 41) + 1000;

/// What one handoff from a holder to a named waiter cost and gave.
struct Handoff {
    /// Scripts each node ran from the release to the waiter's grant.
    scripts: Vec<u64>,
    /// Scripts the holder's release runs on the home: 2 in the first round
    /// (its client knows of no waiter, so the lean release goes first,
    /// finds the waiting marker and asks for the full one), 1 after (the
    /// last release named a waiter: the client knows the lock is
    /// contended and sends the full release at once).
    home_release: u64,
    holder_token: u64,
    waiter_token: u64,
    /// The home's fence once the waiter holds the lock.
    home_fence: u64,
    /// The lock key's value on each node while the waiter holds it.
    values: Vec<String>,
    after: Duration,
}

/// Holder (one client, without the handover) and a queued waiter
/// (another), on `n` nodes with
/// every fence at [`BASE`] first (no write-back then: every node's fence moves
/// in step), the resource homed on node 0; the waiter's retry policy
/// sleeps 10 s, so only a notice gets it the lock sooner. A round whose
/// named attempt was refused by a node the holder's release had not
/// reached yet (a loaded machine; the quick retries of `fair.rs` then add
/// attempts and scripts) says nothing about the pre-grant and is run
/// again, up to 5 rounds.
async fn handoff(n: usize) -> Handoff {
    let cluster = Cluster::start(n);
    let resource = homed_at("pregrant", 0, n);
    // The pre-grant alone: from the second round on, the holder's client
    // knows the lock is contended and would hand it over (fewer scripts,
    // `a_contended_release_hands_the_other_nodes_over_to_the_named_waiter`).
    let a = crate::helpers::builder(cluster.urls())
        .node_timeout(secs(1))
        .handover(false)
        .build()
        .unwrap();
    let b = client(&cluster, true);
    warm_up(&a, &cluster).await;
    warm_up(&b, &cluster).await;
    for round in 0..5 {
        for node in &cluster.nodes {
            node.cli(&["SET", &fence_key(&resource), &BASE.to_string()]);
        }
        let holder = a.acquire(&resource, secs(30)).await.unwrap();
        let holder_token = holder.token().unwrap().get();
        // From the second round on the holder's own ticket may be in the
        // queue (its client joined: its last release named a waiter);
        // counted once the last round's releases have all landed.
        scripts_at_rest(&cluster).await;
        let ahead = queued(&cluster, &resource);
        let waiter = spawn_notice_waiter(b.clone(), resource.clone());
        assert!(
            eventually(secs(10), || queued(&cluster, &resource) == ahead + 1).await,
            "the waiter queued"
        );
        let (before, attempts) = (scripts_at_rest(&cluster).await, b.stats().attempts);
        let (got, after) = release_and_wait(holder, waiter, secs(30)).await;
        let guard = got.expect("the waiter gets the lock");
        let scripts = scripts(&cluster)
            .iter()
            .zip(&before)
            .map(|(after, before)| after - before)
            .collect();
        let key = lock_key(&resource);
        let handoff = Handoff {
            scripts,
            home_release: if round == 0 { 2 } else { 1 },
            holder_token,
            waiter_token: guard.token().unwrap().get(),
            home_fence: cluster.nodes[0]
                .cli(&["GET", &fence_key(&resource)])
                .trim()
                .parse()
                .unwrap_or(0),
            values: cluster
                .nodes
                .iter()
                .map(|n| n.cli(&["GET", &key]).trim().to_owned())
                .collect(),
            after,
        };
        guard.release().await;
        // Another node than the home running more than the release and the
        // acquire is background work landing late (seen once in five runs
        // with a busy core: [1, 2, 3]): that round says nothing either. A
        // regression that costs scripts every time still fails, after 5.
        let others_clean = handoff.scripts.iter().skip(1).all(|&n| n == 2);
        if b.stats().attempts - attempts == 1 && others_clean {
            return handoff;
        }
        println!(
            "a named attempt raced the holder's release, or late work landed ({:?}): again",
            handoff.scripts
        );
    }
    panic!("5 rounds in which the named attempt raced the holder's release or late work landed");
}

/// On 3 nodes the named waiter asks only the two others: the home runs
/// the holder's release and nothing else (it would also run the waiter's
/// acquire without the pre-grant), the others run the release and the
/// acquire. The waiter's token is the home's fence after the release's
/// move, one above the holder's, and the home and a majority hold the waiter's one value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_pregrants_the_home_vote_to_the_named_waiter() {
    let h = handoff(3).await;
    println!(
        "3 nodes, one handoff: scripts per node {:?} (home first), tokens {} then {}, home fence {}, got the lock {:?} after the release",
        h.scripts, h.holder_token, h.waiter_token, h.home_fence, h.after
    );
    assert_eq!(
        h.scripts,
        vec![h.home_release, 2, 2],
        "the home ran {} scripts (the release only, with the pre-grant: {} expected), the others {:?}",
        h.scripts[0],
        h.home_release,
        &h.scripts[1..]
    );
    // The waiter's first, refused attempt moved every fence once more.
    assert_eq!(h.holder_token, BASE + 1);
    assert_eq!(
        h.waiter_token,
        BASE + 3,
        "the token is the home's pre-granted fence"
    );
    assert_eq!(h.home_fence, BASE + 3);
    // The home and a majority hold the waiter's one value. The third node
    // may hold nothing: on a loaded machine the waiter's acquire can reach
    // it before the holder's release does, be refused there, and the lock
    // is granted by the other two (seen with four test threads on 2 cores).
    let (home, rest) = (&h.values[0], &h.values[1..]);
    let free = |v: &String| v.is_empty() || v == "(nil)";
    assert!(
        !free(home),
        "the home holds the waiter's value: {:?}",
        h.values
    );
    assert!(
        rest.iter().all(|v| v == home || free(v)) && rest.iter().any(|v| v == home),
        "one value on a majority, nothing else anywhere: {:?}",
        h.values
    );
    assert!(h.after < secs(5), "woken {:?} after the release", h.after);
}

/// With one node the pre-grant is the whole grant: the waiter sends no
/// acquire at all, and the node runs the holder's release alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_one_node_the_named_waiter_sends_no_acquire() {
    let h = handoff(1).await;
    println!(
        "1 node, one handoff: scripts {:?}, tokens {} then {}, got the lock {:?} after the release",
        h.scripts, h.holder_token, h.waiter_token, h.after
    );
    assert_eq!(
        h.scripts,
        vec![h.home_release],
        "the node ran {:?} scripts (the release only: {} expected)",
        h.scripts,
        h.home_release
    );
    assert_eq!((h.holder_token, h.waiter_token), (BASE + 1, BASE + 3));
    assert!(h.after < secs(5), "woken {:?} after the release", h.after);
}

/// A holder (one client) and a waiter of another client queued behind it
/// on 3 nodes, the resource homed on node 0.
struct Queued {
    cluster: Cluster,
    resource: String,
    holder: redfence::LockGuard,
    waiter: crate::fair::Waiting,
    /// The waiter's ticket, read from the home's queue.
    ticket: String,
    /// The waiter's client.
    waiting: Client,
}

async fn queued_waiter(prefix: &str) -> Queued {
    let cluster = Cluster::start(3);
    let resource = homed_at(prefix, 0, 3);
    let (a, b) = (client(&cluster, true), client(&cluster, true));
    warm_up(&a, &cluster).await;
    warm_up(&b, &cluster).await;
    let holder = a.acquire(&resource, secs(30)).await.unwrap();
    let waiter = spawn_notice_waiter(b.clone(), resource.clone());
    assert!(eventually(secs(10), || queued(&cluster, &resource) == 1).await);
    let ticket = cluster.nodes[0].cli(&["LINDEX", &queue_key(&resource), "0"]);
    let ticket = ticket.trim().to_owned();
    Queued {
        cluster,
        resource,
        holder,
        waiter,
        ticket,
        waiting: b,
    }
}

/// A ticket `client` issued whose waiter left the queue on `resource`
/// (queued behind the waiters already there, then cancelled: its leave
/// took the ticket out). Put back at the head, it stands for a naming
/// that raced with the leave: the release names a ticket of `client`
/// that no waiter of it holds.
async fn a_ticket_that_left(cluster: &Cluster, client: &Client, resource: &str) -> String {
    let queue = queue_key(resource);
    let before = queued(cluster, resource);
    let leaver = spawn_notice_waiter(client.clone(), resource.to_owned());
    assert!(eventually(secs(10), || queued(cluster, resource) == before + 1).await);
    let ticket = cluster.nodes[0]
        .cli(&["LINDEX", &queue, "-1"])
        .trim()
        .to_owned();
    // The join's answer back at the waiter before it is cut off: cut while
    // its join is in flight, it has no ticket to take out yet, and the
    // ticket stays queued (to be skipped or named as an orphan later).
    tokio::time::sleep(ms(200)).await;
    leaver.abort();
    if !eventually(secs(10), || queued(cluster, resource) == before).await {
        cluster.nodes[0].cli(&["LREM", &queue, "0", &ticket]);
    }
    cluster.nodes[0].cli(&["LPUSH", &queue, &ticket]);
    ticket
}

/// A ticket of a live client that no waiter of it holds (a waiter that
/// left, its ticket put back at the head, ahead of the client's real
/// waiter): the release pre-grants it the home's vote, the client hears
/// the naming, finds no waiter for it and releases the vote at once, which
/// names its real waiter. Without that release the ticket's key would
/// hold the home for its TTL (30 s), and the real waiter would wait for
/// its 10 s timer. A ticket the client never issued (another client with
/// the same tag) is not its to release:
/// `a_pregrant_to_a_ticket_never_issued_is_left_alone`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pregrant_nobody_will_use_is_released_at_once() {
    let Queued {
        cluster,
        resource,
        holder,
        waiter,
        ticket: _,
        waiting,
    } = queued_waiter("orphan").await;
    let home = &cluster.nodes[0];
    let planted = a_ticket_that_left(&cluster, &waiting, &resource).await;
    let (got, after) = release_and_wait(holder, waiter, secs(30)).await;
    println!("a pre-grant to a ticket nobody holds: the real waiter got the lock {after:?} after the release");
    let guard = got.expect("the real waiter gets the lock");
    assert!(
        after < secs(5),
        "the real waiter got the lock {after:?} after the release"
    );
    assert!(
        !home
            .cli(&["LRANGE", &queue_key(&resource), "0", "-1"])
            .contains(&planted),
        "the planted ticket left the queue"
    );
    guard.release().await;
}

/// With the restart guard on, a notice that came over a subscription
/// connection younger than the guard's window does not count the home's
/// vote unasked (that server may have restarted a moment before, without a
/// key it granted earlier): the waiter asks the home too, which says yes
/// again for the pre-granted value. Node 2 is down, so the waiter needs
/// the home's yes: a home that refused its own pre-grant would leave it
/// waiting for its 10 s timer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_young_subscription_asks_the_home_for_its_pregranted_vote() {
    let mut cluster = Cluster::start(3);
    let resource = homed_at("young", 0, 3);
    let guarded = |cluster: &Cluster| {
        crate::helpers::builder(cluster.urls())
            .restart_guard(redfence::RestartGuard::new())
            .node_timeout(secs(1))
            .build()
            .unwrap()
    };
    let (a, b) = (guarded(&cluster), guarded(&cluster));
    // The guard keeps a server out for the longest TTL the client asked
    // for (2 s here) after its start, as far as the client can tell
    // (`INFO`'s uptime is in whole seconds).
    tokio::time::sleep(secs(4)).await;
    warm_up(&a, &cluster).await;
    warm_up(&b, &cluster).await;
    cluster.nodes[2].kill();
    let holder = a.acquire(&resource, secs(2)).await.unwrap();
    let waiter = spawn_notice_waiter_with(b.clone(), resource.clone(), secs(2));
    let home_queue = || cluster.nodes[0].cli(&["LLEN", &queue_key(&resource)]);
    assert!(eventually(secs(10), || home_queue().trim() == "1").await);
    // Past the subscription's confirmation, well within the window.
    tokio::time::sleep(ms(200)).await;
    let before = calls(&cluster.nodes[0], "evalsha");
    let (got, after) = release_and_wait(holder, waiter, secs(30)).await;
    let home_scripts = calls(&cluster.nodes[0], "evalsha") - before;
    println!("a subscription younger than the guard: the home ran {home_scripts} scripts, the waiter got the lock {after:?} after the release");
    let guard = got.expect("the waiter gets the lock");
    assert!(
        home_scripts >= 2,
        "the home ran {home_scripts} scripts: the release, and the waiter's acquire"
    );
    assert!(
        after < secs(5),
        "the waiter got the lock {after:?} after the release"
    );
    guard.release().await;
}

/// A ticket of the releasing client itself (two tasks of one process
/// taking turns) is named in the release script's reply, with its
/// pre-granted fence, and not published: the home sends no notice, and
/// the waiter still gets the lock at once (its timer is 10 s away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_releasing_clients_own_ticket_is_named_in_the_reply() {
    let cluster = Cluster::start(3);
    let resource = homed_at("own", 0, 3);
    let a = client(&cluster, true);
    warm_up(&a, &cluster).await;
    let holder = a.acquire(&resource, secs(30)).await.unwrap();
    let holder_token = holder.token().unwrap().get();
    let waiter = spawn_notice_waiter(a.clone(), resource.clone());
    assert!(eventually(secs(10), || queued(&cluster, &resource) == 1).await);
    let before = calls(&cluster.nodes[0], "publish");
    let (got, after) = release_and_wait(holder, waiter, secs(30)).await;
    let published = calls(&cluster.nodes[0], "publish") - before;
    let guard = got.expect("the waiter gets the lock");
    let token = guard.token().unwrap().get();
    println!("the client's own ticket: {published} notices published, the lock {after:?} after the release, tokens {holder_token} then {token}");
    assert_eq!(published, 0, "the home published {published} notices");
    assert!(
        after < secs(5),
        "the waiter got the lock {after:?} after the release"
    );
    assert!(token > holder_token);
    guard.release().await;
}

/// A queued waiter that is cancelled takes a key pre-granted to its ticket
/// with it: the leave script deletes it with the ticket (the release may
/// have named the waiter just before it left, or while its notice was on
/// the way; its client may be shutting down). Planted here: a pre-granted
/// value for the waiter's ticket, then the waiter's task aborted. Without
/// the leave script the key would stay for its 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiter_takes_its_pregranted_key_with_it() {
    let Queued {
        cluster,
        resource,
        holder,
        waiter,
        ticket,
        waiting: _,
    } = queued_waiter("leave").await;
    let home = &cluster.nodes[0];
    // The holder's key on the home replaced by a pre-grant to the waiter.
    let key = lock_key(&resource);
    let (tag, rest) = ticket.split_once('.').expect("a tag and the rest");
    let planted = format!("{tag}:{rest}:0123456789abcdef");
    home.cli(&["SET", &key, &planted, "PX", "30000"]);
    waiter.abort();
    let gone = eventually(secs(5), || home.cli(&["EXISTS", &key]).trim() == "0").await;
    println!("a cancelled waiter's pre-granted key deleted by its leave: {gone}");
    assert!(gone, "the pre-granted key outlived the waiter that left");
    assert_eq!(queued(&cluster, &resource), 0, "the ticket left the queue");
    drop(holder);
}

/// A guard of `a` on `resource` that came through the fair queue: another
/// client held first, `a` queued and was named. `a`'s client then knows
/// the lock is contended, so its release asks for a handover.
async fn held_via_queue(
    cluster: &Cluster,
    resource: &str,
    a: &redfence::Client,
) -> redfence::LockGuard {
    held_via_queue_for(cluster, resource, a, secs(30)).await
}

/// [`held_via_queue`], `a` asking for `ttl`.
async fn held_via_queue_for(
    cluster: &Cluster,
    resource: &str,
    a: &redfence::Client,
    ttl: Duration,
) -> redfence::LockGuard {
    let first = client(cluster, true);
    warm_up(&first, cluster).await;
    let key = lock_key(resource);
    for _ in 0..5 {
        let holder = first.acquire(resource, secs(30)).await.unwrap();
        // From the second time on `first`'s own ticket may be queued (its
        // client joined: its last release named a waiter).
        let ahead = queued(cluster, resource);
        let waiter = spawn_notice_waiter_with(a.clone(), resource.to_owned(), ttl);
        assert!(eventually(secs(10), || queued(cluster, resource) == ahead + 1).await);
        let (got, _) = release_and_wait(holder, waiter, secs(30)).await;
        let guard = got.expect("a gets the lock through the queue");
        // Its value on every node: a release only hands over where its own
        // acquire was granted everywhere, and on a loaded machine `first`'s
        // release can reach a node after `a`'s attempt, which is refused
        // there.
        let everywhere = eventually(secs(1), || {
            let values: Vec<String> = cluster
                .nodes
                .iter()
                .map(|n| n.cli(&["GET", &key]).trim().to_owned())
                .collect();
            values.iter().all(|v| !v.is_empty() && *v == values[0])
        })
        .await;
        if everywhere {
            // The last answer noted by the client, not only landed.
            tokio::time::sleep(ms(50)).await;
            return guard;
        }
        guard.release().await;
    }
    panic!("5 times a's lock through the queue did not reach every node");
}

/// The handover (DESIGN.md, section 2, fair queue, step 4). A holder that
/// came through the queue, with a waiter of another client queued behind
/// it, on 3 nodes: its release deletes its key on the home only and hands
/// the other two over (`Released::handed_over`); the named waiter's
/// acquire replaces them. So each node runs one script for the handoff:
/// the home the release, the others the acquire ([1, 2, 2] without the
/// handover, as in `a_release_pregrants_the_home_vote_to_the_named_waiter`).
/// The waiter's value ends up on every node, its token above the holder's.
/// Its own release, with nobody queued, is asked for a handover too (its
/// client was named), gets none, and releases the other nodes after the
/// home: every key is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contended_release_hands_the_other_nodes_over_to_the_named_waiter() {
    let cluster = Cluster::start(3);
    let resource = homed_at("handover", 0, 3);
    let (a, b) = (client(&cluster, true), client(&cluster, true));
    warm_up(&a, &cluster).await;
    warm_up(&b, &cluster).await;
    let key = lock_key(&resource);
    let values = || -> Vec<String> {
        cluster
            .nodes
            .iter()
            .map(|n| n.cli(&["GET", &key]).trim().to_owned())
            .collect()
    };
    for round in 0..5 {
        let holder = held_via_queue(&cluster, &resource, &a).await;
        let holder_token = holder.token().unwrap().get();
        scripts_at_rest(&cluster).await;
        let ahead = queued(&cluster, &resource);
        let waiter = spawn_notice_waiter(b.clone(), resource.clone());
        assert!(eventually(secs(10), || queued(&cluster, &resource) == ahead + 1).await);
        let (before, attempts) = (scripts_at_rest(&cluster).await, b.stats().attempts);
        let (released, got, after) = release_and_wait_reporting(holder, waiter, secs(30)).await;
        let guard = got.expect("the named waiter gets the lock");
        let token = guard.token().unwrap().get();
        let whole = eventually(secs(5), || {
            let v = values();
            !v[0].is_empty() && v[0] != "(nil)" && v.iter().all(|x| *x == v[0])
        })
        .await;
        let per_node: Vec<u64> = scripts_at_rest(&cluster)
            .await
            .iter()
            .zip(&before)
            .map(|(x, y)| x - y)
            .collect();
        println!(
            "round {round}: {released:?}; the waiter got the lock {after:?} after the release, scripts per node {per_node:?} (home first), tokens {holder_token} then {token}, values {:?}",
            values()
        );
        assert_eq!(
            (released.confirmed, released.handed_over),
            (1, 2),
            "the home deleted, the other two were handed over: {released:?}"
        );
        assert!(
            after < secs(5),
            "the waiter got the lock {after:?} after the release"
        );
        assert!(token > holder_token, "tokens {holder_token} then {token}");
        assert!(
            whole,
            "the waiter's one value on every node: {:?}",
            values()
        );
        let again = guard.release().await;
        assert_eq!(
            (again.confirmed + again.pending, again.handed_over),
            (3, 0),
            "nobody queued: released everywhere: {again:?}"
        );
        assert!(again.failures.is_empty(), "{again:?}");
        assert!(
            eventually(secs(5), || values()
                .iter()
                .all(|v| v.is_empty() || v == "(nil)"))
            .await,
            "every key gone: {:?}",
            values()
        );
        // One attempt (a second one is a loaded machine's retry): the
        // scripts then say nothing about the handover; run again.
        if b.stats().attempts - attempts == 1 {
            assert_eq!(
                per_node,
                vec![1, 1, 1],
                "one script per node for the handoff: the home's release, the others' acquire"
            );
            return;
        }
    }
    panic!("5 rounds in which the named waiter needed more than one attempt");
}

/// A handover to a ticket of a live client that no waiter of it holds
/// (planted at the head, ahead of the client's real waiter): the client
/// releases the home's vote and the keys handed over with it, so its real
/// waiter, named next, gets the lock at once. Without the release of the
/// handed keys, the holder's keys on the other two nodes would refuse the
/// real waiter for their TTL (30 s) and it would wait for its 10 s timer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_handed_to_a_ticket_nobody_holds_are_released_at_once() {
    let cluster = Cluster::start(3);
    let resource = homed_at("handed-orphan", 0, 3);
    let (a, b) = (client(&cluster, true), client(&cluster, true));
    warm_up(&a, &cluster).await;
    warm_up(&b, &cluster).await;
    let holder = held_via_queue(&cluster, &resource, &a).await;
    let ahead = queued(&cluster, &resource);
    let waiter = spawn_notice_waiter(b.clone(), resource.clone());
    assert!(eventually(secs(10), || queued(&cluster, &resource) == ahead + 1).await);
    let home = &cluster.nodes[0];
    let queue = queue_key(&resource);
    let real = home.cli(&["LINDEX", &queue, "-1"]).trim().to_owned();
    // Taken out of the queue: the holder's ticket, then the planted one
    // at the head, ahead of the real waiter.
    let tickets = home.cli(&["LRANGE", &queue, "0", "-1"]);
    for t in tickets
        .lines()
        .map(str::trim)
        .filter(|t| !t.is_empty() && *t != real)
    {
        home.cli(&["LREM", &queue, "0", t]);
    }
    let _planted = a_ticket_that_left(&cluster, &b, &resource).await;
    let (released, got, after) = release_and_wait_reporting(holder, waiter, secs(30)).await;
    println!("keys handed to a ticket nobody holds ({released:?}): the real waiter got the lock {after:?} after the release");
    assert_eq!(released.handed_over, 2, "{released:?}");
    let guard = got.expect("the real waiter gets the lock");
    assert!(
        after < secs(5),
        "the real waiter got the lock {after:?} after the release"
    );
    guard.release().await;
}

/// A handover to a waiter whose process stands still (stopped, or its
/// runtime blocked) with its subscription open, so that the home names it
/// and hands it the lock: the other nodes keep the released holder's keys,
/// which nobody else can take, until they expire (3 s here; before the
/// handover its release freed them at once). A client outside the queue
/// (`fair(false)`) then gets the lock from the other two nodes, not
/// before; the queue itself waits for the stopped waiter's pre-granted key
/// on the home (its TTL, 30 s), as it did before the handover. The stopped
/// waiter is a client on a thread of its own whose runtime is blocked
/// while the holder releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_to_a_stopped_waiter_keeps_the_lock_until_the_holders_keys_expire() {
    use std::sync::mpsc;
    let cluster = Cluster::start(3);
    let resource = homed_at("handover-stopped", 0, 3);
    let a = client(&cluster, true);
    warm_up(&a, &cluster).await;
    let ttl = secs(3);
    let holder = held_via_queue_for(&cluster, &resource, &a, ttl).await;
    let expires = std::time::Instant::now() + ttl;
    let ahead = queued(&cluster, &resource);
    // The waiter's thread: queue, then block its runtime until told.
    let (urls, r) = (cluster.urls(), resource.clone());
    let (freeze_tx, freeze_rx) = mpsc::channel::<()>();
    let (thaw_tx, thaw_rx) = mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let b = crate::helpers::builder(urls)
                .node_timeout(secs(1))
                .build()
                .unwrap();
            let w = b.acquire("stopped-warm-up", secs(5)).await.unwrap();
            w.release().await;
            let waiter = tokio::spawn(async move {
                b.lock(&r, secs(30))
                    .retry(crate::helpers::notice_only_retry())
                    .acquire()
                    .await
            });
            // Runs until told to stand still, then blocks the runtime.
            while freeze_rx.try_recv().is_err() {
                tokio::time::sleep(ms(5)).await;
            }
            let _ = thaw_rx.recv_timeout(secs(60));
            waiter.abort();
        });
    });
    assert!(
        eventually(secs(10), || queued(&cluster, &resource) == ahead + 1).await,
        "the waiter queued"
    );
    freeze_tx.send(()).unwrap();
    tokio::time::sleep(ms(100)).await;
    let released = holder.release().await;
    let released_at = std::time::Instant::now();
    let left = expires.saturating_duration_since(released_at);
    let c = client(&cluster, false);
    let got = c
        .lock(&resource, secs(5))
        .retry(
            redfence::Retry::new()
                .with_delay(ms(50))
                .with_max_wait(secs(20)),
        )
        .acquire()
        .await;
    let after = released_at.elapsed();
    let _ = thaw_tx.send(());
    let _ = thread.join();
    println!(
        "a handover to a stopped waiter ({released:?}): another client got the lock {after:?} after the release, the holder's keys had {left:?} left"
    );
    assert_eq!(released.handed_over, 2, "{released:?}");
    let guard = got.expect("another client gets the lock once the holder's keys expired");
    assert!(
        after + ms(100) >= left,
        "got the lock {after:?} after the release, before the holder's keys expired ({left:?} left)"
    );
    assert!(
        after <= left + secs(2),
        "got the lock {after:?} after the release: the holder's keys had {left:?} left"
    );
    guard.release().await;
}

/// `Builder::handover(false)`: the same contended release as in
/// `a_contended_release_hands_the_other_nodes_over_to_the_named_waiter`
/// deletes its key everywhere (`handed_over` 0) and the named waiter
/// still gets the lock at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_handover_a_contended_release_deletes_everywhere() {
    let cluster = Cluster::start(3);
    let resource = homed_at("no-handover", 0, 3);
    let a = crate::helpers::builder(cluster.urls())
        .node_timeout(secs(1))
        .handover(false)
        .build()
        .unwrap();
    let b = client(&cluster, true);
    warm_up(&a, &cluster).await;
    warm_up(&b, &cluster).await;
    let holder = held_via_queue(&cluster, &resource, &a).await;
    let ahead = queued(&cluster, &resource);
    let waiter = spawn_notice_waiter(b.clone(), resource.clone());
    assert!(eventually(secs(10), || queued(&cluster, &resource) == ahead + 1).await);
    let (released, got, after) = release_and_wait_reporting(holder, waiter, secs(30)).await;
    println!("handover(false): {released:?}; the waiter got the lock {after:?} after the release");
    assert_eq!(released.handed_over, 0, "{released:?}");
    assert_eq!(released.confirmed + released.pending, 3, "{released:?}");
    let guard = got.expect("the named waiter gets the lock");
    assert!(
        after < secs(5),
        "the waiter got the lock {after:?} after the release"
    );
    guard.release().await;
}

/// A waiter outside the queue (a `fair(false)` client here; a queue
/// widened when its home was silent listens the same way) needs the other
/// nodes freed to compete: while one listens on the home's plain channel,
/// a contended release deletes everywhere instead of handing over. (With
/// the handover, such waiters starved behind a queue handing the lock
/// from one of its waiters to the next: after a home restart, three of
/// four worker processes whose queues had widened got no grant, in
/// `fair::processes_keep_safe_turns_through_a_home_restarted_empty`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_outside_the_queue_keeps_a_release_from_handing_over() {
    let cluster = Cluster::start(3);
    let resource = homed_at("handover-classic", 0, 3);
    let (a, b, c) = (
        client(&cluster, true),
        client(&cluster, true),
        client(&cluster, false),
    );
    for x in [&a, &b, &c] {
        warm_up(x, &cluster).await;
    }
    let holder = held_via_queue(&cluster, &resource, &a).await;
    let ahead = queued(&cluster, &resource);
    let fair = spawn_notice_waiter(b.clone(), resource.clone());
    assert!(eventually(secs(10), || queued(&cluster, &resource) == ahead + 1).await);
    let classic = spawn_notice_waiter(c.clone(), resource.clone());
    let channel = format!("{}@0", lock_key(&resource));
    let listening = || {
        cluster.nodes[0]
            .cli(&["PUBSUB", "NUMSUB", &channel])
            .lines()
            .nth(1)
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert!(
        eventually(secs(10), || listening() >= 1).await,
        "the classic waiter listens on the home"
    );
    let released = holder.release().await;
    println!("a classic waiter listening: {released:?}");
    assert_eq!(released.handed_over, 0, "{released:?}");
    // Both get the lock in turn, in either order.
    let mut pending = vec![fair, classic];
    while !pending.is_empty() {
        let (out, _, rest) = tokio::time::timeout(secs(30), futures::future::select_all(pending))
            .await
            .expect("a waiter hung");
        let (got, _) = out.unwrap();
        got.expect("the waiter gets the lock").release().await;
        pending = rest;
    }
}

/// A waiter named after a long wait: the release set its pre-granted key
/// on the home just now, with the ticket's whole TTL, but the waiter can
/// count the home's vote unasked only from a moment it knows the key was
/// not yet set (its join). Issue 31: counted from the join 7 s earlier, a
/// 10 s lock came with 2.9 s of validity (and with ~1 ms when the
/// wait came closer to the TTL). Now a credit that would leave less than
/// half the TTL is not taken: the home is asked in the same round (no
/// extra round trip), re-confirms the key with a fresh TTL, and the
/// validity counts from the round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pregrant_after_a_long_wait_comes_with_a_fresh_validity() {
    let cluster = Cluster::start(3);
    let resource = homed_at("fresh", 0, 3);
    let (a, b) = (client(&cluster, true), client(&cluster, true));
    warm_up(&a, &cluster).await;
    warm_up(&b, &cluster).await;
    let holder = a.acquire(&resource, secs(30)).await.unwrap();
    let ttl = secs(10);
    let waiter = spawn_notice_waiter_with(b, resource.clone(), ttl);
    assert!(eventually(secs(10), || queued(&cluster, &resource) == 1).await);
    tokio::time::sleep(secs(7)).await;
    let (got, after) = release_and_wait(holder, waiter, secs(10)).await;
    let guard = got.expect("the waiter gets the lock");
    let value = cluster.nodes[0].cli(&["GET", &lock_key(&resource)]);
    assert_eq!(
        value.matches(':').count(),
        2,
        "the home's key is not the pre-grant's ({value}): no pre-grant was tested"
    );
    let validity = guard.validity();
    println!("a pre-grant after a 7 s wait: granted {after:?} after the release, valid for {validity:?} of {ttl:?}");
    assert!(
        validity > ttl / 2,
        "a fresh pre-grant came with {validity:?} of validity (TTL {ttl:?})"
    );
    guard.release().await;
}

/// A pre-grant only from a home the releaser counts (issue 31): the home
/// restarted (here with its data, AOF: the holder's key, the queue and the
/// fence come back) and is young under the restart guard, so neither the
/// releaser nor the waiter counts its vote. Before, the release's script
/// pre-granted it anyway (a `SET` of the waiter's pre-grant value and a
/// move of the fence) and only the waiter's look at its subscription's age
/// kept it from being counted; a home restarted empty then seeded the
/// pre-grant's fence from the releaser's clock, below the fences the
/// others held, and nothing checked whether it had been re-seeded. The
/// waiter still gets the lock, from the other two nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_young_home_does_not_pregrant() {
    let mut cluster = Cluster::start_with(3, |_| crate::support::ServerOptions {
        appendonly: true,
        appendfsync_always: true,
        ..Default::default()
    });
    // The window is the longest TTL the client asked for, at least this:
    // the warm-up's 5 s, and every lock here. 10 s, not 5: the holder's
    // keys must outlive the waiter's join and the home's restart, which
    // on a loaded machine took more than 5 s once (the waiter then got
    // the lock by expiry and left the queue before the restart).
    let window = secs(10);
    let build = || {
        redfence::Client::builder(cluster.urls())
            .node_timeout(secs(1))
            .restart_guard(redfence::RestartGuard::new().with_window(window))
            .build()
            .unwrap()
    };
    let (a, b) = (build(), build());
    // The servers just started: young until the window is over (a second
    // more for the rounding of their reported uptime).
    tokio::time::sleep(window + ms(1200)).await;
    warm_up(&a, &cluster).await;
    warm_up(&b, &cluster).await;
    let resource = homed_at("young-home", 0, 3);
    let holder = a.acquire(&resource, window).await.unwrap();
    let first = holder.token().unwrap().get();
    let waiter = spawn_notice_waiter_with(b.clone(), resource.clone(), window);
    assert!(eventually(secs(10), || queued(&cluster, &resource) == 1).await);
    // A full TTL from here: the holder's keys outlive the restart.
    holder.extend(window).await.unwrap();
    cluster.node(0).restart();
    assert!(
        !waiter.is_finished(),
        "the waiter got the lock before the restart: the holder's keys expired"
    );
    // The queue comes back from the AOF, but the waiter may already have
    // left it: its client saw the home's connection drop, and its look on
    // reconnecting can find the home lost and take its ticket out (seen
    // once in a CI run on a loaded machine). Then no release can name it
    // and the run proves nothing about pre-grants: it still checks that the
    // waiter gets the lock from the other nodes.
    let came_back = queued(&cluster, &resource) == 1;
    if !came_back {
        println!("the waiter left the queue before it was read: no pre-grant to look for");
    }
    let monitor = cluster.nodes[0].monitor();
    let (released, got, after) = release_and_wait_reporting(holder, waiter, secs(20)).await;
    println!("{released:?}");
    let guard = got.expect("the waiter gets the lock from the other nodes");
    let key = format!("\"{}\"", lock_key(&resource));
    let pregrants: Vec<String> = monitor
        .lines()
        .into_iter()
        .filter(|l| l.contains(" lua] ") && l.contains("\"SET\"") && l.contains(&key))
        .filter(|l| {
            l.split('"')
                .nth(5)
                .is_some_and(|v| v.matches(':').count() == 2)
        })
        .collect();
    println!("a young home: the waiter got the lock {after:?} after the release; pre-grants on the home: {pregrants:?}");
    assert!(
        pregrants.is_empty(),
        "the young home pre-granted its vote (queue back: {came_back}): {pregrants:#?}"
    );
    assert!(guard.token().unwrap().get() > first);
    guard.release().await;
}

/// A ticket with this client's tag that it never issued: another live
/// client's, had two clients drawn one tag (32-bit tags before issue 31:
/// about 2^16 clients make a collision likely), stood in for by a ticket
/// planted at the head. The release pre-grants it the home's vote and
/// publishes the naming on the tag's channel, where this client hears it.
/// Before, the client took it for an orphan of its own and released it:
/// it deleted the other client's pre-granted key and the home's vote went
/// to the next ticket, two holders. Now the key is left alone: its own
/// client uses it, or it expires with its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pregrant_to_a_ticket_never_issued_is_left_alone() {
    let Queued {
        cluster,
        resource,
        holder,
        waiter,
        ticket,
        waiting: _,
    } = queued_waiter("never-issued").await;
    let home = &cluster.nodes[0];
    let (tag, _) = ticket.split_once('.').expect("a tag and the rest");
    let planted = format!("{tag}.0123456789abcdef-30000");
    home.cli(&["LPUSH", &queue_key(&resource), &planted]);
    let key = lock_key(&resource);
    let monitor = home.monitor();
    holder.release().await;
    let pregranted = format!("{tag}:0123456789abcdef-30000:");
    let set = format!("\"SET\" \"{key}\" \"{pregranted}");
    assert!(
        eventually(secs(5), || monitor.lines().iter().any(|l| l.contains(&set))).await,
        "the release did not pre-grant the planted ticket: {:#?}",
        monitor.lines()
    );
    // Time for the client to hear the naming and, before, release it.
    tokio::time::sleep(secs(2)).await;
    let value = home.cli(&["GET", &key]);
    println!("a pre-grant to a ticket never issued: the home's key after 2 s: {value}");
    assert!(
        value.starts_with(&pregranted),
        "the pre-grant to a ticket this client never issued was released: the key is {value:?}"
    );
    assert!(
        !waiter.is_finished(),
        "the real waiter got the lock while another ticket held the home"
    );
    waiter.abort();
}

/// A handover's notice names the released holder's keys by the SHA1 of
/// its value, never the value: the value proves ownership (release and
/// extend compare it), and pub/sub can be read by any client allowed to
/// `PSUBSCRIBE`. `MONITOR` on the home shows every `PUBLISH` the release
/// ran: none carries the value's secret, the handover's carries its hash.
/// Before issue 31 the notice carried the value itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_publishes_a_hash_of_the_holders_value_never_the_value() {
    let cluster = Cluster::start(3);
    let resource = homed_at("handover-secret", 0, 3);
    let (a, b) = (client(&cluster, true), client(&cluster, true));
    warm_up(&a, &cluster).await;
    warm_up(&b, &cluster).await;
    let key = lock_key(&resource);
    for round in 0..5 {
        let holder = held_via_queue(&cluster, &resource, &a).await;
        let value = cluster.nodes[0].cli(&["GET", &key]).trim().to_owned();
        let (_, secret) = value.split_once(':').expect("tag:secret");
        let ahead = queued(&cluster, &resource);
        let waiter = spawn_notice_waiter(b.clone(), resource.clone());
        assert!(eventually(secs(10), || queued(&cluster, &resource) == ahead + 1).await);
        let monitor = cluster.nodes[0].monitor();
        let (released, got, _) = release_and_wait_reporting(holder, waiter, secs(30)).await;
        let guard = got.expect("the named waiter gets the lock");
        // MONITOR's stream may lag the release's reply (seen with a busy
        // core: a handover and no `PUBLISH` read yet): a handover's notice
        // is waited for, up to 5 s.
        if released.handed_over == 2 {
            let published = || monitor.lines().iter().any(|l| l.contains("\"PUBLISH\""));
            eventually(secs(5), published).await;
        }
        let publishes: Vec<String> = monitor
            .lines()
            .into_iter()
            .filter(|l| l.contains("\"PUBLISH\""))
            .collect();
        assert!(
            publishes.iter().all(|l| !l.contains(secret)),
            "a notice carried the holder's secret: {publishes:#?}"
        );
        guard.release().await;
        if released.handed_over == 2 {
            let hash = sha1_smol::Sha1::from(value.as_str()).digest().to_string();
            println!("round {round}: the handover's notice: {publishes:?}");
            assert!(
                publishes.iter().any(|l| l.contains(&hash)),
                "the handover's notice does not name the keys by their hash {hash}: {publishes:#?}"
            );
            return;
        }
    }
    panic!("no handover in 5 rounds");
}

/// A contended release whose home is out of reach when it starts (its
/// connection killed, the server paused for longer than the node timeout):
/// the release's first step on the home lives until the holder's keys
/// would expire, so when the home comes back it deletes the holder's key
/// there and names the waiter. Issue 31: that step lived one node timeout
/// and was then dropped; the holder's key stayed on the home for its TTL
/// (30 s), nobody was named, and the waiter got the lock from its 10 s
/// timer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_outlives_a_paused_home() {
    let mut cluster = Cluster::start(3);
    let resource = homed_at("paused-home", 0, 3);
    let (a, b) = (client(&cluster, true), client(&cluster, true));
    warm_up(&a, &cluster).await;
    warm_up(&b, &cluster).await;
    let holder = held_via_queue(&cluster, &resource, &a).await;
    let ahead = queued(&cluster, &resource);
    let waiter = spawn_notice_waiter(b.clone(), resource.clone());
    assert!(eventually(secs(10), || queued(&cluster, &resource) == ahead + 1).await);
    // The holder's client loses its connection to the home, and the home
    // stops: the release cannot reach it within a node timeout (1 s).
    cluster.nodes[0].cli(&["CLIENT", "KILL", "TYPE", "normal"]);
    cluster.node(0).pause();
    let released = holder.release().await;
    tokio::time::sleep(ms(1500)).await;
    cluster.node(0).resume();
    let resumed = std::time::Instant::now();
    let (got, at) = tokio::time::timeout(secs(30), waiter)
        .await
        .expect("the waiter hung")
        .unwrap();
    let after = at - resumed;
    println!("a release over a paused home ({released:?}): the waiter got the lock {after:?} after the home resumed");
    let guard = got.expect("the waiter gets the lock");
    assert!(
        after < secs(5),
        "the waiter got the lock {after:?} after the home resumed"
    );
    guard.release().await;
}
