//! Test support shared by the workspace's tests (a dev-dependency only).
//!
//! - [`RedisServer`]: a private `redis-server` on a free port, for tests that kill, pause or
//!   restart Redis. It is stopped by the pid it was started with, never by name.
//! - [`unique_prefix`]: a key prefix no other test or run uses, for tests on the shared Redis.
//! - [`free_port`].

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A key prefix unique to one test run: `<label>:<random>:`.
pub fn unique_prefix(label: &str) -> String {
    format!("test:{label}:{}:", hex::encode(rand::random::<[u8; 6]>()))
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A private `redis-server` (no persistence) on a port of its own, killed when dropped.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
}

impl RedisServer {
    /// Start one on a free port and wait until it accepts connections.
    pub fn start() -> Self {
        Self::start_on(free_port())
    }

    /// Start one on `port` (to restart a killed server where its clients expect it).
    pub fn start_on(port: u16) -> Self {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on the PATH");
        let server = Self {
            child: Some(child),
            port,
        };
        server.wait_ready();
        server
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn wait_ready(&self) {
        for _ in 0..400 {
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("redis-server on port {} did not start", self.port);
    }

    /// SIGKILL the server (its data is gone: it keeps nothing on disk) and reap it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kill it and start an empty one on the same port.
    pub fn restart_empty(&mut self) {
        self.kill();
        *self = Self::start_on(self.port);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
