//! What the lock tests share: a connection to the shared Redis, unique keys, and throwaway
//! `redis-server` processes for tests that must kill one.

#![allow(dead_code)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use distlock::{LockOptions, Locker};
use redis::aio::ConnectionManager;

pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

pub async fn connect(url: &str) -> ConnectionManager {
    let client = redis::Client::open(url).expect("valid redis url");
    ConnectionManager::new(client)
        .await
        .unwrap_or_else(|e| panic!("cannot reach redis at {url}: {e}"))
}

/// A new connection to the shared test Redis.
pub async fn shared_redis() -> ConnectionManager {
    connect(&redis_url()).await
}

/// A key no other test (or earlier run) uses.
pub fn unique_key(test: &str) -> String {
    format!(
        "distlock-test:{test}:{}",
        hex::encode(rand::random::<[u8; 6]>())
    )
}

pub fn locker(conn: ConnectionManager, options: LockOptions) -> Locker<ConnectionManager> {
    Locker::new(conn, options)
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub async fn pttl(conn: &mut ConnectionManager, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap()
}

pub async fn get(conn: &mut ConnectionManager, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(conn).await.unwrap()
}

/// A private `redis-server` on a free port, killed (by its pid) when dropped.
pub struct RedisServer {
    child: Child,
    pub port: u16,
}

impl RedisServer {
    pub fn start() -> Self {
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on the PATH");
        let server = Self { child, port };
        server.wait_ready();
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn wait_ready(&self) {
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("redis-server on port {} did not start", self.port);
    }

    /// Kill the server now (SIGKILL) and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}
