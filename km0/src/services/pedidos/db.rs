//! The orders database: schema, and storing an order with its event in one transaction.

use async_trait::async_trait;
use entrega_core::{MigrationSet, NewEvent, StoreError};
use sqlx::{PgConnection, SqliteConnection};
use uuid::Uuid;

use super::domain::{NewOrder, Order, OrderLine, CREATED};
use super::messaging::order_created;
use crate::config::Db;
use crate::schema::{self, Migration};

/// The tables of the seed, with the seed's columns, so the seed's own Python works against them.
const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    description: "pedidos and lineas_pedido",
    sqlite: "CREATE TABLE IF NOT EXISTS pedidos (
        id        TEXT PRIMARY KEY,
        cliente   TEXT NOT NULL,
        mercado   TEXT NOT NULL,
        estado    TEXT NOT NULL,
        creado_en TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')));
    CREATE TABLE IF NOT EXISTS lineas_pedido (
        pedido_id       TEXT    NOT NULL REFERENCES pedidos (id),
        producto        TEXT    NOT NULL,
        cantidad        INTEGER NOT NULL CHECK (cantidad > 0),
        precio_centimos INTEGER NOT NULL CHECK (precio_centimos >= 0));
    CREATE INDEX IF NOT EXISTS lineas_pedido_pedido ON lineas_pedido (pedido_id);",
    postgres: "CREATE TABLE IF NOT EXISTS pedidos (
        id        TEXT        PRIMARY KEY,
        cliente   TEXT        NOT NULL,
        mercado   TEXT        NOT NULL,
        estado    TEXT        NOT NULL,
        creado_en TIMESTAMPTZ NOT NULL DEFAULT now());
    CREATE TABLE IF NOT EXISTS lineas_pedido (
        pedido_id       TEXT    NOT NULL REFERENCES pedidos (id),
        producto        TEXT    NOT NULL,
        cantidad        INTEGER NOT NULL CHECK (cantidad > 0),
        precio_centimos INTEGER NOT NULL CHECK (precio_centimos >= 0));
    CREATE INDEX IF NOT EXISTS lineas_pedido_pedido ON lineas_pedido (pedido_id);",
}];

/// Failpoint inside the create-order transaction, after the order, its lines and its outbox
/// row are written, right before `COMMIT`. `exit` dies mid-request with the transaction open
/// (rolled back by the database); `error` fails the commit step (transient: the client gets a
/// 503) and drops the transaction. See [`entrega::failpoint`] for the engine's failpoints.
pub const BEFORE_COMMIT: &str = "pedidos.before_commit";

/// Passes [`BEFORE_COMMIT`]; its `error` action reads as an unavailable database.
fn before_commit() -> Result<(), StoreError> {
    entrega::failpoint::hit(BEFORE_COMMIT).map_err(StoreError::unavailable)
}

/// Why an order was not stored.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CreateOrderError {
    /// An order with this id exists already; nothing was written.
    #[error("order `{id}` already exists")]
    Duplicate {
        /// The id.
        id: String,
    },
    /// The database failed; nothing was written.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The orders database of the `pedidos` service.
#[derive(Debug, Clone)]
pub struct OrderStore {
    db: Db,
}

impl OrderStore {
    /// Wraps a connected database.
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// The underlying database.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Creates entrega's outbox tables and the orders tables, if missing.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.db.migrate_entrega(&[MigrationSet::Outbox]).await?;
        schema::apply(&self.db, "pedidos", MIGRATIONS).await
    }

    /// Stores the order, its lines and its `pedido.creado` event in one transaction; returns
    /// the event id (`id_evento`). Either all three are committed or none is.
    pub async fn create(&self, order: &NewOrder) -> Result<Uuid, CreateOrderError> {
        let event = order_created(order);
        match &self.db {
            Db::Sqlite(pool) => {
                // IMMEDIATE: writers queue on busy_timeout instead of failing an upgrade.
                let mut tx = entrega_sqlite::begin_immediate(pool).await?;
                write_order(&mut *tx, order, &event).await?;
                before_commit()?;
                tx.commit().await.map_err(entrega_sqlite::classify)?;
            }
            Db::Postgres(pool) => {
                let mut tx = pool.begin().await.map_err(entrega_postgres::classify)?;
                write_order(&mut *tx, order, &event).await?;
                before_commit()?;
                tx.commit().await.map_err(entrega_postgres::classify)?;
            }
        }
        Ok(event.id)
    }

    /// The order with its lines, if it exists.
    pub async fn find(&self, id: &str) -> Result<Option<Order>, StoreError> {
        type Head = (String, String, String, String, String);
        let (head, lines): (Option<Head>, Vec<(String, i32, i32)>) = match &self.db {
            Db::Sqlite(pool) => {
                let err = entrega_sqlite::classify;
                let head = sqlx::query_as(
                    "SELECT id, cliente, mercado, estado, creado_en FROM pedidos WHERE id = $1",
                )
                .bind(id)
                .fetch_optional(pool)
                .await
                .map_err(err)?;
                let lines = sqlx::query_as(
                    "SELECT producto, cantidad, precio_centimos FROM lineas_pedido \
                     WHERE pedido_id = $1 ORDER BY rowid",
                )
                .bind(id)
                .fetch_all(pool)
                .await
                .map_err(err)?;
                (head, lines)
            }
            Db::Postgres(pool) => {
                let err = entrega_postgres::classify;
                let head = sqlx::query_as(
                    "SELECT id, cliente, mercado, estado, \
                     to_char(creado_en AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') \
                     FROM pedidos WHERE id = $1",
                )
                .bind(id)
                .fetch_optional(pool)
                .await
                .map_err(err)?;
                // No key column in the seed's table: physical order is insertion order for
                // rows that are never updated.
                let lines = sqlx::query_as(
                    "SELECT producto, cantidad, precio_centimos FROM lineas_pedido \
                     WHERE pedido_id = $1 ORDER BY ctid",
                )
                .bind(id)
                .fetch_all(pool)
                .await
                .map_err(err)?;
                (head, lines)
            }
        };
        Ok(head.map(|(id, customer, market, state, created_at)| Order {
            id,
            customer,
            market,
            state,
            created_at,
            lines: lines
                .into_iter()
                .map(|(product, quantity, price_cents)| OrderLine {
                    product,
                    quantity,
                    price_cents,
                })
                .collect(),
        }))
    }

    /// Number of orders stored.
    pub async fn count(&self) -> Result<u64, StoreError> {
        let n: i64 = match &self.db {
            Db::Sqlite(pool) => sqlx::query_scalar("SELECT COUNT(*) FROM pedidos")
                .fetch_one(pool)
                .await
                .map_err(entrega_sqlite::classify)?,
            Db::Postgres(pool) => sqlx::query_scalar("SELECT COUNT(*) FROM pedidos")
                .fetch_one(pool)
                .await
                .map_err(entrega_postgres::classify)?,
        };
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

/// The writes of one order, on either backend's connection inside a transaction.
#[async_trait]
trait OrderWrites: Send {
    /// Inserts the order row; `false` if the id exists already.
    async fn insert_order(&mut self, order: &NewOrder) -> Result<bool, StoreError>;
    /// Inserts one line.
    async fn insert_line(&mut self, order_id: &str, line: &OrderLine) -> Result<(), StoreError>;
    /// Enqueues the event in the outbox.
    async fn enqueue(&mut self, event: &NewEvent) -> Result<(), StoreError>;
}

/// The SQL is the same on both backends (`$n` placeholders work on SQLite too); only the
/// connection type, the outbox and the error classifier differ.
macro_rules! impl_order_writes {
    ($conn:ty, $outbox:path, $classify:path) => {
        #[async_trait]
        impl OrderWrites for $conn {
            async fn insert_order(&mut self, order: &NewOrder) -> Result<bool, StoreError> {
                // ON CONFLICT instead of catching the unique violation: a duplicate is an
                // expected answer (409), not an error to classify.
                let done = sqlx::query(
                    "INSERT INTO pedidos (id, cliente, mercado, estado) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (id) DO NOTHING",
                )
                .bind(&order.id)
                .bind(&order.customer)
                .bind(&order.market)
                .bind(CREATED)
                .execute(&mut *self)
                .await
                .map_err($classify)?;
                Ok(done.rows_affected() == 1)
            }

            async fn insert_line(
                &mut self,
                order_id: &str,
                line: &OrderLine,
            ) -> Result<(), StoreError> {
                sqlx::query(
                    "INSERT INTO lineas_pedido (pedido_id, producto, cantidad, precio_centimos) \
                     VALUES ($1, $2, $3, $4)",
                )
                .bind(order_id)
                .bind(&line.product)
                .bind(line.quantity)
                .bind(line.price_cents)
                .execute(&mut *self)
                .await
                .map_err($classify)?;
                Ok(())
            }

            async fn enqueue(&mut self, event: &NewEvent) -> Result<(), StoreError> {
                <$outbox>::enqueue(self, event).await
            }
        }
    };
}

impl_order_writes!(
    SqliteConnection,
    entrega_sqlite::SqliteOutbox,
    entrega_sqlite::classify
);
impl_order_writes!(
    PgConnection,
    entrega_postgres::PgOutbox,
    entrega_postgres::classify
);

async fn write_order(
    conn: &mut dyn OrderWrites,
    order: &NewOrder,
    event: &NewEvent,
) -> Result<(), CreateOrderError> {
    if !conn.insert_order(order).await? {
        return Err(CreateOrderError::Duplicate {
            id: order.id.clone(),
        });
    }
    for line in &order.lines {
        conn.insert_line(&order.id, line).await?;
    }
    conn.enqueue(event).await?;
    Ok(())
}
