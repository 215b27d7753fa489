//! [`TcpProxy`]: a TCP forwarder a test can cut, to partition one client from its server
//! while every other client still reaches it.

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
    /// Both ends of every live connection, to close them on a cut.
    live: Mutex<Vec<TcpStream>>,
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
            live: Mutex::new(Vec::new()),
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
        for stream in self.shared.live.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
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
        {
            let mut live = shared.live.lock().unwrap();
            live.push(client_end);
            live.push(server_end);
        }
        let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
            continue;
        };
        std::thread::spawn(move || pump(client, server));
        std::thread::spawn(move || pump(s2, c2));
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
