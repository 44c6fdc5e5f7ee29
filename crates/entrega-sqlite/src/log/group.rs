//! Consumer-group membership on the database: heartbeats, fenced partition leases shared with
//! [`plan_balance`], and fenced offset commits.

use entrega_core::{plan_balance, SlotLease, StoreError};
use sqlx::{Row, SqliteConnection, SqlitePool};

use super::json_slots;
use crate::connect::begin_immediate;
use crate::errors::{classify, corrupt};

/// A partition this member holds after a balance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Held {
    pub(super) partition: u32,
    pub(super) token: i64,
    /// The group's committed next offset, if any.
    pub(super) committed: Option<i64>,
}

async fn upsert_member(
    conn: &mut SqliteConnection,
    group: &str,
    topic: &str,
    member: &str,
    now_ms: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO entrega_group_members (group_id, topic, member, seen_at_ms) VALUES (?, ?, ?, ?)
         ON CONFLICT (group_id, topic, member) DO UPDATE SET seen_at_ms = excluded.seen_at_ms",
    )
    .bind(group)
    .bind(topic)
    .bind(member)
    .bind(now_ms)
    .execute(conn)
    .await
    .map_err(classify)?;
    Ok(())
}

/// Records that `member` is alive.
pub(super) async fn heartbeat(
    pool: &SqlitePool,
    group: &str,
    topic: &str,
    member: &str,
    now_ms: i64,
) -> Result<(), StoreError> {
    let mut conn = pool.acquire().await.map_err(classify)?;
    upsert_member(&mut conn, group, topic, member, now_ms).await
}

async fn read_leases(
    conn: &mut SqliteConnection,
    group: &str,
    topic: &str,
) -> Result<Vec<SlotLease>, StoreError> {
    let rows = sqlx::query(
        "SELECT partition_no, owner, token, expires_at_ms FROM entrega_partition_leases
         WHERE group_id = ? AND topic = ? ORDER BY partition_no",
    )
    .bind(group)
    .bind(topic)
    .fetch_all(&mut *conn)
    .await
    .map_err(classify)?;
    let get_err = |e: sqlx::Error| corrupt("entrega_partition_leases", e);
    rows.iter()
        .map(|row| {
            let slot: i64 = row.try_get("partition_no").map_err(get_err)?;
            Ok(SlotLease {
                slot: u32::try_from(slot).map_err(|_| {
                    corrupt("entrega_partition_leases", format!("partition {slot}"))
                })?,
                owner: row.try_get("owner").map_err(get_err)?,
                token: row.try_get("token").map_err(get_err)?,
                expires_at_ms: row.try_get("expires_at_ms").map_err(get_err)?,
            })
        })
        .collect()
}

/// The membership identity every statement filters on.
#[derive(Debug, Clone, Copy)]
pub(super) struct Member<'a> {
    pub(super) group: &'a str,
    pub(super) topic: &'a str,
    pub(super) member: &'a str,
}

/// Heartbeats, then renews, takes and gives back partitions per [`plan_balance`], all in one
/// write transaction. Returns every partition held afterwards.
pub(super) async fn balance(
    pool: &SqlitePool,
    who: Member<'_>,
    now_ms: i64,
    ttl_ms: i64,
) -> Result<Vec<Held>, StoreError> {
    let Member {
        group,
        topic,
        member,
    } = who;
    let expires = now_ms.saturating_add(ttl_ms);
    let mut tx = begin_immediate(pool).await?;
    upsert_member(&mut tx, group, topic, member, now_ms).await?;
    // Members silent for a whole lease period are gone and no longer count for the share.
    sqlx::query(
        "DELETE FROM entrega_group_members
         WHERE group_id = ? AND topic = ? AND seen_at_ms <= ? AND member <> ?",
    )
    .bind(group)
    .bind(topic)
    .bind(now_ms.saturating_sub(ttl_ms))
    .bind(member)
    .execute(&mut *tx)
    .await
    .map_err(classify)?;
    let live: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM entrega_group_members WHERE group_id = ? AND topic = ?",
    )
    .bind(group)
    .bind(topic)
    .fetch_one(&mut *tx)
    .await
    .map_err(classify)?;
    // Lease rows appear lazily, one per partition, the first time the group balances.
    sqlx::query(
        "WITH RECURSIVE parts (n) AS (
             SELECT 0 UNION ALL SELECT n + 1 FROM parts
             WHERE n + 1 < (SELECT partitions FROM entrega_topics WHERE topic = ?))
         INSERT INTO entrega_partition_leases (group_id, topic, partition_no)
         SELECT ?, ?, n FROM parts WHERE EXISTS (SELECT 1 FROM entrega_topics WHERE topic = ?)
         ON CONFLICT (group_id, topic, partition_no) DO NOTHING",
    )
    .bind(topic)
    .bind(group)
    .bind(topic)
    .bind(topic)
    .execute(&mut *tx)
    .await
    .map_err(classify)?;

    let leases = read_leases(&mut tx, group, topic).await?;
    let plan = plan_balance(member, &leases, usize::try_from(live).unwrap_or(1), now_ms);
    let writes: [(&str, &[u32]); 3] = [
        (
            "UPDATE entrega_partition_leases SET expires_at_ms = ?1
             WHERE group_id = ?2 AND topic = ?3 AND owner = ?4
               AND partition_no IN (SELECT value FROM json_each(?5))",
            &plan.renew,
        ),
        (
            "UPDATE entrega_partition_leases SET owner = ?4, token = token + 1, expires_at_ms = ?1
             WHERE group_id = ?2 AND topic = ?3
               AND partition_no IN (SELECT value FROM json_each(?5))",
            &plan.take,
        ),
        (
            "UPDATE entrega_partition_leases SET owner = NULL
             WHERE group_id = ?2 AND topic = ?3 AND owner = ?4
               AND partition_no IN (SELECT value FROM json_each(?5))",
            &plan.release,
        ),
    ];
    for (sql, slots) in writes {
        if slots.is_empty() {
            continue;
        }
        sqlx::query(sql)
            .bind(expires)
            .bind(group)
            .bind(topic)
            .bind(member)
            .bind(json_slots(slots))
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
    }

    let rows: Vec<(i64, i64, Option<i64>)> = sqlx::query_as(
        "SELECT l.partition_no, l.token, o.next_offset
         FROM entrega_partition_leases l
         LEFT JOIN entrega_group_offsets o
           ON o.group_id = l.group_id AND o.topic = l.topic AND o.partition_no = l.partition_no
         WHERE l.group_id = ? AND l.topic = ? AND l.owner = ?
         ORDER BY l.partition_no",
    )
    .bind(group)
    .bind(topic)
    .bind(member)
    .fetch_all(&mut *tx)
    .await
    .map_err(classify)?;
    tx.commit().await.map_err(classify)?;
    rows.into_iter()
        .map(|(partition, token, committed)| {
            Ok(Held {
                partition: u32::try_from(partition).map_err(|_| {
                    corrupt("entrega_partition_leases", format!("partition {partition}"))
                })?,
                token,
                committed,
            })
        })
        .collect()
}

/// Writes committed offsets if `who` still holds every listed partition with the given token.
/// Returns the first partition whose lease was lost; then nothing is written.
pub(super) async fn commit(
    pool: &SqlitePool,
    who: Member<'_>,
    offsets: &[(u32, i64, i64)],
    now_ms: i64,
) -> Result<Option<u32>, StoreError> {
    let mut tx = begin_immediate(pool).await?;
    for &(partition, token, next_offset) in offsets {
        let held: Option<i64> = sqlx::query_scalar(
            "SELECT 1 FROM entrega_partition_leases
             WHERE group_id = ? AND topic = ? AND partition_no = ? AND owner = ? AND token = ?",
        )
        .bind(who.group)
        .bind(who.topic)
        .bind(i64::from(partition))
        .bind(who.member)
        .bind(token)
        .fetch_optional(&mut *tx)
        .await
        .map_err(classify)?;
        if held.is_none() {
            // Dropping the transaction rolls back offsets written for earlier partitions.
            return Ok(Some(partition));
        }
        sqlx::query(
            "INSERT INTO entrega_group_offsets
                 (group_id, topic, partition_no, next_offset, committed_at_ms)
             VALUES (?, ?, ?, ?, ?)
             ON CONFLICT (group_id, topic, partition_no) DO UPDATE
             SET next_offset = excluded.next_offset, committed_at_ms = excluded.committed_at_ms",
        )
        .bind(who.group)
        .bind(who.topic)
        .bind(i64::from(partition))
        .bind(next_offset)
        .bind(now_ms)
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
    }
    tx.commit().await.map_err(classify)?;
    Ok(None)
}

/// Gives back every partition of `who` and removes the member, so others take over at once.
pub(super) async fn leave(pool: &SqlitePool, who: Member<'_>) -> Result<(), StoreError> {
    let mut tx = begin_immediate(pool).await?;
    // Tokens stay: the next holder increments them, fencing any late commit of ours.
    sqlx::query(
        "UPDATE entrega_partition_leases SET owner = NULL
         WHERE group_id = ? AND topic = ? AND owner = ?",
    )
    .bind(who.group)
    .bind(who.topic)
    .bind(who.member)
    .execute(&mut *tx)
    .await
    .map_err(classify)?;
    sqlx::query(
        "DELETE FROM entrega_group_members WHERE group_id = ? AND topic = ? AND member = ?",
    )
    .bind(who.group)
    .bind(who.topic)
    .bind(who.member)
    .execute(&mut *tx)
    .await
    .map_err(classify)?;
    tx.commit().await.map_err(classify)
}
