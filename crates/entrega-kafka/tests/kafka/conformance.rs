//! entrega-kafka against the shared log conformance suite of `entrega-testkit`, on a real
//! broker over TCP (`ENTREGA_TEST_KAFKA`, default `127.0.0.1:9092`).
//!
//! Every scenario gets its own topics and groups (a unique suffix, see `support/namespace.rs`)
//! and deletes its topics at the end. A scenario that fails shows librdkafka's debug lines
//! about its topics (`support/client_log.rs`). An unreachable broker fails every scenario with a
//! message naming the address.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{Clock, LogInspector, Publisher, Record, Subscriber, TopicAdmin};
use entrega_kafka::Kafka;
use entrega_testkit::{BoxError, LogCapabilities, LogFixture, LogHarness, LogSettings};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::ClientConfig;

use support::namespace::{Namespace, NsAdmin, NsInspector, NsPublisher, NsSubscriber};

/// Builds Kafka fixtures on the broker under test.
struct KafkaHarness;

struct KafkaLog {
    kafka: Kafka,
    ns: Namespace,
}

#[async_trait]
impl LogHarness for KafkaHarness {
    /// A join and each cooperative round take up to a few seconds, and a member that stops
    /// polling is expelled after `max.poll.interval.ms` (8 s in `test_config`):
    /// polls wait up to a second so the suite's bounded rounds span that, and a lone member
    /// is polled until its join completes.
    fn capabilities(&self) -> LogCapabilities {
        LogCapabilities::default()
            .with_poll_wait(Duration::from_secs(1))
            .with_assigned_on_first_poll(false)
            .with_leases_by_name(false)
    }

    async fn log(
        &self,
        _settings: LogSettings,
        _clock: Arc<dyn Clock>,
    ) -> Result<Box<dyn LogFixture>, BoxError> {
        support::client_log::install();
        let config =
            support::test_config().with_override("debug", support::client_log::DEBUG_CONTEXTS);
        let kafka = support::connect(config).await?;
        Ok(Box::new(KafkaLog {
            kafka,
            ns: Namespace::fresh(),
        }))
    }
}

impl KafkaLog {
    fn inspector(&self) -> NsInspector {
        NsInspector(self.kafka.inspector(), self.ns.clone())
    }

    /// Deletes this scenario's topics so the shared broker does not fill up.
    async fn delete_topics(&self) -> Result<(), BoxError> {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.kafka.config().bootstrap)
            .create()?;
        let metadata = admin
            .inner()
            .fetch_metadata(None, std::time::Duration::from_secs(10))?;
        let ours: Vec<String> = metadata
            .topics()
            .iter()
            .map(|t| t.name().to_owned())
            .filter(|name| {
                self.ns.wrap(&self.ns.unwrap(name)) == *name && self.ns.unwrap(name) != *name
            })
            .collect();
        if !ours.is_empty() {
            let names: Vec<&str> = ours.iter().map(String::as_str).collect();
            admin.delete_topics(&names, &AdminOptions::new()).await?;
        }
        Ok(())
    }
}

#[async_trait]
impl LogFixture for KafkaLog {
    fn publisher(&self) -> Arc<dyn Publisher> {
        Arc::new(NsPublisher(self.kafka.publisher(), self.ns.clone()))
    }
    fn admin(&self) -> Arc<dyn TopicAdmin> {
        Arc::new(NsAdmin(self.kafka.admin(), self.ns.clone()))
    }
    fn subscriber(&self) -> Arc<dyn Subscriber> {
        Arc::new(NsSubscriber(self.kafka.subscriber(), self.ns.clone()))
    }

    async fn committed(&self, group: &str, topic: &str) -> Result<Vec<(u32, i64)>, BoxError> {
        Ok(self.inspector().committed(group, topic).await?)
    }

    async fn end_offsets(&self, topic: &str) -> Result<Vec<(u32, i64)>, BoxError> {
        Ok(self.inspector().end_offsets(topic).await?)
    }

    async fn read(
        &self,
        topic: &str,
        partition: u32,
        from: i64,
        max: usize,
    ) -> Result<Vec<Record>, BoxError> {
        Ok(self.inspector().read(topic, partition, from, max).await?)
    }

    /// What librdkafka logged about this scenario's topics: the batches, their sequence
    /// numbers and reports, retries and errors.
    fn account(&self) -> Vec<String> {
        support::client_log::publishing(&self.ns.wrap(""), 250)
    }

    async fn teardown(self: Box<Self>) -> Result<(), BoxError> {
        if let Err(e) = self.delete_topics().await {
            eprintln!("could not delete the scenario's topics: {e}");
        }
        Ok(())
    }
}

mod log {
    entrega_testkit::log_conformance!(super::KafkaHarness);
}
