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
