//! `km0 dlq` and `km0 lag` as processes on RabbitMQ, in a virtual host of the test's own: the
//! inventario consumer (in the test process) dead-letters orders of an unknown product into
//! `inventario.pedidos.dlq`; the operator lists them, is refused what RabbitMQ cannot do,
//! dry-runs a replay, discards one, fixes the cause and replays the other, which is then
//! applied once; the audit records it all. Checked against the queues' depths and
//! inventario's rows.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

/// The log procedure's steps; the ones that read offsets are not used on RabbitMQ.
#[allow(dead_code)]
use std::time::Duration;

use serde_json::Value;

use crate::dlq_steps::Deployment;
use common::amqp::Vhost;
use common::state::eventually;

/// The stock consumer's entry of a `km0 lag --json` report (which lists every group).
fn inventario(lag: &Value) -> &Value {
    lag["groups"]
        .as_array()
        .and_then(|groups| groups.iter().find(|g| g["group"] == "inventario"))
        .unwrap_or(&Value::Null)
}

/// Messages waiting in `inventario.pedidos.dlq`, as `km0 lag --json` reports them.
async fn dead_letters(d: &Deployment) -> u64 {
    let lag = d.json(&["lag", "--json"]).await;
    inventario(&lag)["dead_letters"]["ready"]
        .as_u64()
        .unwrap_or(u64::MAX)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tend_the_dead_letter_queue_on_rabbitmq() {
    let vhost = Vhost::create();
    let url = format!("{}?shards=3", vhost.url());
    let d = Deployment::start(&url, Duration::from_secs(60)).await;
    let a = d.order("PA", "pedido.creado", "queso-azul", 2).await;
    let b = d.order("PB", "pedido.creado", "queso-azul", 1).await;
    eventually(Duration::from_secs(60), "2 dead letters", || async {
        (dead_letters(&d).await == 2).then_some(())
    })
    .await;
    let lag = d.json(&["lag", "--json"]).await;
    let queues = inventario(&lag)["queues"].as_array().unwrap();
    assert_eq!(queues.len(), 3, "{lag:#}");
    assert!(queues.iter().all(|q| q["ready"] == 0), "{lag:#}");

    let listed = d.json(&["dlq", "list", "--json"]).await;
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed:#}");
    let row_a = d.row_of(&listed, &a);
    assert_eq!(row_a["key"], "PA");
    assert_eq!(
        row_a["motivo"],
        "permanent: producto desconocido: queso-azul"
    );
    assert_eq!(row_a["attempts"], 1);
    assert_eq!(row_a["topic"], "inventario.pedidos.dlq");
    let id_b = d.row_of(&listed, &b)["id"].as_str().unwrap().to_owned();

    // What RabbitMQ cannot answer is refused (exit 2), with nothing changed.
    let (code, _, stderr) = d.km0(&["dlq", "stats"]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("km0 lag"), "{stderr}");

    // A dry run replays nothing; a discard takes one letter off the queue.
    let dry = d.json(&["dlq", "replay", "--dry-run", "--json"]).await;
    assert_eq!(dry["applied"].as_array().unwrap().len(), 2, "{dry:#}");
    assert_eq!(dead_letters(&d).await, 2);
    let discarded = d
        .json(&[
            "dlq",
            "discard",
            "--id",
            &id_b,
            "--reason",
            "pedido de prueba",
            "--json",
        ])
        .await;
    assert_eq!(
        discarded["applied"].as_array().unwrap().len(),
        1,
        "{discarded:#}"
    );
    assert_eq!(dead_letters(&d).await, 1);
    assert_eq!(d.keys_of(&b).await, 0);

    // Fix the cause, replay: the order is applied once, the queue is empty.
    d.add_product("queso-azul", 10).await;
    let replayed = d.json(&["dlq", "replay", "--json"]).await;
    assert_eq!(
        replayed["applied"].as_array().unwrap().len(),
        1,
        "{replayed:#}"
    );
    eventually(Duration::from_secs(60), "PA applied", || async {
        (d.keys_of(&a).await == 1).then_some(())
    })
    .await;
    assert_eq!(d.stock("queso-azul").await, Some(8));
    assert_eq!(dead_letters(&d).await, 0);
    let listed = d.json(&["dlq", "list", "--json"]).await;
    assert_eq!(listed, Value::Array(Vec::new()));

    let audit = d.json(&["dlq", "audit", "--json"]).await;
    let entries = audit.as_array().unwrap();
    assert_eq!(entries.len(), 3, "{audit:#}");
    d.finish().await;
}
