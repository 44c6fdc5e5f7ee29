//! A TCP proxy a test can cut: while cut, every open connection is closed and new ones are
//! closed as soon as they are accepted, so clients see the server as unreachable; restored,
//! it forwards again. It can also slow every chunk down by a delay (a slow network), or stop
//! moving bytes without closing anything (a black hole: packets silently dropped, nothing
//! refused; TCP's retransmissions deliver them once it heals, if the ends still wait).
//! Runs on its own thread and runtime, independent of the test's.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How bytes move: delay per chunk, and whether they move at all.
#[derive(Debug, Default)]
struct Network {
    delay_ms: AtomicU64,
    hole: watch::Sender<bool>,
    /// Chunks forwarded after a delay.
    delayed: AtomicU64,
    /// Chunks that waited in the black hole.
    swallowed: AtomicU64,
}

/// A cuttable proxy from a local port to `upstream`.
pub struct Proxy {
    addr: SocketAddr,
    network: Arc<Network>,
    cut: Arc<AtomicBool>,
    generation: watch::Sender<u64>,
    refused: Arc<AtomicU64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream`.
    pub fn start(upstream: SocketAddr) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("proxy addr");
        Self::start_on(listener, addr, upstream)
    }

    /// Forwards from `listener` (already bound, e.g. to a port chosen before the upstream
    /// server started) to `upstream`.
    pub fn start_on(
        listener: std::net::TcpListener,
        addr: SocketAddr,
        upstream: SocketAddr,
    ) -> Self {
        listener.set_nonblocking(true).expect("nonblocking");
        let cut = Arc::new(AtomicBool::new(false));
        let network = Arc::new(Network::default());
        let refused = Arc::new(AtomicU64::new(0));
        let (generation, gen_rx) = watch::channel(0u64);
        let (stop, stop_rx) = tokio::sync::oneshot::channel();
        let thread = {
            let cut = Arc::clone(&cut);
            let network = Arc::clone(&network);
            let refused = Arc::clone(&refused);
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("proxy runtime");
                rt.block_on(async move {
                    let listener = TcpListener::from_std(listener).expect("tokio listener");
                    tokio::select! {
                        _ = stop_rx => {}
                        () = accept_loop(listener, upstream, cut, refused, gen_rx, network) => {}
                    }
                });
            })
        };
        Self {
            addr,
            network,
            cut,
            generation,
            refused,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The proxy's own address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every open connection and refuses new ones until [`Proxy::restore`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Forwards new connections again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    /// Holds every chunk `delay` before forwarding it, both ways (zero: no delay).
    pub fn slow(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.network.delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Stops moving bytes, both ways, on every connection, without closing any: what a
    /// network that silently drops packets looks like to both ends.
    pub fn black_hole(&self) {
        self.network.hole.send_replace(true);
    }

    /// Moves bytes again at full speed: the black hole closes, the delay goes.
    pub fn heal(&self) {
        self.network.delay_ms.store(0, Ordering::SeqCst);
        self.network.hole.send_replace(false);
    }

    /// Chunks forwarded after a delay so far.
    pub fn delayed(&self) -> u64 {
        self.network.delayed.load(Ordering::SeqCst)
    }

    /// Chunks that waited in a black hole so far.
    pub fn swallowed(&self) -> u64 {
        self.network.swallowed.load(Ordering::SeqCst)
    }

    /// Connections closed at once because the proxy was cut (clients kept trying).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    cut: Arc<AtomicBool>,
    refused: Arc<AtomicU64>,
    generation: watch::Receiver<u64>,
    network: Arc<Network>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if cut.load(Ordering::SeqCst) {
            refused.fetch_add(1, Ordering::SeqCst);
            drop(client);
            continue;
        }
        let mut generation = generation.clone();
        generation.mark_unchanged();
        let network = Arc::clone(&network);
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::select! {
                () = pump(client_read, server_write, &network) => {}
                () = pump(server_read, client_write, &network) => {}
                _ = generation.changed() => {}
            }
        });
    }
}

/// Copies `from` to `to` chunk by chunk, each after the network's delay, none while it is a
/// black hole (the chunk waits, and nothing more is read, so the sender's buffers fill).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    network: &Network,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut hole = network.hole.subscribe();
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if *hole.borrow_and_update() {
            network.swallowed.fetch_add(1, Ordering::SeqCst);
            while *hole.borrow_and_update() {
                if hole.changed().await.is_err() {
                    return;
                }
            }
        }
        let delay = network.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            network.delayed.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
