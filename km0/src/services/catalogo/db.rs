//! catalogo's database: one row per product with its last known units and low-stock flag.

use entrega::db::{query, Db, Migration};
use entrega_core::{MigrationSet, StoreError};

use super::domain::StockChange;

const MIGRATIONS: &[Migration] = &[Migration::same(
    1,
    "catalogo: units and low-stock flag per product",
    "CREATE TABLE IF NOT EXISTS catalogo (
        producto TEXT PRIMARY KEY, unidades BIGINT NOT NULL, bajo_stock BOOLEAN NOT NULL,
        evento_ms BIGINT NOT NULL);",
)];

/// A product as the catalogue shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogEntry {
    /// The product.
    pub product: String,
    /// Its last known units.
    pub units: i64,
    /// Whether it shows as low on stock.
    pub low: bool,
}

/// catalogo's database.
#[derive(Debug, Clone)]
pub struct CatalogStore {
    db: Db,
}

impl CatalogStore {
    /// The store over `db`.
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// The database.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Creates the catalogue table (and the parking table its ordered retries use).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.db
            .migrate(&[
                MigrationSet::Inbox,
                MigrationSet::Rpc,
                MigrationSet::HeldLetters,
                MigrationSet::Dlq,
            ])
            .await?;
        self.db.apply_migrations("catalogo", MIGRATIONS).await
    }

    /// Sets the product's units and flag from `change`, made at `event_ms` (its envelope's
    /// `fecha_ms`): the same change applied twice leaves the same row, and a change older
    /// than the one shown (a retry that a later change overtook) changes nothing. Returns
    /// whether the row changed.
    pub async fn apply(&self, change: &StockChange, event_ms: i64) -> Result<bool, StoreError> {
        self.db
            .execute(
                query(
                    "INSERT INTO catalogo (producto, unidades, bajo_stock, evento_ms) \
                     VALUES ($1, $2, $3, $4) ON CONFLICT (producto) DO UPDATE SET \
                     unidades = excluded.unidades, bajo_stock = excluded.bajo_stock, \
                     evento_ms = excluded.evento_ms \
                     WHERE catalogo.evento_ms <= excluded.evento_ms",
                )
                .bind(change.product.as_str())
                .bind(change.after)
                .bind(change.is_low())
                .bind(event_ms),
            )
            .await
            .map(|n| n == 1)
    }

    /// Every product, by name.
    pub async fn all(&self) -> Result<Vec<CatalogEntry>, StoreError> {
        let rows: Vec<(String, i64, bool)> = self
            .db
            .fetch_all(query(
                "SELECT producto, unidades, bajo_stock FROM catalogo ORDER BY producto",
            ))
            .await?;
        Ok(rows
            .into_iter()
            .map(|(product, units, low)| CatalogEntry {
                product,
                units,
                low,
            })
            .collect())
    }
}
