//! entrega-postgres's log transport against the log conformance suite of `entrega-testkit`.
//!
//! Every scenario creates its own database (`entrega_t_<uuid>`) on the server named by
//! `ENTREGA_TEST_PG` (default `postgres://postgres@127.0.0.1:5432`) and drops it at the end.

use std::sync::Arc;

use async_trait::async_trait;
use entrega_core::{Clock, MigrationSet, Publisher, Record, Subscriber, TopicAdmin};
use entrega_postgres::{connect, ensure_database, migrate, LogConfig, PgLog, PgPool};
use entrega_testkit::{BoxError, LogFixture, LogHarness, LogSettings};
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

/// Builds fresh PostgreSQL databases for the suites.
struct PgHarness;

fn server_url() -> String {
    std::env::var("ENTREGA_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// A database created for one scenario, dropped at teardown.
struct TestDb {
    pool: PgPool,
    name: String,
}

impl TestDb {
    async fn new(sets: &[MigrationSet]) -> Result<Self, BoxError> {
        let name = format!("entrega_t_{}", Uuid::new_v4().simple());
        let url = ensure_database(&server_url(), &name).await?;
        let pool = connect(&url).await?;
        migrate(&pool, sets).await?;
        Ok(Self { pool, name })
    }

    async fn drop_database(&self) -> Result<(), BoxError> {
        self.pool.close().await;
        let mut admin = PgConnection::connect(&server_url()).await?;
        sqlx::query(&format!(
            "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
            self.name
        ))
        .execute(&mut admin)
        .await?;
        admin.close().await?;
        Ok(())
    }
}

struct LogDb {
    db: TestDb,
    log: PgLog,
}

#[async_trait]
impl LogHarness for PgHarness {
    async fn log(
        &self,
        settings: LogSettings,
        clock: Arc<dyn Clock>,
    ) -> Result<Box<dyn LogFixture>, BoxError> {
        let db = TestDb::new(&[MigrationSet::Log]).await?;
        let config = LogConfig {
            lease_ttl: settings.lease_ttl,
            heartbeat: settings.heartbeat,
            poll_interval: settings.poll_interval,
            auto_create_partitions: settings.auto_create_partitions,
        };
        let log = PgLog::with_config(db.pool.clone(), config, clock);
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
        self.db.drop_database().await
    }
}

mod log {
    entrega_testkit::log_conformance!(super::PgHarness);
}
