//! One database handle for both backends, chosen at run time from the URL.
//!
//! A service writes its queries once ([`query`]), opens a transaction with [`Db::begin`],
//! and inside it writes the business change, the outbox row ([`Tx::enqueue`]) and the
//! inbox key ([`Tx::claim`]); its own tables are created by [`Db::apply_migrations`], the
//! runner that creates entrega's. Where SQLite and PostgreSQL really need different SQL, the
//! two texts sit side by side ([`query_each`]); a path written for one backend alone takes
//! that backend's connection explicitly ([`Tx::postgres`]).
//!
//! ```no_run
//! use entrega::db::{query, Db};
//! use entrega::{MigrationSet, NewEvent};
//!
//! # async fn order(url: &str) -> Result<(), entrega::StoreError> {
//! let db = Db::connect(url).await?; // sqlite://pedidos.db or postgres://.../pedidos
//! db.migrate(&[MigrationSet::Outbox]).await?;
//! let mut tx = db.begin().await?;
//! tx.execute(query("INSERT INTO pedidos (id, estado) VALUES ($1, $2)").bind("P-1").bind("creado"))
//!     .await?;
//! let datos = serde_json::json!({ "pedido_id": "P-1" });
//! tx.enqueue(&NewEvent::new("pedido", "P-1", "pedido.creado", datos)).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```

mod answers;
mod batch;
mod exec;
mod migration;
mod migrator;
mod placeholders;
mod query;
mod row_runs;
mod rows;
mod schema;
mod tx;
pub(crate) mod types;

use std::sync::Arc;

use entrega_contracts::Catalog;
use entrega_core::migration::Step;
use entrega_core::{DlqStore, HeldLetterStore, MigrationSet, ParkingStore, StoreError};
use sqlx::{PgPool, SqlitePool};

pub use migration::Migration;
pub use query::{query, query_each, Query, Sql, Value};
pub use row_runs::row_runs;
pub use rows::{Column, FromRow};
pub use tx::Tx;
pub use types::{IntList, JsonText, TextList, TimeMs};

pub(crate) use answers::{insert_answers, Repeat};

use crate::OutboxPorts;

/// The database engines entrega runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// SQLite, the embedded default (`sqlite://FILE`).
    Sqlite,
    /// PostgreSQL (`postgres://USER@HOST:PORT/DB`).
    Postgres,
}

impl Backend {
    /// `sqlite` or `postgres`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
        }
    }

    /// The backend a URL names: `sqlite:...`, `postgres://...` or `postgresql://...`.
    pub fn of_url(url: &str) -> Option<Self> {
        if url.starts_with("sqlite:") {
            Some(Self::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(Self::Postgres)
        } else {
            None
        }
    }
}

/// A URL that names no database entrega knows how to open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported database url `{0}`: expected sqlite://FILE or postgres://USER@HOST:PORT/DB")]
pub struct UnsupportedUrl(pub String);

/// A connected database of either backend: a pool, cheap to clone.
#[derive(Debug, Clone)]
pub struct Db {
    pub(crate) pool: Pool,
    /// The contracts every event enqueued through this handle must meet.
    contracts: Option<Arc<Catalog>>,
}

#[derive(Debug, Clone)]
pub(crate) enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

impl From<SqlitePool> for Db {
    fn from(pool: SqlitePool) -> Self {
        Self {
            pool: Pool::Sqlite(pool),
            contracts: None,
        }
    }
}

impl From<PgPool> for Db {
    fn from(pool: PgPool) -> Self {
        Self {
            pool: Pool::Postgres(pool),
            contracts: None,
        }
    }
}

impl Db {
    /// Connects to a database URL: `sqlite://file.db` (created if missing, with entrega's
    /// settings: WAL, busy timeout, commit wake-ups), `sqlite::memory:`, or
    /// `postgres://user@host:port/db`.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        match Backend::of_url(url) {
            Some(Backend::Sqlite) => Ok(entrega_sqlite::connect(url).await?.into()),
            Some(Backend::Postgres) => Ok(entrega_postgres::connect(url).await?.into()),
            None => Err(StoreError::rejected(UnsupportedUrl(
                entrega_core::redact_url(url),
            ))),
        }
    }

    /// The backend of this database.
    pub fn backend(&self) -> Backend {
        match self.pool {
            Pool::Sqlite(_) => Backend::Sqlite,
            Pool::Postgres(_) => Backend::Postgres,
        }
    }

    /// The SQLite pool, for a path written for SQLite alone; `None` on PostgreSQL.
    pub fn sqlite(&self) -> Option<&SqlitePool> {
        match &self.pool {
            Pool::Sqlite(pool) => Some(pool),
            Pool::Postgres(_) => None,
        }
    }

    /// The PostgreSQL pool, for a path written for PostgreSQL alone; `None` on SQLite.
    pub fn postgres(&self) -> Option<&PgPool> {
        match &self.pool {
            Pool::Postgres(pool) => Some(pool),
            Pool::Sqlite(_) => None,
        }
    }

    /// Opens a write transaction (see [`Tx`]).
    pub async fn begin(&self) -> Result<Tx, StoreError> {
        let tx = match &self.pool {
            Pool::Sqlite(pool) => Tx::sqlite_tx(entrega_sqlite::begin_immediate(pool).await?),
            Pool::Postgres(pool) => {
                let tx = pool.begin().await.map_err(entrega_postgres::classify)?;
                Tx::postgres_tx(tx, pool.clone())
            }
        };
        Ok(tx.with_contracts(self.contracts.clone()))
    }

    /// This handle with `catalog` checked on every enqueue: an event of a `tipo` the catalog
    /// knows must meet the contract of its version, or [`Tx::enqueue`] refuses it with
    /// [`StoreError::Contract`] and writes nothing.
    pub fn with_contracts(mut self, catalog: Arc<Catalog>) -> Self {
        self.contracts = Some(catalog);
        self
    }

    /// The contracts enqueued events are checked against, if any.
    pub fn contracts(&self) -> Option<&Arc<Catalog>> {
        self.contracts.as_ref()
    }

    /// Runs a statement outside any transaction; returns how many rows it affected.
    pub async fn execute(&self, q: Query) -> Result<u64, StoreError> {
        match &self.pool {
            Pool::Sqlite(pool) => exec::sqlite::execute(pool, q).await,
            Pool::Postgres(pool) => exec::postgres::execute(pool, q).await,
        }
    }

    /// The first row of a query, if any.
    pub async fn fetch_optional<T: FromRow>(&self, q: Query) -> Result<Option<T>, StoreError> {
        match &self.pool {
            Pool::Sqlite(pool) => exec::sqlite::fetch_optional(pool, q).await,
            Pool::Postgres(pool) => exec::postgres::fetch_optional(pool, q).await,
        }
    }

    /// Every row of a query.
    pub async fn fetch_all<T: FromRow>(&self, q: Query) -> Result<Vec<T>, StoreError> {
        match &self.pool {
            Pool::Sqlite(pool) => exec::sqlite::fetch_all(pool, q).await,
            Pool::Postgres(pool) => exec::postgres::fetch_all(pool, q).await,
        }
    }

    /// The first column of the first row, if any.
    pub async fn scalar<T: Column>(&self, q: Query) -> Result<Option<T>, StoreError> {
        let row: Option<(T,)> = self.fetch_optional(q).await?;
        Ok(row.map(|(value,)| value))
    }

    /// Creates or updates entrega's own tables for the given sets.
    pub async fn migrate(&self, sets: &[MigrationSet]) -> Result<(), StoreError> {
        migrator::own_sets(self, sets).await
    }

    /// What keeps this database's schema from being the one this build expects: every entrega
    /// set it has applied (`entrega_migrations`) that is behind this build's latest version,
    /// as `"<set> at <applied> of <latest>"`, or the absence of any applied set. Empty when the
    /// schema is current. Readiness checks use it: a database restored from an old backup, or
    /// wiped while a process runs, is not ready even though it answers.
    pub async fn schema_behind(&self) -> Result<Vec<String>, StoreError> {
        let applied: Result<Vec<(String, i64)>, StoreError> = self
            .fetch_all(query(
                "SELECT set_name, CAST(MAX(version) AS BIGINT) FROM entrega_migrations \
                 GROUP BY set_name",
            ))
            .await;
        let applied = match applied {
            Ok(applied) => applied,
            // No migration table at all: nothing was ever applied here.
            Err(StoreError::Rejected { .. } | StoreError::Corrupt { .. }) => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut behind = Vec::new();
        for set in MigrationSet::ALL {
            let Some((_, version)) = applied.iter().find(|(name, _)| name == set.name()) else {
                continue;
            };
            let latest = migrator::latest_version(set, self.backend());
            if *version < latest {
                behind.push(format!("{} at {version} of {latest}", set.name()));
            }
        }
        let known = applied
            .iter()
            .any(|(name, _)| MigrationSet::ALL.iter().any(|s| s.name() == name));
        if !known {
            behind.push("no entrega migrations applied".to_owned());
        }
        Ok(behind)
    }

    /// Brings the application's set `name` up to date: every step not yet recorded, in
    /// order, in one transaction, with the runner, lock and record of entrega's own sets.
    /// Several processes may run it at once; each step still runs once.
    pub async fn apply_migrations(
        &self,
        name: &str,
        migrations: &[Migration],
    ) -> Result<(), StoreError> {
        let backend = self.backend();
        let scripts: Vec<[Step<'_>; 1]> = migrations
            .iter()
            .map(|m| [Step::Sql(m.sql.text(backend))])
            .collect();
        let steps: Vec<entrega_core::migration::Migration<'_>> = migrations
            .iter()
            .zip(&scripts)
            .map(|(m, steps)| entrega_core::migration::Migration {
                version: m.version,
                description: m.description,
                steps,
            })
            .collect();
        migrator::application_set(self, name, &steps).await
    }

    /// The outbox of this database through the relay's ports.
    pub fn outbox(&self) -> OutboxPorts {
        self.outbox_with_clock(Arc::new(entrega_core::SystemClock))
    }

    /// The outbox of this database through the relay's ports, reading time from `clock`
    /// (which rows are due again, leases).
    pub fn outbox_with_clock(&self, clock: Arc<dyn entrega_core::Clock>) -> OutboxPorts {
        OutboxPorts::new(Arc::new(crate::store::outbox::DbOutbox::new(
            self.clone(),
            clock,
        )))
    }

    /// Where ordered retries park their keys (needs [`MigrationSet::Inbox`]).
    pub fn parking(&self) -> Arc<dyn ParkingStore> {
        Arc::new(crate::store::parking::DbParking::new(self.clone()))
    }

    /// Where the worker holds dead letters the broker refused (needs
    /// [`MigrationSet::HeldLetters`]).
    pub fn held_letters(&self) -> Arc<dyn HeldLetterStore> {
        Arc::new(crate::dlq::DbHeldLetters::new(self.clone()))
    }

    /// Operator state of dead letters (needs [`MigrationSet::Dlq`]).
    pub fn dead_letters(&self) -> Arc<dyn DlqStore> {
        Arc::new(crate::store::dead_letters::DbDeadLetterMarks::new(
            self.clone(),
        ))
    }

    /// Checks that the database answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.execute(query("SELECT 1")).await.map(drop)
    }

    /// Closes the pool, waiting for connections in use to be returned.
    pub async fn close(&self) {
        match &self.pool {
            Pool::Sqlite(pool) => pool.close().await,
            Pool::Postgres(pool) => pool.close().await,
        }
    }
}
