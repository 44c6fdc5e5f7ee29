//! entrega-sqlite's log transport against the log conformance suite of `entrega-testkit`.
//!
//! Every scenario gets its own database file in its own temporary directory.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use entrega_core::{Clock, MigrationSet, Publisher, Record, Subscriber, TopicAdmin};
use entrega_sqlite::{connect, migrate, LogConfig, SqliteLog};
use entrega_testkit::{BoxError, LogFixture, LogHarness, LogSettings};
use sqlx::SqlitePool;
use uuid::Uuid;

/// Builds fresh SQLite databases for the suites.
struct SqliteHarness;

/// A database file in its own directory, removed at teardown.
struct TestFile {
    pool: SqlitePool,
    dir: PathBuf,
}

impl TestFile {
    async fn new(sets: &[MigrationSet]) -> Result<Self, BoxError> {
        let dir = std::env::temp_dir().join(format!("entrega_t_{}", Uuid::new_v4().simple()));
        let pool = connect(&format!("sqlite://{}/conformance.db", dir.display())).await?;
        migrate(&pool, sets).await?;
        Ok(Self { pool, dir })
    }

    async fn remove(&self) -> Result<(), BoxError> {
        self.pool.close().await;
        std::fs::remove_dir_all(&self.dir)?;
        Ok(())
    }
}

struct LogDb {
    db: TestFile,
    log: SqliteLog,
}

#[async_trait]
impl LogHarness for SqliteHarness {
    async fn log(
        &self,
        settings: LogSettings,
        clock: Arc<dyn Clock>,
    ) -> Result<Box<dyn LogFixture>, BoxError> {
        let db = TestFile::new(&[MigrationSet::Log]).await?;
        let config = LogConfig {
            lease_ttl: settings.lease_ttl,
            heartbeat: settings.heartbeat,
            poll_interval: settings.poll_interval,
            auto_create_partitions: settings.auto_create_partitions,
        };
        let log = SqliteLog::with_config(db.pool.clone(), config, clock);
        Ok(Box::new(LogDb { db, log }))
    }
}

#[async_trait]
impl LogFixture for LogDb {
    fn publisher(&self) -> Arc<dyn Publisher> {
        Arc::new(self.log.clone())
    }
    fn admin(&self) -> Arc<dyn TopicAdmin> {
        Arc::new(self.log.clone())
    }
    fn subscriber(&self) -> Arc<dyn Subscriber> {
        Arc::new(self.log.clone())
    }

    async fn committed(&self, group: &str, topic: &str) -> Result<Vec<(u32, i64)>, BoxError> {
        Ok(self.log.committed(group, topic).await?)
    }

    async fn end_offsets(&self, topic: &str) -> Result<Vec<(u32, i64)>, BoxError> {
        Ok(self.log.end_offsets(topic).await?)
    }

    async fn read(
        &self,
        topic: &str,
        partition: u32,
        from: i64,
        max: usize,
    ) -> Result<Vec<Record>, BoxError> {
        Ok(self.log.read(topic, partition, from, max).await?)
    }

    async fn teardown(self: Box<Self>) -> Result<(), BoxError> {
        self.db.remove().await
    }
}

mod log {
    entrega_testkit::log_conformance!(super::SqliteHarness);
}
