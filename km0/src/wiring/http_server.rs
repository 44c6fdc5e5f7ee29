//! How km0 serves HTTP (pedidos, the gateway simulator, the operations endpoint), with
//! limits so a slow or stuck client holds nothing for long:
//!
//! - a request's headers must arrive within `header_timeout`, or the connection is closed
//!   (a client that opens a connection and trickles its headers holds no task for ever);
//! - a request, its body included, must be answered within `request_timeout`, or it gets
//!   `408` (its handler is dropped, so a transaction it held rolls back);
//! - at most `max_in_flight` requests are handled at once; one more gets `503` at once with
//!   `Retry-After`, rather than queueing without bound;
//! - at most `max_connections` connections are open at once; one more is closed on accept;
//! - with a certificate and key, HTTPS only (rustls), the handshake bounded like the headers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::error_handling::HandleErrorLayer;
use axum::extract::ConnectInfo;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{BoxError, Json, Router};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::limit::GlobalConcurrencyLimitLayer;
use tower::{ServiceBuilder, ServiceExt as _};

/// How long open connections get to finish once the server is told to stop.
const DRAIN: Duration = Duration::from_secs(10);

/// The limits of one HTTP server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Longest wait for a request's headers.
    pub header_timeout: Duration,
    /// Longest time to answer a request, reading its body included.
    pub request_timeout: Duration,
    /// Requests handled at once; more are refused with `503`.
    pub max_in_flight: usize,
    /// Connections open at once; more are closed on accept.
    pub max_connections: usize,
}

impl Default for HttpLimits {
    /// Headers within 10 s, answers within 30 s, 256 requests and 1,024 connections at once.
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            max_in_flight: 256,
            max_connections: 1024,
        }
    }
}

/// `router` with the request timeout and the in-flight limit of `limits`. The router wraps
/// each route in the layers, so the limit is one semaphore they all share.
pub fn limited(router: Router, limits: HttpLimits) -> Router {
    router.layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(refusal))
            .load_shed()
            .layer(GlobalConcurrencyLimitLayer::new(
                limits.max_in_flight.max(1),
            ))
            .timeout(limits.request_timeout),
    )
}

/// The answer to a request the limits stopped: `408` past its time, `503` over the limit.
async fn refusal(error: BoxError) -> Response {
    if error.is::<tower::timeout::error::Elapsed>() {
        let body = json!({"error": "the request took too long"});
        return (StatusCode::REQUEST_TIMEOUT, Json(body)).into_response();
    }
    if error.is::<tower::load_shed::error::Overloaded>() {
        let body = json!({"error": "too many requests in flight; try again"});
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            Json(body),
        )
            .into_response();
    }
    tracing::warn!(%error, "request failed in the server's layers");
    let body = json!({"error": "internal error"});
    (StatusCode::INTERNAL_SERVER_ERROR, Json(body)).into_response()
}

/// Serves `router` on `listener` with `limits` until `stop` (HTTPS when `tls` is given: a
/// handshake must finish within the header timeout); then lets open connections finish
/// their requests for a while. Handlers see the peer's address as
/// [`ConnectInfo<SocketAddr>`].
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    tls: Option<TlsAcceptor>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let router = limited(router, limits);
    let connections = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    builder.http2().timer(TokioTimer::new());
    loop {
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before accept: wait a
                    // little rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
            tracing::warn!(%peer, "too many connections; closing a new one");
            drop(stream);
            continue;
        };
        let app = router.clone();
        let service = tower::service_fn(move |mut request: axum::http::Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            app.clone().oneshot(request)
        });
        let service = TowerToHyperService::new(service);
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let tls = tls.clone();
        let handshake = limits.header_timeout;
        tokio::spawn(async move {
            let served = match tls {
                None => {
                    let conn =
                        builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                    watcher.watch(conn.into_owned()).await
                }
                Some(acceptor) => {
                    // The handshake is bounded like the headers: a client that stalls in it
                    // holds nothing for long.
                    match tokio::time::timeout(handshake, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            let conn = builder
                                .serve_connection_with_upgrades(TokioIo::new(stream), service);
                            watcher.watch(conn.into_owned()).await
                        }
                        Ok(Err(e)) => Err(e.into()),
                        Err(_) => Err("the TLS handshake took too long".into()),
                    }
                }
            };
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "connection ended");
            }
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(DRAIN) => tracing::warn!("connections still open after the drain"),
    }
    Ok(())
}

/// Binds `addr` and serves `router` on it in a task; returns the bound address and the task.
pub async fn spawn(
    addr: SocketAddr,
    router: Router,
    limits: HttpLimits,
    tls: Option<TlsAcceptor>,
    stop: CancellationToken,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<anyhow::Result<()>>)> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        serve(listener, router, limits, tls, stop)
            .await
            .context("serving HTTP")
    });
    Ok((bound, task))
}
