//! Migrations: idempotent, concurrent-safe, recorded per set, adopting seed tables.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use crate::common;

use common::{TestDb, ALL};
use entrega_core::{MigrationSet, StoreError};
use entrega_sqlite::migrate;

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

fn assert_send<T: Send>(_: &T) {}

#[tokio::test]
async fn the_public_futures_can_be_spawned() {
    let db = TestDb::new(&[]).await;
    let pool = db.pool.clone();
    assert_send(&entrega_sqlite::connect("sqlite::memory:"));
    assert_send(&migrate(&pool, ALL));
    assert_send(&entrega_sqlite::begin_immediate(&pool));
    // And migrating from a spawned task works.
    tokio::spawn(async move { migrate(&pool, ALL).await })
        .await
        .unwrap()
        .unwrap();
}
