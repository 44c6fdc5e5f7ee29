//! Reading and marking several relay lanes at once: one statement for the pending rows of
//! every lane a relay holds and one fenced write for the rows it published, instead of a
//! round trip per lane. These are the relay's hot paths, so each backend has its own shape:
//! SQLite has no `LATERAL` and no arrays (a compound `SELECT` of index probes, JSON lists),
//! PostgreSQL plans arrays and `LATERAL` joins well (and its statements are shaped for the
//! generic plans of prepared statements).

use entrega_core::{LaneCursor, LaneMark, LaneRows, NewEvent, StoreError};
use sqlx::{PgConnection, Postgres};
use uuid::Uuid;

use std::sync::OnceLock;

use super::{corrupt, decode, id_list, row_columns, Row};
use crate::db::{query, Db, Pool, Query, TimeMs};

/// Lanes per SQLite statement: each is one member of a compound `SELECT`, and SQLite
/// allows 500.
const LANES_PER_QUERY: usize = 64;

/// Condition on a pending row `o` (SQLite): no row of its aggregate at or before it is
/// blocked (refused and not due again at `$1`, or held). The first probe does not depend on
/// the row, so SQLite runs it once per statement; while the lane has no refused rows (the
/// usual case) the second, per row, is never asked. Both read the partial index
/// `outbox_blocked`. `{lane}` is the lane's parameter.
const SQLITE_UNBLOCKED: &str = "
    (NOT EXISTS (SELECT 1 FROM outbox b
                 WHERE b.lane = {lane} AND b.publicado_en IS NULL
                   AND (b.next_attempt_at IS NOT NULL OR b.held_at IS NOT NULL))
     OR NOT EXISTS (SELECT 1 FROM outbox b
                    WHERE b.lane = o.lane AND b.agregado_id = o.agregado_id
                      AND b.rowid <= o.rowid AND b.publicado_en IS NULL
                      AND (b.next_attempt_at IS NOT NULL OR b.held_at IS NOT NULL)
                      AND (b.held_at IS NOT NULL OR b.next_attempt_at > $1)))";

/// PostgreSQL: the oldest pending rows of each listed lane past its cursor (up to `$2` each),
/// lanes in list order, leaving out every row of an aggregate from its earliest blocked row
/// on (one refused and not due again at `$4`, or held). Every lane is one range probe of the
/// partial index `outbox_lane_pending (lane, seq)` plus one probe of the partial index
/// `outbox_blocked`, empty while nothing is refused; only a lane that has refused rows asks
/// that index again per row (`NOT g.blocked OR ...` stops at its first operand otherwise).
const POSTGRES_PENDING_LANES: &str = "
FROM UNNEST($1::int2[], $3::int8[]) WITH ORDINALITY AS h(lane, after_seq, ord)
CROSS JOIN LATERAL (
    SELECT EXISTS (
        SELECT 1 FROM outbox b
        WHERE b.lane = h.lane AND b.publicado_en IS NULL
          AND (b.next_attempt_at IS NOT NULL OR b.held_at IS NOT NULL)
    ) AS blocked
) g
CROSS JOIN LATERAL (
    SELECT p.lane, p.id, p.agregado, p.agregado_id, p.tipo, p.version, p.carga, p.seq,
           p.attempts, p.headers, p.creado_en
    FROM outbox p
    WHERE p.lane = h.lane AND p.publicado_en IS NULL AND p.seq > h.after_seq
      AND (NOT g.blocked OR NOT EXISTS (
          SELECT 1 FROM outbox b
          WHERE b.lane = p.lane AND b.agregado_id = p.agregado_id AND b.seq <= p.seq
            AND b.publicado_en IS NULL
            AND (b.next_attempt_at IS NOT NULL OR b.held_at IS NOT NULL)
            AND (b.held_at IS NOT NULL OR b.next_attempt_at > $4)))
    ORDER BY p.seq
    LIMIT $2
) o
ORDER BY h.ord, o.seq";

/// PostgreSQL: marks rows published, but only those of lanes whose lease (owner and token)
/// still holds; returns the lanes that held. The fence and the update share one statement
/// and snapshot.
///
/// Shaped for the generic plan PostgreSQL settles on for a prepared statement after a few
/// runs: the ids are the condition of one scan of the primary key, and the held lanes are
/// folded once into an array (an init plan) that each row is checked against. Checking each
/// row against the `held` rows instead made the generic plan rescan them per row, about half
/// of the mark's time for a round of 64 lanes × 100 rows.
const POSTGRES_MARK_LANES: &str = "
WITH held AS (
    SELECT l.lane
    FROM entrega_relay_lanes l
    JOIN UNNEST($2::int4[], $3::text[], $4::int8[]) AS m(lane, owner, token)
      ON m.lane = l.lane AND m.owner = l.owner AND m.token = l.token
), marked AS (
    UPDATE outbox SET publicado_en = $1
    WHERE id = ANY($5) AND publicado_en IS NULL
      AND lane = ANY(ARRAY(SELECT lane::int2 FROM held))
    RETURNING 1
)
SELECT lane FROM held";

/// Rows of one lane come together, lanes in the order asked: grouped as they come.
fn grouped(rows: Vec<Row>) -> Result<Vec<LaneRows>, StoreError> {
    let mut found: Vec<LaneRows> = Vec::new();
    for row in rows {
        let (lane, decoded) = decode(row)?;
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

/// The oldest pending, unblocked rows of each cursor's lane past the cursor, at most
/// `limit` per lane, grouped by lane in the cursors' order.
pub(super) async fn pending_lanes(
    db: &Db,
    cursors: &[LaneCursor],
    limit: usize,
    now_ms: i64,
) -> Result<Vec<LaneRows>, StoreError> {
    if cursors.is_empty() || limit == 0 {
        return Ok(Vec::new());
    }
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    match &db.pool {
        Pool::Sqlite(_) => {
            let mut found = Vec::new();
            for chunk in cursors.chunks(LANES_PER_QUERY) {
                let rows: Vec<Row> = db.fetch_all(sqlite_pending(chunk, limit, now_ms)).await?;
                found.extend(grouped(rows)?);
            }
            Ok(found)
        }
        Pool::Postgres(pool) => {
            let lanes: Vec<i16> = cursors
                .iter()
                .map(|c| i16::try_from(c.lane).map_err(|_| corrupt(format!("no lane {}", c.lane))))
                .collect::<Result<_, _>>()?;
            let after: Vec<i64> = cursors.iter().map(|c| c.after_seq).collect();
            let rows: Vec<Row> = sqlx::query_as::<Postgres, Row>(postgres_pending_lanes())
                .bind(&lanes)
                .bind(limit)
                .bind(&after)
                .bind(crate::db::types::PgTimestamptz(now_ms))
                .fetch_all(pool)
                .await
                .map_err(entrega_postgres::classify)?;
            grouped(rows)
        }
    }
}

/// PostgreSQL's statement for the pending rows of several lanes.
fn postgres_pending_lanes() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| format!("SELECT {} {POSTGRES_PENDING_LANES}", row_columns!("o.seq")))
}

/// The SQLite statement for `lanes` lanes (1 to [`LANES_PER_QUERY`]): one member per lane,
/// each an index probe with its own `LIMIT`; `ord` keeps the caller's lane order, rowid the
/// insertion order within a lane. `$1` is the current time, `$2` the limit, then three per
/// lane. Each text is built once: the relay reads many times a second.
fn sqlite_pending_text(lanes: usize) -> &'static str {
    static TEXTS: OnceLock<Vec<String>> = OnceLock::new();
    let texts = TEXTS.get_or_init(|| (1..=LANES_PER_QUERY).map(sqlite_pending_sql).collect());
    texts
        .get(lanes.clamp(1, LANES_PER_QUERY) - 1)
        .map_or("", String::as_str)
}

fn sqlite_pending_sql(lanes: usize) -> String {
    let members: Vec<String> = (0..lanes)
        .map(|k| {
            let (ord, lane, after) = (3 * k + 3, 3 * k + 4, 3 * k + 5);
            let unblocked = SQLITE_UNBLOCKED.replace("{lane}", &format!("${lane}"));
            format!(
                "SELECT * FROM (SELECT ${ord} AS ord, {} FROM outbox o
                                WHERE o.lane = ${lane} AND o.publicado_en IS NULL
                                  AND o.rowid > ${after} AND {unblocked}
                                ORDER BY o.rowid LIMIT $2)",
                row_columns!("o.rowid")
            )
        })
        .collect();
    format!(
        "SELECT lane, seq, id, agregado, agregado_id, tipo, version, carga, attempts,
                headers, creado_en
         FROM ({}) ORDER BY ord, seq",
        members.join(" UNION ALL ")
    )
}

/// The SQLite query for up to [`LANES_PER_QUERY`] cursors.
fn sqlite_pending(cursors: &[LaneCursor], limit: i64, now_ms: i64) -> Query {
    cursors.iter().enumerate().fold(
        query(sqlite_pending_text(cursors.len()))
            .bind(TimeMs(now_ms))
            .bind(limit),
        |q, (ord, cursor)| {
            q.bind(i64::try_from(ord).unwrap_or(i64::MAX))
                .bind(i64::from(cursor.lane))
                .bind(cursor.after_seq)
        },
    )
}

/// Marks the rows of each mark whose lane is still leased as handed out; returns the lanes
/// that were not (their rows stay pending, for the lanes' new holders).
pub(super) async fn mark_published_lanes(
    db: &Db,
    marks: &[LaneMark],
    now_ms: i64,
) -> Result<Vec<u32>, StoreError> {
    if marks.is_empty() {
        return Ok(Vec::new());
    }
    let held: Vec<u32> = match &db.pool {
        Pool::Sqlite(_) => sqlite_mark(db, marks, now_ms).await?,
        Pool::Postgres(pool) => {
            let mut lanes = Vec::with_capacity(marks.len());
            let mut owners = Vec::with_capacity(marks.len());
            let mut tokens = Vec::with_capacity(marks.len());
            let mut ids: Vec<Uuid> = Vec::new();
            for mark in marks {
                lanes.push(super::int4(mark.lease.lane));
                owners.push(mark.lease.owner.as_str());
                tokens.push(mark.lease.token);
                ids.extend_from_slice(&mark.ids);
            }
            let held: Vec<i32> = sqlx::query_scalar(POSTGRES_MARK_LANES)
                .bind(crate::db::types::PgTimestamptz(now_ms))
                .bind(&lanes)
                .bind(&owners)
                .bind(&tokens)
                .bind(&ids)
                .fetch_all(pool)
                .await
                .map_err(entrega_postgres::classify)?;
            held.into_iter()
                .filter_map(|l| u32::try_from(l).ok())
                .collect()
        }
    };
    Ok(marks
        .iter()
        .map(|m| m.lease.lane)
        .filter(|lane| !held.contains(lane))
        .collect())
}

/// SQLite: the fence and the update share one write transaction, so no successor can take a
/// lane between the check and the write. Returns the lanes still held.
async fn sqlite_mark(db: &Db, marks: &[LaneMark], now_ms: i64) -> Result<Vec<u32>, StoreError> {
    let leases: Vec<serde_json::Value> = marks
        .iter()
        .map(|m| serde_json::json!([m.lease.lane, m.lease.owner, m.lease.token]))
        .collect();
    let mut tx = db.begin().await?;
    let held: Vec<(i64,)> = tx
        .fetch_all(
            query(
                "SELECT l.lane FROM entrega_relay_lanes l
                 JOIN json_each($1) j
                   ON l.lane = json_extract(j.value, '$[0]')
                  AND l.owner = json_extract(j.value, '$[1]')
                  AND l.token = json_extract(j.value, '$[2]')",
            )
            .bind(serde_json::Value::from(leases).to_string()),
        )
        .await?;
    let held: Vec<u32> = held
        .into_iter()
        .filter_map(|(lane,)| u32::try_from(lane).ok())
        .collect();
    let kept: Vec<&LaneMark> = marks
        .iter()
        .filter(|m| held.contains(&m.lease.lane))
        .collect();
    let ids: Vec<Uuid> = kept.iter().flat_map(|m| m.ids.iter().copied()).collect();
    if !ids.is_empty() {
        let lanes: Vec<u32> = kept.iter().map(|m| m.lease.lane).collect();
        tx.execute(
            query(
                "UPDATE outbox SET publicado_en = $1
                 WHERE publicado_en IS NULL
                   AND lane IN (SELECT value FROM json_each($2))
                   AND id IN (SELECT value FROM json_each($3))",
            )
            .bind(TimeMs(now_ms))
            .bind(serde_json::Value::from(lanes).to_string())
            .bind(id_list(&ids)),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(held)
}

/// PostgreSQL: several events in one statement, in order (`seq` defaults are drawn in the
/// order rows reach the insert).
pub(super) async fn enqueue_many_postgres(
    conn: &mut PgConnection,
    events: &[NewEvent],
) -> Result<(), StoreError> {
    let mut ids = Vec::with_capacity(events.len());
    let mut aggregates = Vec::with_capacity(events.len());
    let mut aggregate_ids = Vec::with_capacity(events.len());
    let mut kinds = Vec::with_capacity(events.len());
    let mut versions = Vec::with_capacity(events.len());
    let mut payloads = Vec::with_capacity(events.len());
    let mut headers = Vec::with_capacity(events.len());
    for e in events {
        ids.push(e.id);
        aggregates.push(e.aggregate.as_str());
        aggregate_ids.push(e.aggregate_id.as_str());
        kinds.push(e.kind.as_str());
        versions.push(super::version_of(e)?);
        payloads.push(e.payload.to_string());
        headers.push(e.headers.to_json_object());
    }
    sqlx::query(
        "INSERT INTO outbox (id, agregado, agregado_id, tipo, version, carga, headers)
         SELECT u.id, u.agregado, u.agregado_id, u.tipo, u.version, u.carga::jsonb,
                u.headers::jsonb
         FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::int4[], $6::text[],
                     $7::text[])
              WITH ORDINALITY AS u(id, agregado, agregado_id, tipo, version, carga,
                                   headers, ord)
         ORDER BY u.ord",
    )
    .bind(&ids)
    .bind(&aggregates)
    .bind(&aggregate_ids)
    .bind(&kinds)
    .bind(&versions)
    .bind(&payloads)
    .bind(&headers)
    .execute(conn)
    .await
    .map_err(entrega_postgres::classify)?;
    Ok(())
}
