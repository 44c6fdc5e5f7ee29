//! Shared setup of the engine tests: an outbox and a log, in memory or on SQLite files, behind
//! the testkit's fixture traits so every test runs on both.
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used, clippy::panic)]

pub mod authorise;
pub mod handlers;
pub mod keys_steps;
pub mod observed;
pub mod pg;
pub mod relay_steps;
pub mod worker_steps;

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use entrega_core::{
    Clock, Envelope, Headers, LaneLeases, MigrationSet, NewEvent, OutboxMaintenance, OutboxReader,
    OutboxWakeup, OutgoingMessage, Publisher, Record, Subscriber, TopicAdmin,
};
use entrega_sqlite::{begin_immediate, LogConfig, SqliteLog, SqliteOutbox};
use entrega_testkit::memory::{MemoryLog, MemoryOutbox};
use entrega_testkit::{BoxError, HeldTx, LogFixture, LogSettings, OutboxFixture, RowState, TxEnd};
use serde_json::json;
use sqlx::SqlitePool;
use uuid::Uuid;

/// Which backend a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Memory,
    Sqlite,
    /// The outbox on PostgreSQL, the log on SQLite.
    Postgres,
}

pub const BACKENDS: [Backend; 2] = [Backend::Memory, Backend::Sqlite];

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("entrega_t_{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }

    pub fn url(&self, file: &str) -> String {
        format!("sqlite://{}/{file}", self.0.display())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub async fn sqlite_pool(dir: &TempDir, file: &str, set: MigrationSet) -> SqlitePool {
    let pool = entrega_sqlite::connect(&dir.url(file))
        .await
        .expect("connect");
    entrega_sqlite::migrate(&pool, &[set])
        .await
        .expect("migrate");
    pool
}

/// An outbox on a SQLite file.
pub struct SqliteOutboxFixture {
    pub pool: SqlitePool,
    pub outbox: SqliteOutbox,
}

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
impl OutboxFixture for SqliteOutboxFixture {
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
        let mut tx = begin_immediate(&self.pool).await?;
        SqliteOutbox::enqueue_all(&mut tx, events).await?;
        match end {
            TxEnd::Commit => tx.commit().await?,
            TxEnd::Rollback => tx.rollback().await?,
        }
        Ok(())
    }
    async fn enqueue_held(&self, events: &[NewEvent]) -> Result<Box<dyn HeldTx>, BoxError> {
        // SQLite serializes writers, so a late commit is an insert made at commit time.
        Ok(Box::new(DeferredInsert {
            pool: self.pool.clone(),
            events: events.to_vec(),
        }))
    }
    async fn row(&self, id: Uuid) -> Result<Option<RowState>, BoxError> {
        let row: Option<(i64, i64, bool)> =
            sqlx::query_as("SELECT lane, rowid, publicado_en IS NOT NULL FROM outbox WHERE id = ?")
                .bind(id.hyphenated().to_string())
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|(lane, seq, published)| RowState {
            lane: lane as u32,
            seq,
            published,
        }))
    }
    async fn row_count(&self) -> Result<u64, BoxError> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox")
            .fetch_one(&self.pool)
            .await?;
        Ok(n as u64)
    }
    async fn teardown(self: Box<Self>) -> Result<(), BoxError> {
        self.pool.close().await;
        Ok(())
    }
}

/// A log transport on a SQLite file.
pub struct SqliteLogFixture {
    pub log: SqliteLog,
}

#[async_trait]
impl LogFixture for SqliteLogFixture {
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
        self.log.pool().close().await;
        Ok(())
    }
}

async fn sqlite_log(dir: &TempDir, clock: Arc<dyn Clock>) -> SqliteLogFixture {
    let broker = sqlite_pool(dir, "broker.db", MigrationSet::Log).await;
    let config = LogConfig {
        poll_interval: std::time::Duration::from_millis(20),
        ..LogConfig::default()
    };
    SqliteLogFixture {
        log: SqliteLog::with_config(broker, config, clock),
    }
}

/// An outbox and a log on one backend; the directory lives as long as the value.
pub struct Env {
    pub backend: Backend,
    pub outbox: Arc<dyn OutboxFixture>,
    pub log: Arc<dyn LogFixture>,
    /// The PostgreSQL database to drop at [`Env::finish`].
    pg_database: Option<String>,
    _dir: TempDir,
}

impl Env {
    pub async fn new(backend: Backend, clock: Arc<dyn Clock>) -> Self {
        let dir = TempDir::new();
        let mut pg_database = None;
        let (outbox, log): (Arc<dyn OutboxFixture>, Arc<dyn LogFixture>) = match backend {
            Backend::Memory => (
                Arc::new(MemoryOutbox::with_clock(clock.clone())),
                Arc::new(MemoryLog::with_settings(LogSettings::default(), clock)),
            ),
            Backend::Sqlite => {
                let pool = sqlite_pool(&dir, "pedidos.db", MigrationSet::Outbox).await;
                let outbox = SqliteOutbox::with_clock(pool.clone(), clock.clone());
                (
                    Arc::new(SqliteOutboxFixture { pool, outbox }),
                    Arc::new(sqlite_log(&dir, clock).await),
                )
            }
            Backend::Postgres => {
                let outbox = pg::PgOutboxFixture::new(clock.clone()).await;
                pg_database = Some(outbox.name.clone());
                (Arc::new(outbox), Arc::new(sqlite_log(&dir, clock).await))
            }
        };
        Self {
            backend,
            outbox,
            log,
            pg_database,
            _dir: dir,
        }
    }

    /// Drops what the environment made outside its temporary directory.
    pub async fn finish(self) {
        if let Some(name) = &self.pg_database {
            pg::drop_database(name).await;
        }
    }

    /// The four outbox ports of this environment's outbox.
    pub fn ports(&self) -> entrega::OutboxPorts {
        entrega::OutboxPorts {
            leases: self.outbox.leases(),
            reader: self.outbox.reader(),
            maintenance: self.outbox.maintenance(),
            wakeup: self.outbox.wakeup(),
        }
    }
}

/// Every record of a topic, partition by partition.
pub async fn all_records(log: &dyn LogFixture, topic: &str) -> Vec<Record> {
    let mut out = Vec::new();
    for (partition, end) in log.end_offsets(topic).await.expect("end offsets") {
        let mut from = 0;
        while from < end {
            let batch = log.read(topic, partition, from, 500).await.expect("read");
            if batch.is_empty() {
                break;
            }
            from += batch.len() as i64;
            out.extend(batch);
        }
    }
    out
}

/// A domain event as the relay would publish it.
pub fn event_message(topic: &str, key: &str, tipo: &str, n: u32) -> (Envelope, OutgoingMessage) {
    let envelope = Envelope::new(tipo, "pedidos", json!({ "n": n, "clave": key }));
    let message = OutgoingMessage {
        topic: topic.to_owned(),
        key: Some(key.to_owned()),
        headers: Headers::new()
            .with("tipo", tipo)
            .with("id_evento", envelope.id.to_string()),
        payload: envelope.to_bytes(),
    };
    (envelope, message)
}

/// A raw payload that is not a valid envelope.
pub fn raw_message(topic: &str, key: &str, payload: &[u8]) -> OutgoingMessage {
    OutgoingMessage {
        topic: topic.to_owned(),
        key: Some(key.to_owned()),
        headers: Headers::new().with("tipo", "pedido.creado"),
        payload: payload.to_vec(),
    }
}

/// The routing of the tests' relays: order events to `pedidos.eventos`.
pub fn routing() -> entrega::TopicRouting {
    entrega::TopicRouting::new().route("pedido", "pedidos.eventos")
}
