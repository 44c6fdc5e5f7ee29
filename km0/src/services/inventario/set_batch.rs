//! The set-based batch apply: a whole poll batch of `pedido.creado` in a constant number of
//! statements, whatever its size.
//!
//! 1. Claim every key at once ([`Tx::claim_all`]): one `INSERT … ON CONFLICT DO NOTHING
//!    RETURNING`; what comes back is new, the rest are duplicates.
//! 2. Read the reservations that exist for the batch's orders, and lock the stock rows of its
//!    products (`FOR UPDATE`, in product order; on SQLite the write transaction holds the
//!    database), one statement each.
//! 3. Decide each event in order in memory ([`batch_plan`](super::batch_plan)), over a running
//!    copy of the locked stock: the same outcomes as the per-event path, one by one.
//! 4. Write the plan: each product's stock once, the reservations, the `stock.actualizado`
//!    events, and give back the keys of the events refused (they commit unrecorded).
//!
//! The stock rows stay locked from the read to the commit, so the units decided on are the
//! units written: no concurrent writer can slip in between, and no `CHECK` can fail.

use entrega::db::Tx;
use entrega_core::{Processed, StoreError};
use sqlx::{PgConnection, SqliteConnection};

use super::batch_plan::{self, Inputs, NewReservation, Plan};
use super::db::{ApplyError, BatchItem};
use super::reservations::ReservationState;

/// Applies `items` in the caller's transaction; one result per item. An `Err` is a database
/// failure: the transaction must not commit, and no item takes effect.
pub(super) async fn apply_items(
    tx: &mut Tx,
    consumer: &str,
    items: &[BatchItem],
) -> Result<Vec<Result<Processed<()>, ApplyError>>, StoreError> {
    let claimed = tx
        .claim_all(consumer, &batch_plan::candidate_keys(items))
        .await?;
    let (reservation_ids, products) = batch_plan::needs(items);
    let mut inputs = Inputs {
        claimed,
        ..Inputs::default()
    };
    if let Some(conn) = tx.postgres() {
        pg::read(conn, &reservation_ids, &products, &mut inputs).await?;
    } else if let Some(conn) = tx.sqlite() {
        lite::read(conn, &reservation_ids, &products, &mut inputs).await?;
    }
    let Plan {
        results,
        taken,
        reservations,
        events,
        unclaim,
    } = batch_plan::plan(items, inputs);
    let taken: Vec<(String, i64)> = taken.into_iter().collect();
    let now = entrega_core::now_ms();
    if let Some(conn) = tx.postgres() {
        pg::write(conn, &taken, &reservations, now).await?;
    } else if let Some(conn) = tx.sqlite() {
        lite::write(conn, &taken, &reservations, now).await?;
    }
    let events = events
        .iter()
        .map(batch_plan::StockChange::event)
        .collect::<Result<Vec<_>, _>>()
        .map_err(StoreError::from)?;
    tx.enqueue_all(&events).await?;
    let unclaim: Vec<&str> = unclaim.iter().map(String::as_str).collect();
    tx.unclaim_all(consumer, &unclaim).await?;
    Ok(results)
}

/// A reservation's lines as stored in `reservas.lineas`.
fn lines_json(reservation: &NewReservation) -> String {
    super::domain::lines_value(&reservation.lines).to_string()
}

mod pg {
    use super::*;
    use entrega_postgres::classify;

    pub(super) async fn read(
        conn: &mut PgConnection,
        reservation_ids: &[String],
        products: &[String],
        inputs: &mut Inputs,
    ) -> Result<(), StoreError> {
        if reservation_ids.is_empty() {
            return Ok(());
        }
        let existing: Vec<String> =
            sqlx::query_scalar("SELECT id_reserva FROM reservas WHERE id_reserva = ANY($1)")
                .bind(reservation_ids)
                .fetch_all(&mut *conn)
                .await
                .map_err(classify)?;
        inputs.reserved.extend(existing);
        let stock: Vec<(String, i64)> = sqlx::query_as(
            "SELECT producto, unidades::int8 FROM stock WHERE producto = ANY($1)
             ORDER BY producto FOR UPDATE",
        )
        .bind(products)
        .fetch_all(&mut *conn)
        .await
        .map_err(classify)?;
        inputs.stock.extend(stock);
        Ok(())
    }

    pub(super) async fn write(
        conn: &mut PgConnection,
        taken: &[(String, i64)],
        reservations: &[NewReservation],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        if !taken.is_empty() {
            let (products, units): (Vec<&str>, Vec<i64>) =
                taken.iter().map(|(p, n)| (p.as_str(), *n)).unzip();
            sqlx::query(
                "UPDATE stock s SET unidades = s.unidades - t.n
                 FROM UNNEST($1::text[], $2::int8[]) AS t(producto, n)
                 WHERE s.producto = t.producto",
            )
            .bind(&products)
            .bind(&units)
            .execute(&mut *conn)
            .await
            .map_err(classify)?;
        }
        if !reservations.is_empty() {
            let ids: Vec<&str> = reservations.iter().map(|r| r.id.as_str()).collect();
            let orders: Vec<&str> = reservations.iter().map(|r| r.order_id.as_str()).collect();
            let lines: Vec<String> = reservations.iter().map(lines_json).collect();
            sqlx::query(
                "INSERT INTO reservas (id_reserva, pedido_id, estado, lineas, motivo, actualizado_ms)
                 SELECT r.id, r.pedido, $4, r.lineas, NULL, $5
                 FROM UNNEST($1::text[], $2::text[], $3::text[]) AS r(id, pedido, lineas)",
            )
            .bind(&ids)
            .bind(&orders)
            .bind(&lines)
            .bind(ReservationState::Held.as_str())
            .bind(now_ms)
            .execute(&mut *conn)
            .await
            .map_err(classify)?;
        }
        Ok(())
    }
}

mod lite {
    use super::*;
    use entrega_sqlite::classify;

    fn json<T: serde::Serialize>(value: &T) -> Result<String, StoreError> {
        serde_json::to_string(value).map_err(|e| StoreError::Corrupt {
            table: "stock",
            reason: format!("batch not encodable: {e}"),
        })
    }

    pub(super) async fn read(
        conn: &mut SqliteConnection,
        reservation_ids: &[String],
        products: &[String],
        inputs: &mut Inputs,
    ) -> Result<(), StoreError> {
        if reservation_ids.is_empty() {
            return Ok(());
        }
        let existing: Vec<String> = sqlx::query_scalar(
            "SELECT id_reserva FROM reservas WHERE id_reserva IN (SELECT value FROM json_each(?))",
        )
        .bind(json(&reservation_ids)?)
        .fetch_all(&mut *conn)
        .await
        .map_err(classify)?;
        inputs.reserved.extend(existing);
        let stock: Vec<(String, i64)> = sqlx::query_as(
            "SELECT producto, unidades FROM stock WHERE producto IN (SELECT value FROM json_each(?))",
        )
        .bind(json(&products)?)
        .fetch_all(&mut *conn)
        .await
        .map_err(classify)?;
        inputs.stock.extend(stock);
        Ok(())
    }

    pub(super) async fn write(
        conn: &mut SqliteConnection,
        taken: &[(String, i64)],
        reservations: &[NewReservation],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        if !taken.is_empty() {
            sqlx::query(
                "UPDATE stock SET unidades = unidades - (
                     SELECT json_extract(t.value, '$[1]') FROM json_each(?1) AS t
                     WHERE json_extract(t.value, '$[0]') = stock.producto)
                 WHERE producto IN (SELECT json_extract(value, '$[0]') FROM json_each(?1))",
            )
            .bind(json(&taken)?)
            .execute(&mut *conn)
            .await
            .map_err(classify)?;
        }
        if !reservations.is_empty() {
            let rows: Vec<(&str, &str, String)> = reservations
                .iter()
                .map(|r| (r.id.as_str(), r.order_id.as_str(), lines_json(r)))
                .collect();
            sqlx::query(
                "INSERT INTO reservas (id_reserva, pedido_id, estado, lineas, motivo, actualizado_ms)
                 SELECT json_extract(r.value, '$[0]'), json_extract(r.value, '$[1]'), ?2,
                        json_extract(r.value, '$[2]'), NULL, ?3
                 FROM json_each(?1) AS r ORDER BY r.key",
            )
            .bind(json(&rows)?)
            .bind(ReservationState::Held.as_str())
            .bind(now_ms)
            .execute(&mut *conn)
            .await
            .map_err(classify)?;
        }
        Ok(())
    }
}
