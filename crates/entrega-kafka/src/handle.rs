//! The cheap-clone handle that builds and shares every client of one cluster.

use std::sync::Arc;

use entrega_core::{LogInspector, Publisher, Subscriber, TopicAdmin, TransportError};

use crate::{KafkaAdmin, KafkaConfig, KafkaInspector, KafkaPublisher, KafkaSubscriber};

/// One Kafka cluster: a shared idempotent producer, an admin client, an inspector, and a
/// subscriber that makes one consumer per subscription. Clones share the clients.
#[derive(Clone)]
pub struct Kafka {
    inner: Arc<Inner>,
}

struct Inner {
    config: KafkaConfig,
    publisher: Arc<KafkaPublisher>,
    admin: Arc<KafkaAdmin>,
    subscriber: Arc<KafkaSubscriber>,
    inspector: Arc<KafkaInspector>,
}

impl Kafka {
    /// Builds the clients. Nothing here waits for the brokers: connections are made in the
    /// background, and an unreachable cluster shows as transient errors on first use. Invalid
    /// settings (an unknown librdkafka property, say) fail here as `Rejected`.
    pub fn connect(config: KafkaConfig) -> Result<Self, TransportError> {
        if config.bootstrap.trim().is_empty() {
            return Err(crate::error::invalid("no bootstrap brokers configured"));
        }
        let publisher = Arc::new(KafkaPublisher::new(&config)?);
        let admin = Arc::new(KafkaAdmin::new(&config)?);
        let subscriber = Arc::new(KafkaSubscriber::new(config.clone()));
        let inspector = Arc::new(KafkaInspector::new(config.clone()));
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                publisher,
                admin,
                subscriber,
                inspector,
            }),
        })
    }

    /// The shared publisher.
    pub fn publisher(&self) -> Arc<dyn Publisher> {
        self.inner.publisher.clone()
    }

    /// The subscriber; each subscription gets a consumer of its own.
    pub fn subscriber(&self) -> Arc<dyn Subscriber> {
        self.inner.subscriber.clone()
    }

    /// Topic creation.
    pub fn admin(&self) -> Arc<dyn TopicAdmin> {
        self.inner.admin.clone()
    }

    /// End offsets, committed offsets and direct reads.
    pub fn inspector(&self) -> Arc<dyn LogInspector> {
        self.inner.inspector.clone()
    }

    /// Deletes the topics and groups of the configured namespace; see
    /// [`KafkaAdmin::remove_namespace`].
    pub async fn remove_namespace(&self) -> Result<crate::RemovedNamespace, TransportError> {
        self.inner.admin.remove_namespace().await
    }

    /// The settings the clients were built with.
    pub fn config(&self) -> &KafkaConfig {
        &self.inner.config
    }
}

impl std::fmt::Debug for Kafka {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kafka")
            .field("bootstrap", &self.inner.config.bootstrap)
            .finish_non_exhaustive()
    }
}
