//! Handler panics and timeouts: caught, attributed to one message, and treated as transient
//! failures.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use entrega_core::HandlerError;
use futures::FutureExt;

use super::router::{Handler, Message};

/// A handler panicked; treated as a transient failure.
#[derive(Debug, thiserror::Error)]
#[error("handler panicked: {0}")]
struct HandlerPanicked(String);

/// A handler call ran past the worker's `handler_timeout`; treated as a transient failure.
#[derive(Debug, thiserror::Error)]
#[error("handler did not finish within {0:?}")]
struct HandlerTimedOut(Duration);

/// A handler returned no result at all for a non-empty batch.
#[derive(Debug, thiserror::Error)]
#[error("handler returned no result")]
pub(super) struct NoResult;

/// Runs `handle_batch`, catching a panic and abandoning it past `timeout`. A batch of several
/// messages that panics or times out is run again one by one (idempotent handlers absorb the
/// repeats) to find the message at fault.
pub(super) async fn guarded_batch(
    handler: &dyn Handler,
    msgs: &[Message],
    timeout: Option<Duration>,
) -> Vec<Result<(), HandlerError>> {
    let run = AssertUnwindSafe(handler.handle_batch(msgs)).catch_unwind();
    let outcome = match timeout {
        Some(limit) => tokio::time::timeout(limit, run).await.ok(),
        None => Some(run.await),
    };
    match outcome {
        Some(Ok(results)) => results,
        Some(Err(panic)) if msgs.len() > 1 => {
            tracing::error!(panic = %panic_text(&*panic), "batch handler panicked; retrying one by one");
            one_by_one(handler, msgs, timeout).await
        }
        Some(Err(panic)) => vec![Err(panicked(&*panic))],
        None if msgs.len() > 1 => {
            tracing::warn!(?timeout, "batch handler timed out; retrying one by one");
            one_by_one(handler, msgs, timeout).await
        }
        None => vec![Err(timed_out(timeout))],
    }
}

/// Calls `handle` for each message, catching panics and timeouts, stopping after the first
/// transient failure (the contract of `handle_batch`).
pub(super) async fn one_by_one(
    handler: &dyn Handler,
    msgs: &[Message],
    timeout: Option<Duration>,
) -> Vec<Result<(), HandlerError>> {
    let mut results = Vec::with_capacity(msgs.len());
    for msg in msgs {
        let run =
            AssertUnwindSafe(crate::trace::scope(msg.trace, handler.handle(msg))).catch_unwind();
        let outcome = match timeout {
            Some(limit) => tokio::time::timeout(limit, run).await.ok(),
            None => Some(run.await),
        };
        let result = match outcome {
            Some(Ok(result)) => result,
            Some(Err(panic)) => Err(panicked(&*panic)),
            None => Err(timed_out(timeout)),
        };
        let stop = matches!(&result, Err(e) if e.is_transient());
        results.push(result);
        if stop {
            break;
        }
    }
    results
}

fn panic_text(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-text panic payload".to_owned())
}

fn timed_out(timeout: Option<Duration>) -> HandlerError {
    let limit = timeout.unwrap_or_default();
    tracing::warn!(?limit, "handler timed out; retrying the message");
    HandlerError::transient(HandlerTimedOut(limit))
}

/// A caught panic as a transient failure: the bug may depend on state that changes.
fn panicked(panic: &(dyn Any + Send)) -> HandlerError {
    let text = panic_text(panic);
    tracing::error!(panic = %text, "handler panicked; retrying the message");
    HandlerError::transient(HandlerPanicked(text))
}
