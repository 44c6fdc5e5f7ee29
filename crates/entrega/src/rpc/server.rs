//! The server's side: requests of one queue handled in batches, each answered to its
//! `reply_to` with its `correlation_id`, and acknowledged only once the answer was sent.
//!
//! One task owns the queue: it reads deliveries, hands them to the lanes and settles what
//! the lanes send back (acknowledged, or given back to come again). A lane takes every
//! request waiting when it is free, up to [`RpcServerConfig::max_batch`], and hands them to
//! [`RpcHandler::answer_batch`] at once: while one batch is in the database, the next one
//! gathers, so a handler that writes its answers in one transaction commits once per batch
//! (group commit). The answers of a batch are sent by a task of their own, so a lane takes
//! its next batch while the replies of the last are still being confirmed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{HandlerError, RpcDelivery, RpcInbox, RpcMessage, RpcTransport, TransportError};
use tokio::sync::{mpsc, Mutex};
use tokio_util::sync::CancellationToken;

use super::lanes::{run_lane, Lane, Settled};
use crate::backoff::Backoff;

/// Header set on the answer to a request that failed for good; its body is
/// `{"error": "..."}`.
pub const RPC_ERROR: &str = "entrega-rpc-error";

/// How long the reader waits for requests while some are being handled: the longest an
/// acknowledgement waits to be sent.
const BUSY_WAIT: Duration = Duration::from_millis(5);
/// How long the reader waits for requests while none is being handled.
const IDLE_WAIT: Duration = Duration::from_millis(200);

/// Answers the requests of one queue.
#[async_trait]
pub trait RpcHandler: Send + Sync {
    /// The body of the answer to `request`. A transient error gives the request back to be
    /// delivered again later; a permanent one is answered with an error body
    /// ([`RPC_ERROR`]), so the caller is not left waiting.
    async fn answer(&self, request: &RpcMessage) -> Result<Vec<u8>, HandlerError>;

    /// The answers to several requests taken from the queue together, one result per
    /// request, in order. By default each is [`answer`](Self::answer)ed, all at once; a
    /// handler that stores its answers overrides it to write the batch in one transaction.
    async fn answer_batch(&self, requests: &[&RpcMessage]) -> Vec<Result<Vec<u8>, HandlerError>> {
        futures::future::join_all(requests.iter().map(|r| self.answer(r))).await
    }
}

/// Settings of one server.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RpcServerConfig {
    /// The request queue (`pagos.autorizaciones`).
    pub queue: String,
    /// This server's name among the queue's consumers.
    pub consumer: String,
    /// Requests held from the queue at once (being handled, or waiting for a lane).
    pub concurrency: usize,
    /// Batches handled at once. One lane suits a handler whose batches queue for one lock
    /// anyway (SQLite's single writer); more let a database with many connections work on
    /// several batches at once.
    pub lanes: usize,
    /// The most requests one batch holds.
    pub max_batch: usize,
    /// Wait between attempts to open the queue again after it failed.
    pub backoff: Backoff,
}

impl RpcServerConfig {
    /// Defaults for `queue`: a random consumer name, 64 requests held, 2 lanes of at most
    /// 64 requests.
    pub fn new(queue: impl Into<String>) -> Self {
        let queue = queue.into();
        Self {
            consumer: format!("{queue}-{}", uuid::Uuid::new_v4().simple()),
            queue,
            concurrency: 64,
            lanes: 2,
            max_batch: 64,
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
    /// Answers nobody could take (the requester's private queue was gone): dropped. An
    /// answer the transport took as sent and got back later counts as the next batches are
    /// answered ([`RpcTransport::undelivered`]).
    pub undeliverable: AtomicU64,
    /// Requests without `reply_to`: handled, nothing sent.
    pub unanswered: AtomicU64,
    /// Batches handed to the handler.
    pub batches: AtomicU64,
}

impl RpcServerStats {
    /// Requests answered so far.
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    /// Batches handed to the handler so far.
    pub fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }
}

/// Serves one request queue; see the module docs.
pub struct RpcServer {
    transport: Arc<dyn RpcTransport>,
    handler: Arc<dyn RpcHandler>,
    config: RpcServerConfig,
    stats: Arc<RpcServerStats>,
    opened: tokio::sync::watch::Sender<bool>,
}

impl std::fmt::Debug for RpcServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcServer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Why the reader stopped reading one opening of the queue.
enum Ended {
    /// Told to stop.
    Stopped,
    /// Reading failed: open the queue again.
    Broken,
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
            opened: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Resolves once the server has its request queue open (declared if it was missing),
    /// so a request sent from then on finds a reader's queue; resolves at once after that.
    /// Take it before [`RpcServer::run`] moves the server onto a task.
    pub fn opened(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut opened = self.opened.subscribe();
        async move {
            // An error means the server was dropped: nothing more to wait for.
            let _ = opened.wait_for(|open| *open).await;
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
        let capacity = cfg.concurrency.max(1);
        let (to_lanes, from_reader) = mpsc::channel::<RpcDelivery>(capacity);
        let (to_reader, mut settles) = mpsc::unbounded_channel::<Vec<Settled>>();
        let from_reader = Arc::new(Mutex::new(from_reader));
        let mut lanes = tokio::task::JoinSet::new();
        for _ in 0..cfg.lanes.max(1) {
            lanes.spawn(run_lane(Lane {
                transport: Arc::clone(&self.transport),
                handler: Arc::clone(&self.handler),
                stats: Arc::clone(&self.stats),
                deliveries: Arc::clone(&from_reader),
                settles: to_reader.clone(),
                max_batch: cfg.max_batch.max(1),
            }));
        }
        drop(to_reader);
        let prefetch = u16::try_from(capacity).unwrap_or(u16::MAX);
        let mut failures = 0u32;
        let outcome = loop {
            let opened = tokio::select! {
                () = stop.cancelled() => break Ok(()),
                opened = self.transport.serve(&cfg.queue, &cfg.consumer, prefetch) => opened,
            };
            let mut inbox = match opened {
                Ok(inbox) => inbox,
                Err(e) if e.is_transient() => {
                    failures = failures.saturating_add(1);
                    let delay = cfg.backoff.delay(failures);
                    tracing::warn!(queue = %cfg.queue, error = %e, ?delay, "opening the request queue failed");
                    tokio::select! {
                        () = stop.cancelled() => break Ok(()),
                        () = tokio::time::sleep(delay) => continue,
                    }
                }
                Err(e) => break Err(e),
            };
            failures = 0;
            self.opened.send_replace(true);
            let reading = Reading {
                inbox: inbox.as_mut(),
                to_lanes: &to_lanes,
                settles: &mut settles,
                capacity,
                held: 0,
            };
            match reading.run(&stop).await {
                Ended::Stopped => break Ok(()),
                Ended::Broken => {
                    tracing::warn!(queue = %cfg.queue, "reading the request queue failed; opening it again");
                }
            }
        };
        // The lanes end once the requests they were handed are done.
        drop(to_lanes);
        while lanes.join_next().await.is_some() {}
        outcome
    }
}

/// One opening of the request queue: deliveries to the lanes, settlements back.
struct Reading<'a> {
    inbox: &'a mut dyn RpcInbox,
    to_lanes: &'a mpsc::Sender<RpcDelivery>,
    settles: &'a mut mpsc::UnboundedReceiver<Vec<Settled>>,
    capacity: usize,
    /// Deliveries handed to the lanes and not settled yet.
    held: usize,
}

impl Reading<'_> {
    /// Reads until `stop` or a failure, then waits for every delivery handed out to be
    /// settled on this inbox (their tags mean nothing to another opening).
    async fn run(mut self, stop: &CancellationToken) -> Ended {
        let ended = loop {
            self.settle_ready().await;
            if stop.is_cancelled() {
                break Ended::Stopped;
            }
            let room = self.capacity.saturating_sub(self.held);
            if room == 0 {
                tokio::select! {
                    () = stop.cancelled() => break Ended::Stopped,
                    batch = self.settles.recv() => match batch {
                        Some(batch) => self.settle(batch).await,
                        None => break Ended::Stopped,
                    },
                }
                continue;
            }
            let wait = if self.held == 0 { IDLE_WAIT } else { BUSY_WAIT };
            let next = tokio::select! {
                () = stop.cancelled() => break Ended::Stopped,
                next = self.inbox.next(room, wait) => next,
            };
            match next {
                Ok(deliveries) => {
                    for delivery in deliveries {
                        self.held += 1;
                        if self.to_lanes.send(delivery).await.is_err() {
                            // No lane left (they only end with the server): nothing to do.
                            self.held -= 1;
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reading the request queue failed");
                    break Ended::Broken;
                }
            }
        };
        while self.held > 0 {
            match self.settles.recv().await {
                Some(batch) => self.settle(batch).await,
                None => break,
            }
        }
        ended
    }

    /// Settles everything the lanes sent back so far.
    async fn settle_ready(&mut self) {
        let mut all = Vec::new();
        while let Ok(batch) = self.settles.try_recv() {
            all.extend(batch);
        }
        if !all.is_empty() {
            self.settle(all).await;
        }
    }

    async fn settle(&mut self, batch: Vec<Settled>) {
        self.held = self.held.saturating_sub(batch.len());
        let mut done = Vec::with_capacity(batch.len());
        for settled in batch {
            match settled {
                Settled::Done(tag) => done.push(tag),
                Settled::Again(tag) => {
                    if let Err(e) = self.inbox.retry(tag).await {
                        tracing::warn!(error = %e, "giving a request back failed");
                    }
                }
            }
        }
        if let Err(e) = self.inbox.ack_all(&done).await {
            // The deliveries go back to the queue with the channel; their stored answers
            // make the repeats harmless.
            tracing::warn!(error = %e, "acknowledging requests failed");
        }
    }
}
