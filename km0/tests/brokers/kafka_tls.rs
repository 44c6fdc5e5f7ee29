//! Kafka over TLS, on an Apache Kafka broker of its own serving `SSL` and `SASL_SSL`
//! (SCRAM-SHA-256) listeners with a certificate of the test's own CA: entrega publishes and
//! reads over `SSL`, the km0 demo runs end to end over `SASL_SSL` (relay, consumers, topic
//! creation) without printing the password, and a wrong password or a CA that did not sign
//! the broker's certificate is refused.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::process::Command;
use std::time::Duration;

use entrega::Broker;
use entrega_core::{Headers, OutgoingMessage};

use common::kafka::{KafkaBroker, Secure};
use common::tls::TestPki;

const USER: &str = "km0";
const PASSWORD: &str = "scram-pw-7f3a9c";

fn sasl_url(port: u16, password: &str, ca: &std::path::Path) -> String {
    format!(
        "kafka://localhost:{port}?security.protocol=SASL_SSL&sasl.mechanism=SCRAM-SHA-256\
         &sasl.username={USER}&sasl.password={password}&ssl.ca.location={}\
         &request_timeout_ms=5000&delivery_timeout_ms=10000&session_timeout_ms=6000",
        ca.display()
    )
}

fn ssl_url(port: u16, ca: &std::path::Path) -> String {
    format!(
        "kafka://localhost:{port}?security.protocol=SSL&ssl.ca.location={}\
         &request_timeout_ms=5000&delivery_timeout_ms=10000",
        ca.display()
    )
}

/// Creates `topic`, publishes one record and reads the topic's end offset back.
async fn round_trip(url: &str, topic: &str) -> Result<i64, String> {
    let broker = Broker::connect(url, Duration::from_secs(10))
        .await
        .map_err(|e| e.to_string())?;
    broker
        .admin()
        .ensure_topic(topic, 1)
        .await
        .map_err(|e| e.to_string())?;
    let message = OutgoingMessage {
        topic: topic.to_owned(),
        key: Some("K".to_owned()),
        headers: Headers::new(),
        payload: b"{}".to_vec(),
    };
    broker
        .publisher()
        .publish(&[message])
        .await
        .map_err(|e| e.to_string())?;
    let ends = broker
        .inspector()
        .end_offsets(topic)
        .await
        .map_err(|e| e.to_string())?;
    broker.close().await;
    Ok(ends.iter().map(|(_, end)| *end).sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_over_ssl_and_sasl_ssl_with_scram() {
    let dir = std::env::temp_dir().join(format!("km0-kafka-tls-{}", uuid::Uuid::new_v4().simple()));
    let pki = TestPki::new(&dir);
    let kafka = KafkaBroker::start_secure(&Secure {
        cert: pki.cert.clone(),
        key: pki.key.clone(),
        scram: (USER.to_owned(), PASSWORD.to_owned()),
    });
    let ports = kafka.secure_ports();

    assert_eq!(
        round_trip(&ssl_url(ports.ssl, &pki.ca), "tls.ssl").await,
        Ok(1)
    );
    assert_eq!(
        round_trip(&sasl_url(ports.sasl_ssl, PASSWORD, &pki.ca), "tls.sasl").await,
        Ok(1)
    );
    // Refused: a wrong password, and a CA that did not sign the broker's certificate.
    assert!(round_trip(
        &sasl_url(ports.sasl_ssl, "not-the-password", &pki.ca),
        "tls.x"
    )
    .await
    .is_err());
    assert!(round_trip(&ssl_url(ports.ssl, &pki.other_ca), "tls.y")
        .await
        .is_err());

    // The demo end to end over SASL_SSL; its output never shows the password.
    let data = dir.join("data");
    let out = Command::new(env!("CARGO_BIN_EXE_km0"))
        .args(["--database", &format!("sqlite://{}", data.display())])
        .args(["--broker", &sasl_url(ports.sasl_ssl, PASSWORD, &pki.ca)])
        .args(["demo", "--orders", "20", "--no-saga", "--no-progress"])
        .env_remove("KM0_DATABASE")
        .env_remove("KM0_BROKER")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(
        !text.contains(PASSWORD),
        "the password was printed:\n{text}"
    );
    drop(kafka);
    let _ = std::fs::remove_dir_all(&dir);
}
