//! The whole system in one process, through the entrega engine: HTTP → outbox → relay →
//! log → worker → stock. Each scenario runs on SQLite and on PostgreSQL and asserts on rows,
//! offsets and dead letters, never on logs.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::{Duration, Instant};

use entrega_core::headers::MOTIVO;
use km0::demo::DemoOptions;
use km0::services::inventario::CONSUMER;
use km0::wiring::{dead_letter_topic, Components, System};
use serde_json::{json, Value};

use common::test_system;

/// Polls `check` until it returns `Some`, failing after `limit`.
async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn order(id: &str, product: &str, quantity: i64) -> Value {
    json!({"id": id, "cliente": "ana", "mercado": "girona",
           "lineas": [{"producto": product, "cantidad": quantity, "precio_centimos": 100}]})
}

async fn post(addr: std::net::SocketAddr, body: &Value) -> u16 {
    reqwest::Client::new()
        .post(format!("http://{addr}/pedidos"))
        .json(body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn orders_are_applied_once_each(backend: &str) {
    let system = test_system(backend);
    let running = system
        .start(Components::all("e2e"), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = running.http_addr().unwrap();
    for n in 0..20 {
        assert_eq!(
            post(addr, &order(&format!("P-{n}"), "calabacin", 2)).await,
            201
        );
    }
    let stock = system.inventario().await.unwrap();
    eventually(Duration::from_secs(30), "20 orders consumed", || async {
        (stock.processed(CONSUMER).await.unwrap() == 20).then_some(())
    })
    .await;
    assert_eq!(stock.units("calabacin").await.unwrap(), Some(80 - 40));
    running.stop().await.unwrap();

    assert_eq!(km0::ops::outbox::backlog(&system).await.unwrap().pending, 0);
    let log = system.broker_log().await.unwrap();
    assert_eq!(
        log.topic_total(km0::services::pedidos::TOPIC)
            .await
            .unwrap(),
        20
    );
    stock.db().close().await;
    system.destroy().await.unwrap();
}

async fn an_order_without_stock_is_dead_lettered_and_does_not_block_the_next(backend: &str) {
    let system = test_system(backend);
    let stock = system.inventario().await.unwrap();
    let running = system
        .start(Components::all("e2e"), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = running.http_addr().unwrap();
    // Same order id prefix → likely different partitions; the point is the worker goes on.
    assert_eq!(post(addr, &order("P-poison", "queso-curado", 6)).await, 201);
    assert_eq!(post(addr, &order("P-after", "queso-curado", 5)).await, 201);

    let log = system.broker_log().await.unwrap();
    let dead = eventually(Duration::from_secs(30), "a dead letter", || async {
        let records = log.read(&dead_letter_topic(), 0, 0, 10).await.unwrap();
        (!records.is_empty()).then_some(records)
    })
    .await;
    assert_eq!(dead.len(), 1);
    let reason = dead[0].headers.get(MOTIVO).unwrap_or_default().to_owned();
    assert!(
        reason.contains("sin stock de queso-curado"),
        "motivo: {reason}"
    );
    let payload: Value = serde_json::from_slice(&dead[0].payload).unwrap();
    assert_eq!(
        payload["datos"]["id"], "P-poison",
        "the original event is kept"
    );

    eventually(
        Duration::from_secs(30),
        "the next order applied",
        || async { (stock.processed(CONSUMER).await.unwrap() == 1).then_some(()) },
    )
    .await;
    assert_eq!(stock.units("queso-curado").await.unwrap(), Some(0));
    running.stop().await.unwrap();
    stock.db().close().await;
    system.destroy().await.unwrap();
}

async fn the_demo_holds_its_invariants(backend: &str) {
    let system: System = test_system(backend);
    let options = DemoOptions {
        orders: 120,
        concurrency: 8,
        fresh: false,
        keep: true,
        timeout: Duration::from_secs(60),
        seed: 7,
        progress: false,
        redeliver: 10,
        saga: false,
        json: false,
    };
    let report = km0::demo::run(&system, &options).await.unwrap();
    assert!(report.passed(), "{}", report.render());
    assert_eq!(report.consumed, 120);
    assert_eq!(report.events_published, 120);
    // Ten events went out twice, byte for byte; each was recognised, none applied again.
    assert_eq!(report.redelivered, 10);
    assert_eq!(report.duplicates, 10);
    assert_eq!(report.messages_on_topic, Some(130));
    system.destroy().await.unwrap();
}

macro_rules! on_both_backends {
    ($($scenario:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test]
            async fn $scenario() {
                super::$scenario("sqlite").await;
            })*
        }
        mod postgres {
            $(#[tokio::test]
            async fn $scenario() {
                super::$scenario("postgres").await;
            })*
        }
    };
}

on_both_backends!(
    orders_are_applied_once_each,
    an_order_without_stock_is_dead_lettered_and_does_not_block_the_next,
    the_demo_holds_its_invariants,
);
