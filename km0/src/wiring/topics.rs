//! The topics km0 uses, created before anything publishes or subscribes; on RabbitMQ, its
//! consumer groups' queues too, since a publish no queue takes is refused (`mandatory`).

use anyhow::Context as _;

use super::component::{groups, topics};
use super::Broker;
use crate::services::inventario;
use crate::services::pedidos::PARTITIONS;

/// The dead-letter topic of the stock consumer (`<topic>.dlq`).
pub fn dead_letter_topic() -> String {
    format!("{}.dlq", crate::services::pedidos::TOPIC)
}

/// Where the stock consumer's dead letters are on `broker`: its dead-letter queue on a
/// broker with queues per group (`inventario.pedidos.dlq` on RabbitMQ), else
/// [`dead_letter_topic`].
pub fn dead_letters_of(broker: &Broker) -> String {
    broker.dead_letter_place(inventario::GROUP, inventario::TOPIC)
}

/// Names the queues of km0's groups (each component's [`GroupQueue`]s) on a broker that
/// keeps them in queues.
///
/// [`GroupQueue`]: super::GroupQueue
pub fn name_groups(broker: &Broker) {
    for owned in groups() {
        broker.name_group(owned.group, owned.topic, owned.queue);
    }
}

/// Creates the topics km0's components publish to ([`topics`]) if missing, with their
/// dead-letter and retry topics where those are topics (a broker with queues per group keeps
/// them in the group's queues), and each group's place on a broker that needs one before
/// anything is published.
pub async fn ensure_topics(broker: &Broker) -> anyhow::Result<()> {
    let side_topics = broker.side_queues().is_none();
    for topic in topics() {
        if side_topics {
            ensure_topic_and_dlq(broker, topic).await?;
        } else {
            broker
                .admin()
                .ensure_topic(topic, PARTITIONS)
                .await
                .with_context(|| format!("creating topic {topic}"))?;
        }
    }
    for owned in groups() {
        let (group, topic) = (owned.group, owned.topic);
        broker
            .declare_group(group, topic)
            .await
            .with_context(|| format!("declaring the place of group {group} on {topic}"))?;
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
