//! The dead-letter operator store on PostgreSQL: the shared conformance scenarios, and its
//! migration set applied on its own.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use crate::common;

use std::sync::Arc;

use async_trait::async_trait;
use common::TestDb;
use entrega_core::{DlqStore, MigrationSet};
use entrega_postgres::PgDlqStore;
use entrega_testkit::{BoxError, DlqFixture, DlqHarness};

struct PgHarness;

struct StoreDb {
    db: TestDb,
    store: PgDlqStore,
}

#[async_trait]
impl DlqHarness for PgHarness {
    async fn dlq(&self) -> Result<Box<dyn DlqFixture>, BoxError> {
        let db = TestDb::with(&[MigrationSet::Dlq]).await?;
        let store = PgDlqStore::new(db.pool.clone());
        Ok(Box::new(StoreDb { db, store }))
    }
}

#[async_trait]
impl DlqFixture for StoreDb {
    fn store(&self) -> Arc<dyn DlqStore> {
        Arc::new(self.store.clone())
    }

    async fn teardown(self: Box<Self>) -> Result<(), BoxError> {
        self.db.drop().await
    }
}

entrega_testkit::dlq_conformance!(PgHarness);

#[tokio::test]
async fn the_dlq_set_is_applied_once_and_alone() -> common::TestResult {
    let db = TestDb::with(&[MigrationSet::Dlq]).await?;
    entrega_postgres::migrate(&db.pool, &[MigrationSet::Dlq]).await?;
    let sets: Vec<(String, i64)> =
        sqlx::query_as("SELECT set_name, version FROM entrega_migrations ORDER BY set_name")
            .fetch_all(&db.pool)
            .await?;
    assert_eq!(sets, vec![("dlq".to_owned(), 1)]);
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT tablename::TEXT FROM pg_tables WHERE tablename LIKE 'entrega_dlq%'
         ORDER BY tablename",
    )
    .fetch_all(&db.pool)
    .await?;
    assert_eq!(tables, ["entrega_dlq_audit", "entrega_dlq_state"]);
    db.drop().await
}
