//! Test support shared by the workspace's tests (a dev-dependency only).
//!
//! - [`unique_prefix`]: a key prefix no other test or run uses, for tests on the shared Redis,
//!   and [`PrefixCleanup`], which deletes what a test left under it.
//! - [`TcpProxy`]: a TCP forwarder a test can cut, to partition one client from its server.
//! - [`TestAuthority`]: a certificate authority of the test's own, for servers over TLS.
//! - The private servers of the `servers` crate, re-exported for the tests that start their
//!   own ([`RedisServer`], [`RedisCluster`], [`RedisSentinels`], [`ZooKeeperServer`],
//!   [`ZooKeeperEnsemble`], [`EtcdServer`], [`EtcdCluster`], [`PatroniCluster`]), and
//!   [`free_port`].

pub mod proxy;
pub mod tls;

pub use proxy::TcpProxy;
pub use servers::{
    EtcdCluster, EtcdServer, PatroniCluster, PostgresServer, RedisCluster, RedisSentinels,
    RedisServer, ServerCertificate, Tie, ZooKeeperEnsemble, ZooKeeperServer, etcd, free_port,
    send_signal, server_info_section, zookeeper,
};
pub use tls::TestAuthority;

/// A key prefix unique to one test run: `<label>:<random>:`.
pub fn unique_prefix(label: &str) -> String {
    format!("test:{label}:{}:", hex::encode(rand::random::<[u8; 6]>()))
}

/// Deletes every key a test left under its prefix in a Redis when dropped: lock fence
/// counters have no TTL by design, so without this each run would leave a few behind.
/// Keys are found with `SCAN`, both `<prefix>*` and `{<prefix>*` (a lock's fence key wraps
/// the lock key in a hash tag).
pub struct PrefixCleanup {
    url: String,
    prefix: String,
}

impl PrefixCleanup {
    /// Clean `prefix` in the Redis at `url` when dropped. An empty prefix cleans nothing.
    pub fn new(url: &str, prefix: &str) -> Self {
        Self {
            url: url.to_owned(),
            prefix: prefix.to_owned(),
        }
    }

    fn clean(&self) -> redis::RedisResult<()> {
        servers::forget_prefix(&self.url, &self.prefix)
    }
}

impl Drop for PrefixCleanup {
    fn drop(&mut self) {
        if self.prefix.is_empty() {
            return;
        }
        if let Err(error) = self.clean() {
            eprintln!("could not clean keys under {:?}: {error}", self.prefix);
        }
    }
}
