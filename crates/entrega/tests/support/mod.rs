//! Shared setup of the engine tests: an outbox and a log, in memory or on SQLite files, behind
//! the testkit's fixture traits so every test runs on both.
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used, clippy::panic)]

pub mod authorise;
pub mod handlers;
pub mod keys_steps;
pub mod observed;
pub mod outbox;
pub mod pg;
pub mod relay_steps;
pub mod worker_steps;

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use entrega::broker::{DbLog, LogConfig};
use entrega_core::{
    Clock, Envelope, Headers, MigrationSet, OutgoingMessage, Publisher, Record, Subscriber,
    TopicAdmin,
};
use entrega_testkit::memory::{MemoryLog, MemoryOutbox};
use entrega_testkit::{BoxError, LogFixture, LogSettings, OutboxFixture};
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
    entrega::Db::from(pool.clone())
        .migrate(&[set])
        .await
        .expect("migrate");
    pool
}

/// A log transport over a database, as the suites use it: on a database made for the
/// fixture (dropped at teardown) or on one the caller keeps.
pub struct DbLogFixture {
    pub log: DbLog,
    owned: Option<(pg::FreshDb, TempDir)>,
}

impl DbLogFixture {
    /// Over a database the caller keeps; teardown closes the pool.
    pub fn new(log: DbLog) -> Self {
        Self { log, owned: None }
    }

    /// Over `fresh` (its SQLite file in `dir`), dropped at teardown.
    pub fn owning(log: DbLog, fresh: pg::FreshDb, dir: TempDir) -> Self {
        Self {
            log,
            owned: Some((fresh, dir)),
        }
    }
}

#[async_trait]
impl LogFixture for DbLogFixture {
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
        match self.owned {
            Some((fresh, _dir)) => fresh.finish().await,
            None => self.log.db().close().await,
        }
        Ok(())
    }
}

async fn sqlite_log(dir: &TempDir, clock: Arc<dyn Clock>) -> DbLogFixture {
    let broker = sqlite_pool(dir, "broker.db", MigrationSet::Log).await;
    let config = LogConfig {
        poll_interval: std::time::Duration::from_millis(20),
        ..LogConfig::default()
    };
    DbLogFixture::new(DbLog::new(broker.into(), config, clock))
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
            Backend::Sqlite | Backend::Postgres => {
                let database = match backend {
                    Backend::Postgres => entrega::db::Backend::Postgres,
                    _ => entrega::db::Backend::Sqlite,
                };
                let outbox = outbox::DbOutboxFixture::new(database, &dir, clock.clone()).await;
                pg_database = outbox.pg_database();
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

/// One test per database for each scenario `async fn name(backend: entrega::db::Backend)`:
/// `on_both_databases!(name);` makes the tests `name::sqlite` and `name::postgres`.
#[allow(unused_macros)]
macro_rules! on_both_databases {
    ($($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    super::$name(entrega::db::Backend::Sqlite).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    super::$name(entrega::db::Backend::Postgres).await;
                }
            }
        )+
    };
}
#[allow(unused_imports)]
pub(crate) use on_both_databases;
