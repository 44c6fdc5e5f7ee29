//! RabbitMQ over TLS (`amqps://`, rustls), on the shared broker's TLS listener (127.0.0.1:5671,
//! which `scripts/test` turns on with the suite's own certificate authority), in a virtual
//! host of the test's own: the km0 demo runs end to end trusting that CA (`tls_ca`), and a
//! client trusting another CA cannot even declare a topic.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::amqp::Vhost;
use common::tls::TestPki;

/// `amqps://guest:guest@localhost:5671/<vhost>?tls_ca=<ca>`.
fn amqps(vhost: &Vhost, ca: &str) -> String {
    let path = vhost.url();
    let name = path.rsplit('/').next().unwrap();
    format!("amqps://guest:guest@localhost:5671/{name}?tls_ca={ca}&connect_timeout_ms=3000")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_runs_over_amqps_and_a_foreign_ca_is_refused() {
    let vhost = Vhost::create();
    let dir = std::env::temp_dir().join(format!("km0-amqps-{}", uuid::Uuid::new_v4().simple()));
    let pki = TestPki::new(&dir);

    let foreign = amqps(&vhost, &pki.other_ca.display().to_string());
    let broker = entrega::Broker::connect(&foreign, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(broker.admin().ensure_topic("tls.t", 1).await.is_err());
    broker.close().await;

    let out = Command::new(env!("CARGO_BIN_EXE_km0"))
        .args([
            "--database",
            &format!("sqlite://{}", dir.join("data").display()),
        ])
        .args(["--broker", &amqps(&vhost, &common::tls::test_ca())])
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
        !text.contains("guest:guest"),
        "a password was printed:\n{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
