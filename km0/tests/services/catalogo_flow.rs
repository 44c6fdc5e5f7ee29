//! The seed's exercise 2 through the whole system: an order's stock change leaves
//! inventario's outbox as `stock.actualizado` on `inventario.eventos` and reaches catalogo's
//! low-stock flag. On SQLite and on PostgreSQL; assertions read rows and the log.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::{Duration, Instant};

use entrega_core::now_ms;
use km0::services::catalogo::CatalogEntry;
use km0::services::inventario::EVENTS_TOPIC;
use km0::wiring::Components;
use serde_json::json;

use common::test_system;

async fn stock_changes_reach_the_catalogue(backend: &str) {
    let system = test_system(backend);
    let running = system
        .start(Components::all("catalogo"), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = running.http_addr().unwrap();
    let client = reqwest::Client::new();
    for (id, product, quantity) in [("P-1", "queso-curado", 2), ("P-2", "calabacin", 1)] {
        let body = json!({"id": id, "cliente": "ana", "mercado": "girona",
            "lineas": [{"producto": product, "cantidad": quantity, "precio_centimos": 100}]});
        let status = client
            .post(format!("http://{addr}/pedidos"))
            .json(&body)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status.as_u16(), 201);
    }
    let catalogue = system.catalogo().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let entries = loop {
        let entries = catalogue.all().await.unwrap();
        if entries.len() == 2 {
            break entries;
        }
        assert!(Instant::now() < deadline, "catalogue rows: {entries:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    running.stop().await.unwrap();
    let entry = |product: &str, units: i64, low: bool| CatalogEntry {
        product: product.into(),
        units,
        low,
    };
    assert_eq!(
        entries,
        vec![
            entry("calabacin", 79, false),
            entry("queso-curado", 3, true)
        ]
    );
    let log = system.broker_log().await.unwrap();
    assert_eq!(log.topic_total(EVENTS_TOPIC).await.unwrap(), 2);
    let inventario = system.inventario().await.unwrap();
    let pending = inventario
        .db()
        .outbox()
        .maintenance
        .status(now_ms())
        .await
        .unwrap()
        .pending;
    assert_eq!(pending, 0, "inventario's outbox drained");
    inventario.db().close().await;
    catalogue.db().close().await;
    system.destroy().await.unwrap();
}

#[tokio::test]
async fn sqlite_stock_changes_reach_the_catalogue() {
    stock_changes_reach_the_catalogue("sqlite").await;
}

#[tokio::test]
async fn postgres_stock_changes_reach_the_catalogue() {
    stock_changes_reach_the_catalogue("postgres").await;
}
