//! Consumer-group membership: heartbeats, partition leases shared by [`plan_balance`] and
//! fenced by tokens, and offset commits that only a partition's current holder can make.

use entrega_core::{plan_balance, SlotLease, StoreError};

use super::{partition_int, partition_of};
use crate::db::{query, query_each, Db, IntList, Pool};

/// Who is balancing what.
#[derive(Debug, Clone, Copy)]
pub(super) struct Member<'a> {
    pub(super) group: &'a str,
    pub(super) topic: &'a str,
    pub(super) member: &'a str,
}

/// A partition held after balancing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Held {
    pub(super) partition: u32,
    /// Fencing token of this holding; commits must present it.
    pub(super) token: i64,
    /// The group's committed next offset, if any.
    pub(super) committed: Option<i64>,
}

const TABLE: &str = "entrega_partition_leases";

/// Records that the member is alive (joining the group if new).
pub(super) async fn join(db: &Db, m: Member<'_>, now_ms: i64) -> Result<(), StoreError> {
    db.execute(join_statement(m, now_ms)).await.map(drop)
}

fn join_statement(m: Member<'_>, now_ms: i64) -> crate::db::Query {
    query(
        "INSERT INTO entrega_group_members (group_id, topic, member, seen_at_ms)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (group_id, topic, member) DO UPDATE SET seen_at_ms = excluded.seen_at_ms",
    )
    .bind(m.group)
    .bind(m.topic)
    .bind(m.member)
    .bind(now_ms)
}

fn partitions(slots: &[u32]) -> IntList {
    IntList(slots.iter().map(|&s| i64::from(s)).collect())
}

/// Heartbeats the member, renews its leases, takes free or expired partitions up to its fair
/// share and gives back its surplus, in one write transaction on a settled picture (SQLite's
/// write lock; PostgreSQL's row locks on the group's leases). Returns what it holds.
pub(super) async fn balance(
    db: &Db,
    m: Member<'_>,
    now_ms: i64,
    ttl_ms: i64,
) -> Result<Vec<Held>, StoreError> {
    let expires = now_ms.saturating_add(ttl_ms);
    let mut tx = db.begin().await?;
    // Lease rows appear lazily, one per partition of the topic, for each group.
    tx.execute(
        query(
            "INSERT INTO entrega_partition_leases (group_id, topic, partition_no)
             SELECT $1, topic, partition_no FROM entrega_partitions
             WHERE topic = $2 ORDER BY partition_no
             ON CONFLICT (group_id, topic, partition_no) DO NOTHING",
        )
        .bind(m.group)
        .bind(m.topic),
    )
    .await?;
    let rows: Vec<(i64, Option<String>, i64, i64)> = tx
        .fetch_all(
            query_each(
                "SELECT CAST(partition_no AS BIGINT), owner, token, expires_at_ms
                 FROM entrega_partition_leases WHERE group_id = $1 AND topic = $2
                 ORDER BY partition_no",
                "SELECT CAST(partition_no AS BIGINT), owner, token, expires_at_ms
                 FROM entrega_partition_leases WHERE group_id = $1 AND topic = $2
                 ORDER BY partition_no FOR UPDATE",
            )
            .bind(m.group)
            .bind(m.topic),
        )
        .await?;
    let leases = rows
        .into_iter()
        .map(|(slot, owner, token, expires_at_ms)| {
            Ok(SlotLease {
                slot: partition_of(slot, TABLE)?,
                owner,
                token,
                expires_at_ms,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    // Members silent for a whole lease period are gone and no longer count for the share.
    tx.execute(join_statement(m, now_ms)).await?;
    tx.execute(
        query(
            "DELETE FROM entrega_group_members
             WHERE group_id = $1 AND topic = $2 AND seen_at_ms <= $3",
        )
        .bind(m.group)
        .bind(m.topic)
        .bind(now_ms.saturating_sub(ttl_ms)),
    )
    .await?;
    let live: Option<i64> = tx
        .scalar(
            query("SELECT COUNT(*) FROM entrega_group_members WHERE group_id = $1 AND topic = $2")
                .bind(m.group)
                .bind(m.topic),
        )
        .await?;
    let live = live
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(1)
        .max(1);
    let plan = plan_balance(m.member, &leases, live, now_ms);

    // `$1` group, `$2` topic, `$3` the partitions, `$4` the member, `$5` the new expiry.
    // Taking bumps the token, so the previous holder's commits are refused from now on.
    let writes: [(&str, &[u32]); 3] = [
        (
            "SET owner = NULL, expires_at_ms = 0 WHERE owner = $4 AND",
            &plan.release,
        ),
        ("SET expires_at_ms = $5 WHERE owner = $4 AND", &plan.renew),
        (
            "SET owner = $4, token = token + 1, expires_at_ms = $5 WHERE",
            &plan.take,
        ),
    ];
    for (change, slots) in writes {
        if slots.is_empty() {
            continue;
        }
        let head = format!("UPDATE entrega_partition_leases {change} group_id = $1 AND topic = $2");
        let statement = query_each(
            format!("{head} AND partition_no IN (SELECT value FROM json_each($3))"),
            format!("{head} AND partition_no = ANY($3)"),
        )
        .bind(m.group)
        .bind(m.topic)
        .bind(partitions(slots))
        .bind(m.member);
        // Only the statements that set an expiry have a `$5`.
        let statement = if change.contains("$5") {
            statement.bind(expires)
        } else {
            statement
        };
        tx.execute(statement).await?;
    }
    let held: Vec<(i64, i64, Option<i64>)> = tx
        .fetch_all(
            query(
                "SELECT CAST(l.partition_no AS BIGINT), l.token, o.next_offset
                 FROM entrega_partition_leases l
                 LEFT JOIN entrega_group_offsets o
                        ON o.group_id = l.group_id AND o.topic = l.topic
                       AND o.partition_no = l.partition_no
                 WHERE l.group_id = $1 AND l.topic = $2 AND l.owner = $3
                 ORDER BY l.partition_no",
            )
            .bind(m.group)
            .bind(m.topic)
            .bind(m.member),
        )
        .await?;
    tx.commit().await?;
    held.into_iter()
        .map(|(partition, token, committed)| {
            Ok(Held {
                partition: partition_of(partition, TABLE)?,
                token,
                committed,
            })
        })
        .collect()
}

/// Gives back every partition of the member and removes it from the group, so others take
/// over at once. Tokens stay: the next holder increments them, fencing any late commit.
pub(super) async fn leave(db: &Db, m: Member<'_>) -> Result<(), StoreError> {
    let mut tx = db.begin().await?;
    tx.execute(
        query(
            "UPDATE entrega_partition_leases SET owner = NULL, expires_at_ms = 0
             WHERE group_id = $1 AND topic = $2 AND owner = $3",
        )
        .bind(m.group)
        .bind(m.topic)
        .bind(m.member),
    )
    .await?;
    tx.execute(
        query(
            "DELETE FROM entrega_group_members WHERE group_id = $1 AND topic = $2 AND member = $3",
        )
        .bind(m.group)
        .bind(m.topic)
        .bind(m.member),
    )
    .await?;
    tx.commit().await
}

/// PostgreSQL: the lease rows are read `FOR SHARE`, so a takeover (which locks them
/// `FOR UPDATE`) waits for this write, or this write sees the takeover's new token and writes
/// nothing. A stale holder can therefore never overwrite its successor's progress.
const POSTGRES_COMMIT: &str = "
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

/// Writes the `(partition, next offset, token)` commits of the member only when it still
/// holds every listed partition with the given token; otherwise writes nothing and returns
/// the lowest partition found lost.
pub(super) async fn commit(
    db: &Db,
    m: Member<'_>,
    offsets: &[(u32, i64, i64)],
    now_ms: i64,
) -> Result<Option<u32>, StoreError> {
    if let Pool::Postgres(pool) = &db.pool {
        let partitions: Vec<i32> = offsets.iter().map(|(p, _, _)| partition_int(*p)).collect();
        let next: Vec<i64> = offsets.iter().map(|(_, o, _)| *o).collect();
        let tokens: Vec<i64> = offsets.iter().map(|(_, _, t)| *t).collect();
        let lost: Option<i32> = sqlx::query_scalar(POSTGRES_COMMIT)
            .bind(m.group)
            .bind(m.topic)
            .bind(&partitions)
            .bind(&next)
            .bind(&tokens)
            .bind(m.member)
            .bind(now_ms)
            .fetch_one(pool)
            .await
            .map_err(entrega_postgres::classify)?;
        return lost.map(|p| partition_of(i64::from(p), TABLE)).transpose();
    }
    // SQLite: the checks and the writes share one write transaction.
    let mut tx = db.begin().await?;
    for &(partition, next_offset, token) in offsets {
        let held: Option<i32> = tx
            .scalar(
                query(
                    "SELECT 1 FROM entrega_partition_leases
                     WHERE group_id = $1 AND topic = $2 AND partition_no = $3 AND owner = $4
                       AND token = $5",
                )
                .bind(m.group)
                .bind(m.topic)
                .bind(partition_int(partition))
                .bind(m.member)
                .bind(token),
            )
            .await?;
        if held.is_none() {
            // Dropping the transaction rolls back offsets written for earlier partitions.
            return Ok(Some(partition));
        }
        tx.execute(
            query(
                "INSERT INTO entrega_group_offsets
                     (group_id, topic, partition_no, next_offset, committed_at_ms)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (group_id, topic, partition_no) DO UPDATE
                 SET next_offset = excluded.next_offset, committed_at_ms = excluded.committed_at_ms",
            )
            .bind(m.group)
            .bind(m.topic)
            .bind(partition_int(partition))
            .bind(next_offset)
            .bind(now_ms),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(None)
}
