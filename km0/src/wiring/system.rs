//! One km0 deployment: where the services' databases and the broker are, opened as the
//! deployment's settings say (migrated, or checked when the processes do not migrate).

use entrega::db::query;
use entrega::saga::Sagas;
use entrega::Db;
use entrega_core::StoreError;
use std::sync::Arc;

use super::component::Database;
use super::config::{BrokerUrl, BrokerUrlError, DataPlace, Databases};
use super::settings::{SchemaMode, Settings};
use super::{Broker, BrokerError};
use crate::services::catalogo::CatalogStore;
use crate::services::inventario::StockStore;
use crate::services::pagos::PaymentStore;
use crate::services::pasarela::Ledger;
use crate::services::pedidos::{OrderSaga, OrderStore};
use crate::services::reparto::DeliveryStore;
use crate::services::{catalogo, inventario, pagos, pasarela, pedidos, reparto};

/// Attempts at opening a database that fails transiently, and the pause between them.
const OPEN_TRIES: u32 = 20;
const OPEN_PAUSE: std::time::Duration = std::time::Duration::from_millis(250);

/// The databases and the broker of one km0 deployment, and its settings.
#[derive(Debug, Clone)]
pub struct System {
    pub(super) databases: Databases,
    pub(super) broker_url: String,
    pub(super) settings: Settings,
}

/// A database whose schema is behind this build, opened by a process that does not migrate.
#[derive(Debug, thiserror::Error)]
#[error("the {service} database is not ready ({behind}): run `km0 migrate` as its owner first")]
pub struct SchemaBehind {
    /// The service.
    pub service: &'static str,
    /// What is behind (`inbox at 1 of 2`, ...).
    pub behind: String,
}

impl System {
    /// A deployment with its services' databases at `databases` and the broker at `broker_url`.
    pub fn new(databases: Databases, broker_url: String) -> Self {
        Self {
            databases,
            broker_url,
            settings: Settings::default(),
        }
    }

    /// `database`, created if missing under [`SchemaMode::Migrate`], required to exist
    /// under [`SchemaMode::Expect`]. Not migrated here.
    pub async fn database(&self, database: &Database) -> Result<Db, StoreError> {
        match self.settings.schema {
            SchemaMode::Migrate => self.databases.connect(database).await,
            SchemaMode::Expect => self.databases.connect_existing(database).await,
        }
    }

    /// `database`, opened as its service opens it: migrated, or checked under
    /// [`SchemaMode::Expect`].
    pub async fn open(&self, database: &Database) -> Result<Db, StoreError> {
        // Processes started together on one new SQLite file can find it locked while another
        // creates and migrates it (a journal-mode switch does not wait): try again for a while.
        let mut tries = 0;
        loop {
            match self.open_once(database).await {
                Err(e) if e.is_transient() && tries < OPEN_TRIES => {
                    tries += 1;
                    tracing::warn!(database = database.name, error = %e, "opening failed; trying again");
                    tokio::time::sleep(OPEN_PAUSE).await;
                }
                opened => return opened,
            }
        }
    }

    async fn open_once(&self, database: &Database) -> Result<Db, StoreError> {
        let db = self.database(database).await?;
        let ready = match self.settings.schema {
            SchemaMode::Migrate => (database.migrate)(&db).await,
            SchemaMode::Expect => expect_current(database, &db).await,
        };
        if let Err(e) = ready {
            db.close().await;
            return Err(e);
        }
        Ok(db)
    }

    /// The orders store.
    pub async fn pedidos(&self) -> Result<OrderStore, StoreError> {
        Ok(OrderStore::new(self.open(&pedidos::DATABASE).await?))
    }

    /// The stock store.
    pub async fn inventario(&self) -> Result<StockStore, StoreError> {
        Ok(StockStore::new(self.open(&inventario::DATABASE).await?))
    }

    /// The delivery store.
    pub async fn reparto(&self) -> Result<DeliveryStore, StoreError> {
        Ok(DeliveryStore::new(self.open(&reparto::DATABASE).await?))
    }

    /// The payments store.
    pub async fn pagos(&self) -> Result<PaymentStore, StoreError> {
        Ok(PaymentStore::new(self.open(&pagos::DATABASE).await?))
    }

    /// The catalogue's store.
    pub async fn catalogo(&self) -> Result<CatalogStore, StoreError> {
        Ok(CatalogStore::new(self.open(&catalogo::DATABASE).await?))
    }

    /// The payment gateway simulator's ledger.
    pub async fn pasarela(&self) -> Result<Ledger, StoreError> {
        Ok(Ledger::new(self.open(&pasarela::DATABASE).await?))
    }

    /// The order sagas in pedidos' database (opened by [`System::pedidos`], which migrates
    /// their tables with the rest).
    pub async fn sagas(&self, store: &OrderStore) -> Result<Sagas, StoreError> {
        let timings = self.settings.saga.unwrap_or_default();
        Ok(Sagas::new(
            store.db().clone(),
            Arc::new(OrderSaga::new(timings)),
            Arc::new(entrega_core::SystemClock),
        ))
    }

    /// What `--broker` names, checked.
    pub fn broker_kind(&self) -> Result<BrokerUrl, BrokerUrlError> {
        BrokerUrl::parse(&self.broker_url)
    }

    /// The broker, connected (the log transport's database created if missing and migrated,
    /// or checked under [`SchemaMode::Expect`]).
    pub async fn broker(&self) -> Result<Broker, BrokerError> {
        let ttl = self.settings.lease_ttl;
        match self.settings.schema {
            SchemaMode::Migrate => super::broker::connect(&self.broker_kind()?, ttl).await,
            SchemaMode::Expect => super::broker::connect_existing(&self.broker_kind()?, ttl).await,
        }
    }

    /// The same as [`System::broker`].
    pub async fn broker_log(&self) -> Result<Broker, BrokerError> {
        self.broker().await
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
            self.databases.name(&pedidos::DATABASE),
            self.databases.name(&inventario::DATABASE),
            entrega_core::redact_url(&self.broker_url)
        )
    }
}

/// Fails unless `db`'s schema is this build's: entrega's sets, or for a database without
/// entrega's tables, the service's own set.
async fn expect_current(database: &Database, db: &Db) -> Result<(), StoreError> {
    let behind = if database.entrega_tables {
        db.schema_behind().await?
    } else {
        let applied: Result<Option<i64>, StoreError> = db
            .scalar(
                query("SELECT COUNT(*) FROM entrega_migrations WHERE set_name = $1")
                    .bind(database.name),
            )
            .await;
        match applied {
            Ok(Some(n)) if n > 0 => Vec::new(),
            Ok(_) | Err(StoreError::Rejected { .. }) => {
                vec![format!("no {} migrations applied", database.name)]
            }
            Err(e) => return Err(e),
        }
    };
    if behind.is_empty() {
        return Ok(());
    }
    Err(StoreError::rejected(SchemaBehind {
        service: database.name,
        behind: behind.join(", "),
    }))
}
