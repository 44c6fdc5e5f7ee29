//! km0's events as CloudEvents on Apache Kafka (binary content mode, `--cloudevents`), read
//! back with the CloudEvents SDK for Rust (`cloudevents-sdk`): each record's `ce_*` headers
//! and `content-type` become an SDK `Event` whose attributes are the envelope's (`id_evento` →
//! `id`, `tipo` → `type`, `origen` → `source`, `fecha_ms` → `time`, `version` →
//! `dataschema`), and whose data is the envelope itself, byte for byte, as without the
//! binding. The SDK's own rdkafka binding needs rdkafka 0.38, which cannot link beside the
//! 0.39 entrega uses (both bundle librdkafka), so the record's headers are handed to the
//! SDK's binary-mode deserializer the way that binding does, under the Kafka binding's names.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use cloudevents::event::SpecVersion;
use cloudevents::message::BinaryDeserializer;
use cloudevents::{AttributesReader, Data, Event};
use entrega_core::{Envelope, Record};
use km0::services::pedidos::TOPIC;
use km0::wiring::config::{DataPlace, Databases};
use km0::wiring::{ensure_topics, Components, System};
use serde_json::json;

use crate::common::cloudevents::BindingMessage;
use crate::common::kafka_ns::KafkaNamespace;
use crate::common::state::eventually;

fn as_cloudevent(record: &Record) -> Event {
    BindingMessage {
        prefix: "ce_",
        content_type: Some("content-type"),
        headers: &record.headers,
        body: record.payload.clone(),
    }
    .into_event()
    .unwrap_or_else(|e| panic!("not a CloudEvent: {e}: {:?}", record.headers))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn km0_events_read_as_cloudevents_with_the_sdk() {
    let kafka = KafkaNamespace::new();
    let dir = std::env::temp_dir().join(format!("km0-ce-{}", uuid::Uuid::new_v4().simple()));
    let system = System::new(
        Databases::new(DataPlace::SqliteDir(dir.clone())),
        kafka.url(),
    )
    .with_cloudevents(true);
    let broker = system.broker().await.unwrap();
    ensure_topics(&broker).await.unwrap();
    let mut components = Components::none("cloudevents-test");
    components.add(&km0::services::pedidos::API);
    components.add(&km0::services::pedidos::RELAY);
    let running = system
        .start(components, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let url = format!("http://{}/pedidos", running.http_addr().unwrap());
    for id in ["P-CE-1", "P-CE-2"] {
        let body = json!({"id": id, "cliente": "ana", "mercado": "girona",
            "lineas": [{"producto": "queso-curado", "cantidad": 1, "precio_centimos": 1450}]});
        let status = http.post(&url).json(&body).send().await.unwrap().status();
        assert_eq!(status, 201);
    }
    let records = eventually(Duration::from_secs(60), "both orders published", || async {
        let mut all = Vec::new();
        for (partition, end) in broker.end_offsets(TOPIC).await.unwrap() {
            if end > 0 {
                all.extend(broker.read(TOPIC, partition, 0, 100).await.unwrap());
            }
        }
        (all.len() == 2).then_some(all)
    })
    .await;

    for record in &records {
        let event = as_cloudevent(record);
        // The payload is the envelope, unchanged: the attributes repeat it.
        let envelope = Envelope::parse(&record.payload).unwrap();
        assert_eq!(event.specversion(), SpecVersion::V10);
        assert_eq!(event.id(), envelope.id.to_string());
        assert_eq!(event.ty(), "pedido.creado");
        assert_eq!(event.source().to_string(), "pedidos");
        assert_eq!(
            event.time().unwrap().timestamp_millis(),
            envelope.timestamp_ms
        );
        assert_eq!(
            event.dataschema().unwrap().to_string(),
            format!("urn:km0:contract:pedido.creado:v{}", envelope.version)
        );
        assert_eq!(envelope.version, 2);
        assert_eq!(event.datacontenttype(), Some("application/json"));
        match event.data() {
            Some(Data::Binary(bytes)) => assert_eq!(bytes, &record.payload),
            Some(Data::Json(value)) => {
                assert_eq!(
                    value,
                    &serde_json::from_slice::<serde_json::Value>(&record.payload).unwrap()
                )
            }
            other => panic!("data: {other:?}"),
        }
        // And without the SDK: the seed's headers are still there.
        assert_eq!(record.headers.get("tipo"), Some("pedido.creado"));
        assert_eq!(
            record.headers.get("id_evento"),
            Some(envelope.id.to_string().as_str())
        );
    }
    running.stop().await.unwrap();
    broker.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}
