//! Self-test of the Redis Cluster harness (`tests/support/cluster.rs`):
//! real clusters on 127.0.0.1, resharded, migrated by hand and failed over,
//! checked through the nodes' own answers rather than the crate under test.
//! In its own binary so that its clusters do not load the machine while
//! the `it` tests run.

#[path = "support/mod.rs"]
mod support;

use std::time::Instant;

use support::cluster::{crc16, slot_of, tag_for_slot, RedisCluster, SLOTS};

/// Known values: the CRC16 check value of the XMODEM variant, and slots
/// from the Redis Cluster specification's hash tag examples.
#[test]
fn slot_of_follows_the_cluster_spec() {
    assert_eq!(crc16(b"123456789"), 0x31C3);
    assert_eq!(crc16(b""), 0);
    assert_eq!(slot_of("123456789"), 12739); // 0x31C3 < 16384
    assert_eq!(slot_of("foo"), 12182);
    assert_eq!(slot_of("bar"), 5061);
    // The tag is hashed, not the key.
    assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
    assert_eq!(slot_of("{user1000}.followers"), slot_of("user1000"));
    // An empty tag `{}` means no tag: the whole key is hashed.
    assert_eq!(slot_of("foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
    // The tag runs from the first `{` to the first `}` after it.
    assert_eq!(slot_of("foo{{bar}}zap"), slot_of("{bar"));
    assert_eq!(slot_of("foo{bar}{zap}"), slot_of("bar"));
    // No closing brace: the whole key.
    assert_eq!(slot_of("foo{bar"), crc16(b"foo{bar") % 16384);
    for slot in [0, 1, 5460, 5461, 16383] {
        assert_eq!(slot_of(&format!("{}lock", tag_for_slot(slot))), slot);
    }
}

/// Three masters: full coverage, `CLUSTER KEYSLOT` agreeing with
/// `slot_of`, a 100-slot reshard, and a manual migration of one slot
/// holding a key, checked at both halves.
#[test]
fn three_masters_reshard_and_migrate() {
    let t0 = Instant::now();
    let cluster = RedisCluster::start(3, 0);
    eprintln!("3-master cluster up in {:?}", t0.elapsed());
    let masters = cluster.master_ports();
    assert_eq!(masters.len(), 3, "masters: {masters:?}");
    assert!(cluster.replica_ports().is_empty());
    assert_eq!(
        cluster.ports(),
        masters,
        "all nodes are masters, in start order"
    );
    assert_eq!(
        cluster.seed_url(),
        format!("redis+cluster://127.0.0.1:{}", masters[0])
    );
    assert_eq!(
        cluster.seed_urls(),
        masters
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
    );

    // Every slot covered, by one of the three, the same on every node.
    let owners = cluster.slot_owners();
    assert_eq!(owners.len(), SLOTS);
    for (slot, owner) in owners.iter().enumerate() {
        assert!(
            owner.is_some_and(|p| masters.contains(&p)),
            "slot {slot}: {owner:?}"
        );
    }
    let total: usize = masters.iter().map(|&p| cluster.slots_of(p).len()).sum();
    assert_eq!(total, SLOTS);
    cluster.check_consistent().unwrap();
    for &port in &masters {
        let server: &support::RedisServer = cluster.server(port);
        let info = server.cli(&["CLUSTER", "INFO"]);
        assert!(info.contains("cluster_state:ok"), "{port}: {info}");
        assert!(
            info.contains("cluster_slots_assigned:16384"),
            "{port}: {info}"
        );
    }

    // slot_of against the server's own hashing.
    let keys = [
        "123456789",
        "foo",
        "{user1000}.following",
        "{user1000}.followers",
        "foo{}{bar}",
        "foo{{bar}}zap",
        "foo{bar}{zap}",
        "{}",
        "}{",
        "{a",
        "lock:order:42",
    ];
    for key in keys {
        let server: u16 = cluster
            .server(masters[1])
            .cli(&["CLUSTER", "KEYSLOT", key])
            .parse()
            .unwrap();
        assert_eq!(slot_of(key), server, "CLUSTER KEYSLOT {key:?}");
        assert_eq!(RedisCluster::slot_of(key), server);
    }

    // redis-cli reshard: 100 slots from the first master to the second.
    let t = Instant::now();
    let (from, to) = (masters[0], masters[1]);
    let before_from = cluster.slots_of(from);
    let before_to = cluster.slots_of(to);
    cluster.reshard(from, to, 100);
    let after_from = cluster.slots_of(from);
    let after_to = cluster.slots_of(to);
    assert_eq!(after_from.len(), before_from.len() - 100);
    assert_eq!(after_to.len(), before_to.len() + 100);
    let moved: Vec<u16> = before_from
        .iter()
        .copied()
        .filter(|s| !after_from.contains(s))
        .collect();
    assert_eq!(moved.len(), 100);
    for &slot in &moved {
        assert_eq!(cluster.owner_of_slot(slot), to, "slot {slot}");
    }
    cluster.check_consistent().unwrap();
    eprintln!("reshard of 100 slots in {:?}", t.elapsed());

    // In the background, with keys in the moving slots: 10 slots from the
    // third master to the first, while the test keeps reading.
    let t = Instant::now();
    let (from, to) = (masters[2], masters[0]);
    let before_from = cluster.slots_of(from);
    for &slot in &before_from[..20] {
        let key = format!("{}bg", tag_for_slot(slot));
        assert_eq!(cluster.server(from).cli(&["SET", &key, "x"]), "OK");
    }
    let mut reshard = cluster.reshard_in_background(from, to, 10);
    let mut polls = 0;
    while !reshard.is_finished() {
        let _ = cluster.server(masters[1]).cli(&["PING"]);
        polls += 1;
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    reshard.wait();
    let after_from = cluster.slots_of(from);
    assert_eq!(after_from.len(), before_from.len() - 10);
    for &slot in &before_from[..20] {
        let key = format!("{}bg", tag_for_slot(slot));
        let owner = cluster.owner_of_slot(slot);
        assert_eq!(
            cluster.server(owner).cli(&["GET", &key]),
            "x",
            "slot {slot}"
        );
    }
    eprintln!(
        "background reshard of 10 slots in {:?} ({polls} polls meanwhile)",
        t.elapsed()
    );

    // Manual migration of a slot holding a key, in two halves.
    let key = "harness:migrated";
    let slot = slot_of(key);
    let from = cluster.owner_of_slot(slot);
    let to = *masters.iter().find(|&&p| p != from).unwrap();
    assert_eq!(cluster.server(from).cli(&["SET", key, "v1"]), "OK");
    cluster.migrate_slot_begin(slot, from, to);
    let slot_arg = slot.to_string();
    assert_eq!(
        cluster
            .server(from)
            .cli(&["CLUSTER", "COUNTKEYSINSLOT", &slot_arg]),
        "0"
    );
    assert_eq!(
        cluster
            .server(to)
            .cli(&["CLUSTER", "COUNTKEYSINSLOT", &slot_arg]),
        "1"
    );
    // Migrating: the source sends clients to the target with ASK, and the
    // slot still belongs to the source.
    assert_eq!(
        cluster.server(from).cli(&["GET", key]),
        format!("(error) ASK {slot} 127.0.0.1:{to}")
    );
    assert_eq!(cluster.owner_of_slot(slot), from);
    let nodes = cluster.server(from).cli(&["CLUSTER", "NODES"]);
    assert!(nodes.contains(&format!("[{slot}->-")), "{nodes}");
    cluster.migrate_slot_finish(slot, from, to);
    assert_eq!(cluster.owner_of_slot(slot), to);
    assert_eq!(cluster.server(to).cli(&["GET", key]), "v1");
    assert_eq!(
        cluster.server(from).cli(&["GET", key]),
        format!("(error) MOVED {slot} 127.0.0.1:{to}")
    );
    cluster.check_consistent().unwrap();
    eprintln!("three_masters_reshard_and_migrate: {:?}", t0.elapsed());
}

/// Three masters with a replica each: a manual failover swaps a pair's
/// roles, killing the new master promotes the old one back, and the killed
/// node rejoins as a replica when restarted.
#[test]
fn replicas_fail_over() {
    let t0 = Instant::now();
    let mut cluster = RedisCluster::start(3, 1);
    eprintln!("3x1 cluster up in {:?}", t0.elapsed());
    let masters = cluster.master_ports();
    let replicas = cluster.replica_ports();
    assert_eq!(masters.len(), 3, "masters: {masters:?}");
    assert_eq!(replicas.len(), 3, "replicas: {replicas:?}");
    for &m in &masters {
        assert_eq!(cluster.replicas_of(m).len(), 1, "replicas of {m}");
    }
    let replica = replicas[0];
    let master = cluster.master_of(replica);
    assert!(masters.contains(&master));
    let slots = cluster.slots_of(master);
    assert!(!slots.is_empty());
    let info = cluster.server(replica).cli(&["INFO", "replication"]);
    assert!(info.contains("master_link_status:up"), "{info}");

    // Manual failover: the pair swaps roles, the slots follow.
    let t = Instant::now();
    cluster.failover(replica);
    eprintln!("manual failover in {:?}", t.elapsed());
    assert!(cluster.master_ports().contains(&replica));
    assert!(cluster.replica_ports().contains(&master));
    assert_eq!(cluster.master_of(master), replica);
    assert_eq!(cluster.slots_of(replica), slots);
    assert!(cluster.slots_of(master).is_empty());
    let role = cluster.server(replica).cli(&["ROLE"]);
    assert!(role.starts_with("master"), "{role}");

    // Crash of the new master: the old one is elected back.
    let t = Instant::now();
    let promoted = cluster.kill_master_and_wait_failover(replica);
    eprintln!("failover after a kill in {:?}", t.elapsed());
    assert_eq!(promoted, master);
    assert!(cluster.master_ports().contains(&master));
    assert!(!cluster.master_ports().contains(&replica));
    assert!(!cluster.replica_ports().contains(&replica));
    assert_eq!(cluster.slots_of(master), slots);
    assert_eq!(cluster.master_ports().len(), 3);
    assert!(cluster.slot_owners().iter().all(Option::is_some));
    assert!(cluster.seed_url().starts_with("redis+cluster://127.0.0.1:"));

    // The killed node comes back (same port and cluster config) as a
    // replica of the node that replaced it.
    let t = Instant::now();
    cluster.node(replica).restart();
    cluster.wait_consistent();
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    while !cluster.replica_ports().contains(&replica) {
        assert!(
            Instant::now() < deadline,
            "{replica} did not rejoin as a replica"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    cluster.wait_consistent();
    assert_eq!(cluster.master_of(replica), master);
    eprintln!("restarted node rejoined in {:?}", t.elapsed());
    eprintln!("replicas_fail_over: {:?}", t0.elapsed());
}
