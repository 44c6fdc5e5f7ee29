//! Stock changes inside the caller's transaction, each with its `stock.actualizado` in the
//! outbox, and the reservations rows that make a saga's reservation and release idempotent.

use entrega::db::{query, Db, Tx};
use entrega_core::StoreError;

use super::db::ApplyError;
use super::domain::{StockError, StockLine};
use super::reservations::{by_product, stock_updated, Motive, ReservationState};

/// A reservation as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredReservation {
    /// Where it stands.
    pub state: ReservationState,
    /// What it took (empty for a refusal or a tombstone).
    pub lines: Vec<StockLine>,
    /// Why it was refused.
    pub reason: Option<String>,
}

/// What [`reserve`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserved {
    /// The stock is taken now.
    Taken,
    /// The reservation existed already, in this state (nothing changed).
    Existing(StoredReservation),
    /// It could not be served, and the refusal is recorded (only when asked to record it).
    Refused(String),
}

/// Takes `lines` (summed by product) for `order_id`, writing one `stock.actualizado` per
/// product. Refuses with the first product short or unknown; the caller undoes the
/// products already taken (a savepoint or the whole transaction).
pub async fn take(
    tx: &mut Tx,
    order_id: &str,
    lines: &[StockLine],
    motive: Motive,
) -> Result<(), ApplyError> {
    for line in by_product(lines) {
        // The seed's conditional update: never below zero, even under concurrency.
        let after: Option<i64> = tx
            .scalar(
                query(
                    "UPDATE stock SET unidades = unidades - $1 \
                     WHERE producto = $2 AND unidades >= $1 RETURNING CAST(unidades AS BIGINT)",
                )
                .bind(line.quantity)
                .bind(&line.product),
            )
            .await?;
        let Some(after) = after else {
            let product = line.product.clone();
            let exists: Option<i32> = tx
                .scalar(query("SELECT 1 FROM stock WHERE producto = $1").bind(&product))
                .await?;
            return Err(if exists.is_some() {
                StockError::OutOfStock { product }.into()
            } else {
                StockError::UnknownProduct { product }.into()
            });
        };
        let before = after + i64::from(line.quantity);
        tx.enqueue(&stock_updated(
            &line.product,
            before,
            after,
            motive,
            Some(order_id),
        )?)
        .await?;
    }
    Ok(())
}

/// Gives `lines` back (summed by product), one `stock.actualizado` each.
pub async fn give_back(tx: &mut Tx, order_id: &str, lines: &[StockLine]) -> Result<(), StoreError> {
    for line in by_product(lines) {
        let after: Option<i64> = tx
            .scalar(
                query(
                    "UPDATE stock SET unidades = unidades + $1 WHERE producto = $2 \
                     RETURNING CAST(unidades AS BIGINT)",
                )
                .bind(line.quantity)
                .bind(&line.product),
            )
            .await?;
        // A product removed since it was reserved has no row to give back to.
        if let Some(after) = after {
            let before = after - i64::from(line.quantity);
            tx.enqueue(&stock_updated(
                &line.product,
                before,
                after,
                Motive::Release,
                Some(order_id),
            )?)
            .await?;
        }
    }
    Ok(())
}

const FIND: &str = "SELECT estado, lineas, motivo FROM reservas WHERE id_reserva = $1";

/// A `reservas` row: state, lines (JSON), reason.
type ReservationRow = (String, String, Option<String>);

/// The reservation `id`, if any, in the caller's transaction.
pub async fn find(tx: &mut Tx, id: &str) -> Result<Option<StoredReservation>, StoreError> {
    let row: Option<ReservationRow> = tx.fetch_optional(query(FIND).bind(id)).await?;
    row.map(|row| decode(id, row)).transpose()
}

/// The reservation `id`, if any, read outside any transaction.
pub async fn read(db: &Db, id: &str) -> Result<Option<StoredReservation>, StoreError> {
    let row: Option<ReservationRow> = db.fetch_optional(query(FIND).bind(id)).await?;
    row.map(|row| decode(id, row)).transpose()
}

fn decode(
    id: &str,
    (state, lines, reason): ReservationRow,
) -> Result<StoredReservation, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        table: "reservas",
        reason,
    };
    let state = ReservationState::parse(&state)
        .ok_or_else(|| corrupt(format!("estado `{state}` of `{id}`")))?;
    let lines: Vec<StockLine> =
        serde_json::from_str(&lines).map_err(|e| corrupt(format!("lineas of `{id}`: {e}")))?;
    Ok(StoredReservation {
        state,
        lines,
        reason,
    })
}

async fn insert(
    tx: &mut Tx,
    id: &str,
    order_id: &str,
    state: ReservationState,
    lines: &[StockLine],
    reason: Option<&str>,
    now_ms: i64,
) -> Result<(), StoreError> {
    let lines = super::domain::lines_value(lines);
    tx.execute(
        query(
            "INSERT INTO reservas (id_reserva, pedido_id, estado, lineas, motivo, actualizado_ms) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(id)
        .bind(order_id)
        .bind(state.as_str())
        .bind(lines.to_string())
        .bind(reason)
        .bind(now_ms),
    )
    .await
    .map(drop)
}

/// Reserves `lines` under `id` once. An existing reservation (held, refused or released) is
/// returned as it is. A refusal is recorded under `id` when `record_refusal`, or returned as
/// the error otherwise (the caller's transaction must then be rolled back).
pub async fn reserve(
    tx: &mut Tx,
    id: &str,
    order_id: &str,
    lines: &[StockLine],
    motive: Motive,
    record_refusal: bool,
    now_ms: i64,
) -> Result<Reserved, ApplyError> {
    if let Some(existing) = find(tx, id).await? {
        return Ok(Reserved::Existing(existing));
    }
    savepoint(tx, "SAVEPOINT km0_reserva").await?;
    match take(tx, order_id, lines, motive).await {
        Ok(()) => {
            savepoint(tx, "RELEASE SAVEPOINT km0_reserva").await?;
            insert(
                tx,
                id,
                order_id,
                ReservationState::Held,
                lines,
                None,
                now_ms,
            )
            .await?;
            Ok(Reserved::Taken)
        }
        Err(ApplyError::Stock(refusal)) if record_refusal => {
            savepoint(tx, "ROLLBACK TO SAVEPOINT km0_reserva").await?;
            savepoint(tx, "RELEASE SAVEPOINT km0_reserva").await?;
            let reason = refusal.to_string();
            let state = ReservationState::Refused;
            insert(tx, id, order_id, state, &[], Some(&reason), now_ms).await?;
            Ok(Reserved::Refused(reason))
        }
        Err(e) => Err(e),
    }
}

/// What [`release`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// The reservation's stock is back.
    GivenBack,
    /// Nothing to give back: refused, released before, or never made (now a tombstone).
    Nothing,
}

/// Releases reservation `id` once: its stock back if it held any; a tombstone if it was
/// never made, so a reservation arriving later is not served.
pub async fn release(
    tx: &mut Tx,
    id: &str,
    order_id: &str,
    now_ms: i64,
) -> Result<Released, StoreError> {
    match find(tx, id).await? {
        Some(r) if r.state == ReservationState::Held => {
            give_back(tx, order_id, &r.lines).await?;
            tx.execute(
                query("UPDATE reservas SET estado = $1, actualizado_ms = $2 WHERE id_reserva = $3")
                    .bind(ReservationState::Released.as_str())
                    .bind(now_ms)
                    .bind(id),
            )
            .await?;
            Ok(Released::GivenBack)
        }
        Some(_) => Ok(Released::Nothing),
        None => {
            let reason = Some("liberada antes de reservarse");
            let state = ReservationState::Released;
            insert(tx, id, order_id, state, &[], reason, now_ms).await?;
            Ok(Released::Nothing)
        }
    }
}

async fn savepoint(tx: &mut Tx, sql: &'static str) -> Result<(), StoreError> {
    tx.execute(query(sql)).await.map(drop)
}
