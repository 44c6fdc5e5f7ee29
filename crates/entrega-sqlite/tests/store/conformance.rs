//! entrega-sqlite against the shared conformance suites of `entrega-testkit`.
//!
//! Every scenario gets its own database file in its own temporary directory.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{
    Clock, LaneLeases, MigrationSet, NewEvent, OutboxMaintenance, OutboxReader, OutboxWakeup,
    ParkingStore, Publisher, Record, Subscriber, TopicAdmin,
};
use entrega_sqlite::{
    begin_immediate, connect, migrate, LogConfig, SqliteInbox, SqliteLog, SqliteOutbox,
    SqliteParking,
};
use entrega_testkit::{
    BoxError, HeldTx, InboxFixture, InboxHarness, LogFixture, LogHarness, LogSettings,
    OutboxFixture, OutboxHarness, ParkingFixture, ParkingHarness, RowState, TxEnd,
};
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

struct OutboxDb {
    db: TestFile,
    outbox: SqliteOutbox,
}

#[async_trait]
impl OutboxHarness for SqliteHarness {
    async fn outbox(&self, clock: Arc<dyn Clock>) -> Result<Box<dyn OutboxFixture>, BoxError> {
        let db = TestFile::new(&[MigrationSet::Outbox]).await?;
        let outbox = SqliteOutbox::with_clock(db.pool.clone(), clock);
        Ok(Box::new(OutboxDb { db, outbox }))
    }
}

/// SQLite serializes writers: a transaction holding an insert open would block every other
/// writer, so a "late commit" is an insert made at commit time.
struct DeferredInsert {
    pool: SqlitePool,
    events: Vec<NewEvent>,
}

#[async_trait]
impl HeldTx for DeferredInsert {
    async fn commit(self: Box<Self>) -> Result<(), BoxError> {
        let mut tx = begin_immediate(&self.pool).await?;
        SqliteOutbox::enqueue_all(&mut tx, &self.events).await?;
        tx.commit().await?;
        Ok(())
    }
}

#[async_trait]
impl OutboxFixture for OutboxDb {
    fn leases(&self) -> Arc<dyn LaneLeases> {
        Arc::new(self.outbox.clone())
    }
    fn reader(&self) -> Arc<dyn OutboxReader> {
        Arc::new(self.outbox.clone())
    }
    fn maintenance(&self) -> Arc<dyn OutboxMaintenance> {
        Arc::new(self.outbox.clone())
    }
    fn wakeup(&self) -> Arc<dyn OutboxWakeup> {
        Arc::new(self.outbox.clone())
    }

    async fn enqueue(&self, events: &[NewEvent], end: TxEnd) -> Result<(), BoxError> {
        let mut tx = begin_immediate(&self.db.pool).await?;
        SqliteOutbox::enqueue_all(&mut tx, events).await?;
        match end {
            TxEnd::Commit => tx.commit().await?,
            TxEnd::Rollback => tx.rollback().await?,
        }
        Ok(())
    }

    async fn enqueue_held(&self, events: &[NewEvent]) -> Result<Box<dyn HeldTx>, BoxError> {
        Ok(Box::new(DeferredInsert {
            pool: self.db.pool.clone(),
            events: events.to_vec(),
        }))
    }

    async fn row(&self, id: Uuid) -> Result<Option<RowState>, BoxError> {
        let row: Option<(i64, i64, bool)> =
            sqlx::query_as("SELECT lane, rowid, publicado_en IS NOT NULL FROM outbox WHERE id = ?")
                .bind(id.hyphenated().to_string())
                .fetch_optional(&self.db.pool)
                .await?;
        Ok(row.map(|(lane, seq, published)| RowState {
            lane: u32::try_from(lane).unwrap_or(u32::MAX),
            seq,
            published,
        }))
    }

    async fn row_count(&self) -> Result<u64, BoxError> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox")
            .fetch_one(&self.db.pool)
            .await?;
        Ok(u64::try_from(n)?)
    }

    async fn teardown(self: Box<Self>) -> Result<(), BoxError> {
        self.db.remove().await
    }
}

#[async_trait]
impl ParkingHarness for SqliteHarness {
    async fn parking(&self) -> Result<Box<dyn ParkingFixture>, BoxError> {
        let db = TestFile::new(&[MigrationSet::Inbox]).await?;
        Ok(Box::new(ParkingDb(db)))
    }
}

/// A database with the inbox set, as a parking fixture.
struct ParkingDb(TestFile);

#[async_trait]
impl ParkingFixture for ParkingDb {
    fn store(&self) -> Arc<dyn ParkingStore> {
        Arc::new(SqliteParking::new(self.0.pool.clone()))
    }

    async fn teardown(self: Box<Self>) -> Result<(), BoxError> {
        self.0.remove().await
    }
}

#[async_trait]
impl InboxHarness for SqliteHarness {
    async fn inbox(&self) -> Result<Box<dyn InboxFixture>, BoxError> {
        Ok(Box::new(TestFile::new(&[MigrationSet::Inbox]).await?))
    }
}

#[async_trait]
impl InboxFixture for TestFile {
    async fn claim(&self, consumer: &str, message_id: &str, end: TxEnd) -> Result<bool, BoxError> {
        let mut tx = begin_immediate(&self.pool).await?;
        let new = SqliteInbox::claim(&mut tx, consumer, message_id).await?;
        match end {
            TxEnd::Commit => tx.commit().await?,
            TxEnd::Rollback => tx.rollback().await?,
        }
        Ok(new)
    }

    async fn count(&self, consumer: &str) -> Result<u64, BoxError> {
        Ok(SqliteInbox::count(&self.pool, consumer).await?)
    }

    async fn purge_older_than(&self, age: Duration) -> Result<u64, BoxError> {
        Ok(SqliteInbox::purge_older_than(&self.pool, age).await?)
    }

    async fn backdate(
        &self,
        consumer: &str,
        message_id: &str,
        age: Duration,
    ) -> Result<(), BoxError> {
        sqlx::query(
            "UPDATE mensajes_procesados
             SET procesado_en = strftime('%Y-%m-%dT%H:%M:%fZ', procesado_en, ?)
             WHERE consumidor = ? AND id_mensaje = ?",
        )
        .bind(format!("-{} seconds", age.as_secs()))
        .bind(consumer)
        .bind(message_id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn teardown(self: Box<Self>) -> Result<(), BoxError> {
        self.remove().await
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

mod outbox {
    entrega_testkit::outbox_conformance!(super::SqliteHarness);
}

mod parking {
    entrega_testkit::parking_conformance!(super::SqliteHarness);
}

mod inbox {
    entrega_testkit::inbox_conformance!(super::SqliteHarness);
}

mod log {
    entrega_testkit::log_conformance!(super::SqliteHarness);
}
