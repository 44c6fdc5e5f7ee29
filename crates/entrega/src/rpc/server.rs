//! The server's side: requests of one queue handled concurrently, each answered to its
//! `reply_to` with its `correlation_id`, and acknowledged only once the answer was sent.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{HandlerError, Headers, RpcDelivery, RpcMessage, RpcTransport, TransportError};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;

/// Header set on the answer to a request that failed for good; its body is
/// `{"error": "..."}`.
pub const RPC_ERROR: &str = "entrega-rpc-error";

/// Answers the requests of one queue.
#[async_trait]
pub trait RpcHandler: Send + Sync {
    /// The body of the answer to `request`. A transient error gives the request back to be
    /// delivered again later; a permanent one is answered with an error body
    /// ([`RPC_ERROR`]), so the caller is not left waiting.
    async fn answer(&self, request: &RpcMessage) -> Result<Vec<u8>, HandlerError>;
}

/// Settings of one server.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RpcServerConfig {
    /// The request queue (`pagos.autorizaciones`).
    pub queue: String,
    /// This server's name among the queue's consumers.
    pub consumer: String,
    /// Requests handled at once (and held from the queue).
    pub concurrency: usize,
    /// Wait between attempts to open the queue again after it failed.
    pub backoff: Backoff,
}

impl RpcServerConfig {
    /// Defaults for `queue`: a random consumer name, 64 requests at once.
    pub fn new(queue: impl Into<String>) -> Self {
        let queue = queue.into();
        Self {
            consumer: format!("{queue}-{}", uuid::Uuid::new_v4().simple()),
            queue,
            concurrency: 64,
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(5)),
        }
    }
}

/// What a server did, shared through an `Arc`.
#[derive(Debug, Default)]
pub struct RpcServerStats {
    /// Requests answered (the answer sent, the request acknowledged).
    pub answered: AtomicU64,
    /// Requests that failed for good and were answered with an error body.
    pub failed: AtomicU64,
    /// Requests given back after a transient failure.
    pub retried: AtomicU64,
    /// Answers nobody could take (the requester's private queue was gone): dropped.
    pub undeliverable: AtomicU64,
    /// Requests without `reply_to`: handled, nothing sent.
    pub unanswered: AtomicU64,
}

impl RpcServerStats {
    /// Requests answered so far.
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }
}

/// Serves one request queue; see the module docs.
pub struct RpcServer {
    transport: Arc<dyn RpcTransport>,
    handler: Arc<dyn RpcHandler>,
    config: RpcServerConfig,
    stats: Arc<RpcServerStats>,
}

impl std::fmt::Debug for RpcServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcServer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// What became of one request.
enum Settled {
    /// Answered (or needing no answer): acknowledge.
    Done,
    /// Deliver it again later.
    Again,
}

impl RpcServer {
    /// A server answering `config.queue` with `handler`.
    pub fn new(
        transport: Arc<dyn RpcTransport>,
        handler: Arc<dyn RpcHandler>,
        config: RpcServerConfig,
    ) -> Self {
        Self {
            transport,
            handler,
            config,
            stats: Arc::default(),
        }
    }

    /// The server's counters.
    pub fn stats(&self) -> Arc<RpcServerStats> {
        Arc::clone(&self.stats)
    }

    /// Serves until `stop`, then finishes the requests in hand. The queue is opened again,
    /// after a backoff, whenever reading it fails; a permanent failure to open it (refused
    /// by the broker) ends the server with that error.
    pub async fn run(&self, stop: CancellationToken) -> Result<(), TransportError> {
        let cfg = &self.config;
        let prefetch = u16::try_from(cfg.concurrency.max(1)).unwrap_or(u16::MAX);
        let mut failures = 0u32;
        loop {
            let opened = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                opened = self.transport.serve(&cfg.queue, &cfg.consumer, prefetch) => opened,
            };
            let mut inbox = match opened {
                Ok(inbox) => inbox,
                Err(e) if e.is_transient() => {
                    failures = failures.saturating_add(1);
                    let delay = cfg.backoff.delay(failures);
                    tracing::warn!(queue = %cfg.queue, error = %e, ?delay, "opening the request queue failed");
                    tokio::select! {
                        () = stop.cancelled() => return Ok(()),
                        () = tokio::time::sleep(delay) => continue,
                    }
                }
                Err(e) => return Err(e),
            };
            failures = 0;
            let mut running: JoinSet<(u64, Settled)> = JoinSet::new();
            let stopped = loop {
                while let Some(done) = running.try_join_next() {
                    if let Ok((tag, settled)) = done {
                        settle(inbox.as_mut(), tag, settled).await;
                    }
                }
                if stop.is_cancelled() {
                    break true;
                }
                let room = cfg.concurrency.max(1).saturating_sub(running.len());
                if room == 0 {
                    if let Some(Ok((tag, settled))) = running.join_next().await {
                        settle(inbox.as_mut(), tag, settled).await;
                    }
                    continue;
                }
                // Short waits while requests run, so their acknowledgements are not held up.
                let wait = if running.is_empty() {
                    Duration::from_millis(200)
                } else {
                    Duration::from_millis(20)
                };
                let next = tokio::select! {
                    () = stop.cancelled() => break true,
                    next = inbox.next(room, wait) => next,
                };
                match next {
                    Ok(deliveries) => {
                        for delivery in deliveries {
                            running.spawn(handle(
                                self.transport.clone(),
                                self.handler.clone(),
                                self.stats.clone(),
                                delivery,
                            ));
                        }
                    }
                    Err(e) => {
                        tracing::warn!(queue = %cfg.queue, error = %e, "reading the request queue failed; opening it again");
                        break false;
                    }
                }
            };
            // Requests in hand finish; their deliveries are settled on this inbox.
            while let Some(done) = running.join_next().await {
                if let Ok((tag, settled)) = done {
                    settle(inbox.as_mut(), tag, settled).await;
                }
            }
            if stopped {
                return Ok(());
            }
        }
    }
}

async fn settle(inbox: &mut dyn entrega_core::RpcInbox, tag: u64, settled: Settled) {
    let outcome = match settled {
        Settled::Done => inbox.ack(tag).await,
        Settled::Again => inbox.retry(tag).await,
    };
    if let Err(e) = outcome {
        // The delivery goes back to the queue with the channel; its stored answer makes the
        // repeat harmless.
        tracing::warn!(error = %e, "settling a request failed");
    }
}

/// Handles one request and sends its answer; says what to do with its delivery.
async fn handle(
    transport: Arc<dyn RpcTransport>,
    handler: Arc<dyn RpcHandler>,
    stats: Arc<RpcServerStats>,
    delivery: RpcDelivery,
) -> (u64, Settled) {
    let tag = delivery.tag;
    let request = delivery.message;
    let (body, headers) = match handler.answer(&request).await {
        Ok(body) => (body, Headers::new()),
        Err(e) if e.is_transient() => {
            stats.retried.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, "request failed for now; it comes again");
            return (tag, Settled::Again);
        }
        Err(e) => {
            stats.failed.fetch_add(1, Ordering::Relaxed);
            let body = serde_json::json!({ "error": e.to_string() }).to_string();
            (
                body.into_bytes(),
                Headers::new().with(RPC_ERROR, "permanent"),
            )
        }
    };
    let Some(reply_to) = request.reply_to.filter(|r| !r.is_empty()) else {
        stats.unanswered.fetch_add(1, Ordering::Relaxed);
        return (tag, Settled::Done);
    };
    let reply = RpcMessage {
        correlation_id: request.correlation_id,
        reply_to: None,
        headers,
        payload: body,
        durable: request.durable,
    };
    match transport.send(&reply_to, &reply, None).await {
        Ok(()) => {
            stats.answered.fetch_add(1, Ordering::Relaxed);
            (tag, Settled::Done)
        }
        Err(TransportError::Rejected { reason }) => {
            // A requester that gave up took its private queue with it: nobody waits.
            stats.undeliverable.fetch_add(1, Ordering::Relaxed);
            tracing::info!(%reply_to, %reason, "the requester's queue is gone; answer dropped");
            (tag, Settled::Done)
        }
        Err(e) => {
            tracing::warn!(error = %e, "sending an answer failed; the request comes again");
            stats.retried.fetch_add(1, Ordering::Relaxed);
            (tag, Settled::Again)
        }
    }
}
