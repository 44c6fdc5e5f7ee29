//! A TCP proxy a test can cut: while cut, every open connection is closed and new ones are
//! closed as soon as they are accepted, so clients see the server as unreachable; restored,
//! it forwards again. Runs on its own thread and runtime, independent of the test's.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A cuttable proxy from a local port to `upstream`.
pub struct Proxy {
    addr: SocketAddr,
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
        let refused = Arc::new(AtomicU64::new(0));
        let (generation, gen_rx) = watch::channel(0u64);
        let (stop, stop_rx) = tokio::sync::oneshot::channel();
        let thread = {
            let cut = Arc::clone(&cut);
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
                        () = accept_loop(listener, upstream, cut, refused, gen_rx) => {}
                    }
                });
            })
        };
        Self {
            addr,
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
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            let (mut client, mut server) = (client, server);
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                _ = generation.changed() => {}
            }
        });
    }
}
