//! Handler panics: caught, attributed to one message, and treated as transient failures.

use std::any::Any;
use std::panic::AssertUnwindSafe;

use entrega_core::HandlerError;
use futures::FutureExt;

use super::router::{Handler, Message};

/// A handler panicked; treated as a transient failure.
#[derive(Debug, thiserror::Error)]
#[error("handler panicked: {0}")]
struct HandlerPanicked(String);

/// A handler returned no result at all for a non-empty batch.
#[derive(Debug, thiserror::Error)]
#[error("handler returned no result")]
pub(super) struct NoResult;

/// Runs `handle_batch`, catching a panic. A panicking batch of several messages is run again
/// one by one (idempotent handlers absorb the repeats) to find the message that panics.
pub(super) async fn guarded_batch(
    handler: &dyn Handler,
    msgs: &[Message],
) -> Vec<Result<(), HandlerError>> {
    match AssertUnwindSafe(handler.handle_batch(msgs))
        .catch_unwind()
        .await
    {
        Ok(results) => results,
        Err(panic) if msgs.len() > 1 => {
            tracing::error!(panic = %panic_text(&*panic), "batch handler panicked; retrying one by one");
            one_by_one(handler, msgs).await
        }
        Err(panic) => vec![Err(panicked(&*panic))],
    }
}

/// Calls `handle` for each message, catching panics, stopping after the first transient
/// failure (the contract of `handle_batch`).
pub(super) async fn one_by_one(
    handler: &dyn Handler,
    msgs: &[Message],
) -> Vec<Result<(), HandlerError>> {
    let mut results = Vec::with_capacity(msgs.len());
    for msg in msgs {
        let result = match AssertUnwindSafe(handler.handle(msg)).catch_unwind().await {
            Ok(result) => result,
            Err(panic) => Err(panicked(&*panic)),
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

/// A caught panic as a transient failure: the bug may depend on state that changes.
fn panicked(panic: &(dyn Any + Send)) -> HandlerError {
    let text = panic_text(panic);
    tracing::error!(panic = %text, "handler panicked; retrying the message");
    HandlerError::transient(HandlerPanicked(text))
}
