//! entrega-postgres against the shared conformance suites of `entrega-testkit`.
//!
//! Every scenario creates its own database (`entrega_t_<uuid>`) on the server named by
//! `ENTREGA_TEST_PG` (default `postgres://postgres@127.0.0.1:5432`) and drops it at the end.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{
    Clock, LaneLeases, MigrationSet, NewEvent, OutboxMaintenance, OutboxReader, OutboxWakeup,
    ParkingStore, Publisher, Record, Subscriber, TopicAdmin,
};
use entrega_postgres::{
    connect, ensure_database, migrate, LogConfig, PgInbox, PgLog, PgOutbox, PgParking, PgPool,
};
use entrega_testkit::{
    BoxError, HeldTx, InboxFixture, InboxHarness, LogFixture, LogHarness, LogSettings,
    OutboxFixture, OutboxHarness, ParkingFixture, ParkingHarness, RowState, TxEnd,
};
use sqlx::{Connection, PgConnection, Postgres, Transaction};
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

struct OutboxDb {
    db: TestDb,
    outbox: PgOutbox,
}

#[async_trait]
impl OutboxHarness for PgHarness {
    async fn outbox(&self, clock: Arc<dyn Clock>) -> Result<Box<dyn OutboxFixture>, BoxError> {
        let db = TestDb::new(&[MigrationSet::Outbox]).await?;
        let outbox = PgOutbox::with_clock(db.pool.clone(), clock);
        Ok(Box::new(OutboxDb { db, outbox }))
    }
}

/// A transaction that inserted rows and stays open: their `seq` is taken, they are invisible.
struct OpenTx(Transaction<'static, Postgres>);

#[async_trait]
impl HeldTx for OpenTx {
    async fn commit(self: Box<Self>) -> Result<(), BoxError> {
        self.0.commit().await?;
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
        let mut tx = self.db.pool.begin().await?;
        PgOutbox::enqueue_all(&mut tx, events).await?;
        match end {
            TxEnd::Commit => tx.commit().await?,
            TxEnd::Rollback => tx.rollback().await?,
        }
        Ok(())
    }

    async fn enqueue_held(&self, events: &[NewEvent]) -> Result<Box<dyn HeldTx>, BoxError> {
        let mut tx = self.db.pool.begin().await?;
        PgOutbox::enqueue_all(&mut tx, events).await?;
        Ok(Box::new(OpenTx(tx)))
    }

    async fn row(&self, id: Uuid) -> Result<Option<RowState>, BoxError> {
        let row: Option<(i16, i64, bool)> =
            sqlx::query_as("SELECT lane, seq, publicado_en IS NOT NULL FROM outbox WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.db.pool)
                .await?;
        Ok(row.map(|(lane, seq, published)| RowState {
            lane: u32::try_from(lane).unwrap_or(u32::MAX),
            seq,
            published,
        }))
    }

    async fn row_count(&self) -> Result<u64, BoxError> {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
            .fetch_one(&self.db.pool)
            .await?;
        Ok(u64::try_from(n)?)
    }

    async fn teardown(self: Box<Self>) -> Result<(), BoxError> {
        self.db.drop_database().await
    }
}

#[async_trait]
impl ParkingHarness for PgHarness {
    async fn parking(&self) -> Result<Box<dyn ParkingFixture>, BoxError> {
        let db = TestDb::new(&[MigrationSet::Inbox]).await?;
        Ok(Box::new(ParkingDb(db)))
    }
}

/// A database with the inbox set, as a parking fixture.
struct ParkingDb(TestDb);

#[async_trait]
impl ParkingFixture for ParkingDb {
    fn store(&self) -> Arc<dyn ParkingStore> {
        Arc::new(PgParking::new(self.0.pool.clone()))
    }

    async fn teardown(self: Box<Self>) -> Result<(), BoxError> {
        self.0.drop_database().await
    }
}

#[async_trait]
impl InboxHarness for PgHarness {
    async fn inbox(&self) -> Result<Box<dyn InboxFixture>, BoxError> {
        Ok(Box::new(TestDb::new(&[MigrationSet::Inbox]).await?))
    }
}

#[async_trait]
impl InboxFixture for TestDb {
    async fn claim(&self, consumer: &str, message_id: &str, end: TxEnd) -> Result<bool, BoxError> {
        let mut tx = self.pool.begin().await?;
        let new = PgInbox::claim(&mut tx, consumer, message_id).await?;
        match end {
            TxEnd::Commit => tx.commit().await?,
            TxEnd::Rollback => tx.rollback().await?,
        }
        Ok(new)
    }

    async fn count(&self, consumer: &str) -> Result<u64, BoxError> {
        Ok(PgInbox::count(&self.pool, consumer).await?)
    }

    async fn purge_older_than(&self, age: Duration) -> Result<u64, BoxError> {
        Ok(PgInbox::purge_older_than(&self.pool, age).await?)
    }

    async fn backdate(
        &self,
        consumer: &str,
        message_id: &str,
        age: Duration,
    ) -> Result<(), BoxError> {
        sqlx::query(
            "UPDATE mensajes_procesados SET procesado_en = procesado_en - make_interval(secs => $1)
             WHERE consumidor = $2 AND id_mensaje = $3",
        )
        .bind(age.as_secs_f64())
        .bind(consumer)
        .bind(message_id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn teardown(self: Box<Self>) -> Result<(), BoxError> {
        self.drop_database().await
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

mod outbox {
    entrega_testkit::outbox_conformance!(super::PgHarness);
}

mod parking {
    entrega_testkit::parking_conformance!(super::PgHarness);
}

mod inbox {
    entrega_testkit::inbox_conformance!(super::PgHarness);
}

mod log {
    entrega_testkit::log_conformance!(super::PgHarness);
}
