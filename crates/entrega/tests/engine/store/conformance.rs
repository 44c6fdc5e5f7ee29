//! The testkit's conformance suites on both databases, through [`Db`] as every caller sees
//! the stores. Each scenario gets a fresh SQLite file or PostgreSQL database of its own.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega::broker::{DbLog, LogConfig};
use entrega::db::{query, Backend, Db, TimeMs};
use entrega_core::{Clock, DlqStore, MigrationSet, ParkingStore};
use entrega_testkit::{
    BoxError, DlqFixture, DlqHarness, InboxFixture, InboxHarness, LogFixture, LogHarness,
    LogSettings, OutboxFixture, OutboxHarness, ParkingFixture, ParkingHarness, TxEnd,
};

use crate::support::outbox::{DbOutboxFixture, LateCommit};
use crate::support::pg::FreshDb;
use crate::support::{DbLogFixture, TempDir};

/// Fresh databases of one backend for the suites.
pub struct DbHarness(pub Backend);

/// A fresh database with `sets` applied, and the directory of its SQLite file.
pub struct Fixture {
    pub fresh: FreshDb,
    _dir: TempDir,
}

impl Fixture {
    pub async fn new(backend: Backend, sets: &[MigrationSet]) -> Result<Self, BoxError> {
        let dir = TempDir::new();
        let fresh = FreshDb::new(backend, &dir, "conformance.db").await;
        fresh.db.migrate(sets).await?;
        Ok(Self { fresh, _dir: dir })
    }

    pub fn db(&self) -> &Db {
        &self.fresh.db
    }

    pub async fn finish(self) -> Result<(), BoxError> {
        self.fresh.finish().await;
        Ok(())
    }
}

#[async_trait]
impl OutboxHarness for DbHarness {
    async fn outbox(&self, clock: Arc<dyn Clock>) -> Result<Box<dyn OutboxFixture>, BoxError> {
        let dir = TempDir::new();
        let fixture =
            DbOutboxFixture::with_late_commits(self.0, &dir, clock, LateCommit::Open).await;
        Ok(Box::new(WithDir { fixture, _dir: dir }))
    }
}

/// An outbox fixture with the directory its SQLite file lives in.
struct WithDir {
    fixture: DbOutboxFixture,
    _dir: TempDir,
}

#[async_trait]
impl OutboxFixture for WithDir {
    fn leases(&self) -> Arc<dyn entrega_core::LaneLeases> {
        self.fixture.leases()
    }
    fn reader(&self) -> Arc<dyn entrega_core::OutboxReader> {
        self.fixture.reader()
    }
    fn maintenance(&self) -> Arc<dyn entrega_core::OutboxMaintenance> {
        self.fixture.maintenance()
    }
    fn wakeup(&self) -> Arc<dyn entrega_core::OutboxWakeup> {
        self.fixture.wakeup()
    }
    async fn enqueue(&self, events: &[entrega_core::NewEvent], end: TxEnd) -> Result<(), BoxError> {
        self.fixture.enqueue(events, end).await
    }
    async fn enqueue_held(
        &self,
        events: &[entrega_core::NewEvent],
    ) -> Result<Box<dyn entrega_testkit::HeldTx>, BoxError> {
        self.fixture.enqueue_held(events).await
    }
    async fn row(&self, id: uuid::Uuid) -> Result<Option<entrega_testkit::RowState>, BoxError> {
        self.fixture.row(id).await
    }
    async fn row_count(&self) -> Result<u64, BoxError> {
        self.fixture.row_count().await
    }
    async fn teardown(self: Box<Self>) -> Result<(), BoxError> {
        Box::new(self.fixture).teardown().await
    }
}

#[async_trait]
impl LogHarness for DbHarness {
    async fn log(
        &self,
        settings: LogSettings,
        clock: Arc<dyn Clock>,
    ) -> Result<Box<dyn LogFixture>, BoxError> {
        let Fixture { fresh, _dir: dir } = Fixture::new(self.0, &[MigrationSet::Log]).await?;
        let config = LogConfig {
            lease_ttl: settings.lease_ttl,
            heartbeat: settings.heartbeat,
            poll_interval: settings.poll_interval,
            auto_create_partitions: settings.auto_create_partitions,
        };
        let log = DbLog::new(fresh.db.clone(), config, clock);
        Ok(Box::new(DbLogFixture::owning(log, fresh, dir)))
    }
}

#[async_trait]
impl InboxHarness for DbHarness {
    async fn inbox(&self) -> Result<Box<dyn InboxFixture>, BoxError> {
        Ok(Box::new(
            Fixture::new(self.0, &[MigrationSet::Inbox]).await?,
        ))
    }
}

#[async_trait]
impl InboxFixture for Fixture {
    async fn claim(&self, consumer: &str, message_id: &str, end: TxEnd) -> Result<bool, BoxError> {
        let mut tx = self.db().begin().await?;
        let new = tx.claim(consumer, message_id).await?;
        match end {
            TxEnd::Commit => tx.commit().await?,
            TxEnd::Rollback => tx.rollback().await?,
        }
        Ok(new)
    }

    async fn count(&self, consumer: &str) -> Result<u64, BoxError> {
        Ok(self.db().processed(consumer).await?)
    }

    async fn purge_older_than(&self, age: Duration) -> Result<u64, BoxError> {
        Ok(self.db().purge_processed(age).await?)
    }

    async fn backdate(
        &self,
        consumer: &str,
        message_id: &str,
        age: Duration,
    ) -> Result<(), BoxError> {
        let age_ms = i64::try_from(age.as_millis())?;
        self.db()
            .execute(
                query(
                    "UPDATE mensajes_procesados SET procesado_en = $1
                     WHERE consumidor = $2 AND id_mensaje = $3",
                )
                .bind(TimeMs(entrega_core::now_ms() - age_ms))
                .bind(consumer)
                .bind(message_id),
            )
            .await?;
        Ok(())
    }

    async fn teardown(self: Box<Self>) -> Result<(), BoxError> {
        self.finish().await
    }
}

#[async_trait]
impl ParkingHarness for DbHarness {
    async fn parking(&self) -> Result<Box<dyn ParkingFixture>, BoxError> {
        Ok(Box::new(Parking(
            Fixture::new(self.0, &[MigrationSet::Inbox]).await?,
        )))
    }
}

/// A database with the inbox set, as a parking fixture.
struct Parking(Fixture);

#[async_trait]
impl ParkingFixture for Parking {
    fn store(&self) -> Arc<dyn ParkingStore> {
        self.0.db().parking()
    }

    async fn teardown(self: Box<Self>) -> Result<(), BoxError> {
        self.0.finish().await
    }
}

#[async_trait]
impl DlqHarness for DbHarness {
    async fn dlq(&self) -> Result<Box<dyn DlqFixture>, BoxError> {
        Ok(Box::new(DeadLetters(
            Fixture::new(self.0, &[MigrationSet::Dlq]).await?,
        )))
    }
}

/// A database with the dlq set, as a dead-letter store fixture.
struct DeadLetters(Fixture);

#[async_trait]
impl DlqFixture for DeadLetters {
    fn store(&self) -> Arc<dyn DlqStore> {
        self.0.db().dead_letters()
    }

    async fn teardown(self: Box<Self>) -> Result<(), BoxError> {
        self.0.finish().await
    }
}

/// Every store's conformance suite on one backend, as `<backend>::<store>::<scenario>`.
macro_rules! every_suite {
    ($($backend:ident => $variant:ident),+ $(,)?) => {
        $(
            mod $backend {
                mod outbox {
                    entrega_testkit::outbox_conformance!(crate::store::conformance::DbHarness(
                        entrega::db::Backend::$variant
                    ));
                }
                mod inbox {
                    entrega_testkit::inbox_conformance!(crate::store::conformance::DbHarness(
                        entrega::db::Backend::$variant
                    ));
                }
                mod parking {
                    entrega_testkit::parking_conformance!(crate::store::conformance::DbHarness(
                        entrega::db::Backend::$variant
                    ));
                }
                mod dead_letters {
                    entrega_testkit::dlq_conformance!(crate::store::conformance::DbHarness(
                        entrega::db::Backend::$variant
                    ));
                }
                mod log {
                    entrega_testkit::log_conformance!(crate::store::conformance::DbHarness(
                        entrega::db::Backend::$variant
                    ));
                }
            }
        )+
    };
}

every_suite!(sqlite => Sqlite, postgres => Postgres);
