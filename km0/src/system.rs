//! One km0 deployment's databases: the services' stores, the outbox, and the broker's log.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use entrega::OutboxPorts;
use entrega_core::{
    now_ms, Clock, MigrationSet, OutboxStatus, Publisher, Record, StoreError, Subscriber,
    SystemClock, TopicAdmin,
};
use entrega_postgres::{PgLog, PgOutbox};
use entrega_sqlite::{SqliteLog, SqliteOutbox};

use crate::config::{
    connect_broker, is_postgres, split_database, sqlite_path, with_database, DataPlace, Databases,
    Db, Service,
};
use crate::services::inventario::StockStore;
use crate::services::pedidos::OrderStore;

/// The outbox of `db` through the relay's ports.
pub fn outbox_ports(db: &Db) -> OutboxPorts {
    match db {
        Db::Sqlite(pool) => OutboxPorts::new(Arc::new(SqliteOutbox::new(pool.clone()))),
        Db::Postgres(pool) => OutboxPorts::new(Arc::new(PgOutbox::new(pool.clone()))),
    }
}

/// The log transport in the broker database, either backend.
#[derive(Debug, Clone)]
pub enum BrokerLog {
    /// On SQLite.
    Sqlite(SqliteLog),
    /// On PostgreSQL.
    Postgres(PgLog),
}

impl BrokerLog {
    /// The log in `db`; a consumer group member silent for `lease_ttl` loses its partitions.
    pub fn of(db: &Db, lease_ttl: Duration) -> Self {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        match db {
            Db::Sqlite(pool) => {
                let config = entrega_sqlite::LogConfig {
                    lease_ttl,
                    heartbeat: lease_ttl / 3,
                    ..entrega_sqlite::LogConfig::default()
                };
                Self::Sqlite(SqliteLog::with_config(pool.clone(), config, clock))
            }
            Db::Postgres(pool) => {
                let config = entrega_postgres::LogConfig {
                    lease_ttl,
                    heartbeat: lease_ttl / 3,
                    ..entrega_postgres::LogConfig::default()
                };
                Self::Postgres(PgLog::with_config(pool.clone(), config, clock))
            }
        }
    }

    /// Publishing side.
    pub fn publisher(&self) -> Arc<dyn Publisher> {
        match self {
            Self::Sqlite(log) => Arc::new(log.clone()),
            Self::Postgres(log) => Arc::new(log.clone()),
        }
    }

    /// Consuming side.
    pub fn subscriber(&self) -> Arc<dyn Subscriber> {
        match self {
            Self::Sqlite(log) => Arc::new(log.clone()),
            Self::Postgres(log) => Arc::new(log.clone()),
        }
    }

    /// Topic creation.
    pub fn admin(&self) -> Arc<dyn TopicAdmin> {
        match self {
            Self::Sqlite(log) => Arc::new(log.clone()),
            Self::Postgres(log) => Arc::new(log.clone()),
        }
    }

    /// Closes the broker's pool.
    pub async fn close(&self) {
        match self {
            Self::Sqlite(log) => log.pool().close().await,
            Self::Postgres(log) => log.pool().close().await,
        }
    }

    /// Up to `max` records of one partition from offset `from` on (tests, tooling).
    pub async fn read(
        &self,
        topic: &str,
        partition: u32,
        from: i64,
        max: usize,
    ) -> Result<Vec<Record>, StoreError> {
        match self {
            Self::Sqlite(log) => log.read(topic, partition, from, max).await,
            Self::Postgres(log) => log.read(topic, partition, from, max).await,
        }
    }

    /// End offset (next offset to be written) of each partition of `topic`.
    pub async fn end_offsets(&self, topic: &str) -> Result<Vec<(u32, i64)>, StoreError> {
        match self {
            Self::Sqlite(log) => log.end_offsets(topic).await,
            Self::Postgres(log) => log.end_offsets(topic).await,
        }
    }

    /// Messages ever appended to `topic` (0 if it does not exist).
    pub async fn topic_total(&self, topic: &str) -> Result<u64, StoreError> {
        let ends = self.end_offsets(topic).await?;
        Ok(ends
            .iter()
            .map(|(_, end)| u64::try_from(*end).unwrap_or(0))
            .sum())
    }
}

/// Lease period of relay lanes and consumer-group partitions unless told otherwise.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

/// How long published outbox rows and processed-message keys are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Published outbox rows older than this are purged by the relay.
    pub outbox: Duration,
    /// Keys in `mensajes_procesados` older than this are purged by the consumer. Must exceed
    /// the longest time a redelivery can arrive (the broker's retention), or a very late
    /// duplicate would be applied again.
    pub inbox: Duration,
}

impl Default for Retention {
    /// One day of published outbox rows; 14 days of keys, as the seed suggests.
    fn default() -> Self {
        Self {
            outbox: Duration::from_secs(24 * 3600),
            inbox: Duration::from_secs(14 * 24 * 3600),
        }
    }
}

/// The databases of one km0 deployment.
#[derive(Debug, Clone)]
pub struct System {
    databases: Databases,
    broker_url: String,
    lease_ttl: Duration,
    retention: Retention,
}

impl System {
    /// A deployment with its services' databases at `databases` and the broker at `broker_url`.
    pub fn new(databases: Databases, broker_url: String) -> Self {
        Self {
            databases,
            broker_url,
            lease_ttl: DEFAULT_LEASE_TTL,
            retention: Retention::default(),
        }
    }

    /// Sets how long published outbox rows and processed-message keys are kept.
    pub fn with_retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// How long published outbox rows and processed-message keys are kept.
    pub fn retention(&self) -> Retention {
        self.retention
    }

    /// Sets how long relay lanes and consumer partitions stay with a silent instance before
    /// others take them over (short in crash tests).
    pub fn with_lease_ttl(mut self, lease_ttl: Duration) -> Self {
        self.lease_ttl = lease_ttl;
        self
    }

    /// Lease period of relay lanes and consumer partitions.
    pub fn lease_ttl(&self) -> Duration {
        self.lease_ttl
    }

    /// The services' databases.
    pub fn databases(&self) -> &Databases {
        &self.databases
    }

    /// The broker's URL.
    pub fn broker_url(&self) -> &str {
        &self.broker_url
    }

    /// Where everything lives, for people.
    pub fn describe(&self) -> String {
        let place = match &self.databases.place {
            DataPlace::SqliteDir(dir) => format!("sqlite dir {}", dir.display()),
            DataPlace::PostgresServer(server) => format!("postgres {server}"),
        };
        format!(
            "{place} ({}, {}), broker {}",
            self.databases.name(Service::Pedidos),
            self.databases.name(Service::Inventario),
            self.broker_url
        )
    }

    /// The orders store, migrated.
    pub async fn pedidos(&self) -> Result<OrderStore, StoreError> {
        let store = OrderStore::new(self.databases.connect(Service::Pedidos).await?);
        store.migrate().await?;
        Ok(store)
    }

    /// The stock store, migrated.
    pub async fn inventario(&self) -> Result<StockStore, StoreError> {
        let store = StockStore::new(self.databases.connect(Service::Inventario).await?);
        store.migrate().await?;
        Ok(store)
    }

    /// The broker's database, migrated.
    pub async fn broker(&self) -> Result<Db, StoreError> {
        let db = connect_broker(&self.broker_url).await?;
        db.migrate_entrega(&[MigrationSet::Log]).await?;
        Ok(db)
    }

    /// The broker's log transport, migrated.
    pub async fn broker_log(&self) -> Result<BrokerLog, StoreError> {
        Ok(BrokerLog::of(&self.broker().await?, self.lease_ttl))
    }

    /// Migrates every database of the deployment.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.pedidos().await?.db().close().await;
        self.inventario().await?.db().close().await;
        self.broker().await?.close().await;
        Ok(())
    }

    /// Backlog of the pedidos outbox.
    pub async fn outbox_status(&self) -> Result<OutboxStatus, StoreError> {
        let store = self.pedidos().await?;
        let status = outbox_ports(store.db()).maintenance.status(now_ms()).await;
        store.db().close().await;
        status
    }

    /// The same deployment on databases of its own, named after `run`: a `demo-<run>`
    /// directory on SQLite, `<prefix>demo<run>_*` databases on PostgreSQL.
    pub fn fresh(&self, run: &str) -> Result<Self, crate::config::UnsupportedUrl> {
        let databases = match &self.databases.place {
            DataPlace::SqliteDir(dir) => Databases {
                place: DataPlace::SqliteDir(dir.join(format!("demo-{run}"))),
                prefix: self.databases.prefix.clone(),
            },
            DataPlace::PostgresServer(server) => Databases {
                place: DataPlace::PostgresServer(server.clone()),
                prefix: Some(format!(
                    "{}demo{run}_",
                    self.databases.prefix.as_deref().unwrap_or("km0_")
                )),
            },
        };
        let broker_url = if is_postgres(&self.broker_url) {
            let name = split_database(&self.broker_url)
                .1
                .unwrap_or_else(|| "km0_broker".to_owned());
            with_database(&self.broker_url, &format!("{name}_demo{run}"))
        } else {
            let path = sqlite_path(&self.broker_url)
                .map(PathBuf::from)
                .ok_or_else(|| crate::config::UnsupportedUrl(self.broker_url.clone()))?;
            let dir = path.parent().map(PathBuf::from).unwrap_or_default();
            let file = path
                .file_name()
                .map(PathBuf::from)
                .unwrap_or_else(|| "broker.db".into());
            format!(
                "sqlite://{}",
                dir.join(format!("demo-{run}")).join(file).display()
            )
        };
        Ok(Self {
            databases,
            broker_url,
            lease_ttl: self.lease_ttl,
            retention: self.retention,
        })
    }

    /// Removes every database of this deployment (fresh demo runs), once nothing uses them:
    /// the SQLite files (and their directory when left empty) or the PostgreSQL databases.
    pub async fn destroy(&self) -> Result<(), StoreError> {
        let mut sqlite_files = Vec::new();
        let mut pg_databases = Vec::new();
        for service in [Service::Pedidos, Service::Inventario] {
            let name = self.databases.name(service);
            match &self.databases.place {
                DataPlace::SqliteDir(dir) => sqlite_files.push(dir.join(format!("{name}.db"))),
                DataPlace::PostgresServer(server) => pg_databases.push((server.clone(), name)),
            }
        }
        if is_postgres(&self.broker_url) {
            if let (server, Some(name)) = split_database(&self.broker_url) {
                pg_databases.push((server, name));
            }
        } else if let Some(path) = sqlite_path(&self.broker_url) {
            sqlite_files.push(PathBuf::from(path));
        }
        for file in &sqlite_files {
            for suffix in ["", "-wal", "-shm"] {
                let mut path = file.clone().into_os_string();
                path.push(suffix);
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(StoreError::rejected(e)),
                }
            }
        }
        for file in &sqlite_files {
            if let Some(dir) = file.parent() {
                // Only succeeds when empty: never removes anything km0 did not create.
                let _ = std::fs::remove_dir(dir);
            }
        }
        for (server, name) in pg_databases {
            let admin = entrega_postgres::connect(&with_database(&server, "postgres")).await?;
            // FORCE: pools of this process may still hold idle connections.
            let sql = format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                name.replace('"', "\"\"")
            );
            let dropped = sqlx::query(&sql)
                .execute(&admin)
                .await
                .map_err(entrega_postgres::classify);
            admin.close().await;
            dropped?;
        }
        Ok(())
    }
}
