//! The limits of km0's HTTP servers, on a real socket: a client trickling its headers is cut
//! off, a request not answered in time gets `408` (a stalled body too), requests over the
//! in-flight limit get `503` at once while the others go on, and connections over the limit
//! are closed on accept.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::{get, post};
use axum::{Json, Router};
use km0::wiring::http_server::{spawn, HttpLimits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Long enough for any honest test client, short against a stuck one.
const PATIENCE: Duration = Duration::from_secs(20);

struct Server {
    addr: SocketAddr,
    stop: CancellationToken,
    /// Permits the `/hold` handler waits for.
    gate: Arc<Semaphore>,
}

async fn start(limits: HttpLimits) -> Server {
    let gate = Arc::new(Semaphore::new(0));
    let held = Arc::clone(&gate);
    let router = Router::new()
        .route("/ok", get(|| async { "ok" }))
        .route(
            "/hold",
            get(move || {
                let gate = Arc::clone(&held);
                async move {
                    let _permit = gate.acquire().await.unwrap();
                    "released"
                }
            }),
        )
        .route(
            "/echo",
            post(|Json(body): Json<serde_json::Value>| async move { Json(body) }),
        );
    let stop = CancellationToken::new();
    let (addr, _task) = spawn(
        "127.0.0.1:0".parse().unwrap(),
        router,
        limits,
        None,
        stop.clone(),
    )
    .await
    .unwrap();
    Server { addr, stop, gate }
}

/// Sends `request` raw and reads until the server closes or `PATIENCE` passes: what was
/// read, and whether the server closed the connection.
async fn raw(addr: SocketAddr, request: &[u8]) -> (String, bool) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(PATIENCE, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    (String::from_utf8_lossy(&got).into_owned(), closed)
}

fn status(response: &str) -> u16 {
    response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trickling_its_headers_is_cut_off() {
    let server = start(HttpLimits {
        header_timeout: Duration::from_millis(300),
        ..HttpLimits::default()
    })
    .await;
    // The request line and one header, then nothing: the headers never end.
    let (got, closed) = raw(server.addr, b"GET /ok HTTP/1.1\r\nHost: km0\r\n").await;
    assert!(closed, "the connection stayed open");
    assert!(!got.contains("200 OK"), "{got}");
    // A whole request on another connection is served.
    let (got, _) = raw(
        server.addr,
        b"GET /ok HTTP/1.1\r\nHost: km0\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status(&got), 200, "{got}");
    server.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_not_answered_in_time_gets_408_a_stalled_body_too() {
    let server = start(HttpLimits {
        request_timeout: Duration::from_millis(300),
        ..HttpLimits::default()
    })
    .await;
    let (got, _) = raw(
        server.addr,
        b"GET /hold HTTP/1.1\r\nHost: km0\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status(&got), 408, "{got}");
    // A body announced as 100 bytes of which 10 arrive.
    let (got, _) = raw(
        server.addr,
        b"POST /echo HTTP/1.1\r\nHost: km0\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\nConnection: close\r\n\r\n{\"a\": 1, ",
    )
    .await;
    assert_eq!(status(&got), 408, "{got}");
    server.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_the_in_flight_limit_get_503_at_once() {
    let server = start(HttpLimits {
        max_in_flight: 2,
        ..HttpLimits::default()
    })
    .await;
    let client = reqwest::Client::new();
    let url = |path: &str| format!("http://{}{path}", server.addr);
    let held: Vec<_> = (0..2)
        .map(|_| tokio::spawn(client.get(url("/hold")).send()))
        .collect();
    // Wait until both are being handled: a third is refused, with Retry-After.
    let mut refused = None;
    for _ in 0..200 {
        let r = client.get(url("/ok")).send().await.unwrap();
        if r.status() == 503 {
            refused = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refused = refused.expect("no request was refused while two were held");
    assert_eq!(refused.headers()["retry-after"], "1");
    server.gate.add_permits(2);
    for h in held {
        let r = h.await.unwrap().unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.text().await.unwrap(), "released");
    }
    assert_eq!(client.get(url("/ok")).send().await.unwrap().status(), 200);
    server.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_are_closed_on_accept() {
    let server = start(HttpLimits {
        max_connections: 2,
        ..HttpLimits::default()
    })
    .await;
    let _a = TcpStream::connect(server.addr).await.unwrap();
    let _b = TcpStream::connect(server.addr).await.unwrap();
    let (got, closed) = raw(
        server.addr,
        b"GET /ok HTTP/1.1\r\nHost: km0\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        closed && got.is_empty(),
        "a third connection was served: {got}"
    );
    drop((_a, _b));
    // Once they are gone, a connection is served again.
    let mut served = false;
    for _ in 0..100 {
        let (got, _) = raw(
            server.addr,
            b"GET /ok HTTP/1.1\r\nHost: km0\r\nConnection: close\r\n\r\n",
        )
        .await;
        if status(&got) == 200 {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served);
    server.stop.cancel();
}
