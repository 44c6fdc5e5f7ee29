//! Shared pieces of the tests that run against a real broker.

#![allow(dead_code)]

pub mod client_log;
pub mod namespace;

use std::time::Duration;

use entrega_core::LogInspector;
use entrega_kafka::{Kafka, KafkaConfig};

/// The broker under test: `ENTREGA_TEST_KAFKA`, default `127.0.0.1:9092`.
pub fn bootstrap() -> String {
    std::env::var("ENTREGA_TEST_KAFKA").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// Settings for tests: a 6 s session, and a member that stops polling for 8 s is taken out
/// of its group (librdkafka then leaves on its behalf), which is how a frozen process looks.
pub fn test_config() -> KafkaConfig {
    KafkaConfig::new(bootstrap())
        .with_session_timeout(Duration::from_secs(6))
        .with_request_timeout(Duration::from_secs(10))
        .with_override("max.poll.interval.ms", "8000")
}

/// A handle on the broker under test, failing loudly when it cannot be reached.
pub async fn connect(
    config: KafkaConfig,
) -> Result<Kafka, Box<dyn std::error::Error + Send + Sync>> {
    let kafka = Kafka::connect(config)?;
    // Any metadata round trip proves the broker answers; a missing topic reads as empty.
    match kafka.inspector().end_offsets("entrega.ping").await {
        Ok(_) => Ok(kafka),
        Err(e) => Err(format!(
            "Kafka broker at {} (ENTREGA_TEST_KAFKA) not usable: {e}",
            kafka.config().bootstrap
        )
        .into()),
    }
}

/// Inspector shortcut.
pub async fn ends(inspector: &dyn LogInspector, topic: &str) -> Vec<(u32, i64)> {
    inspector.end_offsets(topic).await.unwrap_or_default()
}
