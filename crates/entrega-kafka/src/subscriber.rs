//! Joining consumer groups: one librdkafka consumer per subscription.

use std::sync::Arc;

use async_trait::async_trait;
use entrega_core::{Subscriber, Subscription, TransportError};
use rdkafka::config::FromClientConfigAndContext;
use rdkafka::consumer::Consumer;

use crate::error::{invalid, transport};
use crate::group::{GroupContext, MemberState};
use crate::meta::{blocking, topic_info};
use crate::subscription::{GroupConsumer, KafkaSubscription};
use crate::KafkaConfig;

/// Makes group members. Each subscription is a consumer of its own with dynamic membership
/// (no `group.instance.id`), `client.id` = the member name, manual commits only,
/// `auto.offset.reset=earliest` and the `cooperative-sticky` assignor.
#[derive(Debug, Clone)]
pub struct KafkaSubscriber {
    config: KafkaConfig,
}

impl KafkaSubscriber {
    /// A subscriber to the cluster in `config`.
    pub fn new(config: KafkaConfig) -> Self {
        Self { config }
    }
}

#[async_trait]
impl Subscriber for KafkaSubscriber {
    async fn subscribe(
        &self,
        group: &str,
        topic: &str,
        member: &str,
    ) -> Result<Box<dyn Subscription>, TransportError> {
        for (what, value) in [("group", group), ("topic", topic), ("member", member)] {
            if value.is_empty() {
                return Err(invalid(format!("a subscription needs a {what} name")));
            }
        }
        let ns = &self.config.namespace;
        let (local, group, topic) = (topic, &ns.wire(group), &ns.wire(topic));
        let state = Arc::new(std::sync::Mutex::new(MemberState::default()));
        let context = GroupContext::new(topic, state.clone());
        let consumer =
            GroupConsumer::from_config_and_context(&self.config.member(group, member), context)
                .map_err(|e| transport(e, topic))?;
        let timeout = self.config.request_timeout;
        let name = topic.to_owned();
        let consumer = blocking(move || {
            // Subscribing to a missing topic would wait silently; say so instead.
            match topic_info(consumer.client(), &name, timeout) {
                Ok(Some(_)) => {}
                Ok(None) => return Err(TransportError::UnknownTopic { topic: name }),
                Err(e) => return Err(transport(e, &name)),
            }
            consumer
                .subscribe(&[name.as_str()])
                .map_err(|e| transport(e, &name))?;
            Ok(consumer)
        })
        .await?;
        let close_timeout = self.config.session_timeout + self.config.request_timeout;
        Ok(Box::new(KafkaSubscription::new(
            topic,
            local,
            consumer,
            state,
            close_timeout,
        )))
    }
}
