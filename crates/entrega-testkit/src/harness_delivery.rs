//! What a transport provides so the delivery suite ([`crate::delivery`]) can run on it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{Publisher, Subscriber, Subscription, TopicAdmin};

use crate::harness::{BoxError, Scenario};

/// Creates fresh transports for the delivery suite.
#[async_trait]
pub trait DeliveryHarness: Send + Sync {
    /// A transport to run one scenario on.
    async fn fixture(&self) -> Result<Box<dyn DeliveryFixture>, BoxError>;
}

/// One transport under the delivery suite, on the real clock.
#[async_trait]
pub trait DeliveryFixture: Send + Sync {
    /// Publishing side.
    fn publisher(&self) -> Arc<dyn Publisher>;
    /// Consuming side.
    fn subscriber(&self) -> Arc<dyn Subscriber>;
    /// Topic creation.
    fn admin(&self) -> Arc<dyn TopicAdmin>;

    /// Partitions of the topics scenarios create.
    fn partitions(&self) -> u32 {
        3
    }

    /// Longest wait of one scenario poll.
    fn poll_wait(&self) -> Duration {
        Duration::from_millis(100)
    }

    /// Longest a scenario waits for what it published to arrive.
    fn patience(&self) -> Duration {
        Duration::from_secs(20)
    }

    /// How long two new members poll before they share a group's partitions.
    fn settle(&self) -> Duration {
        Duration::from_secs(2)
    }

    /// A group and a topic no other scenario uses, named after `what`.
    fn names(&self, what: &str) -> (String, String) {
        let id = uuid::Uuid::new_v4().simple().to_string();
        (format!("g.{what}.{id}"), format!("t.{what}.{id}"))
    }

    /// Creates `topic` and joins `group` on it as `member`. On a queue transport, joining
    /// declares the group's queues, so what is published after it reaches the group.
    async fn join(
        &self,
        group: &str,
        topic: &str,
        member: &str,
    ) -> Result<Box<dyn Subscription>, BoxError> {
        self.admin().ensure_topic(topic, self.partitions()).await?;
        Ok(self.subscriber().subscribe(group, topic, member).await?)
    }

    /// Removes what a scenario left of `group` on `topic`, when the transport can.
    async fn remove(&self, group: &str, topic: &str) -> Scenario {
        let _ = (group, topic);
        Ok(())
    }

    /// Releases the transport (drops its database, when it has one).
    async fn teardown(self: Box<Self>) -> Scenario;
}
