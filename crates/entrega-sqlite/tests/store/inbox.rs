//! The idempotent consumer's keys: claimed with the effect, duplicates refused, purged by age.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::TestDb;
use entrega_core::MigrationSet;
use entrega_sqlite::{begin_immediate, SqliteInbox};

const CONSUMER: &str = "inventario.descuento_stock";

async fn inbox_db() -> TestDb {
    let db = TestDb::new(&[MigrationSet::Inbox]).await;
    sqlx::raw_sql(
        "CREATE TABLE stock (producto TEXT PRIMARY KEY, unidades INTEGER NOT NULL CHECK (unidades >= 0));
         INSERT INTO stock VALUES ('queso-curado', 5);",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    db
}

/// The seed's consumer: claim the key, apply the effect, commit both together.
async fn consume(db: &TestDb, consumer: &str, message_id: &str, units: i64) -> bool {
    let mut tx = begin_immediate(&db.pool).await.unwrap();
    let fresh = SqliteInbox::claim(&mut tx, consumer, message_id)
        .await
        .unwrap();
    if fresh {
        sqlx::query("UPDATE stock SET unidades = unidades - ? WHERE producto = 'queso-curado'")
            .bind(units)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    fresh
}

async fn stock(db: &TestDb) -> i64 {
    sqlx::query_scalar("SELECT unidades FROM stock WHERE producto = 'queso-curado'")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_new_key_is_claimed_once_and_a_duplicate_does_nothing() {
    let db = inbox_db().await;
    assert!(consume(&db, CONSUMER, "evt-1", 2).await);
    assert!(!consume(&db, CONSUMER, "evt-1", 2).await);
    assert_eq!(stock(&db).await, 3, "the effect ran once");
    assert_eq!(SqliteInbox::count(&db.pool, CONSUMER).await.unwrap(), 1);

    // Another consumer of the same event keeps its own key.
    assert!(consume(&db, "inventario.aviso_productor", "evt-1", 0).await);
    assert_eq!(
        SqliteInbox::count(&db.pool, "inventario.aviso_productor")
            .await
            .unwrap(),
        1
    );
    assert_eq!(SqliteInbox::count(&db.pool, CONSUMER).await.unwrap(), 1);
}

#[tokio::test]
async fn a_failed_effect_rolls_the_key_back_too() {
    let db = inbox_db().await;
    let mut tx = begin_immediate(&db.pool).await.unwrap();
    assert!(SqliteInbox::claim(&mut tx, CONSUMER, "evt-2")
        .await
        .unwrap());
    let effect =
        sqlx::query("UPDATE stock SET unidades = unidades - 50 WHERE producto = 'queso-curado'")
            .execute(&mut *tx)
            .await;
    assert!(
        effect.is_err(),
        "the CHECK constraint refuses negative stock"
    );
    tx.rollback().await.unwrap();

    assert_eq!(SqliteInbox::count(&db.pool, CONSUMER).await.unwrap(), 0);
    assert!(
        consume(&db, CONSUMER, "evt-2", 1).await,
        "the redelivery is applied"
    );
    assert_eq!(stock(&db).await, 4);
}

#[tokio::test]
async fn keys_are_purged_by_age() {
    let db = inbox_db().await;
    sqlx::query(
        "INSERT INTO mensajes_procesados (id_mensaje, consumidor, procesado_en)
         VALUES ('old-1', ?1, '2020-01-01T00:00:00.000Z'), ('old-2', ?1, '2024-06-30T23:59:59.999Z')",
    )
    .bind(CONSUMER)
    .execute(&db.pool)
    .await
    .unwrap();
    assert!(consume(&db, CONSUMER, "recent", 1).await);
    let default_format: String = sqlx::query_scalar(
        "SELECT procesado_en FROM mensajes_procesados WHERE id_mensaje = 'recent'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(default_format.len(), "2026-01-01T00:00:00.000Z".len());
    assert!(default_format.ends_with('Z') && default_format.contains('T'));

    let purged = SqliteInbox::purge_older_than(&db.pool, Duration::from_secs(24 * 3600))
        .await
        .unwrap();
    assert_eq!(purged, 2);
    assert_eq!(SqliteInbox::count(&db.pool, CONSUMER).await.unwrap(), 1);
    let left: String = sqlx::query_scalar("SELECT id_mensaje FROM mensajes_procesados")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, "recent");
}
