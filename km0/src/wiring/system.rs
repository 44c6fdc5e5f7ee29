//! One km0 deployment: the services' databases, the outbox, and the broker.

use std::path::PathBuf;
use std::time::Duration;

use entrega::db::query;
use entrega::Db;
use entrega_core::{now_ms, OutboxStatus, ReleaseError, StoreError};

use crate::services::inventario::StockStore;
use crate::services::pedidos::{OrderSaga, OrderStore, SagaTimings};
use crate::services::reparto::DeliveryStore;
use crate::wiring::config::{
    is_postgres, split_database, sqlite_path, with_database, BrokerUrl, BrokerUrlError, DataPlace,
    Databases, RetryArgs, Service,
};
use crate::wiring::{Broker, BrokerError};
use entrega::saga::Sagas;
use std::sync::Arc;

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
    key_concurrency: usize,
    max_batch: usize,
    retry: RetryArgs,
    saga: Option<SagaTimings>,
    replay_key: Option<entrega_core::ReplayKey>,
    http_limits: super::http_server::HttpLimits,
}

impl System {
    /// A deployment with its services' databases at `databases` and the broker at `broker_url`.
    pub fn new(databases: Databases, broker_url: String) -> Self {
        Self {
            databases,
            broker_url,
            lease_ttl: DEFAULT_LEASE_TTL,
            retention: Retention::default(),
            key_concurrency: 1,
            max_batch: 100,
            retry: RetryArgs::default(),
            saga: None,
            replay_key: None,
            http_limits: super::http_server::HttpLimits::default(),
        }
    }

    /// Runs every new order through the order saga, with `timings` (pedidos orchestrates it).
    pub fn with_saga(mut self, timings: SagaTimings) -> Self {
        self.saga = Some(timings);
        self
    }

    /// The order saga's timings, when orders run through it.
    pub fn saga(&self) -> Option<SagaTimings> {
        self.saga
    }

    /// The order sagas in pedidos' database (their tables migrated), on `store`'s database.
    pub async fn sagas(&self, store: &OrderStore) -> Result<Sagas, StoreError> {
        let timings = self.saga.unwrap_or_default();
        let sagas = Sagas::new(
            store.db().clone(),
            Arc::new(OrderSaga::new(timings)),
            Arc::new(entrega_core::SystemClock),
        );
        sagas.migrate().await?;
        store
            .db()
            .migrate(&[entrega_core::MigrationSet::Inbox])
            .await?;
        Ok(sagas)
    }

    /// Sets the operators' replay key: `km0 dlq replay --group` signs with it, and the
    /// consumers obey `entrega-solo-grupo` only when it verifies.
    pub fn with_replay_key(mut self, key: entrega_core::ReplayKey) -> Self {
        self.replay_key = Some(key);
        self
    }

    /// The operators' replay key, if one is set.
    pub fn replay_key(&self) -> Option<&entrega_core::ReplayKey> {
        self.replay_key.as_ref()
    }

    /// Sets the limits of every HTTP server the deployment runs.
    pub fn with_http_limits(mut self, limits: super::http_server::HttpLimits) -> Self {
        self.http_limits = limits;
        self
    }

    /// The limits of every HTTP server the deployment runs.
    pub fn http_limits(&self) -> super::http_server::HttpLimits {
        self.http_limits
    }

    /// Sets how the consumers retry (strategy, attempts, backoff).
    pub fn with_retry(mut self, retry: RetryArgs) -> Self {
        self.retry = retry;
        self
    }

    /// How the consumers retry.
    pub fn retry(&self) -> &RetryArgs {
        &self.retry
    }

    /// Sets how many keys' events the inventario worker applies at once (1: one batch at a
    /// time, in offset order per partition).
    pub fn with_key_concurrency(mut self, key_concurrency: usize) -> Self {
        self.key_concurrency = key_concurrency.max(1);
        self
    }

    /// How many keys' events the inventario worker applies at once.
    pub fn key_concurrency(&self) -> usize {
        self.key_concurrency
    }

    /// Sets the most records a consumer takes per poll, which is also its transaction's
    /// size (inventario applies a whole poll in a constant number of statements).
    pub fn with_max_batch(mut self, max_batch: usize) -> Self {
        self.max_batch = max_batch.max(1);
        self
    }

    /// The most records a consumer takes per poll.
    pub fn max_batch(&self) -> usize {
        self.max_batch
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
            DataPlace::PostgresServer(server) => {
                format!("postgres {}", entrega_core::redact_url(server))
            }
        };
        format!(
            "{place} ({}, {}), broker {}",
            self.databases.name(Service::Pedidos),
            self.databases.name(Service::Inventario),
            entrega_core::redact_url(&self.broker_url)
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

    /// The delivery store, migrated.
    pub async fn reparto(&self) -> Result<DeliveryStore, StoreError> {
        let store = DeliveryStore::new(self.databases.connect(Service::Reparto).await?);
        store.migrate().await?;
        Ok(store)
    }

    /// The payments store, migrated.
    pub async fn pagos(&self) -> Result<crate::services::pagos::PaymentStore, StoreError> {
        let store = crate::services::pagos::PaymentStore::new(
            self.databases.connect(Service::Pagos).await?,
        );
        store.migrate().await?;
        Ok(store)
    }

    /// The catalogue's store, migrated.
    pub async fn catalogo(&self) -> Result<crate::services::catalogo::CatalogStore, StoreError> {
        let store = crate::services::catalogo::CatalogStore::new(
            self.databases.connect(Service::Catalogo).await?,
        );
        store.migrate().await?;
        Ok(store)
    }

    /// The payment gateway simulator's ledger, migrated.
    pub async fn pasarela(&self) -> Result<crate::services::pasarela::Ledger, StoreError> {
        let ledger = crate::services::pasarela::Ledger::new(
            self.databases.connect(Service::Pasarela).await?,
        );
        ledger.migrate().await?;
        Ok(ledger)
    }

    /// What `--broker` names, checked.
    pub fn broker_kind(&self) -> Result<BrokerUrl, BrokerUrlError> {
        BrokerUrl::parse(&self.broker_url)
    }

    /// The broker, connected (the log transport's database created if missing and migrated).
    pub async fn broker(&self) -> Result<Broker, BrokerError> {
        super::broker::connect(&self.broker_kind()?, self.lease_ttl).await
    }

    /// The same as [`System::broker`].
    pub async fn broker_log(&self) -> Result<Broker, BrokerError> {
        self.broker().await
    }

    /// Migrates every database of the deployment (the broker's too, when it is the log
    /// transport in a database); returns what it migrated.
    pub async fn migrate(&self) -> Result<Vec<&'static str>, BrokerError> {
        self.pedidos().await?.db().close().await;
        self.inventario().await?.db().close().await;
        self.reparto().await?.db().close().await;
        self.catalogo().await?.db().close().await;
        let mut done = vec!["pedidos", "inventario", "reparto", "catalogo"];
        if !self.broker_kind()?.is_server() {
            self.broker().await?.close().await;
            done.push("broker");
        }
        Ok(done)
    }

    /// Backlog of the pedidos outbox.
    pub async fn outbox_status(&self) -> Result<OutboxStatus, StoreError> {
        let store = self.pedidos().await?;
        let status = store.db().outbox().maintenance.status(now_ms()).await;
        store.db().close().await;
        status
    }

    /// Releases the parked pedidos outbox row `id`, recorded under `operator` in the same
    /// transaction ([`entrega::dlq::release_outbox_row`]).
    pub async fn outbox_release(&self, id: uuid::Uuid, operator: &str) -> Result<(), ReleaseError> {
        let store = self.pedidos().await?;
        let released = entrega::dlq::release_outbox_row(store.db(), id, operator).await;
        store.db().close().await;
        released
    }

    /// The same deployment on databases of its own, named after `run`: a `demo-<run>`
    /// directory on SQLite, `<prefix>demo<run>_*` databases on PostgreSQL.
    pub fn fresh(&self, run: &str) -> Result<Self, BrokerUrlError> {
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
        let broker_url = if self.broker_kind()?.is_server() {
            // Topics (and queues) live on the broker: a fresh run shares them and counts from
            // their ends.
            self.broker_url.clone()
        } else if is_postgres(&self.broker_url) {
            let name = split_database(&self.broker_url)
                .1
                .unwrap_or_else(|| "km0_broker".to_owned());
            with_database(&self.broker_url, &format!("{name}_demo{run}"))
        } else {
            let path = sqlite_path(&self.broker_url)
                .map(PathBuf::from)
                .ok_or_else(|| BrokerUrlError::UnknownScheme {
                    url: self.broker_url.clone(),
                })?;
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
            key_concurrency: self.key_concurrency,
            max_batch: self.max_batch,
            retry: self.retry.clone(),
            saga: self.saga,
            replay_key: self.replay_key.clone(),
            http_limits: self.http_limits,
        })
    }

    /// Removes every database of this deployment (fresh demo runs), once nothing uses them:
    /// the SQLite files (and their directory when left empty) or the PostgreSQL databases.
    pub async fn destroy(&self) -> Result<(), StoreError> {
        let mut sqlite_files = Vec::new();
        let mut pg_databases = Vec::new();
        for service in [
            Service::Pedidos,
            Service::Inventario,
            Service::Reparto,
            Service::Pagos,
            Service::Pasarela,
            Service::Catalogo,
        ] {
            let name = self.databases.name(service);
            match &self.databases.place {
                DataPlace::SqliteDir(dir) => sqlite_files.push(dir.join(format!("{name}.db"))),
                DataPlace::PostgresServer(server) => pg_databases.push((server.clone(), name)),
            }
        }
        match BrokerUrl::parse(&self.broker_url) {
            Ok(BrokerUrl::PostgresLog(url)) => {
                if let (server, Some(name)) = split_database(&url) {
                    pg_databases.push((server, name));
                }
            }
            Ok(BrokerUrl::SqliteLog(url)) => {
                if let Some(path) = sqlite_path(&url) {
                    sqlite_files.push(PathBuf::from(path));
                }
            }
            // A cluster's topics are shared; nothing of this deployment's to remove there.
            Ok(BrokerUrl::Kafka(..) | BrokerUrl::Amqp(..)) | Err(_) => {}
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
            let admin = Db::connect(&with_database(&server, "postgres")).await?;
            // FORCE: pools of this process may still hold idle connections.
            let sql = format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                name.replace('"', "\"\"")
            );
            let dropped = admin.execute(query(sql)).await;
            admin.close().await;
            dropped?;
        }
        Ok(())
    }
}
