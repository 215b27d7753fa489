//! The Sentinel-watched Redis set fails over from a dead primary, and takes the old primary
//! back, restarted empty, as a replica of the new one: what the fault soak relies on when
//! it kills a primary and starts it again.

use std::time::Duration;

use servers::{RedisSentinels, Tie, server_info_section};

/// TIMING: a failover takes the Sentinels' `down-after` (1 s) and an election; turning a
/// returning primary into a replica takes them a few of their 1 s and 2 s periods. A minute
/// for each holds on a busy two-core machine.
const WITHIN: Duration = Duration::from_secs(60);

#[test]
fn a_primary_restarted_empty_after_a_failover_comes_back_as_a_replica_of_the_new_one() {
    // Arrange: a primary, a replica and three Sentinels, serving.
    let mut set = RedisSentinels::try_start(1, RedisSentinels::DOWN_AFTER, Tie::Child)
        .expect("the set starts");
    let old = set.try_wait_until_serving(WITHIN).expect("the set serves");
    let old_port = set.node(old).port();

    // Act: the primary dies; once the Sentinels have failed over, it starts again, empty,
    // as a primary of its own (every node of the set does).
    set.nodes()[old].kill();
    let new = set
        .try_wait_for_failover_from(old_port, WITHIN)
        .expect("a failover");
    set.nodes()[old]
        .try_restart_empty()
        .expect("the old primary starts again");

    // Assert: the set serves with another primary (the new one, or on a slow machine the
    // old one again after a second failover, but then with the data of the new one), and
    // the other node follows it: the restarted node is no empty primary of its own.
    assert_ne!(new, old);
    let serving = set.try_wait_until_serving(WITHIN).expect("the set serves");
    let follower = 1 - serving;
    let info = server_info_section(set.node(follower).port(), "replication")
        .expect("the follower answers");
    assert!(info.contains("role:slave"), "{info}");
    assert!(
        info.contains(&format!("master_port:{}\r", set.node(serving).port())),
        "{info}"
    );
}

#[test]
fn a_node_that_was_a_replica_restarts_empty() {
    // Arrange: the set serves with a key on its primary; the replica is killed and started
    // again, and the Sentinels make it a replica once more, so that it receives a full
    // snapshot holding the key (a snapshot it would keep on disk, and load at its next
    // start, unless it deletes it).
    let mut set = RedisSentinels::try_start(1, RedisSentinels::DOWN_AFTER, Tie::Child)
        .expect("the set starts");
    let primary = set.try_wait_until_serving(WITHIN).expect("the set serves");
    let replica = 1 - primary;
    let mut conn = redis::Client::open(set.node(primary).url())
        .and_then(|client| client.get_connection())
        .expect("the primary answers");
    redis::cmd("SET")
        .arg("servers:sentinel-test:key")
        .arg("kept")
        .exec(&mut conn)
        .expect("the primary takes a write");
    set.nodes()[replica].kill();
    set.nodes()[replica]
        .try_restart_empty()
        .expect("the replica starts again");
    let serving = set.try_wait_until_serving(WITHIN).expect("the set serves");
    assert_eq!(serving, primary, "no failover: the primary stayed up");

    // Act: the replica, synchronised from a snapshot, is killed and started again.
    set.nodes()[replica].kill();
    set.nodes()[replica]
        .try_restart_empty()
        .expect("the replica starts again");

    // Assert: it came back empty (before the Sentinels make it a replica again).
    let keys: i64 = redis::Client::open(set.node(replica).url())
        .and_then(|client| client.get_connection())
        .and_then(|mut conn| redis::cmd("DBSIZE").query(&mut conn))
        .expect("the restarted node answers");
    assert_eq!(
        keys, 0,
        "the node loaded the snapshot it received as a replica"
    );
}
