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
//! Spans that stand for one of these hops (`consume`, `rpc_answer`, and an application's own,
//! such as an HTTP request's) are `tracing` spans with `otel.name` and `otel.kind` as
//! `tracing-opentelemetry` names them, and the fields `trace_id` and `span_id` (hex), so every
//! log line inside them names its trace. Each is [`open`]ed: its ids are drawn once, by the
//! hook an application installs with [`set_span_ids`] (an OpenTelemetry SDK's ids, so the
//! `traceparent` the hop's events carry names a span the collector receives) or by entrega.

use std::borrow::Cow;
use std::future::Future;
use std::sync::OnceLock;

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

/// The ids of a hop's span, created and not yet entered, whose caller is `parent` (`None`: the
/// hop starts a trace). An application that exports spans through an SDK answers with the ids
/// the SDK gave `span`, after making `parent` its parent; `None` leaves the ids to entrega
/// (the span is not exported, or the SDK gave it none).
pub type SpanIds = fn(&tracing::Span, Option<TraceContext>) -> Option<TraceContext>;

static SPAN_IDS: OnceLock<SpanIds> = OnceLock::new();

/// [`set_span_ids`] was called before: the hook is set once per process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the span id hook is set already")]
pub struct SpanIdsAlreadySet;

/// Installs the hook every [`open`] asks for a hop's ids; once per process, before the first
/// hop.
pub fn set_span_ids(ids: SpanIds) -> Result<(), SpanIdsAlreadySet> {
    SPAN_IDS.set(ids).map_err(|_| SpanIdsAlreadySet)
}

/// The context of a hop whose span is `span` and whose caller is `parent`: the hook's ids
/// ([`set_span_ids`]) when it answers with `parent`'s trace, else a new span of `parent`'s
/// trace ([`TraceContext::child`]) or a new trace. Records them in `span`'s `trace_id` and
/// `span_id` fields. Call it before `span` is first entered.
pub fn open(span: &tracing::Span, parent: Option<TraceContext>) -> TraceContext {
    let same_trace =
        |ctx: &TraceContext| parent.is_none_or(|p| p.trace_id_bytes() == ctx.trace_id_bytes());
    let ctx = SPAN_IDS
        .get()
        .and_then(|ids| ids(span, parent))
        .filter(same_trace)
        .unwrap_or_else(|| parent.map_or_else(TraceContext::root, |p| p.child()));
    if !span.is_disabled() {
        span.record("trace_id", tracing::field::display(ctx.trace_id()));
        span.record("span_id", tracing::field::display(ctx.span_id()));
    }
    ctx
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
    fn without_a_hook_a_hop_continues_its_callers_trace_or_starts_one() {
        let parent = TraceContext::root();
        let span = tracing::info_span!("hop", trace_id = tracing::field::Empty);
        let ctx = open(&span, Some(parent));
        assert_eq!(ctx.trace_id(), parent.trace_id());
        assert_ne!(ctx.span_id(), parent.span_id());
        assert_ne!(open(&span, None).trace_id(), parent.trace_id());
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
