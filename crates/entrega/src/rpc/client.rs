//! The requester's side: many calls in flight on one reply queue, each with its own timeout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use entrega_core::{Headers, RpcInbox, RpcMessage, RpcTransport, TransportError, TRACEPARENT};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// Why a call got no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    /// No reply within the call's timeout. The request may still be handled: call again
    /// with the same request key, and the server answers with its stored answer.
    #[error("no reply from `{queue}` within {timeout:?}")]
    Timeout {
        /// The request queue.
        queue: String,
        /// The call's timeout.
        timeout: Duration,
    },
    /// The request could not be sent (no such queue, broker unreachable).
    #[error("sending the request failed")]
    Send(#[from] TransportError),
    /// The client's reply queue failed (its connection was lost): start a new client.
    #[error("the client's reply queue is gone; start a new client")]
    Closed,
}

/// What a client did, shared through an `Arc`.
#[derive(Debug, Default)]
pub struct RpcClientStats {
    /// Calls made.
    pub calls: AtomicU64,
    /// Calls answered in time.
    pub answered: AtomicU64,
    /// Calls that timed out.
    pub timeouts: AtomicU64,
    /// Replies that came for no call in flight (after its timeout, or twice): discarded.
    pub late_replies: AtomicU64,
    /// Set once the reply queue failed: the client answers no call any more.
    pub closed: std::sync::atomic::AtomicBool,
}

impl RpcClientStats {
    /// Late replies discarded so far.
    pub fn late_replies(&self) -> u64 {
        self.late_replies.load(Ordering::Relaxed)
    }

    /// Calls that timed out so far.
    pub fn timeouts(&self) -> u64 {
        self.timeouts.load(Ordering::Relaxed)
    }
}

type Pending = Arc<Mutex<HashMap<String, oneshot::Sender<RpcMessage>>>>;

/// A requester: one private reply queue, read by one background task that hands each reply
/// to the call waiting for its correlation id. A call that times out takes its entry out at
/// once, so a reply that comes later finds none and is counted as late, never kept.
pub struct RpcClient {
    transport: Arc<dyn RpcTransport>,
    reply_to: String,
    pending: Pending,
    stats: Arc<RpcClientStats>,
    stop: CancellationToken,
}

impl std::fmt::Debug for RpcClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcClient")
            .field("reply_to", &self.reply_to)
            .finish_non_exhaustive()
    }
}

/// Most replies the reply task takes per read.
const REPLY_BATCH: usize = 256;
/// Longest wait of one read of the reply queue.
const REPLY_WAIT: Duration = Duration::from_millis(200);

impl RpcClient {
    /// Opens a private reply queue on `transport` and starts reading it.
    pub async fn start(transport: Arc<dyn RpcTransport>) -> Result<Self, TransportError> {
        let inbox = transport.replies(None).await?;
        let reply_to = inbox.address().to_owned();
        let pending: Pending = Arc::default();
        let stats = Arc::new(RpcClientStats::default());
        let stop = CancellationToken::new();
        tokio::spawn(pump(inbox, pending.clone(), stats.clone(), stop.clone()));
        Ok(Self {
            transport,
            reply_to,
            pending,
            stats,
            stop,
        })
    }

    /// The client's counters.
    pub fn stats(&self) -> Arc<RpcClientStats> {
        Arc::clone(&self.stats)
    }

    /// Calls in flight right now.
    pub fn in_flight(&self) -> usize {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// The reply queue's address.
    pub fn reply_to(&self) -> &str {
        &self.reply_to
    }

    /// Sends `payload` to `queue` and waits up to `timeout` for the reply's body. The
    /// request expires at the broker after `timeout` too, so a server that is behind does not
    /// handle calls nobody waits for any more.
    pub async fn call(
        &self,
        queue: &str,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, RpcError> {
        self.call_with(queue, Headers::new(), payload, timeout)
            .await
            .map(|reply| reply.payload)
    }

    /// [`RpcClient::call`] with headers, returning the whole reply.
    pub async fn call_with(
        &self,
        queue: &str,
        headers: Headers,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<RpcMessage, RpcError> {
        if self.stats.closed.load(Ordering::SeqCst) {
            return Err(RpcError::Closed);
        }
        self.stats.calls.fetch_add(1, Ordering::Relaxed);
        let correlation_id = uuid::Uuid::new_v4().to_string();
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(correlation_id.clone(), tx);
        let request = RpcMessage {
            correlation_id: correlation_id.clone(),
            reply_to: Some(self.reply_to.clone()),
            headers: traced(headers),
            payload,
            durable: false,
        };
        let forget = || {
            self.pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&correlation_id);
        };
        // The reply is the proof the request arrived: wait for it and for the broker's confirm
        // at once, so the confirm adds no round trip; a refused send still fails the call.
        let waiting = async {
            let send = self.transport.send(queue, &request, Some(timeout));
            tokio::pin!(send);
            let mut rx = rx;
            tokio::select! {
                sent = &mut send => match sent {
                    Err(e) => Err(Some(e)),
                    Ok(()) => (&mut rx).await.map_err(|_| None),
                },
                reply = &mut rx => reply.map_err(|_| None),
            }
        };
        match tokio::time::timeout(timeout, waiting).await {
            Ok(Err(Some(e))) => {
                forget();
                Err(e.into())
            }
            Ok(Ok(reply)) => {
                self.stats.answered.fetch_add(1, Ordering::Relaxed);
                crate::metrics::outcome(crate::metrics::RPC_CALLS, "answered");
                Ok(reply)
            }
            Ok(Err(None)) => {
                forget();
                Err(RpcError::Closed)
            }
            Err(_) => {
                forget();
                self.stats.timeouts.fetch_add(1, Ordering::Relaxed);
                crate::metrics::outcome(crate::metrics::RPC_CALLS, "timed_out");
                Err(RpcError::Timeout {
                    queue: queue.to_owned(),
                    timeout,
                })
            }
        }
    }
}

impl Drop for RpcClient {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Reads the reply queue until `stop`: each reply goes to the call waiting for it, or is
/// counted as late and dropped; every reply is acknowledged.
async fn pump(
    mut inbox: Box<dyn RpcInbox>,
    pending: Pending,
    stats: Arc<RpcClientStats>,
    stop: CancellationToken,
) {
    loop {
        let replies = tokio::select! {
            () = stop.cancelled() => break,
            replies = inbox.next(REPLY_BATCH, REPLY_WAIT) => replies,
        };
        let replies = match replies {
            Ok(replies) => replies,
            Err(e) => {
                // The private queue is gone with its channel: calls in flight time out.
                tracing::warn!(error = %e, "reading the reply queue failed; the client stops");
                break;
            }
        };
        for reply in replies {
            let waiting = pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&reply.message.correlation_id);
            match waiting {
                Some(tx) => {
                    if tx.send(reply.message).is_err() {
                        stats.late_replies.fetch_add(1, Ordering::Relaxed);
                        metrics::counter!(crate::metrics::RPC_LATE_REPLIES).increment(1);
                    }
                }
                None => {
                    stats.late_replies.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!(crate::metrics::RPC_LATE_REPLIES).increment(1);
                }
            }
            if let Err(e) = inbox.ack(reply.tag).await {
                tracing::warn!(error = %e, "acknowledging a reply failed");
            }
        }
    }
    // Calls still waiting learn at once that no reply will come through this client.
    stats.closed.store(true, Ordering::SeqCst);
    pending
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clear();
}

/// `headers` with the current trace context as `traceparent`, unless they carry one.
fn traced(mut headers: Headers) -> Headers {
    if headers.get(TRACEPARENT).is_none() {
        if let Some(ctx) = crate::trace::current() {
            headers.set(TRACEPARENT, ctx.header());
        }
    }
    headers
}
