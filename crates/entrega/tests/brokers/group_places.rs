//! What a broker is asked instead of its kind: where a group's dead letters go, whether it
//! keeps offsets, and a group's own place made, named and removed. On the log transport a
//! group is only offsets; on RabbitMQ (`ENTREGA_TEST_AMQP`) it is queues of its own.

use std::time::Duration;

use entrega::Broker;
use lapin::options::{ExchangeDeleteOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use uuid::Uuid;

use crate::support::TempDir;

fn amqp_url() -> String {
    std::env::var("ENTREGA_TEST_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".into())
}

/// Whether `queue` exists on RabbitMQ (a passive declare).
async fn queue_exists(queue: &str) -> bool {
    let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    let found = channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .is_ok();
    let _ = conn.close(200, "done".into()).await;
    found
}

#[tokio::test]
async fn on_a_log_a_group_is_offsets_and_its_dead_letters_a_topic() {
    let dir = TempDir::new();
    let broker = Broker::connect(&dir.url("broker.db"), Duration::from_secs(5))
        .await
        .unwrap();
    assert!(broker.has_offsets());
    broker.name_group("g", "pedidos.eventos", "inventario.pedidos");
    assert_eq!(
        broker.dead_letter_place("g", "pedidos.eventos"),
        "pedidos.eventos.dlq"
    );
    broker.declare_group("g", "pedidos.eventos").await.unwrap();
    // Nothing is made for a group on a log: not even its topic.
    assert!(broker
        .end_offsets("pedidos.eventos")
        .await
        .unwrap()
        .is_empty());
    broker.delete_group("g", "pedidos.eventos").await.unwrap();
    broker.close().await;
}

#[tokio::test]
async fn on_rabbitmq_a_group_is_queues_of_its_own_named_made_and_removed() {
    let run = Uuid::new_v4().simple().to_string();
    let (group, topic, base) = (
        format!("g-{run}"),
        format!("t-{run}"),
        format!("places-{run}"),
    );
    let broker = Broker::connect(&amqp_url(), Duration::from_secs(5))
        .await
        .unwrap();
    assert!(!broker.has_offsets());
    broker.name_group(&group, &topic, &base);
    let dead_letters = broker.dead_letter_place(&group, &topic);
    assert_eq!(dead_letters, format!("{base}.dlq"));
    assert!(!queue_exists(&dead_letters).await);
    broker.declare_group(&group, &topic).await.unwrap();
    assert!(queue_exists(&dead_letters).await, "no {dead_letters}");
    broker.delete_group(&group, &topic).await.unwrap();
    assert!(!queue_exists(&dead_letters).await, "{dead_letters} left");
    broker.close().await;
    // The topic's exchange is the topic's, not the group's: the test removes it.
    let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    channel
        .exchange_delete(topic.as_str().into(), ExchangeDeleteOptions::default())
        .await
        .unwrap();
    let _ = conn.close(200, "done".into()).await;
}
