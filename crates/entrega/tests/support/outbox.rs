//! An outbox on a fresh database of either backend, through `Db` as every caller sees it,
//! behind the testkit's fixture trait.

use std::sync::Arc;

use async_trait::async_trait;
use entrega::db::{query, query_each, Backend, Db, Tx};
use entrega::OutboxPorts;
use entrega_core::{
    Clock, LaneLeases, MigrationSet, NewEvent, OutboxMaintenance, OutboxReader, OutboxWakeup,
};
use entrega_testkit::{BoxError, HeldTx, OutboxFixture, RowState, TxEnd};
use uuid::Uuid;

use super::pg::FreshDb;
use super::TempDir;

/// How a transaction that commits late is played.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LateCommit {
    /// Its rows are inserted at commit time.
    Deferred,
    /// Its rows are inserted now and stay invisible until it commits (PostgreSQL: their
    /// sequence is drawn early). SQLite serializes writers, so there it is always deferred.
    Open,
}

/// An outbox in a database of its own.
pub struct DbOutboxFixture {
    pub fresh: FreshDb,
    ports: OutboxPorts,
    late: LateCommit,
}

impl DbOutboxFixture {
    pub async fn new(backend: Backend, dir: &TempDir, clock: Arc<dyn Clock>) -> Self {
        Self::with_late_commits(backend, dir, clock, LateCommit::Deferred).await
    }

    pub async fn with_late_commits(
        backend: Backend,
        dir: &TempDir,
        clock: Arc<dyn Clock>,
        late: LateCommit,
    ) -> Self {
        let fresh = FreshDb::new(backend, dir, "pedidos.db").await;
        fresh
            .db
            .migrate(&[MigrationSet::Outbox])
            .await
            .expect("migrate");
        let ports = fresh.db.outbox_with_clock(clock);
        Self { fresh, ports, late }
    }

    pub fn db(&self) -> &Db {
        &self.fresh.db
    }

    /// The PostgreSQL database to drop when done, if on PostgreSQL.
    pub fn pg_database(&self) -> Option<String> {
        self.fresh.name()
    }
}

struct Deferred {
    db: Db,
    events: Vec<NewEvent>,
}

#[async_trait]
impl HeldTx for Deferred {
    async fn commit(self: Box<Self>) -> Result<(), BoxError> {
        let mut tx = self.db.begin().await?;
        tx.enqueue_all(&self.events).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// A transaction that inserted rows and stays open.
struct Open(Tx);

#[async_trait]
impl HeldTx for Open {
    async fn commit(self: Box<Self>) -> Result<(), BoxError> {
        self.0.commit().await?;
        Ok(())
    }
}

#[async_trait]
impl OutboxFixture for DbOutboxFixture {
    fn leases(&self) -> Arc<dyn LaneLeases> {
        self.ports.leases.clone()
    }
    fn reader(&self) -> Arc<dyn OutboxReader> {
        self.ports.reader.clone()
    }
    fn maintenance(&self) -> Arc<dyn OutboxMaintenance> {
        self.ports.maintenance.clone()
    }
    fn wakeup(&self) -> Arc<dyn OutboxWakeup> {
        self.ports.wakeup.clone()
    }

    async fn enqueue(&self, events: &[NewEvent], end: TxEnd) -> Result<(), BoxError> {
        let mut tx = self.db().begin().await?;
        tx.enqueue_all(events).await?;
        match end {
            TxEnd::Commit => tx.commit().await?,
            TxEnd::Rollback => tx.rollback().await?,
        }
        Ok(())
    }

    async fn enqueue_held(&self, events: &[NewEvent]) -> Result<Box<dyn HeldTx>, BoxError> {
        if self.late == LateCommit::Open && self.db().backend() == Backend::Postgres {
            let mut tx = self.db().begin().await?;
            tx.enqueue_all(events).await?;
            return Ok(Box::new(Open(tx)));
        }
        Ok(Box::new(Deferred {
            db: self.db().clone(),
            events: events.to_vec(),
        }))
    }

    async fn row(&self, id: Uuid) -> Result<Option<RowState>, BoxError> {
        let row: Option<(i64, i64, bool)> = self
            .db()
            .fetch_optional(
                query_each(
                    "SELECT lane, rowid, publicado_en IS NOT NULL FROM outbox WHERE id = $1",
                    "SELECT CAST(lane AS BIGINT), seq, publicado_en IS NOT NULL FROM outbox
                     WHERE id = $1",
                )
                .bind(id),
            )
            .await?;
        Ok(row.map(|(lane, seq, published)| RowState {
            lane: u32::try_from(lane).unwrap_or(u32::MAX),
            seq,
            published,
        }))
    }

    async fn row_count(&self) -> Result<u64, BoxError> {
        let n: Option<i64> = self
            .db()
            .scalar(query("SELECT COUNT(*) FROM outbox"))
            .await?;
        Ok(u64::try_from(n.unwrap_or(0))?)
    }

    async fn teardown(self: Box<Self>) -> Result<(), BoxError> {
        self.fresh.finish().await;
        Ok(())
    }
}
