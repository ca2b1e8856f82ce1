use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::state::lock;
use super::*;
use crate::error::failure::{NodeErrorKind, NodeFailure};
use crate::waiting::pregrant::{Home, Orphan, Pregrant};

const MS: Duration = Duration::from_millis(1);

fn held(ms: Option<u64>) -> NodeFailure {
    NodeFailure {
        index: 0,
        addr: "x:1".into(),
        kind: NodeErrorKind::HeldByOther {
            expires_in: ms.map(Duration::from_millis),
        },
    }
}

fn timeout() -> NodeFailure {
    NodeFailure {
        index: 0,
        addr: "x:1".into(),
        kind: NodeErrorKind::Timeout(100 * MS),
    }
}

#[test]
fn free_when_a_quorum_of_keys_expired() {
    // 5 nodes, quorum 3: the third-shortest TTL frees a majority.
    let f = [held(Some(300)), held(Some(100)), held(Some(200))];
    assert_eq!(free_in(5, 3, 0, &f), Some(300 * MS));
    // Nodes that granted us are free now.
    assert_eq!(free_in(5, 3, 2, &f), Some(100 * MS));
    // Unknown nodes never count: two known of a quorum of three.
    assert_eq!(
        free_in(5, 3, 0, &[held(Some(5)), timeout(), held(Some(9))]),
        None
    );
    // A key without expiry (PTTL -1) never frees.
    assert_eq!(free_in(3, 2, 0, &[held(None), held(Some(7))]), None);
    assert_eq!(free_in(1, 1, 0, &[held(Some(42))]), Some(42 * MS));
    // More answers than nodes (a caller bug) do not panic.
    assert_eq!(free_in(1, 1, 3, &[]), Some(Duration::ZERO));
}

#[test]
fn queue_is_fifo_and_wakes_only_the_head() {
    let waits = Waits::default();
    let key: Arc<str> = "k".into();
    let a = waits.join(&[], &key);
    let b = waits.join(&[], &key);
    let c = waits.join(&[], &key);
    assert!(a.head().is_some());
    assert!(b.head().is_none() && c.head().is_none());
    let before = a.head().unwrap().heard;
    waits.shared.heard("k", "n1:1");
    // Copies of one release from other nodes count once.
    waits.shared.heard("k", "n1:1");
    assert_eq!(a.head().unwrap().heard, before + 1);
    waits.shared.heard("k", "n2:1");
    assert_eq!(a.head().unwrap().heard, before + 2);
    // The head got the lock: b is head and learns the holder's expiry.
    let expiry = Instant::now() + 500 * MS;
    a.acquired(expiry);
    assert_eq!(b.head().unwrap().holder_until, Some(expiry));
    // A release heard before b looks still counts for b.
    let since = b.head().unwrap().since;
    waits.shared.heard("k", "n4:1");
    assert_eq!(b.head().unwrap().since, since);
    assert_eq!(b.head().unwrap().heard, since + 1);
    // A waiter behind the head leaves: order unchanged.
    drop(c);
    assert!(b.head().is_some());
    drop(b);
    // The last waiter leaves: the queue lingers, then is reaped.
    assert_eq!(waits.queues(), 1);
    waits.shared.reap(Instant::now());
    assert_eq!(waits.queues(), 1, "lingers");
    waits.shared.reap(Instant::now() + LINGER);
    assert_eq!(waits.queues(), 0, "reaped after LINGER");
    // Unknown channels are ignored.
    waits.shared.heard("other", "n3:1");
    waits.shared.confirmed("other", false);
}

/// A leaving waiter scans for idle queues at most once per
/// `REAP_EVERY`, and idle queues still go within `LINGER + REAP_EVERY`.
#[test]
fn leaving_waiters_reap_now_and_then() {
    let waits = Waits::default();
    let idle = |n: usize| {
        for i in 0..n {
            let key: Arc<str> = format!("k{i}").into();
            drop(waits.join(&[], &key));
        }
    };
    idle(100);
    assert_eq!(waits.queues(), 100, "idle queues linger");
    let later = Instant::now() + 2 * LINGER;
    waits.shared.reap_now_and_then(later);
    assert_eq!(waits.queues(), 0, "reaped by a scan after LINGER");
    // These waiters leave before the next scan is due: none scans, not
    // even the last one, when the others' LINGER has passed.
    idle(100);
    let long_ago = Instant::now().checked_sub(2 * LINGER).unwrap();
    for queue in waits.shared.lock().values_mut() {
        queue.idle_since = Some(long_ago);
    }
    drop(waits.join(&[], &Arc::from("one more")));
    assert_eq!(waits.queues(), 101, "a leaving waiter scanned");
    waits.shared.reap_now_and_then(later + REAP_EVERY / 2);
    assert_eq!(waits.queues(), 101, "no scan within REAP_EVERY");
    waits.shared.reap_now_and_then(later + REAP_EVERY);
    assert_eq!(waits.queues(), 0, "reaped by the next scan");
}

#[test]
fn own_release_wakes_only_once_queued_everywhere() {
    let waits = Waits::default();
    let key: Arc<str> = "k".into();
    let a = waits.join(&[], &key);
    let h0 = a.head().unwrap().heard;
    let releasing = waits.releasing(&key, "00000000000000bb".into());
    // The first node ran our delete and published before the last
    // delete was queued: the head must not retry yet.
    waits.shared.heard("k", "00000000000000bb:1");
    assert_eq!(a.head().unwrap().heard, h0);
    // Another release meanwhile still wakes it.
    waits.shared.heard("k", "00000000000000cc:1");
    assert_eq!(a.head().unwrap().heard, h0 + 1);
    // Queued on every connection: one wake, and later copies count as
    // heard already.
    releasing.queued();
    assert_eq!(a.head().unwrap().heard, h0 + 2);
    waits.shared.heard("k", "00000000000000bb:1");
    assert_eq!(a.head().unwrap().heard, h0 + 2);
    assert!(lock(&waits.shared.own).is_empty());
    // A release abandoned before `queued` (a panic) forgets its notice:
    // its copies then wake the head as any release does.
    drop(waits.releasing(&key, "00000000000000dd".into()));
    assert!(lock(&waits.shared.own).is_empty());
    waits.shared.heard("k", "00000000000000dd:1");
    assert_eq!(a.head().unwrap().heard, h0 + 3);
}

#[test]
fn other_clients_get_a_turn_after_local_handoffs() {
    const LOCAL_TURNS: u32 = 4;
    let waits = Waits::new(&crate::logic::resource::client_tag(), LOCAL_TURNS);
    let key: Arc<str> = "k".into();
    let a = waits.join(&[], &key);
    // Another client's release, heard with 3 clients subscribed.
    waits.shared.heard("k", "0000000000000001:3");
    assert_eq!(a.head().unwrap().competitors, 3);
    let mut woken = Vec::new();
    for i in 0..(2 * LOCAL_TURNS + 2) {
        let before = a.head().unwrap().heard;
        let notice = format!("{:016x}", 0x100 + i);
        waits.releasing(&key, notice.as_str().into()).queued();
        woken.push(a.head().unwrap().heard > before);
        // Its copies come back from Redis with the clients' count.
        waits.shared.heard("k", &format!("{notice}:3"));
    }
    // LOCAL_TURNS handed over at once, then one heard through Redis
    // like every other client's head hears it, and so on.
    let turn = LOCAL_TURNS as usize;
    let mut expected = vec![true; turn];
    expected.push(false);
    expected.extend(vec![true; turn]);
    expected.push(false);
    assert_eq!(woken, expected);
    // The yielded release still woke the head, through its copy, with
    // the clients to spread over.
    assert_eq!(a.head().unwrap().competitors, 3);
    // With this client alone, every release is handed over at once.
    let alone = Waits::new(&crate::logic::resource::client_tag(), LOCAL_TURNS);
    let b = alone.join(&[], &key);
    for i in 0..(2 * LOCAL_TURNS) {
        let before = b.head().unwrap().heard;
        let notice = format!("{:016x}", 0x200 + i);
        alone.releasing(&key, notice.as_str().into()).queued();
        assert!(b.head().unwrap().heard > before);
        alone.shared.heard("k", &format!("{notice}:1"));
    }
}

#[test]
fn a_new_waiter_queues_behind_waiting_tasks_only() {
    let waits = Waits::default();
    let key: Arc<str> = "k".into();
    assert!(waits.join_if_waiting(&[], &key).is_none(), "no queue");
    let a = waits.join(&[], &key);
    let b = waits.join_if_waiting(&[], &key).expect("a waits");
    assert!(a.head().is_some() && b.head().is_none());
    drop((a, b));
    // A lingering queue without waiters: attempt first.
    assert_eq!(waits.queues(), 1);
    assert!(waits.join_if_waiting(&[], &key).is_none());
}

#[test]
fn own_cleanup_notices_are_ignored() {
    let waits = Waits::new(
        &crate::logic::resource::client_tag(),
        DEFAULT_LOCAL_HANDOFFS,
    );
    assert_eq!(waits.tag().len(), 17);
    let key: Arc<str> = "k".into();
    let a = waits.join(&[], &key);
    let h0 = a.head().unwrap().heard;
    // This client's failed attempt freeing its partial grants.
    waits
        .shared
        .heard("k", &format!("{}00000000000000aa:2", waits.tag()));
    assert_eq!(a.head().unwrap().heard, h0);
    // Another client's cleanup (a split vote: the lock may be free).
    waits.shared.heard("k", "0123abcd/00000000000000aa:2");
    assert_eq!(a.head().unwrap().heard, h0 + 1);
    assert_eq!(a.head().unwrap().competitors, 2);
    // Copies from other nodes count once, with the most competitors.
    waits.shared.heard("k", "0123abcd/00000000000000aa:3");
    assert_eq!(a.head().unwrap().heard, h0 + 1);
    assert_eq!(a.head().unwrap().competitors, 3);
    // A payload without a count (another version) counts one.
    waits.shared.heard("k", "ffff");
    assert_eq!(a.head().unwrap().competitors, 1);
}

#[test]
fn first_confirmation_counts_as_a_release() {
    let waits = Waits::default();
    let key: Arc<str> = "k".into();
    let a = waits.join(&[], &key);
    let h0 = a.head().unwrap().heard;
    waits.shared.confirmed("k", false);
    waits.shared.confirmed("k", false);
    assert_eq!(a.head().unwrap().heard, h0 + 1, "only the first");
    waits.shared.confirmed("k", true);
    assert_eq!(a.head().unwrap().heard, h0 + 2, "and after a reconnect");
}

#[test]
fn a_pregranted_naming_reaches_its_waiter_or_comes_back_as_an_orphan() {
    let waits = Waits::new(
        &crate::logic::resource::client_tag(),
        DEFAULT_LOCAL_HANDOFFS,
    );
    let orphans = Arc::new(Mutex::new(Vec::new()));
    let seen = orphans.clone();
    waits.on_orphan(move |o: Orphan| {
        seen.lock().unwrap().push((o.ticket, o.notice));
    });
    let key: Arc<str> = "k".into();
    let home = Home::given(
        0,
        "q".into(),
        "w".into(),
        Some("f".into()),
        Some("c".into()),
    );
    let mine = "aaaaaaaa0000000000000001-30000";
    let (a, _) = waits.join_fair(&key, &home, mine.into());
    let since = Instant::now();
    // Named with the home's fence: the waiter takes the vote.
    let shared = &waits.shared;
    shared.heard_from("k", &format!("n1:2:{mine}:1002"), 0, since);
    let vote = Pregrant {
        notice: "n1".into(),
        fence: Some(1002),
        since,
        handed: None,
    };
    assert_eq!(a.take_named(), Some(Some(vote)));
    assert_eq!(a.take_named(), None);
    // A plain naming carries no vote.
    shared.heard_from("k", &format!("n2:2:{mine}"), 0, since);
    assert_eq!(a.take_named(), Some(None));
    // Named again plainly before taking a pre-granted naming (another
    // release found the key held, by that pre-grant): the vote stays.
    shared.heard_from("k", &format!("n5:2:{mine}:1005"), 0, since);
    shared.heard_from("k", &format!("n6:2:{mine}"), 0, since);
    let kept = a.take_named().flatten().map(|v| v.notice);
    assert_eq!(kept.as_deref(), Some("n5"));
    // A vote its waiter never took before leaving comes back to
    // release; so does a later one for the ticket of a waiter that
    // left.
    shared.heard_from("k", &format!("n4:2:{mine}:1004"), 0, since);
    drop(a);
    shared.heard_from("k", &format!("n7:2:{mine}:1007"), 0, since);
    // A vote for a ticket this client never issued (another live
    // client with the same tag, or one planted by hand) is not this
    // client's to release (issue 31): nothing comes back.
    shared.heard_from("k", "n3:2:aaaaaaaa0000000000000009-30000:1003", 0, since);
    let orphans = orphans.lock().unwrap();
    let got: Vec<(&str, &str)> = orphans.iter().map(|(t, n)| (&**t, &**n)).collect();
    assert_eq!(got, vec![(mine, "n4"), (mine, "n7")]);
}

#[test]
fn a_granted_waiters_ticket_is_the_holders_not_one_that_left() {
    let waits = Waits::new(
        &crate::logic::resource::client_tag(),
        DEFAULT_LOCAL_HANDOFFS,
    );
    let orphans = Arc::new(Mutex::new(Vec::new()));
    let seen = orphans.clone();
    waits.on_orphan(move |o: Orphan| seen.lock().unwrap().push(o.notice));
    let key: Arc<str> = "k".into();
    let home = Home::given(
        0,
        "q".into(),
        "w".into(),
        Some("f".into()),
        Some("c".into()),
    );
    let (granted, left) = ("aaaaaaaa0000000000000001", "aaaaaaaa0000000000000002");
    let (a, _) = waits.join_fair(&key, &home, granted.into());
    let (b, _) = waits.join_fair(&key, &home, left.into());
    let (c, _) = waits.join_fair(&key, &home, "aaaaaaaa0000000000000003".into());
    let since = Instant::now();
    // A pre-granted naming the waiter never took (it got the lock by
    // an attempt of its own meanwhile) is still released.
    waits
        .shared
        .heard_from("k", &format!("n0:2:{granted}:1001"), 0, since);
    a.acquired(Instant::now() + Duration::from_secs(30));
    assert_eq!(*orphans.lock().unwrap(), vec![Arc::<str>::from("n0")]);
    drop(b);
    // The holder's ticket stays at the queue's head until its release:
    // a release heard meanwhile names it, and nobody should look.
    waits
        .shared
        .heard_from("k", &format!("n1:2:{granted}"), 0, since);
    assert_eq!(
        c.look_at(),
        None,
        "a naming of the holder's ticket scheduled a look"
    );
    // A waiter that left: the first waiter looks (the head may be free).
    waits
        .shared
        .heard_from("k", &format!("n2:2:{left}"), 0, since);
    assert!(
        c.look_at().is_some(),
        "a naming of a ticket that left scheduled no look"
    );
}

#[tokio::test]
async fn head_wakes_on_release_and_successor_on_promotion() {
    let waits = Waits::default();
    let key: Arc<str> = "k".into();
    let a = waits.join(&[], &key);
    let b = waits.join(&[], &key);
    let far = Instant::now() + Duration::from_secs(30);
    // A release heard before the head waits leaves a permit.
    waits.shared.heard("k", "n:1");
    tokio::time::timeout(Duration::from_secs(5), a.wait(far))
        .await
        .expect("head woken");
    // The head leaves: its successor is woken.
    drop(a);
    tokio::time::timeout(Duration::from_secs(5), b.wait(far))
        .await
        .expect("successor woken");
    assert!(b.head().is_some());
}

#[test]
fn a_notice_settles_when_its_copies_reach_a_majority() {
    let mut queue = super::queue::Queue::default();
    queue.remember("aa".into());
    // Three nodes: the second copy is the majority; later ones change
    // nothing, and copies of an older notice are not counted.
    queue.copy("aa", 3);
    assert_eq!(queue.settled, 1);
    let settled_at = queue.last_settled.expect("a settle is timed");
    queue.copy("aa", 3);
    assert_eq!((queue.settled, queue.copies), (1, 3));
    queue.remember("bb".into());
    queue.copy("aa", 3);
    assert_eq!((queue.settled, queue.copies), (1, 1));
    // One node: the first copy was the majority; no second wake.
    let mut single = super::queue::Queue::default();
    single.remember("cc".into());
    single.copy("cc", 1);
    assert_eq!(single.settled, 0);
    // Five nodes: the third copy.
    queue.copy("bb", 5);
    assert_eq!(queue.settled, 1);
    queue.copy("bb", 5);
    assert_eq!(queue.settled, 2);
    assert!(queue.last_settled.unwrap() >= settled_at);
}

#[test]
fn a_first_attempt_without_a_place_keeps_the_next_waiter_behind_it() {
    let waits = Waits::default();
    let key: Arc<str> = "k".into();
    let home = Home::given(0, "q".into(), "w".into(), None, None);
    // Nobody waits: the first attempt may go without a place.
    let first = waits.first_attempt(&key, &home).expect("free");
    // While it is out, a second acquire neither attempts first nor
    // attempts at all: it joins, told the resource is busy.
    assert!(waits.first_attempt(&key, &home).is_none());
    let (second, busy) = waits.join_fair(&key, &home, "t2".into());
    assert!(busy);
    assert!(second.head().is_some());
    // Granted, the next waiter learns the holder's expiry.
    let expiry = Instant::now() + 500 * MS;
    first.granted(expiry);
    assert_eq!(second.head().unwrap().holder_until, Some(expiry));
    // A waiter queued: still no attempt without a place.
    assert!(waits.first_attempt(&key, &home).is_none());
    drop(second);
    // Nobody left, nothing in flight: free again, and a refused (dropped)
    // first attempt frees it too.
    let refused = waits.first_attempt(&key, &home).expect("free again");
    drop(refused);
    assert!(waits.first_attempt(&key, &home).is_some());
    // The home's last release named a waiter: busy, a place first. (The
    // holder's first attempt made the queue, so the release finds it.)
    waits.busy(&key).set(true);
    assert!(waits.first_attempt(&key, &home).is_none());
    waits.busy(&key).set(false);
    assert!(waits.first_attempt(&key, &home).is_some());
}

/// A resource a node answered the lean release of with -1 is not quiet
/// for `MARKED_FOR` (its releases send the full script at once), without
/// a queue made for it; then it is quiet again and forgotten.
#[test]
fn a_marked_resource_is_not_quiet_until_its_memory_lapses() {
    use std::sync::atomic::Ordering;
    let waits = Waits::new("c", DEFAULT_LOCAL_HANDOFFS);
    let key: Arc<str> = "k".into();
    assert!(waits.quiet(&key));
    waits.busy(&key).marked();
    assert!(!waits.quiet(&key), "marked a moment ago");
    assert!(waits.quiet("other"), "another resource");
    assert_eq!(waits.queues(), 0, "no queue made for it");
    // Lapsed: quiet again, and forgotten.
    lock(&waits.shared.marked).insert(key.clone(), Instant::now() - MS);
    assert!(waits.quiet(&key));
    assert!(lock(&waits.shared.marked).is_empty());
    assert!(!waits.shared.marked_any.load(Ordering::Relaxed));
}

/// The memory of marked resources drops its lapsed entries when it
/// reaches `MARKED_PRUNE_AT`, and keeps the live ones.
#[test]
fn the_memory_of_marked_resources_drops_lapsed_entries_at_its_bound() {
    let waits = Waits::new("c", DEFAULT_LOCAL_HANDOFFS);
    {
        let mut marked = lock(&waits.shared.marked);
        let past = Instant::now() - MS;
        for i in 0..MARKED_PRUNE_AT - 1 {
            marked.insert(format!("old{i}").into(), past);
        }
        marked.insert("live".into(), Instant::now() + MARKED_FOR);
    }
    waits.busy(&"new".into()).marked();
    let marked = lock(&waits.shared.marked);
    assert_eq!(marked.len(), 2, "the live entry and the new one");
    assert!(marked.contains_key("live") && marked.contains_key("new"));
}
