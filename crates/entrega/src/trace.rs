//! One order, one trace: the W3C trace context of the work in progress, carried from an HTTP
//! request or a consumed message into every event that work enqueues.
//!
//! - An HTTP handler (or any entry point) runs its work in [`scope`] with the context of the
//!   request: [`continued`] from its `traceparent` header, or a new root.
//! - [`crate::Tx::enqueue`] writes the current context into each event's headers as
//!   `traceparent` (unless the event carries one already); the relay publishes it as a message
//!   header.
//! - The [`crate::Worker`] gives each consumed message its own span, a child of the header's
//!   ([`crate::Message::trace`]), and runs its handler in [`scope`] with it, so the events a
//!   handler enqueues, saga steps included, continue the same trace.
//!
//! Spans that stand for one of these hops (`consume`, `rpc_answer`) are `tracing` spans with
//! the fields `trace_id`, `span_id` and `parent_span_id` (hex, empty for a root), plus
//! `otel.name` and `otel.kind` as `tracing-opentelemetry` names them: a subscriber can export
//! them as they are, and every log line inside them names its trace.

use std::borrow::Cow;
use std::future::Future;

use entrega_core::{Headers, NewEvent, TraceContext, TRACEPARENT};

tokio::task_local! {
    static CURRENT: TraceContext;
}

/// Runs `fut` with `ctx` as the current trace context.
pub async fn scope<F: Future>(ctx: TraceContext, fut: F) -> F::Output {
    CURRENT.scope(ctx, fut).await
}

/// The trace context of the work in progress, if it runs inside [`scope`].
pub fn current() -> Option<TraceContext> {
    CURRENT.try_with(|ctx| *ctx).ok()
}

/// The context carried by `headers`' `traceparent`, if present and valid.
pub fn carried(headers: &Headers) -> Option<TraceContext> {
    headers
        .get(TRACEPARENT)
        .and_then(|value| TraceContext::parse(value).ok())
}

/// A new span continuing the trace of `incoming` (a `traceparent` value), or the root of a new
/// trace when there is none or it is malformed (a bad header never fails the work).
pub fn continued(incoming: Option<&str>) -> TraceContext {
    incoming
        .and_then(|value| TraceContext::parse(value).ok())
        .map_or_else(TraceContext::root, |parent| parent.child())
}

/// `events` with the current context added as `traceparent` to those that carry none;
/// borrowed unchanged outside [`scope`] or when every event has one.
pub(crate) fn stamped(events: &[NewEvent]) -> Cow<'_, [NewEvent]> {
    let Some(ctx) = current() else {
        return Cow::Borrowed(events);
    };
    if events.iter().all(|e| e.headers.get(TRACEPARENT).is_some()) {
        return Cow::Borrowed(events);
    }
    let header = ctx.header();
    Cow::Owned(
        events
            .iter()
            .map(|e| {
                let mut e = e.clone();
                if e.headers.get(TRACEPARENT).is_none() {
                    e.headers.set(TRACEPARENT, header.clone());
                }
                e
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn events_enqueued_in_a_scope_carry_its_context() {
        let ctx = TraceContext::root();
        let own = TraceContext::root().header();
        let events = vec![
            NewEvent::new("pedido", "P-1", "pedido.creado", json!({})),
            NewEvent::new("pedido", "P-1", "pedido.pagado", json!({}))
                .with_header(TRACEPARENT, own.clone()),
        ];
        assert!(
            matches!(stamped(&events), Cow::Borrowed(_)),
            "outside a scope nothing changes"
        );
        let inside = scope(ctx, async { stamped(&events).into_owned() }).await;
        assert_eq!(
            inside[0].headers.get(TRACEPARENT),
            Some(ctx.header().as_str())
        );
        assert_eq!(
            inside[1].headers.get(TRACEPARENT),
            Some(own.as_str()),
            "an event's own is kept"
        );
        assert_eq!(current(), None);
    }

    #[test]
    fn a_bad_or_missing_header_starts_a_new_trace() {
        let parent = TraceContext::root();
        let child = continued(Some(&parent.header()));
        assert_eq!(child.trace_id(), parent.trace_id());
        assert_ne!(child.span_id(), parent.span_id());
        for bad in [None, Some("not a traceparent"), Some("")] {
            assert_ne!(continued(bad).trace_id(), parent.trace_id());
        }
        let headers = Headers::new().with(TRACEPARENT, parent.header());
        assert_eq!(carried(&headers), Some(parent));
        assert_eq!(carried(&Headers::new().with(TRACEPARENT, "zz")), None);
    }
}
