//! The dead-letter migration set applied on its own.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use crate::common;

use common::TestDb;
use entrega_core::MigrationSet;

#[tokio::test]
async fn the_dlq_set_is_applied_once_and_alone() {
    let db = TestDb::new(&[MigrationSet::Dlq]).await;
    entrega_sqlite::migrate(&db.pool, &[MigrationSet::Dlq])
        .await
        .unwrap();
    let sets: Vec<(String, i64)> =
        sqlx::query_as("SELECT set_name, version FROM entrega_migrations ORDER BY set_name")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(sets, vec![("dlq".to_owned(), 1)]);
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'entrega_dlq%'
         ORDER BY name",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(tables, ["entrega_dlq_audit", "entrega_dlq_state"]);
}
