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
    schema: SchemaMode,
    http_tls: Option<super::tls::ServerTls>,
    tls_ca: Option<PathBuf>,
}

/// Whether a deployment's processes create and migrate the databases they open, or expect
/// them created and migrated already (by `km0 migrate`, run as their owner) and only read and
/// write rows, as a least-privileged role can.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchemaMode {
    /// Create missing databases and apply pending migrations on opening (the embedded
    /// default, the demo, `km0 migrate`, tests).
    #[default]
    Migrate,
    /// Open existing databases only; one whose schema is behind this build is an error that
    /// names `km0 migrate`.
    Expect,
}

/// Grants `role` least privilege on `db` (PostgreSQL only).
async fn grant(db: &Db, role: &str) -> anyhow::Result<()> {
    match db.postgres() {
        Some(pool) => Ok(entrega_postgres::grant_service_role(pool, role).await?),
        None => anyhow::bail!(
            "service roles are PostgreSQL's; an SQLite file is guarded by its file permissions"
        ),
    }
}

/// A database whose schema is behind this build, opened by a process that does not migrate.
#[derive(Debug, thiserror::Error)]
#[error("the {service} database is not ready ({behind}): run `km0 migrate` as its owner first")]
pub struct SchemaBehind {
    /// The service.
    pub service: &'static str,
    /// What is behind (`inbox at 4 of 5`, ...).
    pub behind: String,
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
            schema: SchemaMode::default(),
            http_tls: None,
            tls_ca: None,
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
        if self.schema == SchemaMode::Migrate {
            sagas.migrate().await?;
            store
                .db()
                .migrate(&[
                    entrega_core::MigrationSet::Inbox,
                    entrega_core::MigrationSet::Rpc,
                ])
                .await?;
        }
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

    /// Serves every HTTP server of the deployment over TLS with this certificate and key.
    pub fn with_http_tls(mut self, tls: super::tls::ServerTls) -> Self {
        self.http_tls = Some(tls);
        self
    }

    /// The acceptor of the deployment's HTTPS servers, when they serve TLS.
    pub fn http_tls(&self) -> anyhow::Result<Option<tokio_rustls::TlsAcceptor>> {
        self.http_tls
            .as_ref()
            .map(super::tls::ServerTls::acceptor)
            .transpose()
    }

    /// Trusts the certificates in `ca` (PEM) for outgoing HTTPS, besides the public roots.
    pub fn with_tls_ca(mut self, ca: PathBuf) -> Self {
        self.tls_ca = Some(ca);
        self
    }

    /// The extra certificate authority of outgoing HTTPS, if any.
    pub fn tls_ca(&self) -> Option<&std::path::Path> {
        self.tls_ca.as_deref()
    }

    /// Sets whether opening a database migrates it ([`SchemaMode`]).
    pub fn with_schema(mut self, schema: SchemaMode) -> Self {
        self.schema = schema;
        self
    }

    /// Whether opening a database migrates it.
    pub fn schema(&self) -> SchemaMode {
        self.schema
    }

    /// `service`'s database: created if missing under [`SchemaMode::Migrate`], required to
    /// exist under [`SchemaMode::Expect`]. Not migrated here.
    pub async fn database(&self, service: Service) -> Result<Db, StoreError> {
        match self.schema {
            SchemaMode::Migrate => self.databases.connect(service).await,
            SchemaMode::Expect => self.databases.connect_existing(service).await,
        }
    }

    /// Under [`SchemaMode::Expect`], fails unless `db`'s entrega schema is this build's.
    async fn expect_current(&self, service: Service, db: &Db) -> Result<(), StoreError> {
        let behind = if service == Service::Pasarela {
            // The gateway simulator keeps no entrega tables, only its own ledger's.
            let applied: Result<Option<i64>, StoreError> = db
                .scalar(
                    query("SELECT COUNT(*) FROM entrega_migrations WHERE set_name = $1")
                        .bind(service.name()),
                )
                .await;
            match applied {
                Ok(Some(n)) if n > 0 => Vec::new(),
                Ok(_) | Err(StoreError::Rejected { .. }) => {
                    vec![format!("no {} migrations applied", service.name())]
                }
                Err(e) => return Err(e),
            }
        } else {
            db.schema_behind().await?
        };
        if behind.is_empty() {
            return Ok(());
        }
        Err(StoreError::rejected(SchemaBehind {
            service: service.name(),
            behind: behind.join(", "),
        }))
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

    /// `service`'s database, opened as its store opens it: migrated, or checked under
    /// [`SchemaMode::Expect`].
    pub async fn service_db(&self, service: Service) -> Result<Db, StoreError> {
        Ok(match service {
            Service::Pedidos => self.pedidos().await?.db().clone(),
            Service::Inventario => self.inventario().await?.db().clone(),
            Service::Reparto => self.reparto().await?.db().clone(),
            Service::Pagos => self.pagos().await?.db().clone(),
            Service::Catalogo => self.catalogo().await?.db().clone(),
            Service::Pasarela => self.pasarela().await?.db().clone(),
        })
    }

    /// The orders store, migrated (or checked, under [`SchemaMode::Expect`]).
    pub async fn pedidos(&self) -> Result<OrderStore, StoreError> {
        let store = OrderStore::new(self.database(Service::Pedidos).await?);
        match self.schema {
            SchemaMode::Migrate => store.migrate().await?,
            SchemaMode::Expect => self.expect_current(Service::Pedidos, store.db()).await?,
        }
        Ok(store)
    }

    /// The stock store, migrated (or checked).
    pub async fn inventario(&self) -> Result<StockStore, StoreError> {
        let store = StockStore::new(self.database(Service::Inventario).await?);
        match self.schema {
            SchemaMode::Migrate => store.migrate().await?,
            SchemaMode::Expect => self.expect_current(Service::Inventario, store.db()).await?,
        }
        Ok(store)
    }

    /// The delivery store, migrated (or checked).
    pub async fn reparto(&self) -> Result<DeliveryStore, StoreError> {
        let store = DeliveryStore::new(self.database(Service::Reparto).await?);
        match self.schema {
            SchemaMode::Migrate => store.migrate().await?,
            SchemaMode::Expect => self.expect_current(Service::Reparto, store.db()).await?,
        }
        Ok(store)
    }

    /// The payments store, migrated (or checked).
    pub async fn pagos(&self) -> Result<crate::services::pagos::PaymentStore, StoreError> {
        let store = crate::services::pagos::PaymentStore::new(self.database(Service::Pagos).await?);
        match self.schema {
            SchemaMode::Migrate => store.migrate().await?,
            SchemaMode::Expect => self.expect_current(Service::Pagos, store.db()).await?,
        }
        Ok(store)
    }

    /// The catalogue's store, migrated (or checked).
    pub async fn catalogo(&self) -> Result<crate::services::catalogo::CatalogStore, StoreError> {
        let store =
            crate::services::catalogo::CatalogStore::new(self.database(Service::Catalogo).await?);
        match self.schema {
            SchemaMode::Migrate => store.migrate().await?,
            SchemaMode::Expect => self.expect_current(Service::Catalogo, store.db()).await?,
        }
        Ok(store)
    }

    /// The payment gateway simulator's ledger, migrated (or checked).
    pub async fn pasarela(&self) -> Result<crate::services::pasarela::Ledger, StoreError> {
        let ledger =
            crate::services::pasarela::Ledger::new(self.database(Service::Pasarela).await?);
        match self.schema {
            SchemaMode::Migrate => ledger.migrate().await?,
            SchemaMode::Expect => self.expect_current(Service::Pasarela, ledger.db()).await?,
        }
        Ok(ledger)
    }

    /// What `--broker` names, checked.
    pub fn broker_kind(&self) -> Result<BrokerUrl, BrokerUrlError> {
        BrokerUrl::parse(&self.broker_url)
    }

    /// The broker, connected (the log transport's database created if missing and migrated).
    pub async fn broker(&self) -> Result<Broker, BrokerError> {
        match self.schema {
            SchemaMode::Migrate => {
                super::broker::connect(&self.broker_kind()?, self.lease_ttl).await
            }
            SchemaMode::Expect => {
                super::broker::connect_existing(&self.broker_kind()?, self.lease_ttl).await
            }
        }
    }

    /// The same as [`System::broker`].
    pub async fn broker_log(&self) -> Result<Broker, BrokerError> {
        self.broker().await
    }

    /// Creates and migrates every database of the deployment (the broker's too, when it is
    /// the log transport in a database), whatever this deployment's [`SchemaMode`]; with
    /// `roles` on PostgreSQL, then makes each service's role (named as its database) the
    /// least-privileged user of its database ([`entrega_postgres::grant_service_role`]), and
    /// the log database's role that of the log. Returns what it migrated.
    pub async fn migrate(&self, roles: bool) -> anyhow::Result<Vec<String>> {
        use anyhow::Context as _;
        let owner = self.clone().with_schema(SchemaMode::Migrate);
        let mut done = Vec::new();
        let pedidos = owner.pedidos().await.context("migrating pedidos")?;
        owner
            .sagas(&pedidos)
            .await
            .context("migrating the order sagas")?;
        let mut opened = vec![(Service::Pedidos, pedidos.db().clone())];
        opened.push((
            Service::Inventario,
            owner
                .inventario()
                .await
                .context("migrating inventario")?
                .db()
                .clone(),
        ));
        opened.push((
            Service::Reparto,
            owner
                .reparto()
                .await
                .context("migrating reparto")?
                .db()
                .clone(),
        ));
        opened.push((
            Service::Pagos,
            owner.pagos().await.context("migrating pagos")?.db().clone(),
        ));
        opened.push((
            Service::Catalogo,
            owner
                .catalogo()
                .await
                .context("migrating catalogo")?
                .db()
                .clone(),
        ));
        opened.push((
            Service::Pasarela,
            owner
                .pasarela()
                .await
                .context("migrating pasarela")?
                .db()
                .clone(),
        ));
        for (service, db) in opened {
            if roles {
                let role = self.databases.name(service);
                grant(&db, &role)
                    .await
                    .with_context(|| format!("granting {role}"))?;
                done.push(format!("{} (role {role})", service.name()));
            } else {
                done.push(service.name().to_owned());
            }
            db.close().await;
        }
        let kind = self.broker_kind()?;
        if !kind.is_server() {
            let broker = owner.broker().await.context("migrating the log broker")?;
            broker.close().await;
            match (roles, super::broker::log_database(&kind)) {
                (true, Some(name)) => {
                    let url = match &kind {
                        BrokerUrl::PostgresLog(url) => super::config::with_database(url, &name),
                        _ => String::new(),
                    };
                    let db = Db::connect(&url)
                        .await
                        .context("opening the log database")?;
                    let granted = grant(&db, &name).await;
                    db.close().await;
                    granted.with_context(|| format!("granting {name}"))?;
                    done.push(format!("broker (role {name})"));
                }
                _ => done.push("broker".to_owned()),
            }
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
            // A fresh run makes its own databases.
            schema: SchemaMode::Migrate,
            http_tls: self.http_tls.clone(),
            tls_ca: self.tls_ca.clone(),
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
