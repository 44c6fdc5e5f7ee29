//! The topics km0 uses, created before anything publishes or subscribes; on RabbitMQ, its
//! consumer groups' queues too, since a publish no queue takes is refused (`mandatory`).

use anyhow::Context as _;
use entrega_amqp::{Amqp, GroupSpec};

use super::Broker;
use crate::services::pedidos::{PARTITIONS, TOPIC};
use crate::services::{catalogo, inventario, pagos, reparto};

/// km0's consumer groups on RabbitMQ, each with the base name of its queues: inventario's
/// is the seed's `inventario.pedidos` (dead letters in `inventario.pedidos.dlq` through
/// `km0.dlx`).
pub const AMQP_GROUPS: [(&str, &str, &str); 10] = [
    (inventario::GROUP, inventario::TOPIC, "inventario.pedidos"),
    (
        inventario::COMMANDS_GROUP,
        inventario::COMMANDS_TOPIC,
        "inventario.reservas",
    ),
    (catalogo::GROUP, catalogo::TOPIC, "catalogo.stock"),
    (reparto::GROUP, reparto::TOPIC, "reparto.pedidos"),
    (pagos::GROUP, pagos::TOPIC, "pagos.pedidos"),
    (pagos::COMMANDS_GROUP, pagos::COMMANDS_TOPIC, "pagos.cobros"),
    // pedidos reads the answers of the order saga's steps; its queues keep them until it does.
    ("pedidos", pagos::EVENTS_TOPIC, "pedidos.pagos"),
    ("pedidos", inventario::EVENTS_TOPIC, "pedidos.inventario"),
    ("pedidos", reparto::EVENTS_TOPIC, "pedidos.reparto"),
    (
        reparto::COMMANDS_GROUP,
        reparto::COMMANDS_TOPIC,
        "reparto.asignaciones",
    ),
];

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

/// Names km0's groups' queues on RabbitMQ ([`AMQP_GROUPS`]), in the layout the URL asks.
pub fn name_amqp_groups(amqp: &Amqp) {
    for (group, topic, base) in AMQP_GROUPS {
        let spec = GroupSpec {
            base: Some(base.to_owned()),
            layout: amqp.config().layout,
        };
        amqp.set_group(group, topic, spec);
    }
}

/// Every topic km0 publishes to: order events, and the commands and events of inventario,
/// pagos and reparto.
pub const TOPICS: [&str; 7] = [
    TOPIC,
    inventario::COMMANDS_TOPIC,
    inventario::EVENTS_TOPIC,
    pagos::COMMANDS_TOPIC,
    pagos::EVENTS_TOPIC,
    reparto::COMMANDS_TOPIC,
    reparto::EVENTS_TOPIC,
];

/// Creates km0's topics ([`TOPICS`]) and their dead-letter and retry topics if missing; on
/// RabbitMQ, the topics and km0's groups' queues.
pub async fn ensure_topics(broker: &Broker) -> anyhow::Result<()> {
    let Some(amqp) = broker.as_amqp() else {
        for topic in TOPICS {
            ensure_topic_and_dlq(broker, topic).await?;
        }
        return Ok(());
    };
    for topic in TOPICS {
        broker
            .admin()
            .ensure_topic(topic, PARTITIONS)
            .await
            .with_context(|| format!("creating topic {topic}"))?;
    }
    for (group, topic, _) in AMQP_GROUPS {
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
