//! An outbox on a fresh PostgreSQL database (`ENTREGA_TEST_PG`, default
//! `postgres://postgres@127.0.0.1:5432`), dropped by [`super::Env::finish`].

use std::sync::Arc;

use async_trait::async_trait;
use entrega_core::{
    Clock, LaneLeases, MigrationSet, NewEvent, OutboxMaintenance, OutboxReader, OutboxWakeup,
};
use entrega_postgres::{PgOutbox, PgPool};
use entrega_testkit::{BoxError, HeldTx, OutboxFixture, RowState, TxEnd};
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

pub fn server_url() -> String {
    std::env::var("ENTREGA_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// An outbox in a database of its own.
pub struct PgOutboxFixture {
    pub pool: PgPool,
    pub outbox: PgOutbox,
    pub name: String,
}

impl PgOutboxFixture {
    pub async fn new(clock: Arc<dyn Clock>) -> Self {
        let name = format!("entrega_t_{}", Uuid::new_v4().simple());
        let url = entrega_postgres::ensure_database(&server_url(), &name)
            .await
            .expect("create database");
        let pool = entrega_postgres::connect(&url).await.expect("connect");
        entrega_postgres::migrate(&pool, &[MigrationSet::Outbox])
            .await
            .expect("migrate");
        let outbox = PgOutbox::with_clock(pool.clone(), clock);
        Self { pool, outbox, name }
    }
}

/// Drops a database made by [`PgOutboxFixture::new`].
pub async fn drop_database(name: &str) {
    let mut admin = PgConnection::connect(&server_url()).await.expect("admin");
    sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
        .execute(&mut admin)
        .await
        .expect("drop database");
}

struct Deferred {
    pool: PgPool,
    events: Vec<NewEvent>,
}

#[async_trait]
impl HeldTx for Deferred {
    async fn commit(self: Box<Self>) -> Result<(), BoxError> {
        let mut tx = self.pool.begin().await?;
        PgOutbox::enqueue_all(&mut tx, &self.events).await?;
        tx.commit().await?;
        Ok(())
    }
}

#[async_trait]
impl OutboxFixture for PgOutboxFixture {
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
        let mut tx = self.pool.begin().await?;
        PgOutbox::enqueue_all(&mut tx, events).await?;
        match end {
            TxEnd::Commit => tx.commit().await?,
            TxEnd::Rollback => tx.rollback().await?,
        }
        Ok(())
    }
    async fn enqueue_held(&self, events: &[NewEvent]) -> Result<Box<dyn HeldTx>, BoxError> {
        Ok(Box::new(Deferred {
            pool: self.pool.clone(),
            events: events.to_vec(),
        }))
    }
    async fn row(&self, id: Uuid) -> Result<Option<RowState>, BoxError> {
        let row: Option<(i16, i64, bool)> =
            sqlx::query_as("SELECT lane, seq, publicado_en IS NOT NULL FROM outbox WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|(lane, seq, published)| RowState {
            lane: u32::try_from(lane).unwrap_or(u32::MAX),
            seq,
            published,
        }))
    }
    async fn row_count(&self) -> Result<u64, BoxError> {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
            .fetch_one(&self.pool)
            .await?;
        Ok(u64::try_from(n)?)
    }
    async fn teardown(self: Box<Self>) -> Result<(), BoxError> {
        self.pool.close().await;
        drop_database(&self.name).await;
        Ok(())
    }
}

/// A fresh database of either backend: a SQLite file in `dir`, or a PostgreSQL database of
/// its own on [`server_url`], dropped by [`FreshDb::finish`].
pub struct FreshDb {
    pub db: entrega::db::Db,
    name: Option<String>,
}

impl FreshDb {
    pub async fn new(backend: entrega::db::Backend, dir: &super::TempDir, file: &str) -> Self {
        match backend {
            entrega::db::Backend::Sqlite => Self {
                db: entrega::db::Db::connect(&dir.url(file))
                    .await
                    .expect("sqlite"),
                name: None,
            },
            entrega::db::Backend::Postgres => {
                let name = format!("entrega_t_{}", Uuid::new_v4().simple());
                let url = entrega_postgres::ensure_database(&server_url(), &name)
                    .await
                    .expect("create database");
                Self {
                    db: entrega::db::Db::connect(&url).await.expect("postgres"),
                    name: Some(name),
                }
            }
        }
    }

    /// Closes the pool and drops the PostgreSQL database.
    pub async fn finish(self) {
        self.db.close().await;
        if let Some(name) = self.name {
            drop_database(&name).await;
        }
    }
}
