//! Migrations: idempotent, concurrent-safe, recorded per set, adopting seed tables.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use crate::common;

use common::{TestDb, ALL};
use entrega_core::{MigrationSet, NewEvent, OutboxReader, StoreError};
use entrega_sqlite::{migrate, SqliteOutbox};
use serde_json::json;

async fn versions(pool: &sqlx::SqlitePool) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT set_name, version FROM entrega_migrations ORDER BY set_name, version")
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn table_exists(pool: &sqlx::SqlitePool, name: &str) -> bool {
    let n: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?")
            .bind(name)
            .fetch_one(pool)
            .await
            .unwrap();
    n == 1
}

#[tokio::test]
async fn migrating_again_and_concurrently_changes_nothing() {
    let db = TestDb::new(ALL).await;
    let other = db.another_pool().await;
    let (a, b) = tokio::join!(migrate(&db.pool, ALL), migrate(&other, ALL));
    a.unwrap();
    b.unwrap();
    migrate(&db.pool, ALL).await.unwrap();

    assert_eq!(
        versions(&db.pool).await,
        vec![
            ("inbox".into(), 1),
            ("inbox".into(), 2),
            ("inbox".into(), 3),
            ("inbox".into(), 4),
            ("inbox".into(), 5),
            ("log".into(), 1),
            ("outbox".into(), 1),
            ("outbox".into(), 2),
            ("outbox".into(), 3)
        ]
    );
    let lanes: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM entrega_relay_lanes")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(lanes, 64);
    let described: String = sqlx::query_scalar(
        "SELECT description FROM entrega_migrations WHERE set_name = 'log' AND applied_at_ms > 0",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(!described.is_empty());
}

#[tokio::test]
async fn only_the_requested_sets_are_created() {
    let db = TestDb::new(&[MigrationSet::Inbox]).await;
    assert!(table_exists(&db.pool, "mensajes_procesados").await);
    assert!(table_exists(&db.pool, "entrega_respuestas").await);
    assert!(table_exists(&db.pool, "entrega_peticiones").await);
    assert!(table_exists(&db.pool, "entrega_retenidos").await);
    assert!(!table_exists(&db.pool, "outbox").await);
    assert!(!table_exists(&db.pool, "entrega_log").await);
    assert_eq!(
        versions(&db.pool).await,
        vec![
            ("inbox".into(), 1),
            ("inbox".into(), 2),
            ("inbox".into(), 3),
            ("inbox".into(), 4),
            ("inbox".into(), 5)
        ]
    );

    migrate(&db.pool, &[MigrationSet::Log]).await.unwrap();
    assert!(table_exists(&db.pool, "entrega_log").await);
    assert_eq!(versions(&db.pool).await.len(), 6);
}

#[tokio::test]
async fn a_newer_schema_is_refused_without_changes() {
    let db = TestDb::new(&[MigrationSet::Inbox]).await;
    sqlx::query(
        "INSERT INTO entrega_migrations (set_name, version, description, applied_at_ms)
         VALUES ('outbox', 99, 'from the future', 0)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let err = migrate(&db.pool, &[MigrationSet::Outbox])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::SchemaTooNew {
                found: 99,
                supported: 3
            }
        ),
        "{err:?}"
    );
    assert!(!err.is_transient());
    assert!(!table_exists(&db.pool, "entrega_relay_lanes").await);
}

#[tokio::test]
async fn tables_created_from_the_seed_sql_are_adopted() {
    let db = TestDb::new(&[]).await;
    // The seed's tables as a SQLite user would write them: no `lane`, no entrega bookkeeping.
    sqlx::raw_sql(
        "CREATE TABLE outbox (
             id UUID PRIMARY KEY, agregado TEXT NOT NULL, agregado_id TEXT NOT NULL,
             tipo TEXT NOT NULL, version INTEGER NOT NULL DEFAULT 1, carga JSONB NOT NULL,
             creado_en TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP, publicado_en TIMESTAMPTZ);
         CREATE TABLE mensajes_procesados (
             id_mensaje TEXT NOT NULL, consumidor TEXT NOT NULL,
             procesado_en TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
             PRIMARY KEY (id_mensaje, consumidor));
         INSERT INTO outbox (id, agregado, agregado_id, tipo, carga)
         VALUES ('0b8f4a52-33a4-4f4e-a1a6-7a4b8d1c2e3f', 'pedido', 'P-1', 'pedido.creado', '{\"id\":\"P-1\"}');",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    migrate(&db.pool, ALL).await.unwrap();

    let outbox = SqliteOutbox::new(db.pool.clone());
    let pending = outbox.pending(0, 10).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].payload, json!({"id": "P-1"}));
    assert!(pending[0].created_at_ms > 1_600_000_000_000);

    // New rows still get their computed lane.
    let event = NewEvent::new("pedido", "P-2", "pedido.creado", json!({}));
    let mut tx = db.pool.begin().await.unwrap();
    SqliteOutbox::enqueue(&mut tx, &event).await.unwrap();
    tx.commit().await.unwrap();
    let lane = entrega_core::lane_of("P-2");
    let rows = outbox.pending(lane, 10).await.unwrap();
    assert!(rows.iter().any(|r| r.id == event.id));
}

#[tokio::test]
async fn an_in_memory_database_works_across_pool_connections() {
    let pool = entrega_sqlite::connect("sqlite::memory:").await.unwrap();
    migrate(&pool, ALL).await.unwrap();
    let event = NewEvent::new("pedido", "P-9", "pedido.creado", json!({"n": 1}));
    let mut tx = entrega_sqlite::begin_immediate(&pool).await.unwrap();
    SqliteOutbox::enqueue(&mut tx, &event).await.unwrap();
    // A second connection while the first is busy must see the same database.
    let outbox = SqliteOutbox::new(pool.clone());
    tx.commit().await.unwrap();
    let rows = outbox
        .pending(entrega_core::lane_of("P-9"), 10)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
}

fn assert_send<T: Send>(_: &T) {}

#[tokio::test]
async fn the_public_futures_can_be_spawned() {
    let db = TestDb::new(&[]).await;
    let pool = db.pool.clone();
    let mut conn = db.pool.acquire().await.unwrap();
    let event = NewEvent::new("pedido", "P-1", "pedido.creado", json!({}));
    assert_send(&entrega_sqlite::connect("sqlite::memory:"));
    assert_send(&migrate(&pool, ALL));
    assert_send(&entrega_sqlite::begin_immediate(&pool));
    assert_send(&SqliteOutbox::enqueue(&mut conn, &event));
    assert_send(&SqliteOutbox::enqueue_all(&mut conn, &[]));
    assert_send(&entrega_sqlite::SqliteInbox::claim(&mut conn, "c", "m"));
    assert_send(&entrega_sqlite::SqliteInbox::purge_older_than(
        &pool,
        std::time::Duration::ZERO,
    ));
    assert_send(&entrega_sqlite::SqliteInbox::count(&pool, "c"));
    // And migrating from a spawned task works.
    tokio::spawn(async move { migrate(&pool, ALL).await })
        .await
        .unwrap()
        .unwrap();
}
