//! The seed's own SQL (its Python services, statement by statement) against km0's PostgreSQL
//! databases: what the seed writes, km0 reads, and the other way round.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use entrega::Db;
use entrega_core::Envelope;
use km0::services::inventario::{StockConsumer, StockStore, CONSUMER};
use km0::services::pedidos::{NewOrder, OrderStore};
use serde_json::json;
use sqlx::PgPool;

use common::TestDb;

fn pg(db: &Db) -> &PgPool {
    db.postgres().expect("the seed is PostgreSQL")
}

#[tokio::test]
async fn an_order_written_by_the_seeds_crear_pedido_reads_back_through_km0() {
    let t = TestDb::postgres().await;
    let store = OrderStore::new(t.db.clone());
    store.migrate().await.unwrap();
    let pool = pg(&t.db);
    let pedido = json!({"id": "P-2026-000123", "cliente": "ana", "mercado": "girona",
                        "lineas": [{"producto": "queso-curado", "cantidad": 2, "precio_centimos": 1450}]});
    // crear_pedido.py, statement by statement, in one transaction.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO pedidos (id, cliente, mercado, estado) VALUES ($1, $2, $3, 'creado')")
        .bind("P-2026-000123")
        .bind("ana")
        .bind("girona")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO lineas_pedido (pedido_id, producto, cantidad, precio_centimos) \
         VALUES ($1, $2, $3, $4)",
    )
    .bind("P-2026-000123")
    .bind("queso-curado")
    .bind(2_i32)
    .bind(1450_i32)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO outbox (id, agregado, agregado_id, tipo, carga) \
         VALUES ($1, 'pedido', $2, 'pedido.creado', $3)",
    )
    .bind(uuid::Uuid::new_v4())
    .bind("P-2026-000123")
    .bind(&pedido)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let order = store.find("P-2026-000123").await.unwrap().expect("order");
    assert_eq!(order.state, km0::services::pedidos::OrderState::Created);
    assert_eq!(order.state.as_str(), "creado");
    assert_eq!(order.lines.len(), 1);
    assert_eq!(
        NewOrder::from_json(&pedido).unwrap().lines,
        order.lines,
        "same lines either way"
    );
    t.remove().await;
}

#[tokio::test]
async fn the_seeds_consumer_and_km0_share_one_idempotency_key() {
    let t = TestDb::postgres().await;
    let store = StockStore::new(t.db.clone());
    store.migrate().await.unwrap();
    let consumer = StockConsumer::new(store.clone());
    let event = Envelope::new(
        "pedido.creado",
        "pedidos",
        json!({"id": "P-1", "lineas": [{"producto": "queso-curado", "cantidad": 2}]}),
    );
    // km0 applies it first...
    consumer.apply(&event).await.unwrap();
    // ...then the seed's procesar_pedido_creado sees a duplicate: its INSERT returns no row.
    let claimed: Option<String> = sqlx::query_scalar(
        "INSERT INTO mensajes_procesados (id_mensaje, consumidor) VALUES ($1, $2) \
         ON CONFLICT DO NOTHING RETURNING id_mensaje",
    )
    .bind(event.id.to_string())
    .bind(CONSUMER)
    .fetch_optional(pg(&t.db))
    .await
    .unwrap();
    assert_eq!(claimed, None, "the seed would answer 'duplicado'");
    assert_eq!(store.units("queso-curado").await.unwrap(), Some(3));
    t.remove().await;
}
