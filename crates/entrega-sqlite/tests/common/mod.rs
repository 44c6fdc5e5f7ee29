//! Shared helpers: a throwaway database file per test.
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::path::PathBuf;

use entrega_core::MigrationSet;
use sqlx::SqlitePool;

/// Every migration set.
pub const ALL: &[MigrationSet] = &[MigrationSet::Outbox, MigrationSet::Inbox, MigrationSet::Log];

/// A fresh database file in its own temporary directory, removed on drop.
pub struct TestDb {
    pub pool: SqlitePool,
    pub url: String,
    dir: PathBuf,
}

impl TestDb {
    /// A new database with `sets` migrated.
    pub async fn new(sets: &[MigrationSet]) -> Self {
        let dir =
            std::env::temp_dir().join(format!("entrega-sqlite-{}", uuid::Uuid::new_v4().simple()));
        // A nested path also checks that `connect` creates parent directories.
        let url = format!("sqlite://{}/nested/test.db", dir.display());
        let pool = entrega_sqlite::connect(&url).await.expect("connect");
        entrega_sqlite::migrate(&pool, sets).await.expect("migrate");
        Self { pool, url, dir }
    }

    /// Another, independent pool on the same file (as a second process would open it).
    pub async fn another_pool(&self) -> SqlitePool {
        entrega_sqlite::connect(&self.url)
            .await
            .expect("connect again")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
