//! The delivery database: couriers, deliveries, and applying order events once each.
//!
//! A paid order with no free courier in its city is not a failure to retry: it is stored as
//! `pendiente` and the periodic assignment takes it once a courier is free (the seed's
//! exercise 3, case 5). The idempotency key and the delivery's writes share one transaction.

use std::fmt;
use std::str::FromStr;

use entrega::db::{query, Db, Migration, Tx};
use entrega_core::{MigrationSet, Processed, StoreError};

use super::domain::PaidOrder;

/// Every courier's city, oldest courier first.
const COURIER_CITIES: &str = "SELECT ciudad FROM repartidores ORDER BY id";

/// The cities of `rows`, each once whatever its case (spelled as its first courier's), in
/// alphabetical order of their lower case.
fn distinct_cities(rows: Vec<(String,)>) -> Vec<String> {
    let mut cities: Vec<String> = Vec::new();
    for (city,) in rows {
        let folded = city.to_lowercase();
        if !cities.iter().any(|c| c.to_lowercase() == folded) {
            cities.push(city);
        }
    }
    cities.sort_by_key(|c| c.to_lowercase());
    cities
}

/// [`DeliveryStore::cities`] in the caller's transaction.
pub(super) async fn covered_cities(tx: &mut Tx) -> Result<Vec<String>, StoreError> {
    Ok(distinct_cities(tx.fetch_all(query(COURIER_CITIES)).await?))
}

/// Couriers and deliveries, with the couriers km0 starts with.
const MIGRATIONS: &[Migration] = &[
    Migration::each(
        1,
        "repartidores and entregas with the initial couriers",
        "CREATE TABLE IF NOT EXISTS repartidores (
        id TEXT PRIMARY KEY, ciudad TEXT NOT NULL, libre INTEGER NOT NULL DEFAULT 1);
    CREATE TABLE IF NOT EXISTS entregas (
        pedido_id TEXT PRIMARY KEY, ciudad TEXT NOT NULL, calle TEXT NOT NULL, km REAL,
        repartidor_id TEXT, estado TEXT NOT NULL, actualizado_ms INTEGER NOT NULL);
    CREATE INDEX IF NOT EXISTS entregas_estado ON entregas (estado, actualizado_ms);
    INSERT INTO repartidores (id, ciudad) VALUES ('R-MAD-1', 'Madrid'), ('R-MAD-2', 'Madrid'),
        ('R-BCN-1', 'Barcelona'), ('R-VLC-1', 'Valencia'), ('R-TGN-1', 'Tarragona')
        ON CONFLICT (id) DO NOTHING;",
        "CREATE TABLE IF NOT EXISTS repartidores (
        id TEXT PRIMARY KEY, ciudad TEXT NOT NULL, libre INTEGER NOT NULL DEFAULT 1);
    CREATE TABLE IF NOT EXISTS entregas (
        pedido_id TEXT PRIMARY KEY, ciudad TEXT NOT NULL, calle TEXT NOT NULL,
        km DOUBLE PRECISION, repartidor_id TEXT, estado TEXT NOT NULL,
        actualizado_ms BIGINT NOT NULL);
    CREATE INDEX IF NOT EXISTS entregas_estado ON entregas (estado, actualizado_ms);
    INSERT INTO repartidores (id, ciudad) VALUES ('R-MAD-1', 'Madrid'), ('R-MAD-2', 'Madrid'),
        ('R-BCN-1', 'Barcelona'), ('R-VLC-1', 'Valencia'), ('R-TGN-1', 'Tarragona')
        ON CONFLICT (id) DO NOTHING;",
    ),
    Migration::same(
        2,
        "entregas asked for by the order saga: their command's key and a refusal's reason",
        "ALTER TABLE entregas ADD COLUMN clave TEXT;
        ALTER TABLE entregas ADD COLUMN motivo TEXT;",
    ),
];

/// Where a delivery stands, stored in `entregas.estado` by its Spanish name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeliveryState {
    /// A courier is on the way (`asignada`).
    Assigned,
    /// A paid order waiting for a free courier in its city (`pendiente`).
    Pending,
    /// The order was cancelled; its courier, if any, freed (`cancelada`).
    Cancelled,
    /// Delivered (`entregada`).
    Delivered,
    /// Refused for good when the order saga asked for it: a city without couriers
    /// (`rechazada`, with its reason in `motivo`).
    Refused,
}

impl DeliveryState {
    /// The name stored in `entregas.estado`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Assigned => "asignada",
            Self::Pending => "pendiente",
            Self::Cancelled => "cancelada",
            Self::Delivered => "entregada",
            Self::Refused => "rechazada",
        }
    }
}

impl fmt::Display for DeliveryState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stored state name km0 does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown delivery state `{0}`")]
pub struct UnknownState(pub String);

impl FromStr for DeliveryState {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            Self::Assigned,
            Self::Pending,
            Self::Cancelled,
            Self::Delivered,
            Self::Refused,
        ]
        .into_iter()
        .find(|state| state.as_str() == s)
        .ok_or_else(|| UnknownState(s.to_owned()))
    }
}

/// Reads a stored state; a name km0 never writes means the row is not km0's.
pub(super) fn state_of(stored: &str) -> Result<DeliveryState, StoreError> {
    stored
        .parse()
        .map_err(|e: UnknownState| StoreError::Corrupt {
            table: "entregas",
            reason: e.to_string(),
        })
}

/// Most pending deliveries one assignment round looks at.
const ASSIGN_BATCH: i64 = 100;

/// One row of `entregas`.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// The order (`pedido_id`).
    pub order_id: String,
    /// Delivery city (`ciudad`).
    pub city: String,
    /// Where it stands (`estado`).
    pub state: DeliveryState,
    /// The courier, once assigned (`repartidor_id`).
    pub courier: Option<String>,
    /// Route length from the maps service (`km`).
    pub km: Option<f64>,
}

/// `pedido_id, ciudad, estado, repartidor_id, km`.
type DeliveryRow = (String, String, String, Option<String>, Option<f64>);

impl TryFrom<DeliveryRow> for Delivery {
    type Error = StoreError;

    fn try_from((order_id, city, state, courier, km): DeliveryRow) -> Result<Self, StoreError> {
        Ok(Self {
            order_id,
            city,
            state: state_of(&state)?,
            courier,
            km,
        })
    }
}

/// Takes a free courier of `city` (its name matched without regard to case) in the open
/// transaction; `None` when all are busy.
pub(super) async fn take_courier(tx: &mut Tx, city: &str) -> Result<Option<String>, StoreError> {
    tx.scalar(
        query(
            "UPDATE repartidores SET libre = 0
             WHERE id = (SELECT id FROM repartidores WHERE lower(ciudad) = lower($1) AND libre = 1
                         ORDER BY id LIMIT 1)
               AND libre = 1
             RETURNING id",
        )
        .bind(city),
    )
    .await
}

/// Frees a courier in the open transaction.
async fn free_courier(tx: &mut Tx, courier: &str) -> Result<(), StoreError> {
    tx.execute(query("UPDATE repartidores SET libre = 1 WHERE id = $1").bind(courier))
        .await
        .map(drop)
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
        self.db
            .migrate(&[
                MigrationSet::Outbox,
                MigrationSet::Inbox,
                MigrationSet::Rpc,
                MigrationSet::HeldLetters,
                MigrationSet::Dlq,
            ])
            .await?;
        self.db.apply_migrations("reparto", MIGRATIONS).await
    }

    /// The cities km0 delivers in (it has couriers there), in order, each once.
    pub async fn cities(&self) -> Result<Vec<String>, StoreError> {
        Ok(distinct_cities(
            self.db.fetch_all(query(COURIER_CITIES)).await?,
        ))
    }

    /// Whether km0 delivers in `city` (it has couriers there).
    pub async fn serves(&self, city: &str) -> Result<bool, StoreError> {
        let found: Option<i32> = self
            .db
            .scalar(
                query("SELECT 1 FROM repartidores WHERE lower(ciudad) = lower($1) LIMIT 1")
                    .bind(city),
            )
            .await?;
        Ok(found.is_some())
    }

    /// Whether `message_id` was already applied by `consumer`.
    pub async fn is_processed(&self, consumer: &str, message_id: &str) -> Result<bool, StoreError> {
        let found: Option<i32> = self
            .db
            .scalar(
                query(
                    "SELECT 1 FROM mensajes_procesados WHERE consumidor = $1 AND id_mensaje = $2",
                )
                .bind(consumer)
                .bind(message_id),
            )
            .await?;
        Ok(found.is_some())
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
    ) -> Result<Processed<DeliveryState>, StoreError> {
        self.db
            .once(consumer, message_id, async |tx| {
                let known: Option<String> = tx
                    .scalar(
                        query("SELECT estado FROM entregas WHERE pedido_id = $1")
                            .bind(&order.order_id),
                    )
                    .await?;
                if let Some(state) = known {
                    let state = state_of(&state)?;
                    return Ok(state);
                }
                let courier = take_courier(tx, &order.city).await?;
                let state = if courier.is_some() {
                    DeliveryState::Assigned
                } else {
                    DeliveryState::Pending
                };
                tx.execute(
                    query(
                        "INSERT INTO entregas (pedido_id, ciudad, calle, km, repartidor_id, estado,
                                               actualizado_ms)
                         VALUES ($1, $2, $3, $4, $5, $6, $7)",
                    )
                    .bind(&order.order_id)
                    .bind(&order.city)
                    .bind(&order.street)
                    .bind(km)
                    .bind(courier)
                    .bind(state.as_str())
                    .bind(now_ms),
                )
                .await?;
                Ok(state)
            })
            .await
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
        self.db
            .once(consumer, message_id, async |tx| {
                let row: Option<(String, Option<String>)> = tx
                    .fetch_optional(
                        query("SELECT estado, repartidor_id FROM entregas WHERE pedido_id = $1")
                            .bind(order_id),
                    )
                    .await?;
                match row {
                    None => {
                        tx.execute(
                            query(
                                "INSERT INTO entregas (pedido_id, ciudad, calle, estado, actualizado_ms)
                                 VALUES ($1, '', '', $2, $3)",
                            )
                            .bind(order_id)
                            .bind(DeliveryState::Cancelled.as_str())
                            .bind(now_ms),
                        )
                        .await?;
                    }
                    Some((state, courier)) => {
                        if matches!(
                            state_of(&state)?,
                            DeliveryState::Assigned | DeliveryState::Pending
                        ) {
                            tx.execute(
                                query(
                                    "UPDATE entregas SET estado = $1, actualizado_ms = $2 \
                                     WHERE pedido_id = $3",
                                )
                                .bind(DeliveryState::Cancelled.as_str())
                                .bind(now_ms)
                                .bind(order_id),
                            )
                            .await?;
                            if let Some(courier) = courier {
                                free_courier(tx, &courier).await?;
                            }
                        }
                    }
                }
                Ok(())
            })
            .await
    }

    /// Gives pending deliveries, oldest first, the couriers that are free now; returns how
    /// many were assigned. Run periodically.
    pub async fn assign_pending(&self, now_ms: i64) -> Result<u64, StoreError> {
        let pending: Vec<(String, String, Option<String>)> = self
            .db
            .fetch_all(
                query(
                    "SELECT pedido_id, ciudad, clave FROM entregas WHERE estado = $1
                     ORDER BY actualizado_ms, pedido_id LIMIT $2",
                )
                .bind(DeliveryState::Pending.as_str())
                .bind(ASSIGN_BATCH),
            )
            .await?;
        let mut assigned = 0;
        for (order_id, city, key) in pending {
            let mut tx = self.db.begin().await?;
            let Some(courier) = take_courier(&mut tx, &city).await? else {
                tx.commit().await?;
                continue;
            };
            // Guarded by the state: a cancellation in between wins.
            let updated = tx
                .execute(
                    query(
                        "UPDATE entregas SET estado = $1, repartidor_id = $2, actualizado_ms = $3
                         WHERE pedido_id = $4 AND estado = $5",
                    )
                    .bind(DeliveryState::Assigned.as_str())
                    .bind(&courier)
                    .bind(now_ms)
                    .bind(&order_id)
                    .bind(DeliveryState::Pending.as_str()),
                )
                .await?;
            if updated == 0 {
                free_courier(&mut tx, &courier).await?;
            } else if let Some(key) = key {
                // The order saga waits for this answer.
                tx.enqueue(&super::commands::assigned_event(&order_id, &key, &courier)?)
                    .await?;
            }
            tx.commit().await?;
            assigned += u64::from(updated > 0);
        }
        Ok(assigned)
    }

    /// Adds courier `id` in `city`, free; `false` if that id exists already.
    pub async fn add_courier(&self, id: &str, city: &str) -> Result<bool, StoreError> {
        let added = self
            .db
            .execute(
                query(
                    "INSERT INTO repartidores (id, ciudad) VALUES ($1, $2) \
                     ON CONFLICT (id) DO NOTHING",
                )
                .bind(id)
                .bind(city),
            )
            .await?;
        Ok(added > 0)
    }

    /// Marks an assigned delivery as made and frees its courier; `false` if the order has
    /// no assigned delivery.
    pub async fn complete(&self, order_id: &str, now_ms: i64) -> Result<bool, StoreError> {
        let mut tx = self.db.begin().await?;
        let courier: Option<(Option<String>,)> = tx
            .fetch_optional(
                query(
                    "UPDATE entregas SET estado = $1, actualizado_ms = $2
                     WHERE pedido_id = $3 AND estado = $4 RETURNING repartidor_id",
                )
                .bind(DeliveryState::Delivered.as_str())
                .bind(now_ms)
                .bind(order_id)
                .bind(DeliveryState::Assigned.as_str()),
            )
            .await?;
        let done = match courier {
            Some((Some(courier),)) => {
                free_courier(&mut tx, &courier).await?;
                true
            }
            Some((None,)) => true,
            None => false,
        };
        tx.commit().await?;
        Ok(done)
    }

    /// Makes every delivery assigned at or before `assigned_by_ms`, oldest first, freeing
    /// its courier (km0's simulated couriers take a fixed time); returns how many.
    pub async fn complete_assigned_before(
        &self,
        assigned_by_ms: i64,
        now_ms: i64,
    ) -> Result<u64, StoreError> {
        let due: Vec<(String,)> = self
            .db
            .fetch_all(
                query(
                    "SELECT pedido_id FROM entregas WHERE estado = $1 AND actualizado_ms <= $2
                     ORDER BY actualizado_ms, pedido_id LIMIT $3",
                )
                .bind(DeliveryState::Assigned.as_str())
                .bind(assigned_by_ms)
                .bind(ASSIGN_BATCH),
            )
            .await?;
        let mut made = 0;
        for (order_id,) in due {
            made += u64::from(self.complete(&order_id, now_ms).await?);
        }
        Ok(made)
    }

    /// The delivery of `order_id`, if any.
    pub async fn delivery(&self, order_id: &str) -> Result<Option<Delivery>, StoreError> {
        let row: Option<DeliveryRow> = self
            .db
            .fetch_optional(
                query(
                    "SELECT pedido_id, ciudad, estado, repartidor_id, km FROM entregas
                     WHERE pedido_id = $1",
                )
                .bind(order_id),
            )
            .await?;
        row.map(Delivery::try_from).transpose()
    }

    /// Every delivery, by order id.
    pub async fn deliveries(&self) -> Result<Vec<Delivery>, StoreError> {
        let rows: Vec<DeliveryRow> = self
            .db
            .fetch_all(query(
                "SELECT pedido_id, ciudad, estado, repartidor_id, km FROM entregas
                 ORDER BY pedido_id",
            ))
            .await?;
        rows.into_iter().map(Delivery::try_from).collect()
    }
}
