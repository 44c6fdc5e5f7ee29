//! The dead-letter operator store on SQLite: the shared conformance scenarios, and its
//! migration set applied on its own.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use crate::common;

use std::sync::Arc;

use async_trait::async_trait;
use common::TestDb;
use entrega_core::{DlqStore, MigrationSet};
use entrega_sqlite::SqliteDlqStore;
use entrega_testkit::{BoxError, DlqFixture, DlqHarness};

struct SqliteHarness;

struct StoreDb {
    db: TestDb,
    store: SqliteDlqStore,
}

#[async_trait]
impl DlqHarness for SqliteHarness {
    async fn dlq(&self) -> Result<Box<dyn DlqFixture>, BoxError> {
        let db = TestDb::new(&[MigrationSet::Dlq]).await;
        let store = SqliteDlqStore::new(db.pool.clone());
        Ok(Box::new(StoreDb { db, store }))
    }
}

#[async_trait]
impl DlqFixture for StoreDb {
    fn store(&self) -> Arc<dyn DlqStore> {
        Arc::new(self.store.clone())
    }

    async fn teardown(self: Box<Self>) -> Result<(), BoxError> {
        self.db.pool.close().await;
        Ok(())
    }
}

entrega_testkit::dlq_conformance!(SqliteHarness);

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
