//! The stock database: schema, and taking an order's stock exactly once per event.
//!
//! The idempotency key (`mensajes_procesados`) and the stock updates share one transaction:
//! both commit or neither does (ARCHITECTURE rule 6). A batch shares one transaction among
//! many events, with a savepoint per event so one refused order undoes only its own writes.

use std::time::Duration;

use entrega::db::{query, Db, Migration, Tx};
use entrega_core::{MigrationSet, Processed, StoreError};

use super::domain::{PlacedOrder, StockError, INITIAL_STOCK};
use super::reservations::{stock_updated, Motive};
use super::stock_moves;

/// The seed's `stock` table and rows; `ON CONFLICT` adopts a database made from the seed's SQL.
const MIGRATIONS: &[Migration] = &[
    Migration::same(
        1,
        "stock with the seed's initial rows",
        "CREATE TABLE IF NOT EXISTS stock (
        producto TEXT PRIMARY KEY,
        unidades INTEGER NOT NULL CHECK (unidades >= 0));
    INSERT INTO stock (producto, unidades) VALUES ('tomate-rosa', 120), ('calabacin', 80),
        ('queso-curado', 5), ('queso-fresco', 30), ('vino-crianza', 200)
        ON CONFLICT (producto) DO NOTHING;",
    ),
    Migration::same(
        2,
        "reservas: the order saga's reservations, by id",
        "CREATE TABLE IF NOT EXISTS reservas (
            id_reserva TEXT PRIMARY KEY, pedido_id TEXT NOT NULL, estado TEXT NOT NULL,
            lineas TEXT NOT NULL, motivo TEXT, actualizado_ms BIGINT NOT NULL);",
    ),
];

/// Failpoint inside the stock transaction, after the key is claimed and the stock `UPDATE`s
/// ran, right before `COMMIT` (single events and batches alike). `exit` dies with the
/// transaction open, so the database rolls it back; `error` fails the commit step (transient),
/// dropping the transaction. See [`entrega::failpoint`] for the engine's failpoints.
pub const BEFORE_COMMIT: &str = "inventario.before_commit";

/// Passes [`BEFORE_COMMIT`]; its `error` action reads as an unavailable database.
pub(super) fn before_commit() -> Result<(), StoreError> {
    entrega::failpoint::hit(BEFORE_COMMIT).map_err(StoreError::unavailable)
}

/// Why an event's effect was not applied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApplyError {
    /// A business rule refused it (permanent); nothing was applied, the key is not recorded.
    #[error(transparent)]
    Stock(#[from] StockError),
    /// The database failed; nothing was applied. Transient or not per [`StoreError::is_transient`].
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<entrega::ContractError> for ApplyError {
    fn from(e: entrega::ContractError) -> Self {
        Self::Store(e.into())
    }
}

impl ApplyError {
    /// Whether trying again later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Store(e) if e.is_transient())
    }
}

/// One event of a batch: its idempotency key and what it asks for (or why it cannot be read).
#[derive(Debug, Clone)]
pub struct BatchItem {
    /// The idempotency key (`id_evento`).
    pub message_id: String,
    /// The order to apply, or the permanent reason it cannot be.
    pub order: Result<PlacedOrder, StockError>,
    /// The delivery's trace, given to the events its effect writes (`traceparent`).
    pub trace: Option<entrega::TraceContext>,
}

/// How [`StockStore::apply_batch`] applies a batch. Both give every event the outcome it
/// would get applied alone, in order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BatchMode {
    /// A constant number of statements per batch ([`set_batch`](super::set_batch)): keys
    /// claimed at once, stock locked and decided in memory, each product written once.
    #[default]
    SetBased,
    /// Statements per event: on PostgreSQL one each ([`pg_batch`](super::pg_batch)), on
    /// SQLite a savepoint each.
    PerEvent,
}

/// The stock database of the `inventario` service.
#[derive(Debug, Clone)]
pub struct StockStore {
    db: Db,
    mode: BatchMode,
}

impl StockStore {
    /// Wraps a connected database; batches are applied set-based.
    pub fn new(db: Db) -> Self {
        Self {
            db,
            mode: BatchMode::default(),
        }
    }

    /// The same store applying batches in `mode`.
    pub fn with_batch_mode(mut self, mode: BatchMode) -> Self {
        self.mode = mode;
        self
    }

    /// How batches are applied.
    pub fn batch_mode(&self) -> BatchMode {
        self.mode
    }

    /// The underlying database.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Creates entrega's outbox (`stock.actualizado` and the reservations' answers leave
    /// through it), processed-messages table, the dead-letter operator tables (the
    /// inventario worker writes `pedidos.eventos.dlq`, so its tending state lives here), the
    /// stock table with its seed rows and the reservations.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.db
            .migrate(&[
                MigrationSet::Outbox,
                MigrationSet::Inbox,
                MigrationSet::Rpc,
                MigrationSet::HeldLetters,
                MigrationSet::Dlq,
            ])
            .await?;
        self.db.apply_migrations("inventario", MIGRATIONS).await
    }

    /// Takes the order's stock once per `message_id` for `consumer`, in one transaction.
    pub async fn apply(
        &self,
        consumer: &str,
        message_id: &str,
        order: &PlacedOrder,
    ) -> Result<Processed<()>, ApplyError> {
        let mut tx = self.db.begin().await?;
        // On `Err` the transaction is dropped, which rolls back the claimed key too.
        let done = apply_one(&mut tx, consumer, message_id, order).await?;
        before_commit()?;
        tx.commit().await?;
        Ok(done)
    }

    /// Applies many events in one transaction, each deduplicated by its own key. Returns one
    /// result per item attempted, in order: a permanent failure (out of stock, unknown
    /// product, unreadable) undoes only its own item, and the items after it still apply
    /// over the stock the earlier ones left. Nothing is visible until the returned `Ok`; an
    /// `Err` means the transaction did not commit and no item took effect.
    ///
    /// [`BatchMode::SetBased`] (the default) does it in a constant number of statements.
    /// [`BatchMode::PerEvent`] runs each item under its own savepoint (on PostgreSQL one
    /// statement per item instead, [`pg_batch`](super::pg_batch)); there a transient
    /// failure ends the list at its item, the items after it not attempted.
    pub async fn apply_batch(
        &self,
        consumer: &str,
        items: &[BatchItem],
    ) -> Result<Vec<Result<Processed<()>, ApplyError>>, StoreError> {
        let mut tx = self.db.begin().await?;
        if self.mode == BatchMode::SetBased {
            let results = super::set_batch::apply_items(&mut tx, consumer, items).await?;
            before_commit()?;
            tx.commit().await?;
            return Ok(results);
        }
        // The PostgreSQL path writes its outbox rows in its own statements.
        tx.notify_relays();
        let results = match tx.postgres() {
            Some(conn) => {
                let mut results = super::pg_batch::apply_items(conn, consumer, items).await;
                // A database error leaves a PostgreSQL transaction aborted (or, for a row
                // that does not add up, must not commit): drop it, so no item takes effect.
                if matches!(results.last(), Some(Err(ApplyError::Store(_)))) {
                    if let Some(Err(ApplyError::Store(e))) = results.pop() {
                        return Err(e);
                    }
                }
                results
            }
            None => apply_items(&mut tx, consumer, items).await,
        };
        before_commit()?;
        tx.commit().await?;
        Ok(results)
    }

    /// Units of every product, by product.
    pub async fn all(&self) -> Result<Vec<(String, i64)>, StoreError> {
        self.db
            .fetch_all(query(
                "SELECT producto, CAST(unidades AS BIGINT) FROM stock ORDER BY producto",
            ))
            .await
    }

    /// Units of one product, if it exists.
    pub async fn units(&self, product: &str) -> Result<Option<i64>, StoreError> {
        self.db
            .scalar(
                query("SELECT CAST(unidades AS BIGINT) FROM stock WHERE producto = $1")
                    .bind(product),
            )
            .await
    }

    /// Sets a product's units, adding the product if missing (operators, demo resets).
    pub async fn set_units(&self, product: &str, units: i32) -> Result<(), StoreError> {
        self.db
            .execute(
                query(
                    "INSERT INTO stock (producto, unidades) VALUES ($1, $2) \
                     ON CONFLICT (producto) DO UPDATE SET unidades = excluded.unidades",
                )
                .bind(product)
                .bind(units),
            )
            .await
            .map(drop)
    }

    /// Adds `units` of `product` (the product too, when new) and its `stock.actualizado`
    /// (`motivo` `reposicion`, no `pedido_id`) in one transaction; returns the units before
    /// and after.
    pub async fn restock(&self, product: &str, units: i32) -> Result<(i64, i64), StoreError> {
        let mut tx = self.db.begin().await?;
        let after: Option<i64> = tx
            .scalar(
                query(
                    "INSERT INTO stock (producto, unidades) VALUES ($1, $2) \
                     ON CONFLICT (producto) DO UPDATE SET unidades = stock.unidades + excluded.unidades \
                     WHERE CAST(stock.unidades AS BIGINT) + excluded.unidades <= 2147483647 \
                     RETURNING CAST(unidades AS BIGINT)",
                )
                .bind(product)
                .bind(units),
            )
            .await?;
        // No row back: the sum would pass what the column holds (2,147,483,647).
        let after = after.ok_or_else(|| {
            StoreError::rejected(std::io::Error::other(format!(
                "{product} cannot hold {units} more units: its count would pass 2,147,483,647"
            )))
        })?;
        let before = after - i64::from(units);
        let event = stock_updated(product, before, after, Motive::Restock, None)?;
        tx.enqueue(&event).await?;
        tx.commit().await?;
        Ok((before, after))
    }

    /// Puts the seed's initial units back.
    pub async fn reset_initial(&self) -> Result<(), StoreError> {
        for (product, units) in INITIAL_STOCK {
            self.set_units(product, i32::try_from(*units).unwrap_or(i32::MAX))
                .await?;
        }
        Ok(())
    }

    /// Deletes processed-message keys older than `older_than`; returns how many.
    pub async fn purge_keys(&self, older_than: Duration) -> Result<u64, StoreError> {
        self.db.purge_processed(older_than).await
    }

    /// Keys recorded for `consumer`: messages applied.
    pub async fn processed(&self, consumer: &str) -> Result<u64, StoreError> {
        self.db.processed(consumer).await
    }
}

async fn apply_items(
    tx: &mut Tx,
    consumer: &str,
    items: &[BatchItem],
) -> Vec<Result<Processed<()>, ApplyError>> {
    let mut results = Vec::with_capacity(items.len());
    for item in items {
        let order = match &item.order {
            Ok(order) => order,
            // Unreadable: nothing to undo, and the key stays unrecorded so an operator can
            // replay the message once the cause is fixed.
            Err(e) => {
                results.push(Err(e.clone().into()));
                continue;
            }
        };
        if let Err(e) = savepoint(tx, "SAVEPOINT km0_item").await {
            results.push(Err(e.into()));
            break;
        }
        let apply = apply_one(tx, consumer, &item.message_id, order);
        let outcome = match item.trace {
            Some(ctx) => entrega::trace::scope(ctx, apply).await,
            None => apply.await,
        };
        let closed = match &outcome {
            Ok(_) => savepoint(tx, "RELEASE SAVEPOINT km0_item").await,
            Err(_) => match savepoint(tx, "ROLLBACK TO SAVEPOINT km0_item").await {
                Ok(()) => savepoint(tx, "RELEASE SAVEPOINT km0_item").await,
                Err(e) => Err(e),
            },
        };
        let transient = outcome.as_ref().is_err_and(ApplyError::is_transient);
        match closed {
            Ok(()) => results.push(outcome),
            // The savepoint cannot be closed: the transaction is unusable. Report this item
            // with that error and attempt nothing more (the commit will tell).
            Err(e) => {
                results.push(Err(e.into()));
                break;
            }
        }
        if transient {
            // Later items must not overtake a failure that will be retried.
            break;
        }
    }
    results
}

/// Runs one savepoint statement.
async fn savepoint(tx: &mut Tx, sql: &'static str) -> Result<(), StoreError> {
    tx.execute(query(sql)).await.map(drop)
}

/// Claims the key, then reserves the order's stock under `reserva-<pedido>` (the key an
/// order saga would use, so the stock is never taken twice for one order); the caller undoes
/// everything on `Err`. An order whose `datos` name a reservation is left to that command.
async fn apply_one(
    tx: &mut Tx,
    consumer: &str,
    message_id: &str,
    order: &PlacedOrder,
) -> Result<Processed<()>, ApplyError> {
    if !tx.claim(consumer, message_id).await? {
        return Ok(Processed::Duplicate);
    }
    if order.reservation.is_some() {
        return Ok(Processed::Applied(()));
    }
    let id = reservation_id(&order.order_id);
    let now = entrega_core::now_ms();
    stock_moves::reserve(
        tx,
        &id,
        &order.order_id,
        &order.lines,
        Motive::Order,
        false,
        now,
    )
    .await?;
    Ok(Processed::Applied(()))
}

/// The reservation id of an order (`reserva-<pedido>`).
pub fn reservation_id(order_id: &str) -> String {
    format!("reserva-{order_id}")
}
