//! Creating topics and waiting until they can be used.

use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{TopicAdmin, TransportError};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tokio::time::Instant;

use crate::error::{invalid, transport};
use crate::meta::{after, blocking, topic_info, TopicInfo};
use crate::KafkaConfig;

/// How often to look at the metadata of a topic just created.
const VISIBLE_EVERY: Duration = Duration::from_millis(50);

/// Creates topics through Kafka's admin API.
pub struct KafkaAdmin {
    admin: std::sync::Arc<AdminClient<DefaultClientContext>>,
    request_timeout: Duration,
    replication: i32,
}

impl KafkaAdmin {
    /// Builds the admin client; it connects in the background.
    pub fn new(config: &KafkaConfig) -> Result<Self, TransportError> {
        let admin: AdminClient<DefaultClientContext> =
            config.admin().create().map_err(|e| transport(e, ""))?;
        Ok(Self {
            admin: std::sync::Arc::new(admin),
            request_timeout: config.request_timeout,
            replication: i32::from(config.replication_factor),
        })
    }

    async fn info(&self, topic: &str) -> Result<Option<TopicInfo>, TransportError> {
        let admin = self.admin.clone();
        let name = topic.to_owned();
        let timeout = self.request_timeout;
        blocking(move || topic_info(admin.inner(), &name, timeout).map_err(|e| transport(e, &name)))
            .await
    }

    /// Waits until every partition of `topic` has a leader, so a produce right after works.
    /// A transient metadata error of a topic just created is waited out like a missing leader.
    async fn wait_ready(&self, topic: &str) -> Result<u32, TransportError> {
        let deadline = Instant::from_std(after(self.request_timeout));
        loop {
            match self.info(topic).await {
                Ok(Some(info)) if info.ready => {
                    return u32::try_from(info.partitions.len())
                        .map_err(|_| invalid("partition count out of range"));
                }
                Ok(_) => {}
                Err(e) if e.is_transient() && Instant::now() < deadline => {}
                Err(e) => return Err(e),
            }
            if Instant::now() >= deadline {
                return Err(TransportError::unavailable(KafkaError::MetadataFetch(
                    RDKafkaErrorCode::LeaderNotAvailable,
                )));
            }
            tokio::time::sleep(VISIBLE_EVERY).await;
        }
    }
}

#[async_trait]
impl TopicAdmin for KafkaAdmin {
    async fn ensure_topic(&self, topic: &str, partitions: u32) -> Result<u32, TransportError> {
        let wanted = match i32::try_from(partitions) {
            Ok(n) if n > 0 => n,
            _ => {
                return Err(invalid(format!(
                    "a topic needs 1 to {} partitions, not {partitions}",
                    i32::MAX
                )))
            }
        };
        if topic.is_empty() {
            return Err(invalid("a topic needs a name"));
        }
        if let Some(info) = self.info(topic).await? {
            if info.ready {
                return u32::try_from(info.partitions.len())
                    .map_err(|_| invalid("partition count out of range"));
            }
        }
        let new = NewTopic::new(topic, wanted, TopicReplication::Fixed(self.replication));
        let options = AdminOptions::new()
            .request_timeout(Some(self.request_timeout))
            .operation_timeout(Some(self.request_timeout));
        let results = self
            .admin
            .create_topics([&new], &options)
            .await
            .map_err(|e| transport(e, topic))?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, code)) => return Err(transport(KafkaError::AdminOp(code), topic)),
            }
        }
        self.wait_ready(topic).await
    }
}

impl std::fmt::Debug for KafkaAdmin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaAdmin").finish_non_exhaustive()
    }
}
