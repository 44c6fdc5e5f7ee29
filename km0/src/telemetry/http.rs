//! W3C trace context over HTTP: a middleware that runs each request in its own span of the
//! caller's trace (or of a new one) and answers with that span's `traceparent`, and the header
//! for outgoing calls.

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use entrega::{TraceContext, TRACEPARENT};
use tracing::Instrument as _;

/// Axum middleware (`axum::middleware::from_fn(traced)`): the request's work runs in
/// [`entrega::trace::scope`] with a child of its `traceparent` (a new root without one, or
/// with a malformed one), inside a `http` span with the trace fields; the answer carries the
/// span's own `traceparent`, so a caller learns the trace of what it started.
pub async fn traced(request: Request, next: Next) -> Response {
    let incoming = request
        .headers()
        .get(TRACEPARENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| TraceContext::parse(v).ok());
    let route = request.extensions().get::<MatchedPath>().map_or_else(
        || request.uri().path().to_owned(),
        |p| p.as_str().to_owned(),
    );
    let span = tracing::info_span!(
        "http",
        otel.name = %format!("{} {route}", request.method()),
        otel.kind = "server",
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
        http.method = %request.method(),
        http.route = %route,
        http.status_code = tracing::field::Empty,
    );
    let ctx = entrega::trace::open(&span, incoming);
    let mut response = entrega::trace::scope(ctx, next.run(request))
        .instrument(span.clone())
        .await;
    span.record("http.status_code", response.status().as_u16());
    if let Ok(value) = HeaderValue::from_str(&ctx.header()) {
        response.headers_mut().insert(TRACEPARENT, value);
    }
    response
}

/// `request` with the current trace context as `traceparent`, for a call to another service.
pub fn outgoing(request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    match entrega::trace::current() {
        Some(ctx) => request.header(TRACEPARENT, ctx.header()),
        None => request,
    }
}
