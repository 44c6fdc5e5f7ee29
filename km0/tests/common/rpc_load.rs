//! Request/reply under faults: an entrega `RpcServer` of the test's own serving a queue of
//! its own, and a client calling it in a steady stream, each call `{"n": n}` answered with its
//! own `n`. A server whose transport fails runs again; a client whose reply queue is gone
//! (`RpcError::Closed`, its node died) is replaced, as km0's pedidos does. Each call's
//! outcome is kept, with when it was made.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use entrega::rpc::{RpcClient, RpcError, RpcHandler, RpcServer, RpcServerConfig};
use entrega::{Broker, CancellationToken};
use entrega_core::{HandlerError, RpcMessage};
use serde_json::{json, Value};

/// How long a call waits for its answer.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// The pause between calls.
const EVERY: Duration = Duration::from_millis(50);

/// Answers `{"n": n}` with `{"n": n}`.
struct Echo;

#[async_trait]
impl RpcHandler for Echo {
    async fn answer(&self, request: &RpcMessage) -> Result<Vec<u8>, HandlerError> {
        let body: Value =
            serde_json::from_slice(&request.payload).map_err(HandlerError::permanent)?;
        Ok(json!({"n": body["n"]}).to_string().into_bytes())
    }
}

/// How one call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered with its own `n`.
    Answered,
    /// Answered with another call's `n`: must never happen.
    Wrong,
    /// No answer within [`CALL_TIMEOUT`].
    TimedOut,
    /// Not sent, or its client's reply queue went away.
    Failed,
}

/// What the calls did.
#[derive(Debug, Default)]
pub struct Calls {
    /// Each call: when it was made and how it ended.
    pub calls: Vec<(Instant, Outcome)>,
    /// Clients started (one more each time a reply queue was lost).
    pub clients: u32,
    /// Replies discarded by the clients: for no call in flight (after its timeout, or twice).
    pub late_replies: u64,
    /// Calls the clients counted as made, answered and timed out.
    pub counted: (u64, u64, u64),
}

impl Calls {
    /// Calls that ended as `outcome`.
    pub fn count(&self, outcome: Outcome) -> usize {
        self.calls.iter().filter(|(_, o)| *o == outcome).count()
    }

    /// Calls made in `[from, to)` that were answered.
    pub fn answered_between(&self, from: Instant, to: Instant) -> usize {
        self.calls
            .iter()
            .filter(|(at, o)| *at >= from && *at < to && *o == Outcome::Answered)
            .count()
    }
}

/// The server and the stream of calls, running until [`RpcLoad::stop`].
pub struct RpcLoad {
    stop: CancellationToken,
    server: tokio::task::JoinHandle<()>,
    client: tokio::task::JoinHandle<Calls>,
}

impl RpcLoad {
    /// Serves `queue` through `server_url` and calls it through `client_url` (each a
    /// `--broker` URL); returns once a first call was answered.
    pub async fn start(server_url: &str, client_url: &str, queue: &str) -> Self {
        let stop = CancellationToken::new();
        let server_broker = Broker::connect(server_url, Duration::from_secs(10))
            .await
            .expect("server's broker");
        let served = RpcServer::new(
            server_broker.rpc(2),
            Arc::new(Echo),
            RpcServerConfig::new(queue),
        );
        let opened = served.opened();
        let server = tokio::spawn({
            let stop = stop.clone();
            async move {
                while !stop.is_cancelled() {
                    if let Err(e) = served.run(stop.clone()).await {
                        eprintln!("rpc server ended: {e}; running it again");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
                server_broker.close().await;
            }
        });
        opened.await;
        let client_broker = Broker::connect(client_url, Duration::from_secs(10))
            .await
            .expect("client's broker");
        let (first_tx, first_rx) = tokio::sync::oneshot::channel();
        let client = tokio::spawn(calls(
            client_broker,
            queue.to_owned(),
            stop.clone(),
            first_tx,
        ));
        tokio::time::timeout(Duration::from_secs(30), first_rx)
            .await
            .expect("a first call answered within 30 s")
            .expect("the calls ran");
        Self {
            stop,
            server,
            client,
        }
    }

    /// Stops calling and serving; what the calls did.
    pub async fn stop(self) -> Calls {
        self.stop.cancel();
        let calls = self.client.await.expect("calls");
        self.server.await.expect("server");
        calls
    }
}

async fn calls(
    broker: Broker,
    queue: String,
    stop: CancellationToken,
    first: tokio::sync::oneshot::Sender<()>,
) -> Calls {
    let mut done = Calls::default();
    let mut first = Some(first);
    let mut client: Option<RpcClient> = None;
    let mut n: i64 = 0;
    let tally = |client: &RpcClient, done: &mut Calls| {
        let stats = client.stats();
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        done.late_replies += stats.late_replies();
        done.counted.0 += load(&stats.calls);
        done.counted.1 += load(&stats.answered);
        done.counted.2 += stats.timeouts();
    };
    while !stop.is_cancelled() {
        if client.is_none() {
            match RpcClient::start(broker.rpc(2)).await {
                Ok(started) => {
                    done.clients += 1;
                    client = Some(started);
                }
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            }
        }
        let Some(current) = client.as_ref() else {
            continue;
        };
        let at = Instant::now();
        let body = json!({"n": n}).to_string().into_bytes();
        let outcome = match current.call(&queue, body, CALL_TIMEOUT).await {
            Ok(reply) => {
                let reply: Value = serde_json::from_slice(&reply).unwrap_or_default();
                if reply["n"].as_i64() == Some(n) {
                    if let Some(first) = first.take() {
                        let _ = first.send(());
                    }
                    Outcome::Answered
                } else {
                    Outcome::Wrong
                }
            }
            Err(RpcError::Timeout { .. }) => Outcome::TimedOut,
            Err(RpcError::Closed) => {
                if let Some(gone) = client.take() {
                    tally(&gone, &mut done);
                }
                Outcome::Failed
            }
            Err(_) => Outcome::Failed,
        };
        done.calls.push((at, outcome));
        n += 1;
        tokio::time::sleep(EVERY).await;
    }
    if let Some(last) = client.take() {
        // Replies still on their way are counted before the tally.
        tokio::time::sleep(Duration::from_millis(500)).await;
        tally(&last, &mut done);
    }
    broker.close().await;
    done
}
