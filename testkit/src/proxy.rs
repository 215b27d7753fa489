//! [`TcpProxy`]: a TCP forwarder a test can cut, to partition one client from its server
//! while every other client still reaches it.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Forwards connections from a free local port to `127.0.0.1:<target>`, one thread pair
/// per connection, until it is cut or dropped.
pub struct TcpProxy {
    port: u16,
    shared: Arc<Shared>,
}

struct Shared {
    /// While set, live connections are closed and new ones refused.
    cut: AtomicBool,
    /// Set on drop: the accept loop ends.
    stopped: AtomicBool,
    /// Both ends of every live connection, by number, to close them on a cut; a
    /// connection leaves when either end closes. A connection is only added while this is
    /// locked and `cut` is clear, so that none made during a cut survives it.
    live: Mutex<HashMap<u64, [TcpStream; 2]>>,
}

impl Shared {
    fn forget(&self, connection: u64) {
        self.live.lock().unwrap().remove(&connection);
    }
}

impl TcpProxy {
    /// Start forwarding to `target` (a port on 127.0.0.1).
    pub fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free port for the proxy");
        let port = listener.local_addr().expect("the proxy's port").port();
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let shared = Arc::new(Shared {
            cut: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            live: Mutex::new(HashMap::new()),
        });
        let accepting = Arc::clone(&shared);
        std::thread::spawn(move || accept(listener, target, accepting));
        Self { port, shared }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Close every connection through the proxy and refuse new ones, until [`heal`](Self::heal).
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
        for (_, ends) in self.shared.live.lock().unwrap().drain() {
            for end in ends {
                let _ = end.shutdown(Shutdown::Both);
            }
        }
    }

    /// Forward again.
    pub fn heal(&self) {
        self.shared.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.cut();
    }
}

fn accept(listener: TcpListener, target: u16, shared: Arc<Shared>) {
    let mut next = 0u64;
    while !shared.stopped.load(Ordering::SeqCst) {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(_) => continue,
        };
        if shared.cut.load(Ordering::SeqCst) {
            continue; // dropped: refused
        }
        let _ = client.set_nonblocking(false);
        let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
            continue;
        };
        let (Ok(client_end), Ok(server_end)) = (client.try_clone(), server.try_clone()) else {
            continue;
        };
        let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
            continue;
        };
        next += 1;
        let connection = next;
        {
            let mut live = shared.live.lock().unwrap();
            // A cut that came while this connection was being made: it must not survive.
            if shared.cut.load(Ordering::SeqCst) {
                let _ = client.shutdown(Shutdown::Both);
                let _ = server.shutdown(Shutdown::Both);
                continue;
            }
            live.insert(connection, [client_end, server_end]);
        }
        let (up, down) = (Arc::clone(&shared), Arc::clone(&shared));
        std::thread::spawn(move || {
            pump(client, server);
            up.forget(connection);
        });
        std::thread::spawn(move || {
            pump(s2, c2);
            down.forget(connection);
        });
    }
}

/// Copy `from` to `to` until either end closes.
fn pump(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that echoes each connection until it closes.
    fn echo_server() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut reader = stream.try_clone().unwrap();
                    let mut writer = stream;
                    let _ = std::io::copy(&mut reader, &mut writer);
                });
            }
        });
        port
    }

    fn live(proxy: &TcpProxy) -> usize {
        proxy.shared.live.lock().unwrap().len()
    }

    /// Waits up to 5 s for `done`.
    fn eventually(what: &str, done: impl Fn() -> bool) {
        for _ in 0..500 {
            if done() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("{what}");
    }

    #[test]
    fn a_cut_closes_live_connections_and_a_closed_one_is_forgotten() {
        // Arrange: two connections through the proxy, both answering.
        let proxy = TcpProxy::start(echo_server());
        let mut first = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
        let mut second = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
        for stream in [&mut first, &mut second] {
            stream.write_all(b"ping").unwrap();
            let mut answer = [0u8; 4];
            stream.read_exact(&mut answer).unwrap();
            assert_eq!(&answer, b"ping");
        }
        assert_eq!(live(&proxy), 2);

        // Act / Assert: a connection the client closes leaves the table.
        drop(first);
        eventually("the closed connection was not forgotten", || {
            live(&proxy) == 1
        });

        // Act / Assert: a cut closes the other one, and nothing is left.
        proxy.cut();
        second
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 4];
        assert!(matches!(second.read(&mut buf), Ok(0) | Err(_)));
        assert_eq!(live(&proxy), 0);
    }
}
