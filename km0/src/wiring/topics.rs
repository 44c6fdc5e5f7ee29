//! The topics km0 uses, created before anything publishes or subscribes; on RabbitMQ, its
//! consumer groups' queues too, since a publish no queue takes is refused (`mandatory`).

use anyhow::Context as _;
use entrega_amqp::{Amqp, GroupSpec};

use super::component::{groups, topics};
use super::Broker;
use crate::services::inventario;
use crate::services::pedidos::PARTITIONS;

/// The dead-letter topic of the stock consumer (`<topic>.dlq`).
pub fn dead_letter_topic() -> String {
    format!("{}.dlq", crate::services::pedidos::TOPIC)
}

/// Where the stock consumer's dead letters are on `broker`: its dead-letter queue on
/// RabbitMQ (`inventario.pedidos.dlq`), else [`dead_letter_topic`].
pub fn dead_letters_of(broker: &Broker) -> String {
    match broker.as_amqp() {
        Some(amqp) => amqp
            .group_queues(inventario::GROUP, inventario::TOPIC)
            .dead_letter_queue(),
        None => dead_letter_topic(),
    }
}

/// Names km0's groups' queues on RabbitMQ (each component's [`GroupQueue`]s), in the layout
/// the URL asks.
///
/// [`GroupQueue`]: super::GroupQueue
pub fn name_amqp_groups(amqp: &Amqp) {
    for owned in groups() {
        let spec = GroupSpec {
            base: Some(owned.queue.to_owned()),
            layout: amqp.config().layout,
        };
        amqp.set_group(owned.group, owned.topic, spec);
    }
}

/// Creates the topics km0's components publish to ([`topics`]) and their dead-letter and
/// retry topics if missing; on RabbitMQ, the topics and km0's groups' queues.
pub async fn ensure_topics(broker: &Broker) -> anyhow::Result<()> {
    let Some(amqp) = broker.as_amqp() else {
        for topic in topics() {
            ensure_topic_and_dlq(broker, topic).await?;
        }
        return Ok(());
    };
    for topic in topics() {
        broker
            .admin()
            .ensure_topic(topic, PARTITIONS)
            .await
            .with_context(|| format!("creating topic {topic}"))?;
    }
    for owned in groups() {
        let (group, topic) = (owned.group, owned.topic);
        amqp.declare_group(group, topic)
            .await
            .with_context(|| format!("declaring the queues of group {group} on {topic}"))?;
    }
    Ok(())
}

/// Creates `topic` with km0's partition count, its dead-letter topic `<topic>.dlq` and its
/// retry topic `<topic>.retry`, if missing.
pub async fn ensure_topic_and_dlq(broker: &Broker, topic: &str) -> anyhow::Result<()> {
    let admin = broker.admin();
    admin
        .ensure_topic(topic, PARTITIONS)
        .await
        .with_context(|| format!("creating topic {topic}"))?;
    for (side, partitions) in [("dlq", 1), ("retry", PARTITIONS)] {
        let name = format!("{topic}.{side}");
        admin
            .ensure_topic(&name, partitions)
            .await
            .with_context(|| format!("creating topic {name}"))?;
    }
    Ok(())
}
