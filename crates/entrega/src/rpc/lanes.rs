//! The server's lanes: each takes the requests waiting when it is free as one batch, has
//! the handler answer them, and leaves the sending of the answers to a task of their own.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use entrega_core::{
    HandlerError, Headers, RpcDelivery, RpcMessage, RpcTransport, TraceContext, TransportError,
};
use futures::FutureExt as _;
use tokio::sync::{mpsc, Mutex};
use tracing::Instrument as _;

use super::server::{RpcHandler, RpcServerStats, RPC_ERROR};

/// What becomes of one delivery, by its tag.
pub(super) enum Settled {
    /// Answered (or needing no answer): acknowledge.
    Done(u64),
    /// Deliver it again later.
    Again(u64),
}

/// What one lane works with.
pub(super) struct Lane {
    pub transport: Arc<dyn RpcTransport>,
    pub handler: Arc<dyn RpcHandler>,
    pub stats: Arc<RpcServerStats>,
    /// The reader's deliveries, shared by the lanes: a free lane takes what waits.
    pub deliveries: Arc<Mutex<mpsc::Receiver<RpcDelivery>>>,
    pub settles: mpsc::UnboundedSender<Vec<Settled>>,
    pub max_batch: usize,
}

/// Runs one lane until the reader closes the deliveries.
pub(super) async fn run_lane(lane: Lane) {
    while let Some(batch) = take_batch(&lane.deliveries, lane.max_batch).await {
        lane.stats.batches.fetch_add(1, Ordering::Relaxed);
        let answers = answer(lane.handler.as_ref(), &batch).await;
        let (transport, stats, settles) = (
            Arc::clone(&lane.transport),
            Arc::clone(&lane.stats),
            lane.settles.clone(),
        );
        tokio::spawn(async move {
            let settled = reply_all(transport.as_ref(), &stats, batch, answers).await;
            // The reader is gone only once the server ended: nothing is left to settle.
            let _ = settles.send(settled);
        });
    }
}

/// Waits for one delivery, then takes every one waiting behind it, up to `max`.
async fn take_batch(
    deliveries: &Mutex<mpsc::Receiver<RpcDelivery>>,
    max: usize,
) -> Option<Vec<RpcDelivery>> {
    let mut deliveries = deliveries.lock().await;
    let first = deliveries.recv().await?;
    let mut batch = vec![first];
    while batch.len() < max {
        match deliveries.try_recv() {
            Ok(delivery) => batch.push(delivery),
            Err(_) => break,
        }
    }
    Some(batch)
}

/// The handler's answers to `batch`, one per delivery. A handler that panics, or answers
/// with the wrong number of results, has every request of the batch given back.
async fn answer(
    handler: &dyn RpcHandler,
    batch: &[RpcDelivery],
) -> Vec<Result<Vec<u8>, HandlerError>> {
    let requests: Vec<&RpcMessage> = batch.iter().map(|d| &d.message).collect();
    let traced: Vec<(TraceContext, tracing::Span)> =
        requests.iter().map(|r| request_span(r)).collect();
    let call = AssertUnwindSafe(handler.answer_batch(&requests)).catch_unwind();
    let answered = match traced.as_slice() {
        [(ctx, span)] => {
            crate::trace::scope(*ctx, call)
                .instrument(span.clone())
                .await
        }
        _ => call.await,
    };
    drop(traced);
    match answered {
        Ok(answers) if answers.len() == batch.len() => answers,
        Ok(answers) => {
            tracing::error!(
                requests = batch.len(),
                answers = answers.len(),
                "the handler answered a batch with the wrong number of results; it comes again"
            );
            batch.iter().map(|_| Err(miscounted())).collect()
        }
        Err(_) => {
            tracing::error!(
                requests = batch.len(),
                "the handler panicked; its batch comes again"
            );
            batch.iter().map(|_| Err(panicked())).collect()
        }
    }
}

fn miscounted() -> HandlerError {
    HandlerError::transient("the handler answered its batch with the wrong number of results")
}

fn panicked() -> HandlerError {
    HandlerError::transient("the handler panicked")
}

/// One request's way out: settled already, or an answer to send to its `reply_to`.
enum Outcome {
    Settled(Settled),
    Send {
        tag: u64,
        reply_to: String,
        reply: RpcMessage,
    },
}

/// What one answer means for its delivery, before anything is sent.
fn outcome(
    stats: &RpcServerStats,
    delivery: RpcDelivery,
    answer: Result<Vec<u8>, HandlerError>,
) -> Outcome {
    let tag = delivery.tag;
    let request = delivery.message;
    let (body, headers) = match answer {
        Ok(body) => (body, Headers::new()),
        Err(e) if e.is_transient() => {
            stats.retried.fetch_add(1, Ordering::Relaxed);
            crate::metrics::outcome(crate::metrics::RPC_SERVED, "retried");
            tracing::warn!(error = %e, "request failed for now; it comes again");
            return Outcome::Settled(Settled::Again(tag));
        }
        Err(e) => {
            stats.failed.fetch_add(1, Ordering::Relaxed);
            crate::metrics::outcome(crate::metrics::RPC_SERVED, "failed");
            let body = serde_json::json!({ "error": e.to_string() }).to_string();
            (
                body.into_bytes(),
                Headers::new().with(RPC_ERROR, "permanent"),
            )
        }
    };
    let Some(reply_to) = request.reply_to.filter(|r| !r.is_empty()) else {
        stats.unanswered.fetch_add(1, Ordering::Relaxed);
        return Outcome::Settled(Settled::Done(tag));
    };
    Outcome::Send {
        tag,
        reply_to,
        reply: RpcMessage {
            correlation_id: request.correlation_id,
            reply_to: None,
            headers,
            payload: body,
            durable: request.durable,
        },
    }
}

/// Sends the answers of one batch in one go; says what to do with each delivery.
async fn reply_all(
    transport: &dyn RpcTransport,
    stats: &RpcServerStats,
    batch: Vec<RpcDelivery>,
    answers: Vec<Result<Vec<u8>, HandlerError>>,
) -> Vec<Settled> {
    let outcomes: Vec<Outcome> = batch
        .into_iter()
        .zip(answers)
        .map(|(delivery, answer)| outcome(stats, delivery, answer))
        .collect();
    let to_send: Vec<(&str, &RpcMessage)> = outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Send {
                reply_to, reply, ..
            } => Some((reply_to.as_str(), reply)),
            Outcome::Settled(_) => None,
        })
        .collect();
    let mut sent = if to_send.is_empty() {
        Vec::new()
    } else {
        transport.send_all(&to_send).await
    }
    .into_iter();
    // Answers of earlier batches the transport took as sent and later got back.
    let undelivered = transport.undelivered().await;
    stats
        .undeliverable
        .fetch_add(undelivered, Ordering::Relaxed);
    outcomes
        .into_iter()
        .map(|o| match o {
            Outcome::Settled(settled) => settled,
            Outcome::Send { tag, reply_to, .. } => {
                let result = sent.next().unwrap_or_else(|| {
                    Err(TransportError::unavailable("the transport gave no outcome"))
                });
                settle_sent(stats, tag, &reply_to, result)
            }
        })
        .collect()
}

/// What a sent (or unsent) answer means for its delivery.
fn settle_sent(
    stats: &RpcServerStats,
    tag: u64,
    reply_to: &str,
    sent: Result<(), TransportError>,
) -> Settled {
    match sent {
        Ok(()) => {
            stats.answered.fetch_add(1, Ordering::Relaxed);
            crate::metrics::outcome(crate::metrics::RPC_SERVED, "answered");
            Settled::Done(tag)
        }
        Err(TransportError::Rejected { reason }) => {
            // A requester that gave up took its private queue with it: nobody waits.
            stats.undeliverable.fetch_add(1, Ordering::Relaxed);
            crate::metrics::outcome(crate::metrics::RPC_SERVED, "undeliverable");
            tracing::info!(%reply_to, %reason, "the requester's queue is gone; answer dropped");
            Settled::Done(tag)
        }
        Err(e) => {
            tracing::warn!(error = %e, "sending an answer failed; the request comes again");
            stats.retried.fetch_add(1, Ordering::Relaxed);
            crate::metrics::outcome(crate::metrics::RPC_SERVED, "retried");
            Settled::Again(tag)
        }
    }
}

/// The span of one request being answered, continuing the caller's trace, with the fields of
/// [`crate::trace`].
fn request_span(request: &RpcMessage) -> (TraceContext, tracing::Span) {
    let span = tracing::info_span!(
        "rpc_answer",
        otel.name = "rpc answer",
        otel.kind = "server",
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
        correlation_id = %request.correlation_id,
    );
    let ctx = crate::trace::open(&span, crate::trace::carried(&request.headers));
    (ctx, span)
}
