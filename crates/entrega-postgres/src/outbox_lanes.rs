//! Reading and marking several relay lanes at once: one query for the pending rows of every
//! lane a relay holds, one fenced update for the rows it published, instead of one round trip
//! per lane. A relay holding 64 lanes would otherwise spend most of an idle pass asking empty
//! lanes, one by one, whether they have anything.

use entrega_core::{LaneCursor, LaneMark, LaneRows, StoreError};
use sqlx::postgres::PgPool;
use sqlx::Row;
use uuid::Uuid;

use crate::errors::{classify, invalid};
use crate::outbox::{row_of, timestamp_ms};

/// The oldest pending rows of each listed lane past its cursor (up to `$2` each), lanes in
/// list order, leaving out every row of an aggregate from its earliest blocked row on (one
/// refused and not due again at `$4`, or held). Every lane is one range probe of the partial
/// index `outbox_lane_pending (lane, seq)` plus one probe of the partial index
/// `outbox_blocked`, empty while nothing is refused; only a lane that has refused rows asks
/// that index again per row (`NOT g.blocked OR ...` stops at its first operand otherwise).
const PENDING_LANES: &str = "
SELECT o.lane, o.id, o.agregado, o.agregado_id, o.tipo, o.version, o.carga, o.seq, o.intentos,
       o.cabeceras::text AS cabeceras,
       (extract(epoch FROM o.creado_en) * 1000)::bigint AS created_at_ms
FROM UNNEST($1::int2[], $3::int8[]) WITH ORDINALITY AS h(lane, after_seq, ord)
CROSS JOIN LATERAL (
    SELECT EXISTS (
        SELECT 1 FROM outbox b
        WHERE b.lane = h.lane AND b.publicado_en IS NULL
          AND (b.proximo_intento IS NOT NULL OR b.aparcado_en IS NOT NULL)
    ) AS blocked
) g
CROSS JOIN LATERAL (
    SELECT p.lane, p.id, p.agregado, p.agregado_id, p.tipo, p.version, p.carga, p.seq,
           p.intentos, p.cabeceras, p.creado_en
    FROM outbox p
    WHERE p.lane = h.lane AND p.publicado_en IS NULL AND p.seq > h.after_seq
      AND (NOT g.blocked OR NOT EXISTS (
          SELECT 1 FROM outbox b
          WHERE b.lane = p.lane AND b.agregado_id = p.agregado_id AND b.seq <= p.seq
            AND b.publicado_en IS NULL
            AND (b.proximo_intento IS NOT NULL OR b.aparcado_en IS NOT NULL)
            AND (b.aparcado_en IS NOT NULL
                 OR b.proximo_intento > to_timestamp($4::float8 / 1000.0))))
    ORDER BY p.seq
    LIMIT $2
) o
ORDER BY h.ord, o.seq";

/// Marks rows published, but only those of lanes whose lease (owner and token) still holds;
/// returns the lanes that held. The fence and the update share one statement and snapshot,
/// as in the single-lane `mark_published`.
///
/// Shaped for the generic plan PostgreSQL settles on for a prepared statement after a few
/// runs: the ids are the condition of one scan of the primary key, and the held lanes are
/// folded once into an array (an init plan) that each row is checked against. Checking each
/// row against the `held` rows instead made the generic plan rescan them per row, about half
/// of the mark's time for a round of 64 lanes × 100 rows.
const MARK_LANES: &str = "
WITH held AS (
    SELECT l.lane
    FROM entrega_relay_lanes l
    JOIN UNNEST($2::int4[], $3::text[], $4::int8[]) AS m(lane, owner, token)
      ON m.lane = l.lane AND m.owner = l.owner AND m.token = l.token
), marked AS (
    UPDATE outbox SET publicado_en = to_timestamp($1::float8 / 1000.0)
    WHERE id = ANY($5) AND publicado_en IS NULL
      AND lane = ANY(ARRAY(SELECT lane::int2 FROM held))
    RETURNING 1
)
SELECT lane FROM held";

pub(crate) async fn pending_lanes(
    pool: &PgPool,
    cursors: &[LaneCursor],
    limit: usize,
    now_ms: i64,
) -> Result<Vec<LaneRows>, StoreError> {
    if cursors.is_empty() || limit == 0 {
        return Ok(Vec::new());
    }
    let lanes: Vec<i16> = cursors
        .iter()
        .map(|c| i16::try_from(c.lane).map_err(|_| invalid(format!("no lane {}", c.lane))))
        .collect::<Result<_, _>>()?;
    let after: Vec<i64> = cursors.iter().map(|c| c.after_seq).collect();
    let rows = sqlx::query(PENDING_LANES)
        .bind(&lanes)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .bind(&after)
        .bind(timestamp_ms(now_ms))
        .fetch_all(pool)
        .await
        .map_err(classify)?;
    let mut found: Vec<LaneRows> = Vec::new();
    for row in &rows {
        let lane: i16 = row.try_get("lane").map_err(classify)?;
        let lane = u32::try_from(lane).map_err(|_| StoreError::Corrupt {
            table: "outbox",
            reason: format!("negative lane {lane}"),
        })?;
        let decoded = row_of(row)?;
        // Rows come grouped by lane, so a lane's rows are always the last group so far.
        match found.last_mut() {
            Some(group) if group.lane == lane => group.rows.push(decoded),
            _ => found.push(LaneRows {
                lane,
                rows: vec![decoded],
            }),
        }
    }
    Ok(found)
}

pub(crate) async fn mark_published_lanes(
    pool: &PgPool,
    marks: &[LaneMark],
    now_ms: i64,
) -> Result<Vec<u32>, StoreError> {
    if marks.is_empty() {
        return Ok(Vec::new());
    }
    let mut lanes = Vec::with_capacity(marks.len());
    let mut owners = Vec::with_capacity(marks.len());
    let mut tokens = Vec::with_capacity(marks.len());
    let mut ids: Vec<Uuid> = Vec::new();
    for mark in marks {
        lanes.push(i32::try_from(mark.lease.lane).map_err(|_| invalid("lane out of range"))?);
        owners.push(mark.lease.owner.as_str());
        tokens.push(mark.lease.token);
        ids.extend_from_slice(&mark.ids);
    }
    let held: Vec<i32> = sqlx::query_scalar(MARK_LANES)
        .bind(timestamp_ms(now_ms))
        .bind(&lanes)
        .bind(&owners)
        .bind(&tokens)
        .bind(&ids)
        .fetch_all(pool)
        .await
        .map_err(classify)?;
    Ok(marks
        .iter()
        .map(|m| m.lease.lane)
        .filter(|lane| i32::try_from(*lane).is_ok_and(|l| !held.contains(&l)))
        .collect())
}
