//! Private servers on free ports of 127.0.0.1, for the workspace's tests and for `loadtest`
//! (the demo, the soak, the bench): one set of launchers, so that what it takes to start
//! each server, and to know that what answers on its port is it, is written once.
//!
//! - [`RedisServer`] (`redis.rs`): a `redis-server` keeping nothing on disk;
//!   [`RedisCluster`]: masters joined with `redis-cli --cluster create`.
//! - [`RedisSentinels`] (`sentinel.rs`): a primary, replicas and three Sentinels that fail
//!   over, as production runs Redis.
//! - [`PostgresServer`] (`postgres.rs`): `initdb` into a temporary directory and `postgres`.
//! - [`ZooKeeperServer`] and [`ZooKeeperEnsemble`] (`zookeeper.rs`): JVMs running
//!   `QuorumPeerMain` from Debian's jars, standalone or as a quorum.
//! - [`EtcdServer`] and [`EtcdCluster`] (`etcd.rs`): one member, or members joined by a
//!   static `--initial-cluster`.
//! - [`PatroniCluster`] (`patroni/`): three PostgreSQL members that fail over, each run
//!   by Patroni with a private etcd as its store, and HAProxy in front of the primary.
//! - [`ServerCertificate`] (`tls.rs`): what [`PostgresServer::start_tls_only`],
//!   [`RedisServer::start_tls`] and [`EtcdServer::start_tls`] present over TLS.
//! - `process.rs`: how each process is spawned, tied to this one ([`Tie`]), signalled and
//!   reaped.
//!
//! What every launcher assumes and keeps:
//! - The server is installed the way Debian installs it (a binary on the PATH, or Debian's
//!   paths); a launcher that cannot find it says what to install.
//! - Ports are picked free and then bound by the server, so another process may take one in
//!   between: each launcher checks that what answers is its own server (a pid, a data
//!   directory, a member name), and starts again on new ports when a port was taken.
//! - A server is stopped by the pid it was started with, never by name, and its temporary
//!   directory removed, when its handle is dropped.
//!
//! The constructors named `start` panic with what went wrong, for tests; those named
//! `try_start` (and [`PostgresServer::start`]) return an [`Error`], for programs.

pub mod etcd;
pub mod patroni;
mod postgres;
mod process;
mod redis;
mod sentinel;
mod tls;
pub mod zookeeper;

pub use etcd::{EtcdCluster, EtcdServer};
pub use patroni::PatroniCluster;
pub use postgres::PostgresServer;
pub use process::{Tie, find as find_program, send_signal};
pub use redis::{RedisCluster, RedisServer, forget_prefix, server_info_section};
pub use sentinel::RedisSentinels;
pub use tls::ServerCertificate;
pub use zookeeper::{ZooKeeperEnsemble, ZooKeeperServer};

use std::net::TcpListener;

/// Why a server did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server, or something it needs, is not installed: the message says what to install.
    #[error("{0}")]
    NotInstalled(String),
    /// It was started but did not serve: the message says why, with the end of its log when
    /// it keeps one.
    #[error("{0}")]
    NotServing(String),
    /// A file or a process could not be made.
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How many times a start is tried on new ports before it is given up: a port is only lost
/// to a race with another process, so one retry is almost always enough.
const ATTEMPTS: usize = 5;

/// A port nobody listens on right now.
///
/// # Panics
/// If the system has no free port.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `n` distinct ports nobody listens on right now: all held at once while picked, so that
/// none is picked twice.
///
/// # Panics
/// If the system has not `n` free ports.
pub fn distinct_free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("a bound port").port())
        .collect()
}

/// An [`Error::Io`] saying what was being done.
fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}
