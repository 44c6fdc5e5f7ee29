//! Interop on RabbitMQ with a consumer written as in the seed's section 6 (Python, pika,
//! `interop/seed_rabbit_consumer.py`), in a virtual host of the test's own:
//!
//! - the seed declares its native dead-letter topology first (`km0.dlx`,
//!   `inventario.pedidos.dlq`, `inventario.pedidos` with its two arguments), and km0, on the
//!   shared layout, declares the same queue after it without a precondition failure;
//! - km0's pedidos and relay publish; the seed consumer reads every `pedido.creado` from
//!   `inventario.pedidos` as a valid envelope;
//! - a malformed message is nacked without requeue by the seed consumer and lands, through
//!   the broker's own dead-lettering, in `inventario.pedidos.dlq`, where km0's dead-letter
//!   tool finds it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use std::collections::BTreeSet;

use entrega::dlq::{DlqFilter, QueueDeadLetters};
use entrega_core::{Headers, MigrationSet, OutgoingMessage};
use km0::services::inventario::{GROUP, TOPIC};
use km0::wiring::{Components, System};

use crate::interop::python::run_ok;
use common::amqp::Vhost;
use common::state::{order, place};

/// Orders km0 places.
const ORDERS: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_consumer_and_dead_letter_queue_work_with_km0_on_rabbitmq() {
    let vhost = Vhost::create();
    let url = vhost.url();
    let declared = run_ok(
        "seed_rabbit_consumer.py",
        &["--url".into(), url.clone(), "--declare-only".into()],
    )
    .await;
    assert_eq!(declared["declared"], true);

    let databases = common::test_system("sqlite").databases().clone();
    let system = System::new(databases, format!("{url}?layout=shared"));
    let mut components = Components::none("amqp-interop");
    components.add(&km0::services::pedidos::API);
    components.add(&km0::services::pedidos::RELAY);
    let running = system
        .start(components, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = running.http_addr().unwrap();
    let mut ids = BTreeSet::new();
    for n in 0..ORDERS {
        ids.insert(place(addr, &order(&format!("S-{n}"), &[("calabacin", 1)])).await);
    }
    let broker = system.broker().await.unwrap();
    broker
        .publisher()
        .publish(&[OutgoingMessage {
            topic: TOPIC.to_owned(),
            key: Some("S-poison".into()),
            headers: Headers::new().with("tipo", "pedido.creado"),
            payload: b"{not json".to_vec(),
        }])
        .await
        .unwrap();

    let seen = run_ok(
        "seed_rabbit_consumer.py",
        &[
            "--url".into(),
            url.clone(),
            "--expect".into(),
            ORDERS.to_string(),
            "--poison".into(),
            "1".into(),
        ],
    )
    .await;
    running.stop().await.unwrap();
    let seen: BTreeSet<String> = seen["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        seen, ids,
        "the seed consumer read other events than km0 published"
    );

    // The broker dead-lettered the nacked message; km0's tool reads it from the queue.
    let db = system
        .databases()
        .connect(&km0::services::inventario::DATABASE)
        .await
        .unwrap();
    db.migrate(&[MigrationSet::Dlq]).await.unwrap();
    let amqp = broker.as_amqp().unwrap().clone();
    let tool = QueueDeadLetters::new(amqp, GROUP, TOPIC, db.dead_letters());
    assert_eq!(tool.queue(), "inventario.pedidos.dlq");
    let letters = tool.list(&DlqFilter::all()).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].payload, b"{not json");
    assert_eq!(letters[0].key.as_deref(), Some("S-poison"));
    broker.close().await;
    db.close().await;
    system.destroy().await.unwrap();
}

/// The seed's request/reply client (`interop/cliente_pagos_rpc.py`: its fragment unchanged,
/// connecting to `localhost` as it is written) against km0's pagos on the default virtual
/// host: every authorisation answered, a repeat with the stored answer, an amount above the
/// limit refused with its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard only keeps the test that restarts the broker out; nothing async waits on it.
#[allow(clippy::await_holding_lock)]
async fn the_seeds_rpc_client_gets_its_authorisations_from_pagos() {
    let _broker = common::amqp::shared();
    let databases = common::test_system("sqlite").databases().clone();
    let system = System::new(databases, common::amqp::base_url());
    let mut components = Components::none("rpc-interop");
    components.add(&km0::services::pagos::COMPONENT);
    let running = system
        .start(components, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    // The seed publishes without `mandatory`: wait for pagos to have declared its queue.
    let broker = system.broker().await.unwrap();
    let amqp = broker.as_amqp().unwrap().clone();
    common::state::eventually(
        std::time::Duration::from_secs(30),
        "pagos.autorizaciones declared",
        || async {
            let depth = amqp
                .queue_depths(&["pagos.autorizaciones".to_owned()])
                .await
                .ok()?;
            depth
                .first()
                .filter(|d| d.exists && d.consumers > 0)
                .map(drop)
        },
    )
    .await;
    let prefix = format!("RPC-{}", uuid::Uuid::new_v4().simple());
    let out = run_ok(
        "cliente_pagos_rpc.py",
        &[
            "--pedidos".into(),
            "5".into(),
            "--prefijo".into(),
            prefix.clone(),
        ],
    )
    .await;
    running.stop().await.unwrap();
    let answers = out["respuestas"].as_array().unwrap();
    assert_eq!(answers.len(), 5, "{out}");
    for (i, a) in answers.iter().enumerate() {
        assert_eq!(a["pedido_id"], format!("{prefix}-{i}"), "{a}");
        assert_eq!(a["autorizado"], true, "{a}");
        assert!(
            a["id_autorizacion"].as_str().unwrap().starts_with("AUT-"),
            "{a}"
        );
    }
    assert_eq!(
        out["repetida"], answers[0],
        "a repeat must get the stored answer"
    );
    assert_eq!(out["excesiva"]["autorizado"], false);
    assert_eq!(out["excesiva"]["motivo"], "importe_excede_limite");
    let store = system.pagos().await.unwrap();
    let rows: Option<i64> = store
        .db()
        .scalar(entrega::db::query("SELECT COUNT(*) FROM autorizaciones"))
        .await
        .unwrap();
    assert_eq!(
        rows,
        Some(6),
        "one authorisation per order, the repeat not recorded again"
    );
    store.db().close().await;
    broker.close().await;
    system.destroy().await.unwrap();
}
