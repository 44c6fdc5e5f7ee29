//! The client against a registry that drops connections: a stand-in server on loopback that
//! closes the first connections it accepts without answering, then answers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::{RegistryError, SchemaRegistry, ATTEMPTS};

/// A server that closes its first `drops` connections once it has read their request, and
/// answers every later one `200 ["s"]`. Returns its base URL and how many connections it took.
async fn dropping_server(drops: u32) -> (String, Arc<AtomicU32>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/apis/ccompat/v7", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicU32::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::spawn(async move {
                let mut request = vec![0u8; 4096];
                let _ = socket.read(&mut request).await;
                if n <= drops {
                    return;
                }
                let body = r#"["s"]"#;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            });
        }
    });
    (base, accepted)
}

#[tokio::test]
async fn a_dropped_connection_is_tried_again() {
    let (base, accepted) = dropping_server(ATTEMPTS - 1).await;
    let registry = SchemaRegistry::new(&base).unwrap();
    assert_eq!(registry.subjects().await.unwrap(), vec!["s".to_owned()]);
    assert_eq!(accepted.load(Ordering::SeqCst), ATTEMPTS);
}

#[tokio::test]
async fn a_registry_that_never_answers_is_unavailable_after_every_try() {
    let (base, accepted) = dropping_server(u32::MAX).await;
    let registry = SchemaRegistry::new(&base).unwrap();
    let error = registry.subjects().await.unwrap_err();
    assert!(
        matches!(&error, RegistryError::Unavailable { url, .. } if url.ends_with("/subjects")),
        "{error:?}"
    );
    assert_eq!(accepted.load(Ordering::SeqCst), ATTEMPTS);
}
