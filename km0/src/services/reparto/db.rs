//! The delivery database: couriers, deliveries, and applying order events once each.
//!
//! A paid order with no free courier in its city is not a failure to retry: it is stored as
//! `pendiente` and the periodic assignment takes it once a courier is free (the seed's
//! exercise 3, case 5). The idempotency key and the delivery's writes share one transaction.

use entrega_core::{MigrationSet, Processed, StoreError};

use super::domain::PaidOrder;
use crate::config::Db;
use crate::schema::{self, Migration};

/// Couriers and deliveries, with the couriers km0 starts with.
const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    description: "repartidores and entregas with the initial couriers",
    sqlite: "CREATE TABLE IF NOT EXISTS repartidores (
        id TEXT PRIMARY KEY, ciudad TEXT NOT NULL, libre INTEGER NOT NULL DEFAULT 1);
    CREATE TABLE IF NOT EXISTS entregas (
        pedido_id TEXT PRIMARY KEY, ciudad TEXT NOT NULL, calle TEXT NOT NULL, km REAL,
        repartidor_id TEXT, estado TEXT NOT NULL, actualizado_ms INTEGER NOT NULL);
    CREATE INDEX IF NOT EXISTS entregas_estado ON entregas (estado, actualizado_ms);
    INSERT INTO repartidores (id, ciudad) VALUES ('R-MAD-1', 'Madrid'), ('R-MAD-2', 'Madrid'),
        ('R-BCN-1', 'Barcelona'), ('R-VLC-1', 'Valencia'), ('R-TGN-1', 'Tarragona')
        ON CONFLICT (id) DO NOTHING;",
    postgres: "CREATE TABLE IF NOT EXISTS repartidores (
        id TEXT PRIMARY KEY, ciudad TEXT NOT NULL, libre INTEGER NOT NULL DEFAULT 1);
    CREATE TABLE IF NOT EXISTS entregas (
        pedido_id TEXT PRIMARY KEY, ciudad TEXT NOT NULL, calle TEXT NOT NULL,
        km DOUBLE PRECISION, repartidor_id TEXT, estado TEXT NOT NULL,
        actualizado_ms BIGINT NOT NULL);
    CREATE INDEX IF NOT EXISTS entregas_estado ON entregas (estado, actualizado_ms);
    INSERT INTO repartidores (id, ciudad) VALUES ('R-MAD-1', 'Madrid'), ('R-MAD-2', 'Madrid'),
        ('R-BCN-1', 'Barcelona'), ('R-VLC-1', 'Valencia'), ('R-TGN-1', 'Tarragona')
        ON CONFLICT (id) DO NOTHING;",
}];

/// A delivery with a courier on its way.
pub const ASSIGNED: &str = "asignada";
/// A paid order waiting for a free courier in its city.
pub const PENDING: &str = "pendiente";
/// A delivery whose order was cancelled (its courier, if any, freed).
pub const CANCELLED: &str = "cancelada";
/// A delivery made.
pub const DELIVERED: &str = "entregada";

/// Most pending deliveries one assignment round looks at.
const ASSIGN_BATCH: i64 = 100;

/// One row of `entregas`.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// Order id.
    pub pedido_id: String,
    /// Delivery city.
    pub ciudad: String,
    /// State: [`ASSIGNED`], [`PENDING`], [`CANCELLED`] or [`DELIVERED`].
    pub estado: String,
    /// The courier, once assigned.
    pub repartidor_id: Option<String>,
    /// Route length from the maps service.
    pub km: Option<f64>,
}

type DeliveryRow = (String, String, String, Option<String>, Option<f64>);

impl From<DeliveryRow> for Delivery {
    fn from((pedido_id, ciudad, estado, repartidor_id, km): DeliveryRow) -> Self {
        Self {
            pedido_id,
            ciudad,
            estado,
            repartidor_id,
            km,
        }
    }
}

/// Runs `$body` in a transaction of either backend, with `$tx` the open transaction and
/// `$inbox` the backend's idempotency table; commits when the body returns.
macro_rules! in_tx {
    ($db:expr, |$tx:ident, $inbox:ident, $classify:ident| $body:block) => {
        match $db {
            Db::Sqlite(pool) => {
                #[allow(unused_imports)]
                use entrega_sqlite::{classify as $classify, SqliteInbox as $inbox};
                let mut $tx = entrega_sqlite::begin_immediate(pool).await?;
                let out = $body;
                $tx.commit().await.map_err(entrega_sqlite::classify)?;
                Ok(out)
            }
            Db::Postgres(pool) => {
                #[allow(unused_imports)]
                use entrega_postgres::{classify as $classify, PgInbox as $inbox};
                let mut $tx = pool.begin().await.map_err(entrega_postgres::classify)?;
                let out = $body;
                $tx.commit().await.map_err(entrega_postgres::classify)?;
                Ok(out)
            }
        }
    };
}

/// Reads with the pool of either backend.
macro_rules! on_pool {
    ($db:expr, |$pool:ident, $classify:ident| $body:expr) => {
        match $db {
            Db::Sqlite($pool) => {
                let $classify = entrega_sqlite::classify;
                $body
            }
            Db::Postgres($pool) => {
                let $classify = entrega_postgres::classify;
                $body
            }
        }
    };
}

/// Takes a free courier of `city` in the open transaction; `None` when all are busy.
macro_rules! take_courier {
    ($tx:ident, $classify:path, $city:expr) => {
        sqlx::query_scalar::<_, String>(
            "UPDATE repartidores SET libre = 0
             WHERE id = (SELECT id FROM repartidores WHERE ciudad = $1 AND libre = 1
                         ORDER BY id LIMIT 1)
               AND libre = 1
             RETURNING id",
        )
        .bind($city)
        .fetch_optional(&mut *$tx)
        .await
        .map_err($classify)?
    };
}

/// Frees a courier in the open transaction.
macro_rules! free_courier {
    ($tx:ident, $classify:path, $courier:expr) => {
        sqlx::query("UPDATE repartidores SET libre = 1 WHERE id = $1")
            .bind($courier)
            .execute(&mut *$tx)
            .await
            .map_err($classify)?
    };
}

/// The delivery database of the `reparto` service.
#[derive(Debug, Clone)]
pub struct DeliveryStore {
    db: Db,
}

impl DeliveryStore {
    /// Wraps a connected database.
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// The underlying database.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Creates entrega's consumer tables and reparto's own, with the initial couriers.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.db.migrate_entrega(&[MigrationSet::Inbox]).await?;
        schema::apply(&self.db, "reparto", MIGRATIONS).await
    }

    /// Whether km0 delivers in `city` (it has couriers there).
    pub async fn serves(&self, city: &str) -> Result<bool, StoreError> {
        let sql = "SELECT 1 FROM repartidores WHERE ciudad = $1 LIMIT 1";
        on_pool!(&self.db, |pool, classify| {
            let found: Option<i32> = sqlx::query_scalar(sql)
                .bind(city)
                .fetch_optional(pool)
                .await
                .map_err(classify)?;
            Ok(found.is_some())
        })
    }

    /// Whether `message_id` was already applied by `consumer`.
    pub async fn is_processed(&self, consumer: &str, message_id: &str) -> Result<bool, StoreError> {
        let sql = "SELECT 1 FROM mensajes_procesados WHERE consumidor = $1 AND id_mensaje = $2";
        on_pool!(&self.db, |pool, classify| {
            let found: Option<i32> = sqlx::query_scalar(sql)
                .bind(consumer)
                .bind(message_id)
                .fetch_optional(pool)
                .await
                .map_err(classify)?;
            Ok(found.is_some())
        })
    }

    /// Records a paid order's delivery once per `message_id`: assigned to a free courier of
    /// its city, or pending when none is free. An order already known (cancelled first, or
    /// paid twice under two event ids) keeps its delivery.
    pub async fn apply_paid(
        &self,
        consumer: &str,
        message_id: &str,
        order: &PaidOrder,
        km: f64,
        now_ms: i64,
    ) -> Result<Processed<String>, StoreError> {
        in_tx!(&self.db, |tx, Inbox, classify| {
            if !Inbox::claim(&mut tx, consumer, message_id).await? {
                return Ok(Processed::Duplicate);
            }
            let known: Option<String> =
                sqlx::query_scalar("SELECT estado FROM entregas WHERE pedido_id = $1")
                    .bind(&order.order_id)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(classify)?;
            if let Some(state) = known {
                tx.commit().await.map_err(classify)?;
                return Ok(Processed::Applied(state));
            }
            let courier = take_courier!(tx, classify, &order.city);
            let state = if courier.is_some() { ASSIGNED } else { PENDING };
            sqlx::query(
                "INSERT INTO entregas (pedido_id, ciudad, calle, km, repartidor_id, estado,
                                       actualizado_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(&order.order_id)
            .bind(&order.city)
            .bind(&order.street)
            .bind(km)
            .bind(courier)
            .bind(state)
            .bind(now_ms)
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
            Processed::Applied(state.to_owned())
        })
    }

    /// Cancels an order's delivery once per `message_id`, freeing its courier. A cancellation
    /// that arrives before the payment leaves a cancelled delivery behind, so a later payment
    /// does not send a courier.
    pub async fn apply_cancelled(
        &self,
        consumer: &str,
        message_id: &str,
        order_id: &str,
        now_ms: i64,
    ) -> Result<Processed<()>, StoreError> {
        in_tx!(&self.db, |tx, Inbox, classify| {
            if !Inbox::claim(&mut tx, consumer, message_id).await? {
                return Ok(Processed::Duplicate);
            }
            let row: Option<(String, Option<String>)> =
                sqlx::query_as("SELECT estado, repartidor_id FROM entregas WHERE pedido_id = $1")
                    .bind(order_id)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(classify)?;
            match row {
                None => {
                    sqlx::query(
                        "INSERT INTO entregas (pedido_id, ciudad, calle, estado, actualizado_ms)
                         VALUES ($1, '', '', $2, $3)",
                    )
                    .bind(order_id)
                    .bind(CANCELLED)
                    .bind(now_ms)
                    .execute(&mut *tx)
                    .await
                    .map_err(classify)?;
                }
                Some((state, courier)) if state == ASSIGNED || state == PENDING => {
                    sqlx::query(
                        "UPDATE entregas SET estado = $1, actualizado_ms = $2 WHERE pedido_id = $3",
                    )
                    .bind(CANCELLED)
                    .bind(now_ms)
                    .bind(order_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(classify)?;
                    if let Some(courier) = courier {
                        free_courier!(tx, classify, &courier);
                    }
                }
                Some(_) => {}
            }
            Processed::Applied(())
        })
    }

    /// Gives pending deliveries, oldest first, the couriers that are free now; returns how
    /// many were assigned. Run periodically.
    pub async fn assign_pending(&self, now_ms: i64) -> Result<u64, StoreError> {
        let pending: Vec<(String, String)> = on_pool!(&self.db, |pool, classify| {
            sqlx::query_as(
                "SELECT pedido_id, ciudad FROM entregas WHERE estado = $1
                 ORDER BY actualizado_ms, pedido_id LIMIT $2",
            )
            .bind(PENDING)
            .bind(ASSIGN_BATCH)
            .fetch_all(pool)
            .await
            .map_err(classify)?
        });
        let mut assigned = 0;
        for (order_id, city) in pending {
            let done: bool = in_tx!(&self.db, |tx, Inbox, classify| {
                match take_courier!(tx, classify, &city) {
                    None => false,
                    Some(courier) => {
                        // Guarded by the state: a cancellation in between wins.
                        let updated = sqlx::query(
                            "UPDATE entregas SET estado = $1, repartidor_id = $2,
                                                 actualizado_ms = $3
                             WHERE pedido_id = $4 AND estado = $5",
                        )
                        .bind(ASSIGNED)
                        .bind(&courier)
                        .bind(now_ms)
                        .bind(&order_id)
                        .bind(PENDING)
                        .execute(&mut *tx)
                        .await
                        .map_err(classify)?;
                        if updated.rows_affected() == 0 {
                            free_courier!(tx, classify, &courier);
                        }
                        updated.rows_affected() > 0
                    }
                }
            })?;
            assigned += u64::from(done);
        }
        Ok(assigned)
    }

    /// Marks an assigned delivery as made and frees its courier; `false` if the order has
    /// no assigned delivery.
    pub async fn complete(&self, order_id: &str, now_ms: i64) -> Result<bool, StoreError> {
        in_tx!(&self.db, |tx, Inbox, classify| {
            let courier: Option<Option<String>> = sqlx::query_scalar(
                "UPDATE entregas SET estado = $1, actualizado_ms = $2
                 WHERE pedido_id = $3 AND estado = $4 RETURNING repartidor_id",
            )
            .bind(DELIVERED)
            .bind(now_ms)
            .bind(order_id)
            .bind(ASSIGNED)
            .fetch_optional(&mut *tx)
            .await
            .map_err(classify)?;
            match courier {
                Some(Some(courier)) => {
                    free_courier!(tx, classify, &courier);
                    true
                }
                Some(None) => true,
                None => false,
            }
        })
    }

    /// The delivery of `order_id`, if any.
    pub async fn delivery(&self, order_id: &str) -> Result<Option<Delivery>, StoreError> {
        let sql = "SELECT pedido_id, ciudad, estado, repartidor_id, km FROM entregas
                   WHERE pedido_id = $1";
        let row: Option<DeliveryRow> = on_pool!(&self.db, |pool, classify| {
            sqlx::query_as(sql)
                .bind(order_id)
                .fetch_optional(pool)
                .await
                .map_err(classify)?
        });
        Ok(row.map(Delivery::from))
    }

    /// Every delivery, by order id.
    pub async fn deliveries(&self) -> Result<Vec<Delivery>, StoreError> {
        let sql = "SELECT pedido_id, ciudad, estado, repartidor_id, km FROM entregas
                   ORDER BY pedido_id";
        let rows: Vec<DeliveryRow> = on_pool!(&self.db, |pool, classify| {
            sqlx::query_as(sql)
                .fetch_all(pool)
                .await
                .map_err(classify)?
        });
        Ok(rows.into_iter().map(Delivery::from).collect())
    }
}
