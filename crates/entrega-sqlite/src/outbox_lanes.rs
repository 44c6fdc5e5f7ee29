//! Reading and marking several relay lanes at once: one statement for the pending rows of
//! every lane a relay holds and one write transaction for the rows it published, instead of a
//! statement and a transaction per lane.

use entrega_core::{LaneCursor, LaneMark, LaneRows, StoreError};
use sqlx::{Row, SqlitePool};

use crate::connect::begin_immediate;
use crate::errors::{classify, corrupt};
use crate::outbox::{decode_row, json_ids};
use crate::outbox_blocked::UNBLOCKED;
use crate::timefmt::{epoch_ms_sql, format_ms};

/// Lanes per statement: each is one member of a compound SELECT, and SQLite allows 500.
const LANES_PER_QUERY: usize = 64;

pub(crate) async fn pending_lanes(
    pool: &SqlitePool,
    cursors: &[LaneCursor],
    limit: usize,
    now_ms: i64,
) -> Result<Vec<LaneRows>, StoreError> {
    let mut found: Vec<LaneRows> = Vec::new();
    let now = format_ms(now_ms);
    if limit == 0 {
        return Ok(found);
    }
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    for chunk in cursors.chunks(LANES_PER_QUERY) {
        // One member per lane, each an index probe with its own LIMIT (SQLite has no LATERAL);
        // `ord` keeps the caller's lane order, rowid the insertion order within a lane.
        let member = format!(
            "SELECT * FROM (SELECT ? AS ord, o.lane, o.rowid AS seq, o.id, o.agregado,
                                   o.agregado_id, o.tipo, o.version, o.carga, o.intentos,
                                   o.cabeceras, {} AS created_ms
                            FROM outbox o
                            WHERE o.lane = ? AND o.publicado_en IS NULL AND o.rowid > ?
                              AND {UNBLOCKED}
                            ORDER BY o.rowid
                            LIMIT ?)",
            epoch_ms_sql("o.creado_en")
        );
        let sql = format!(
            "{} ORDER BY ord, seq",
            vec![member; chunk.len()].join(" UNION ALL ")
        );
        let mut query = sqlx::query(&sql);
        for (ord, cursor) in chunk.iter().enumerate() {
            query = query
                .bind(i64::try_from(ord).unwrap_or(i64::MAX))
                .bind(i64::from(cursor.lane))
                .bind(cursor.after_seq)
                .bind(i64::from(cursor.lane))
                .bind(&now)
                .bind(limit);
        }
        let rows = query.fetch_all(pool).await.map_err(classify)?;
        for row in &rows {
            let lane: i64 = row.try_get("lane").map_err(|e| corrupt("outbox", e))?;
            let lane = u32::try_from(lane)
                .map_err(|_| corrupt("outbox", format!("lane {lane} out of range")))?;
            let decoded = decode_row(row)?;
            match found.last_mut() {
                Some(group) if group.lane == lane => group.rows.push(decoded),
                _ => found.push(LaneRows {
                    lane,
                    rows: vec![decoded],
                }),
            }
        }
    }
    Ok(found)
}

pub(crate) async fn mark_published_lanes(
    pool: &SqlitePool,
    marks: &[LaneMark],
    now_ms: i64,
) -> Result<Vec<u32>, StoreError> {
    if marks.is_empty() {
        return Ok(Vec::new());
    }
    let leases: Vec<serde_json::Value> = marks
        .iter()
        .map(|m| serde_json::json!([m.lease.lane, m.lease.owner, m.lease.token]))
        .collect();
    let mut tx = begin_immediate(pool).await?;
    // The fence and the update share one write transaction: no successor can take a lane
    // between the check and the write.
    let held: Vec<i64> = sqlx::query_scalar(
        "SELECT l.lane FROM entrega_relay_lanes l
         JOIN json_each(?) j
           ON l.lane = json_extract(j.value, '$[0]')
          AND l.owner = json_extract(j.value, '$[1]')
          AND l.token = json_extract(j.value, '$[2]')",
    )
    .bind(serde_json::Value::from(leases).to_string())
    .fetch_all(&mut *tx)
    .await
    .map_err(classify)?;
    let (kept, lost): (Vec<&LaneMark>, Vec<&LaneMark>) = marks
        .iter()
        .partition(|m| held.contains(&i64::from(m.lease.lane)));
    let ids: Vec<_> = kept.iter().flat_map(|m| m.ids.iter().copied()).collect();
    if !ids.is_empty() {
        let lanes: Vec<u32> = kept.iter().map(|m| m.lease.lane).collect();
        sqlx::query(
            "UPDATE outbox SET publicado_en = ?
             WHERE publicado_en IS NULL
               AND lane IN (SELECT value FROM json_each(?))
               AND id IN (SELECT value FROM json_each(?))",
        )
        .bind(format_ms(now_ms))
        .bind(serde_json::Value::from(lanes).to_string())
        .bind(json_ids(&ids))
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
    }
    tx.commit().await.map_err(classify)?;
    Ok(lost.iter().map(|m| m.lease.lane).collect())
}
