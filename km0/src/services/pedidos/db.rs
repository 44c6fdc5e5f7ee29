//! The orders database: schema, and storing an order with its event in one transaction.

use entrega::db::{query, query_each, Db, Migration, Tx};
use entrega_core::{MigrationSet, NewEvent, StoreError};
use uuid::Uuid;

use super::domain::{NewOrder, Order, OrderLine, OrderState};
use super::messaging::{order_created, order_created_in_saga};
use entrega::saga::{SagaError, Sagas};

/// The tables of the seed, with the seed's columns, so the seed's own Python works against them.
const MIGRATIONS: &[Migration] = &[
    Migration::each(
        1,
        "pedidos and lineas_pedido",
        "CREATE TABLE IF NOT EXISTS pedidos (
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
        "CREATE TABLE IF NOT EXISTS pedidos (
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
    ),
    super::requests::MIGRATION,
];

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
    /// The `Idempotency-Key` names another order already; nothing was written.
    #[error("Idempotency-Key `{key}` was used already")]
    KeyTaken {
        /// The key.
        key: String,
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

    /// Creates entrega's outbox, inbox and saga tables and the orders tables, if missing
    /// (the sagas' whether or not the deployment runs the saga).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        // The dead-letter set brings the operator audit, where releases of held rows are kept.
        self.db
            .migrate(&[
                MigrationSet::Outbox,
                MigrationSet::Inbox,
                MigrationSet::Rpc,
                MigrationSet::HeldLetters,
                MigrationSet::Sagas,
                MigrationSet::Dlq,
            ])
            .await?;
        self.db.apply_migrations("pedidos", MIGRATIONS).await
    }

    /// Stores the order, its lines and its `pedido.creado` event in one transaction; returns
    /// the event id (`id_evento`). Either all three are committed or none is. The request
    /// is kept with them (with its `Idempotency-Key`, if any) so a retry gets the same answer
    /// ([`OrderStore::earlier_answer`]).
    pub async fn create(
        &self,
        order: &NewOrder,
        key: Option<&str>,
    ) -> Result<Uuid, CreateOrderError> {
        let event = order_created(order).map_err(StoreError::from)?;
        // Dropped on any `Err` below, which rolls back every write.
        let mut tx = self.db.begin().await?;
        write_order(&mut tx, order, &event, key).await?;
        before_commit()?;
        tx.commit().await?;
        Ok(event.id)
    }

    /// Stores the order, its lines, its `pedido.creado` and the start of its saga (the
    /// saga's row and first command) in one transaction; returns the event id.
    pub async fn create_in_saga(
        &self,
        order: &NewOrder,
        key: Option<&str>,
        sagas: &Sagas,
        input: serde_json::Value,
    ) -> Result<Uuid, CreateOrderError> {
        let event = order_created_in_saga(order).map_err(StoreError::from)?;
        let mut tx = self.db.begin().await?;
        write_order(&mut tx, order, &event, key).await?;
        match sagas.start_in(&mut tx, &order.id, input).await {
            Ok(_) => {}
            Err(SagaError::Store(e)) => return Err(e.into()),
            Err(e) => return Err(StoreError::rejected(e).into()),
        }
        before_commit()?;
        tx.commit().await?;
        Ok(event.id)
    }

    /// The order with its lines, if it exists.
    pub async fn find(&self, id: &str) -> Result<Option<Order>, StoreError> {
        type Head = (String, String, String, String, String);
        let head: Option<Head> = self
            .db
            .fetch_optional(
                query_each(
                    "SELECT id, cliente, mercado, estado, creado_en FROM pedidos WHERE id = $1",
                    "SELECT id, cliente, mercado, estado, \
                     to_char(creado_en AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') \
                     FROM pedidos WHERE id = $1",
                )
                .bind(id),
            )
            .await?;
        let Some((id, customer, market, state, created_at)) = head else {
            return Ok(None);
        };
        // No key column in the seed's table: the physical order of rows that are never
        // updated is their insertion order, named differently by each backend.
        let lines: Vec<(String, i32, i32)> = self
            .db
            .fetch_all(
                query_each(
                    "SELECT producto, cantidad, precio_centimos FROM lineas_pedido \
                     WHERE pedido_id = $1 ORDER BY rowid",
                    "SELECT producto, cantidad, precio_centimos FROM lineas_pedido \
                     WHERE pedido_id = $1 ORDER BY ctid",
                )
                .bind(&id),
            )
            .await?;
        let state = OrderState::parse(&state).ok_or_else(|| StoreError::Corrupt {
            table: "pedidos",
            reason: format!("order `{id}` has unknown state `{state}`"),
        })?;
        Ok(Some(Order {
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
            reason: None,
        }))
    }

    /// The state of every order whose id starts with `prefix`, by id (a state km0 does not
    /// know is an error).
    pub async fn states(
        &self,
        prefix: &str,
    ) -> Result<std::collections::BTreeMap<String, OrderState>, StoreError> {
        let pattern = format!(
            "{}%",
            prefix
                .replace('\\', "\\\\")
                .replace('%', "\\%")
                .replace('_', "\\_")
        );
        let rows: Vec<(String, String)> = self
            .db
            .fetch_all(
                query("SELECT id, estado FROM pedidos WHERE id LIKE $1 ESCAPE '\\'").bind(pattern),
            )
            .await?;
        rows.into_iter()
            .map(|(id, state)| match OrderState::parse(&state) {
                Some(state) => Ok((id, state)),
                None => Err(StoreError::Corrupt {
                    table: "pedidos",
                    reason: format!("order `{id}` has unknown state `{state}`"),
                }),
            })
            .collect()
    }

    /// Number of orders stored.
    pub async fn count(&self) -> Result<u64, StoreError> {
        let n: Option<i64> = self
            .db
            .scalar(query("SELECT COUNT(*) FROM pedidos"))
            .await?;
        Ok(n.and_then(|n| u64::try_from(n).ok()).unwrap_or(0))
    }
}

/// The order, its lines and its event, in the caller's transaction.
async fn write_order(
    tx: &mut Tx,
    order: &NewOrder,
    event: &NewEvent,
    key: Option<&str>,
) -> Result<(), CreateOrderError> {
    // ON CONFLICT instead of catching the unique violation: a duplicate is an expected
    // answer (409), not an error to classify.
    let inserted = tx
        .execute(
            query(
                "INSERT INTO pedidos (id, cliente, mercado, estado) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(&order.id)
            .bind(&order.customer)
            .bind(&order.market)
            .bind(OrderState::Created.as_str()),
        )
        .await?;
    if inserted != 1 {
        return Err(CreateOrderError::Duplicate {
            id: order.id.clone(),
        });
    }
    for line in &order.lines {
        tx.execute(
            query(
                "INSERT INTO lineas_pedido (pedido_id, producto, cantidad, precio_centimos) \
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(&order.id)
            .bind(&line.product)
            .bind(line.quantity)
            .bind(line.price_cents),
        )
        .await?;
    }
    super::requests::record(tx, order, event.id, key).await?;
    tx.enqueue(event).await?;
    Ok(())
}
