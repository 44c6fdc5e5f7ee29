//! Publishing to a real RabbitMQ (`ENTREGA_TEST_AMQP`, default
//! `amqp://guest:guest@127.0.0.1:5672`): a message no queue takes, or an exchange that does not
//! exist, fails the batch instead of vanishing, and an unreachable broker is retried only after
//! the backoff. Delivery itself is proven by `tests/subscription.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use entrega_amqp::{delivery_headers, Amqp, AmqpConfig};
use entrega_core::{Headers, OutgoingMessage, TransportError};
use lapin::options::{BasicGetOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties};

fn url() -> String {
    std::env::var("ENTREGA_TEST_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".into())
}

fn unique(prefix: &str) -> String {
    format!("{prefix}.{}", uuid::Uuid::new_v4().simple())
}

async fn raw_channel() -> (Connection, Channel) {
    let conn = Connection::connect(&url(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    (conn, channel)
}

/// A queue bound to `topic` with weight 1, deleted with the connection's end of the test.
async fn bound_queue(channel: &Channel, topic: &str, name: &str) {
    channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .queue_bind(
            name.into(),
            topic.into(),
            "1".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
}

/// Every message of `queue`, in order: (key header `k`, payload).
async fn drain(channel: &Channel, queue: &str) -> Vec<(Headers, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some(message) = channel
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        out.push((
            delivery_headers(&message.delivery.properties),
            message.delivery.data.clone(),
        ));
    }
    out
}

fn message(topic: &str, key: &str, n: u32) -> OutgoingMessage {
    OutgoingMessage {
        topic: topic.to_owned(),
        key: Some(key.to_owned()),
        headers: Headers::new()
            .with("tipo", "pedido.creado")
            .with("id_evento", uuid::Uuid::new_v4().to_string())
            .with("n", n.to_string()),
        payload: format!("{{\"n\":{n}}}").into_bytes(),
    }
}

fn amqp() -> Amqp {
    Amqp::connect(AmqpConfig::from_url(&url()).unwrap())
}

#[tokio::test]
async fn a_message_no_queue_takes_fails_the_batch_and_a_missing_exchange_is_an_unknown_topic() {
    let amqp = amqp();
    let publisher = amqp.publisher();
    let topic = unique("t.entrega");
    amqp.admin().ensure_topic(&topic, 1).await.unwrap();
    match publisher.publish(&[message(&topic, "P-1", 0)]).await {
        Err(TransportError::Rejected { reason }) => {
            assert!(reason.contains("no queue is bound"), "{reason}")
        }
        other => panic!("expected Rejected for an unroutable message, got {other:?}"),
    }
    let missing = unique("t.missing");
    match publisher.publish(&[message(&missing, "P-1", 0)]).await {
        Err(TransportError::UnknownTopic { topic }) => assert_eq!(topic, missing),
        other => panic!("expected UnknownTopic, got {other:?}"),
    }
    // The channel the broker closed is replaced: the same publisher goes on.
    let (_conn, channel) = raw_channel().await;
    let q = unique("q.after");
    bound_queue(&channel, &topic, &q).await;
    publisher
        .publish(&[message(&topic, "P-1", 7)])
        .await
        .unwrap();
    let got = drain(&channel, &q).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0.get("n"), Some("7"));
    channel
        .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn an_unreachable_broker_is_unavailable_and_retried_only_after_the_backoff() {
    // A port nothing listens on.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let config = AmqpConfig::from_url(&format!(
        "amqp://guest:guest@127.0.0.1:{port}?connect_timeout_ms=1000&reconnect_base_ms=60000"
    ))
    .unwrap();
    let amqp = Amqp::connect(config);
    let publisher = amqp.publisher();
    let first = publisher.publish(&[message("t", "P-1", 0)]).await;
    assert!(matches!(first, Err(ref e) if e.is_transient()), "{first:?}");
    let second = publisher.publish(&[message("t", "P-1", 0)]).await;
    match second {
        Err(TransportError::Unavailable { source }) => {
            assert!(source.to_string().contains("next in"), "{source}")
        }
        other => {
            panic!("expected Unavailable without a new attempt inside the backoff, got {other:?}")
        }
    }
}
