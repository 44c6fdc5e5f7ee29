//! A dead letter the broker refuses, on an Apache Kafka broker of its own: the dead-letter
//! topic takes messages of at most 64 bytes, so every dead letter is refused as too large.
//! The inventario consumer holds them in its database and its partition goes on; the
//! operator sees them (`km0 dlq held`), raises the limit, and sends them on
//! (`km0 dlq send-held`), audited; each is then an ordinary dead letter.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::Duration;

use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::ClientConfig;
use serde_json::Value;

use crate::dlq_steps::Deployment;
use common::kafka_ns::KafkaNamespace;
use km0::wiring::dead_letter_topic;

const PATIENCE: Duration = Duration::from_secs(90);

fn admin(kafka: &KafkaNamespace) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", kafka.bootstrap())
        .create()
        .unwrap()
}

/// Sets the dead-letter topic's (`topic`, as the broker names it) largest record.
async fn set_max_bytes(admin: &AdminClient<DefaultClientContext>, topic: &str, bytes: &str) {
    let alter = AlterConfig::new(ResourceSpecifier::Topic(topic)).set("max.message.bytes", bytes);
    let results = admin
        .alter_configs(&[alter], &AdminOptions::new())
        .await
        .unwrap();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
}

fn os_user() -> String {
    let out = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_the_broker_refuses_are_held_then_sent_on() {
    let kafka = KafkaNamespace::new();
    let admin = admin(&kafka);
    let topic = kafka.wire(&dead_letter_topic());
    let created = admin
        .create_topics(
            &[NewTopic::new(&topic, 1, TopicReplication::Fixed(1)).set("max.message.bytes", "64")],
            &AdminOptions::new(),
        )
        .await
        .unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    let url = kafka.url_with("session_timeout_ms=6000");
    let d = Deployment::start(&url, PATIENCE).await;

    let a = d.order("PA", "pedido.creado", "queso-azul", 2).await;
    let b = d.order("PB", "pedido.creado", "tomate-rosa", 3).await;
    let c = d.order("PA", "pedido.creado", "trufa", 1).await;
    let stock_before = 120;

    // The partition went on: every record committed, the good order applied once, and no
    // record on the dead-letter topic.
    d.wait_caught_up().await;
    assert_eq!(d.stock("tomate-rosa").await, Some(stock_before - 3));
    assert_eq!(d.keys_of(&b).await, 1);
    assert_eq!((d.keys_of(&a).await, d.keys_of(&c).await), (0, 0));
    let listed = d.json(&["dlq", "list", "--json"]).await;
    assert_eq!(listed, Value::Array(vec![]), "{listed:#}");

    let held = d.json(&["dlq", "held", "--json"]).await;
    let rows = held.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{held:#}");
    let ids: Vec<&str> = rows
        .iter()
        .map(|r| r["id_evento"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![a.to_string(), c.to_string()]);
    for r in rows {
        assert_eq!(r["service"], "inventario");
        assert_eq!(r["group"], "inventario");
        assert_eq!(r["topic"], "pedidos.eventos");
        assert_eq!(r["destination"], dead_letter_topic().as_str());
        assert_eq!(r["key"], "PA");
        assert!(
            r["motivo"]
                .as_str()
                .unwrap()
                .contains("producto desconocido"),
            "{r}"
        );
        assert!(
            r["refusal"]
                .as_str()
                .unwrap()
                .to_lowercase()
                .contains("too large"),
            "{r}"
        );
    }

    // Still refused: both stay held, and the attempt is audited.
    let again = d.json(&["dlq", "send-held", "--json"]).await;
    let inventario = again
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["service"] == "inventario")
        .unwrap();
    assert_eq!(inventario["sent"], 0, "{again:#}");
    assert_eq!(inventario["refused"].as_array().unwrap().len(), 2);
    assert_eq!(
        d.json(&["dlq", "held", "--json"])
            .await
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // The limit raised, the letters go on, in order, and are held no more.
    set_max_bytes(&admin, &topic, "1048576").await;
    let sent = d.json(&["dlq", "send-held", "--json"]).await;
    let inventario = sent
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["service"] == "inventario")
        .unwrap();
    assert_eq!(inventario["sent"], 2, "{sent:#}");
    assert_eq!(
        d.json(&["dlq", "held", "--json"]).await,
        Value::Array(vec![])
    );
    d.wait_dead_letters(2).await;
    let listed = d.json(&["dlq", "list", "--json"]).await;
    let on_topic: Vec<String> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["event_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(on_topic, vec![a.to_string(), c.to_string()]);

    let audit = d.audit_rows().await;
    let summary: Vec<(&str, i64, i64, i64)> = audit
        .iter()
        .map(|r| (r.action.as_str(), r.matched, r.applied, r.refused))
        .collect();
    assert_eq!(summary, [("send_held", 2, 0, 2), ("send_held", 2, 2, 0)]);
    assert!(audit.iter().all(|r| r.operator == os_user()));
    d.finish().await;
}
