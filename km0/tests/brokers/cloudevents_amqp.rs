//! km0's events as CloudEvents on RabbitMQ (`--cloudevents`, in a virtual host of the test's
//! own): each message carries the AMQP binding's `cloudEvents:*` application properties, which
//! the CloudEvents SDK for Rust reads back, through its binary-mode deserializer, into an
//! `Event` whose attributes are the envelope's; the body stays the envelope.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use cloudevents::message::BinaryDeserializer;
use cloudevents::AttributesReader;
use entrega_core::Envelope;
use km0::services::pedidos::TOPIC;
use km0::wiring::{ensure_topics, Components, System};
use serde_json::json;

use crate::common;
use common::amqp::Vhost;
use common::cloudevents::BindingMessage;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn km0_events_on_rabbitmq_read_as_cloudevents_with_the_sdk() {
    let vhost = Vhost::create();
    let databases = common::test_system("sqlite").databases().clone();
    let system = System::new(databases, vhost.url()).with_cloudevents(true);
    let broker = system.broker().await.unwrap();
    ensure_topics(&broker).await.unwrap();
    // A queue of the test's own, bound before anything is published.
    let mut subscription = broker
        .subscriber()
        .subscribe("lector-ce", TOPIC, "lector-ce-1")
        .await
        .unwrap();
    let mut components = Components::none("cloudevents-amqp-test");
    components.add(&km0::services::pedidos::API);
    components.add(&km0::services::pedidos::RELAY);
    let running = system
        .start(components, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let url = format!("http://{}/pedidos", running.http_addr().unwrap());
    let body = json!({"id": "P-CE-AMQP", "cliente": "ana", "mercado": "girona",
        "lineas": [{"producto": "calabacin", "cantidad": 1, "precio_centimos": 300}]});
    let status = reqwest::Client::new()
        .post(&url)
        .json(&body)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 201);

    let mut records = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while records.is_empty() {
        assert!(std::time::Instant::now() < deadline, "the order published");
        records = subscription
            .poll(10, Duration::from_millis(500))
            .await
            .unwrap();
    }
    let record = &records[0];
    let event = BindingMessage {
        prefix: "cloudEvents:",
        content_type: None,
        headers: &record.headers,
        body: record.payload.clone(),
    }
    .into_event()
    .unwrap_or_else(|e| panic!("not a CloudEvent: {e}: {:?}", record.headers));
    let envelope = Envelope::parse(&record.payload).unwrap();
    assert_eq!(event.id(), envelope.id.to_string());
    assert_eq!(event.ty(), "pedido.creado");
    assert_eq!(event.source().to_string(), "pedidos");
    assert_eq!(
        event.time().unwrap().timestamp_millis(),
        envelope.timestamp_ms
    );
    assert_eq!(
        event.dataschema().unwrap().to_string(),
        "urn:km0:contract:pedido.creado:v2"
    );
    assert_eq!(
        record.headers.get("content-type"),
        None,
        "the AMQP binding has none"
    );
    subscription.close().await.unwrap();
    running.stop().await.unwrap();
    broker.close().await;
}
