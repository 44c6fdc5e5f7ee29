//! Requests to km0's HTTP servers, counted and timed per route and status:
//! `km0_http_requests_total{service, method, route, status}` and
//! `km0_http_request_duration_seconds{service, method, route}`. The route is the router's
//! template (`/pedidos/{id}`), never the path asked for, so an id does not become a series.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use axum::Router;
use metrics::{counter, describe_counter, describe_histogram, histogram, Unit};

/// Requests answered, by service, method, route template and status.
pub const REQUESTS: &str = "km0_http_requests_total";
/// How long answering took, by service, method and route template.
pub const DURATION: &str = "km0_http_request_duration_seconds";

/// `router` with every request to one of its routes counted and timed under `service`.
/// Requests that match no route are left out (their paths are whatever a client sent).
pub fn tracked(router: Router, service: &'static str) -> Router {
    router.route_layer(axum::middleware::from_fn(
        move |request: Request, next: Next| track(service, request, next),
    ))
}

async fn track(service: &'static str, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = request.method().as_str().to_owned();
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    histogram!(DURATION, "service" => service, "method" => method.clone(), "route" => route.clone())
        .record(started.elapsed().as_secs_f64());
    counter!(REQUESTS, "service" => service, "method" => method, "route" => route, "status" => status)
        .increment(1);
    response
}

/// `# HELP` and units of the two metrics.
pub fn describe() {
    describe_counter!(
        REQUESTS,
        "HTTP requests km0's servers answered, by service, method, route and status."
    );
    describe_histogram!(
        DURATION,
        Unit::Seconds,
        "How long km0's HTTP servers took to answer, by service, method and route."
    );
}
