//! The PostgreSQL batch path: one statement per event, no savepoints.
//!
//! Each event is one statement that checks for the key, checks every line against the stock,
//! and only if the key is new and every line can be served claims the key and takes the
//! units. A statement is atomic, so a refused event leaves nothing behind without a savepoint,
//! and the event costs one round trip instead of five (`SAVEPOINT`, claim, one `UPDATE` per
//! line, `RELEASE`). Every event still has its own key in `mensajes_procesados`, written in the
//! batch's transaction together with its effect.

use entrega_core::{Headers, Processed, StoreError, TRACEPARENT};
use sqlx::{PgConnection, Row};

use super::db::{reservation_id, ApplyError, BatchItem};
use super::domain::{PlacedOrder, StockError};
use super::reservations::by_product;

/// Checks, claims and takes in one statement, with the order's reservation row
/// (`reserva-<pedido>`) and one `stock.actualizado` per product in the outbox, as the
/// savepoint path writes them. An order already reserved (by the saga's command) only has its
/// key claimed. Lines of one product are summed; the first line (in order) that cannot be
/// served is reported. Stock is read in the statement's
/// snapshot; a concurrent writer that took the same units meanwhile makes the `UPDATE` break
/// `CHECK (unidades >= 0)`, an error that aborts the transaction: the batch is then retried
/// whole, never applied in part.
const APPLY_EVENT: &str = "
WITH lines AS (
    SELECT producto, sum(cantidad)::int4 AS cantidad, min(ord) AS ord
    FROM UNNEST($3::text[], $4::int4[]) WITH ORDINALITY AS l(producto, cantidad, ord)
    GROUP BY producto
), dup AS (
    SELECT 1 FROM mensajes_procesados WHERE id_mensaje = $1 AND consumidor = $2
), held AS (
    SELECT 1 FROM reservas WHERE id_reserva = $5
), short AS (
    SELECT l.producto, s.producto IS NULL AS unknown
    FROM lines l LEFT JOIN stock s ON s.producto = l.producto
    WHERE (s.producto IS NULL OR s.unidades < l.cantidad) AND NOT EXISTS (SELECT 1 FROM held)
    ORDER BY l.ord
    LIMIT 1
), claim AS (
    INSERT INTO mensajes_procesados (id_mensaje, consumidor)
    SELECT $1, $2 WHERE NOT EXISTS (SELECT 1 FROM dup) AND NOT EXISTS (SELECT 1 FROM short)
    ON CONFLICT DO NOTHING
    RETURNING 1
), taken AS (
    UPDATE stock s SET unidades = s.unidades - l.cantidad
    FROM lines l
    WHERE s.producto = l.producto AND EXISTS (SELECT 1 FROM claim)
      AND NOT EXISTS (SELECT 1 FROM held)
    RETURNING s.producto, s.unidades, l.cantidad, l.ord
), reserved AS (
    INSERT INTO reservas (id_reserva, pedido_id, estado, lineas, motivo, actualizado_ms)
    SELECT $5, $6, 'reservada', $7, NULL, $8 WHERE EXISTS (SELECT 1 FROM taken)
    RETURNING 1
), updated AS (
    INSERT INTO outbox (id, agregado, agregado_id, tipo, carga, headers)
    SELECT gen_random_uuid(), 'producto', t.producto, 'stock.actualizado',
           jsonb_build_object('producto', t.producto, 'antes', t.unidades + t.cantidad,
                              'despues', t.unidades, 'motivo', 'pedido', 'pedido_id', $6::text),
           $9::jsonb
    FROM taken t ORDER BY t.ord
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM dup) AS duplicate,
       (SELECT producto FROM short) AS short_product,
       COALESCE((SELECT unknown FROM short), false) AS unknown,
       (SELECT count(*) FROM claim) AS claimed,
       (SELECT count(*) FROM taken) AS taken,
       EXISTS (SELECT 1 FROM held) AS held";

/// Applies `items` in order inside the caller's transaction. Same contract as
/// `StockStore::apply_batch`: one result per attempted item; a transient failure ends the
/// list (and, on PostgreSQL, leaves the transaction aborted, so the commit fails and nothing
/// of the batch takes effect).
pub(super) async fn apply_items(
    conn: &mut PgConnection,
    consumer: &str,
    items: &[BatchItem],
) -> Vec<Result<Processed<()>, ApplyError>> {
    let mut results = Vec::with_capacity(items.len());
    for item in items {
        let order = match &item.order {
            Ok(order) => order,
            // Unreadable: nothing to apply, and the key stays unrecorded so an operator can
            // replay the message once the cause is fixed.
            Err(e) => {
                results.push(Err(e.clone().into()));
                continue;
            }
        };
        let headers = item
            .trace
            .map(|ctx| Headers::new().with(TRACEPARENT, ctx.header()))
            .and_then(|h| h.to_json_object());
        let outcome = apply_event(conn, consumer, &item.message_id, order, headers).await;
        let stop = outcome
            .as_ref()
            .is_err_and(|e| matches!(e, ApplyError::Store(_)));
        results.push(outcome);
        if stop {
            break;
        }
    }
    results
}

async fn apply_event(
    conn: &mut PgConnection,
    consumer: &str,
    message_id: &str,
    order: &PlacedOrder,
    headers: Option<String>,
) -> Result<Processed<()>, ApplyError> {
    if order.reservation.is_some() {
        // The saga's command takes this order's stock: only the key is recorded.
        let claimed = sqlx::query(
            "INSERT INTO mensajes_procesados (id_mensaje, consumidor) VALUES ($1, $2) \
             ON CONFLICT DO NOTHING",
        )
        .bind(message_id)
        .bind(consumer)
        .execute(&mut *conn)
        .await
        .map_err(entrega_postgres::classify)?;
        return Ok(if claimed.rows_affected() == 1 {
            Processed::Applied(())
        } else {
            Processed::Duplicate
        });
    }
    let products: Vec<&str> = order.lines.iter().map(|l| l.product.as_str()).collect();
    let quantities: Vec<i32> = order.lines.iter().map(|l| l.quantity).collect();
    let lines = super::domain::lines_value(&by_product(&order.lines));
    let row = sqlx::query(APPLY_EVENT)
        .bind(message_id)
        .bind(consumer)
        .bind(&products)
        .bind(&quantities)
        .bind(reservation_id(&order.order_id))
        .bind(&order.order_id)
        .bind(lines.to_string())
        .bind(entrega_core::now_ms())
        .bind(headers)
        .fetch_one(&mut *conn)
        .await
        .map_err(entrega_postgres::classify)?;
    let get = |e: sqlx::Error| ApplyError::Store(entrega_postgres::classify(e));
    let duplicate: bool = row.try_get("duplicate").map_err(get)?;
    let short: Option<String> = row.try_get("short_product").map_err(get)?;
    let unknown: bool = row.try_get("unknown").map_err(get)?;
    let claimed: i64 = row.try_get("claimed").map_err(get)?;
    let taken: i64 = row.try_get("taken").map_err(get)?;
    let held: bool = row.try_get("held").map_err(get)?;
    if duplicate {
        return Ok(Processed::Duplicate);
    }
    if let Some(product) = short {
        return Err(if unknown {
            StockError::UnknownProduct { product }.into()
        } else {
            StockError::OutOfStock { product }.into()
        });
    }
    if claimed == 0 {
        // Another consumer claimed the key between our check and our insert.
        return Ok(Processed::Duplicate);
    }
    let distinct = order
        .lines
        .iter()
        .map(|l| l.product.as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    if held {
        // Reserved before, under the same id: the stock is taken already.
        return Ok(Processed::Applied(()));
    }
    if usize::try_from(taken).ok() != Some(distinct) {
        // Cannot happen while `short` saw every product; refuse rather than half-apply.
        return Err(ApplyError::Store(StoreError::Corrupt {
            table: "stock",
            reason: format!("took {taken} of {distinct} products for {message_id}"),
        }));
    }
    Ok(Processed::Applied(()))
}
