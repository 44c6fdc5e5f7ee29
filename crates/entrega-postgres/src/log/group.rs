//! Consumer-group membership on the database: heartbeats, fenced partition leases shared with
//! [`entrega_core::plan_balance`], and fenced offset commits (ARCHITECTURE rule 2).

use entrega_core::{plan_balance, SlotLease, StoreError};
use sqlx::postgres::{PgConnection, PgPool};
use sqlx::Row;

use super::partition_u32;
use super::slots_i32;
use crate::errors::classify;

/// A partition held after balancing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeldPartition {
    pub(crate) partition: u32,
    /// Fencing token of this holding; commits must present it.
    pub(crate) token: i64,
    /// The group's committed next offset, if any.
    pub(crate) committed: Option<i64>,
}

/// Who is balancing what.
pub(crate) struct Member<'a> {
    pub(crate) group: &'a str,
    pub(crate) topic: &'a str,
    pub(crate) member: &'a str,
}

/// Records that the member is alive (joining the group if new).
pub(crate) async fn join(
    conn: &mut PgConnection,
    m: &Member<'_>,
    now_ms: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO entrega_group_members (group_id, topic, member, seen_at_ms)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (group_id, topic, member) DO UPDATE SET seen_at_ms = EXCLUDED.seen_at_ms",
    )
    .bind(m.group)
    .bind(m.topic)
    .bind(m.member)
    .bind(now_ms)
    .execute(conn)
    .await
    .map_err(classify)?;
    Ok(())
}

/// Heartbeats the member, renews its leases, takes free or expired partitions up to its
/// fair share and gives back surplus, all in one transaction. Returns what it holds.
pub(crate) async fn balance(
    pool: &PgPool,
    m: &Member<'_>,
    now_ms: i64,
    ttl_ms: i64,
) -> Result<Vec<HeldPartition>, StoreError> {
    let expires = now_ms.saturating_add(ttl_ms);
    let mut tx = pool.begin().await.map_err(classify)?;
    // Lease rows appear lazily, one per partition of the topic, for each group.
    sqlx::query(
        "INSERT INTO entrega_partition_leases (group_id, topic, partition_no)
         SELECT $1, topic, partition_no FROM entrega_partitions
         WHERE topic = $2 ORDER BY partition_no
         ON CONFLICT (group_id, topic, partition_no) DO NOTHING",
    )
    .bind(m.group)
    .bind(m.topic)
    .execute(&mut *tx)
    .await
    .map_err(classify)?;
    // Members of a group balance one at a time, on a settled picture.
    let rows = sqlx::query(
        "SELECT partition_no, owner, token, expires_at_ms FROM entrega_partition_leases
         WHERE group_id = $1 AND topic = $2 ORDER BY partition_no FOR UPDATE",
    )
    .bind(m.group)
    .bind(m.topic)
    .fetch_all(&mut *tx)
    .await
    .map_err(classify)?;
    let mut leases = Vec::with_capacity(rows.len());
    for row in &rows {
        let p: i32 = row.try_get("partition_no").map_err(classify)?;
        leases.push(SlotLease {
            slot: partition_u32(p, "entrega_partition_leases")?,
            owner: row.try_get("owner").map_err(classify)?,
            token: row.try_get("token").map_err(classify)?,
            expires_at_ms: row.try_get("expires_at_ms").map_err(classify)?,
        });
    }

    join(&mut tx, m, now_ms).await?;
    sqlx::query(
        "DELETE FROM entrega_group_members
         WHERE group_id = $1 AND topic = $2 AND seen_at_ms <= $3",
    )
    .bind(m.group)
    .bind(m.topic)
    .bind(now_ms - ttl_ms)
    .execute(&mut *tx)
    .await
    .map_err(classify)?;
    let live: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM entrega_group_members WHERE group_id = $1 AND topic = $2",
    )
    .bind(m.group)
    .bind(m.topic)
    .fetch_one(&mut *tx)
    .await
    .map_err(classify)?;
    let live = usize::try_from(live).unwrap_or(1).max(1);
    let plan = plan_balance(m.member, &leases, live, now_ms);

    sqlx::query(
        "UPDATE entrega_partition_leases SET owner = NULL, expires_at_ms = 0
         WHERE group_id = $1 AND topic = $2 AND partition_no = ANY($3) AND owner = $4",
    )
    .bind(m.group)
    .bind(m.topic)
    .bind(slots_i32(&plan.release))
    .bind(m.member)
    .execute(&mut *tx)
    .await
    .map_err(classify)?;
    sqlx::query(
        "UPDATE entrega_partition_leases SET expires_at_ms = $5
         WHERE group_id = $1 AND topic = $2 AND partition_no = ANY($3) AND owner = $4",
    )
    .bind(m.group)
    .bind(m.topic)
    .bind(slots_i32(&plan.renew))
    .bind(m.member)
    .bind(expires)
    .execute(&mut *tx)
    .await
    .map_err(classify)?;
    // Taking bumps the token, so the previous holder's commits are refused from now on.
    sqlx::query(
        "UPDATE entrega_partition_leases SET owner = $4, token = token + 1, expires_at_ms = $5
         WHERE group_id = $1 AND topic = $2 AND partition_no = ANY($3)",
    )
    .bind(m.group)
    .bind(m.topic)
    .bind(slots_i32(&plan.take))
    .bind(m.member)
    .bind(expires)
    .execute(&mut *tx)
    .await
    .map_err(classify)?;
    let held = sqlx::query(
        "SELECT l.partition_no, l.token, o.next_offset
         FROM entrega_partition_leases l
         LEFT JOIN entrega_group_offsets o
                ON o.group_id = l.group_id AND o.topic = l.topic AND o.partition_no = l.partition_no
         WHERE l.group_id = $1 AND l.topic = $2 AND l.owner = $3
         ORDER BY l.partition_no",
    )
    .bind(m.group)
    .bind(m.topic)
    .bind(m.member)
    .fetch_all(&mut *tx)
    .await
    .map_err(classify)?;
    tx.commit().await.map_err(classify)?;

    held.iter()
        .map(|row| {
            let p: i32 = row.try_get("partition_no").map_err(classify)?;
            Ok(HeldPartition {
                partition: partition_u32(p, "entrega_partition_leases")?,
                token: row.try_get("token").map_err(classify)?,
                committed: row.try_get("next_offset").map_err(classify)?,
            })
        })
        .collect()
}

/// Gives back every partition of the member and removes it from the group.
pub(crate) async fn leave(pool: &PgPool, m: &Member<'_>) -> Result<(), StoreError> {
    let mut tx = pool.begin().await.map_err(classify)?;
    sqlx::query(
        "UPDATE entrega_partition_leases SET owner = NULL, expires_at_ms = 0
         WHERE group_id = $1 AND topic = $2 AND owner = $3",
    )
    .bind(m.group)
    .bind(m.topic)
    .bind(m.member)
    .execute(&mut *tx)
    .await
    .map_err(classify)?;
    sqlx::query(
        "DELETE FROM entrega_group_members WHERE group_id = $1 AND topic = $2 AND member = $3",
    )
    .bind(m.group)
    .bind(m.topic)
    .bind(m.member)
    .execute(&mut *tx)
    .await
    .map_err(classify)?;
    tx.commit().await.map_err(classify)
}

/// Writes committed offsets only when the member still holds every listed partition with the
/// given tokens; otherwise writes nothing and returns the lowest partition found lost.
///
/// One statement: the lease rows are read `FOR SHARE`, so a takeover (which locks them
/// `FOR UPDATE`) waits for this write, or this write sees the takeover's new token and writes
/// nothing. A stale holder can therefore never overwrite its successor's progress.
const COMMIT_OFFSETS: &str = "
WITH wanted AS (
    SELECT * FROM UNNEST($3::int4[], $4::int8[], $5::int8[]) AS c(p, o, token)
), held AS (
    SELECT partition_no, token FROM entrega_partition_leases
    WHERE group_id = $1 AND topic = $2 AND owner = $6 AND partition_no = ANY($3)
    FOR SHARE
), lost AS (
    SELECT w.p FROM wanted w
    WHERE NOT EXISTS (SELECT 1 FROM held h WHERE h.partition_no = w.p AND h.token = w.token)
), written AS (
    INSERT INTO entrega_group_offsets (group_id, topic, partition_no, next_offset, committed_at_ms)
    SELECT $1, $2, w.p, w.o, $7 FROM wanted w
    WHERE NOT EXISTS (SELECT 1 FROM lost)
    ON CONFLICT (group_id, topic, partition_no)
    DO UPDATE SET next_offset = EXCLUDED.next_offset, committed_at_ms = EXCLUDED.committed_at_ms
    RETURNING 1
)
SELECT min(p) FROM lost";

/// Commits `(partition, next offset, token)` triples for the member; see [`COMMIT_OFFSETS`].
pub(crate) async fn commit_offsets(
    pool: &PgPool,
    m: &Member<'_>,
    offsets: &[(u32, i64, i64)],
    now_ms: i64,
) -> Result<Option<u32>, StoreError> {
    let partitions: Vec<i32> = offsets
        .iter()
        .filter_map(|(p, _, _)| i32::try_from(*p).ok())
        .collect();
    let next: Vec<i64> = offsets.iter().map(|(_, o, _)| *o).collect();
    let tokens: Vec<i64> = offsets.iter().map(|(_, _, t)| *t).collect();
    let lost: Option<i32> = sqlx::query_scalar(COMMIT_OFFSETS)
        .bind(m.group)
        .bind(m.topic)
        .bind(&partitions)
        .bind(&next)
        .bind(&tokens)
        .bind(m.member)
        .bind(now_ms)
        .fetch_one(pool)
        .await
        .map_err(classify)?;
    lost.map(|p| partition_u32(p, "entrega_partition_leases"))
        .transpose()
}
