//! No secret in output: a password in a database or broker URL, and Kafka's SASL settings,
//! never appear in what km0 prints (the demo's header and report, logs at debug level,
//! errors), only `***` in their place. The test server trusts loopback, so a URL with a
//! password still connects, and the demo really runs on it.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use common::run_km0;

const DB_SECRET: &str = "pg-s3cret-pw";
const SASL_SECRET: &str = "sasl-hunter2";
const AMQP_SECRET: &str = "amqp-pw-x9";

/// `postgres://user@host:port` with a password added to its user information.
fn with_password(server: &str, password: &str) -> String {
    let (scheme, rest) = server.split_once("://").unwrap();
    let (user_info, host) = rest.split_once('@').unwrap();
    let user = user_info.split(':').next().unwrap();
    format!("{scheme}://{user}:{password}@{host}")
}

fn assert_clean(text: &str) {
    for secret in [DB_SECRET, SASL_SECRET, AMQP_SECRET] {
        assert!(!text.contains(secret), "`{secret}` printed:\n{text}");
    }
}

#[test]
fn the_demo_on_postgres_shows_no_password() {
    let server = with_password(&common::pg_server(), DB_SECRET);
    let prefix = format!("km0nosecret{}_", std::process::id());
    let broker = format!("{server}/{prefix}broker");
    let (ok, text) = run_km0(
        &[
            "--database",
            &server,
            "--db-prefix",
            &prefix,
            "--broker",
            &broker,
            "demo",
            "--orders",
            "3",
            "--no-saga",
            "--no-progress",
        ],
        &[("RUST_LOG", "debug")],
    );
    assert!(ok, "{text}");
    assert!(
        text.contains(":***@"),
        "the header names the server: {text}"
    );
    assert_clean(&text);
}

#[test]
fn broker_errors_and_logs_show_no_sasl_password() {
    // Nothing listens on port 1: the command fails, naming the broker without its secret.
    let kafka = format!(
        "kafka://127.0.0.1:1?request_timeout_ms=1000&security.protocol=SASL_PLAINTEXT\
         &sasl.mechanism=SCRAM-SHA-256&sasl.username=km0&sasl.password={SASL_SECRET}"
    );
    let dir = std::env::temp_dir().join(format!("km0-nosecret-{}", std::process::id()));
    let database = format!("sqlite://{}", dir.display());
    let (ok, text) = run_km0(
        &["--database", &database, "--broker", &kafka, "lag"],
        &[("RUST_LOG", "debug")],
    );
    assert!(!ok, "{text}");
    assert_clean(&text);
    // A URL km0 refuses is echoed without its password.
    let (ok, text) = run_km0(
        &[
            "--database",
            &database,
            "--broker",
            &format!("amqps2://guest:{AMQP_SECRET}@127.0.0.1:5671"),
            "lag",
        ],
        &[("RUST_LOG", "debug")],
    );
    assert!(!ok, "{text}");
    assert!(text.contains("guest:***@"), "{text}");
    assert_clean(&text);
    let _ = std::fs::remove_dir_all(&dir);
}
