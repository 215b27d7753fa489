//! A TCP proxy in this process between one instance and one server (PostgreSQL or Redis), so
//! that the nemesis can slow or cut that instance's link alone.
//!
//! - `Pass`: bytes go through as they come.
//! - `Delay(d)`: each chunk read is written `d` after it was read, in order, in each
//!   direction (a round trip takes `2 d` longer; throughput is not limited).
//! - `Cut`: every open connection is closed at once, and new ones are accepted and closed
//!   straight away, until the mode changes.
//!
//! The proxy is stopped when dropped: its accept loop is aborted, and every connection ends
//! when it sees the mode's sender gone.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    Delay(Duration),
    Cut,
}

/// One proxy: listens on a port of its own on 127.0.0.1 and forwards to `target`.
pub struct Proxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listen on a free port, forwarding to `target`.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, modes) = watch::channel(Mode::Pass);
        let accept = tokio::spawn(accept_loop(listener, target, modes));
        Ok(Self { addr, mode, accept })
    }

    /// Where the instance connects.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, modes: watch::Receiver<Mode>) {
    loop {
        let inbound = match listener.accept().await {
            Ok((inbound, _)) => inbound,
            Err(_) => {
                // Out of file descriptors, say: wait, rather than spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if *modes.borrow() == Mode::Cut {
            drop(inbound);
            continue;
        }
        tokio::spawn(connection(inbound, target, modes.clone()));
    }
}

/// One connection, both ways, until either side closes or the link is cut.
async fn connection(inbound: TcpStream, target: SocketAddr, mut modes: watch::Receiver<Mode>) {
    let outbound =
        match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(target)).await {
            Ok(Ok(outbound)) => outbound,
            _ => return,
        };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (from_client, to_client) = inbound.into_split();
    let (from_server, to_server) = outbound.into_split();
    let both_ways = both(
        pump(from_client, to_server, modes.clone()),
        pump(from_server, to_client, modes.clone()),
    );
    tokio::select! {
        _ = both_ways => {}
        () = cut(&mut modes) => {}
    }
    // Dropping the halves closes both connections.
}

/// Run both directions to their end.
async fn both(a: impl Future<Output = ()>, b: impl Future<Output = ()>) {
    tokio::join!(a, b);
}

/// Returns once the link is cut (or the proxy is gone).
async fn cut(modes: &mut watch::Receiver<Mode>) {
    loop {
        if *modes.borrow_and_update() == Mode::Cut {
            return;
        }
        if modes.changed().await.is_err() {
            return;
        }
    }
}

/// Copy one direction, each chunk held back by the delay in force when it is written. On the
/// reading side's end, the writing side is shut down, so the other end sees it.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, modes: watch::Receiver<Mode>) {
    let (chunks, mut pending) = mpsc::channel::<(Instant, Vec<u8>)>(1024);
    let read = async move {
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            match from.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if chunks
                        .send((Instant::now(), buffer[..n].to_vec()))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    };
    let write = async move {
        while let Some((read_at, chunk)) = pending.recv().await {
            let delay = match *modes.borrow() {
                Mode::Delay(delay) => delay,
                Mode::Pass | Mode::Cut => Duration::ZERO,
            };
            tokio::time::sleep_until(read_at + delay).await;
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on a free port.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buffer = [0u8; 1024];
                    while let Ok(n) = socket.read(&mut buffer).await {
                        if n == 0 || socket.write_all(&buffer[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(socket: &mut TcpStream) -> std::io::Result<Duration> {
        let started = Instant::now();
        socket.write_all(b"ping").await?;
        let mut buffer = [0u8; 4];
        socket.read_exact(&mut buffer).await?;
        assert_eq!(&buffer, b"ping");
        Ok(started.elapsed())
    }

    #[tokio::test]
    async fn a_proxy_passes_delays_and_cuts_a_link() {
        let proxy = Proxy::start(echo().await).await.unwrap();
        let mut socket = TcpStream::connect(("127.0.0.1", proxy.port()))
            .await
            .unwrap();
        round_trip(&mut socket).await.unwrap();

        proxy.set(Mode::Delay(Duration::from_millis(150)));
        let slow = round_trip(&mut socket).await.unwrap();
        assert!(slow >= Duration::from_millis(300), "{slow:?}");

        proxy.set(Mode::Cut);
        let mut buffer = [0u8; 4];
        // TIMING: the cut closes the connection at once; 10 s is only the test's bound.
        let read = tokio::time::timeout(Duration::from_secs(10), socket.read(&mut buffer))
            .await
            .expect("the cut connection is closed");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        let mut refused = TcpStream::connect(("127.0.0.1", proxy.port()))
            .await
            .unwrap();
        assert!(round_trip(&mut refused).await.is_err());

        proxy.set(Mode::Pass);
        let mut again = TcpStream::connect(("127.0.0.1", proxy.port()))
            .await
            .unwrap();
        round_trip(&mut again).await.unwrap();
    }
}
