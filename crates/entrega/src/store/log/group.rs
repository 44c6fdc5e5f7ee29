//! Consumer-group membership: heartbeats, partition leases shared as every lease is
//! ([`crate::store::leases`]) and fenced by tokens, and offset commits that only a
//! partition's current holder can make.

use entrega_core::{Holder, StoreError};

use super::partition_of;
use crate::db::{query, Db, Pool};
use crate::store::int4;
use crate::store::leases::{self, LeaseTable};

/// Who is balancing what.
#[derive(Debug, Clone, Copy)]
pub(super) struct Member<'a> {
    pub(super) group: &'a str,
    pub(super) topic: &'a str,
    pub(super) member: &'a Holder,
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

impl<'a> Member<'a> {
    /// The columns of the group's lease and member rows that are this member's group.
    fn scope(&self) -> [(&'static str, &'a str); 2] {
        [("group_id", self.group), ("topic", self.topic)]
    }
}

/// The partition leases of the group whose columns `scope` gives.
fn lease_table<'a>(scope: &'a [(&'static str, &'a str)]) -> LeaseTable<'a> {
    LeaseTable {
        leases: TABLE,
        slot: "partition_no",
        members: "entrega_group_members",
        member: "member",
        scope,
    }
}

/// Records that the member is alive (joining the group if new).
pub(super) async fn join(db: &Db, m: Member<'_>, now_ms: i64) -> Result<(), StoreError> {
    let scope = m.scope();
    db.execute(lease_table(&scope).heartbeat(&m.member.name, now_ms))
        .await
        .map(drop)
}

/// Heartbeats the member, renews its leases, takes free or expired partitions up to its fair
/// share and gives back its surplus, in one write transaction on a settled picture
/// ([`crate::store::leases`]). Returns what it holds, with the group's committed offsets.
pub(super) async fn balance(
    db: &Db,
    m: Member<'_>,
    now_ms: i64,
    ttl_ms: i64,
) -> Result<Vec<Held>, StoreError> {
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
    let scope = m.scope();
    let held = leases::balance(&mut tx, &lease_table(&scope), m.member, now_ms, ttl_ms).await?;
    let committed: Vec<(i64, i64)> = tx
        .fetch_all(
            query(
                "SELECT CAST(partition_no AS BIGINT), next_offset FROM entrega_group_offsets
                 WHERE group_id = $1 AND topic = $2",
            )
            .bind(m.group)
            .bind(m.topic),
        )
        .await?;
    tx.commit().await?;
    Ok(held
        .into_iter()
        .map(|h| Held {
            partition: h.slot,
            token: h.token,
            committed: committed
                .iter()
                .find(|(p, _)| *p == i64::from(h.slot))
                .map(|(_, next)| *next),
        })
        .collect())
}

/// Gives back every partition of the member and removes it from the group, so others take
/// over at once. Tokens stay: the next holder increments them, fencing any late commit.
pub(super) async fn leave(db: &Db, m: Member<'_>) -> Result<(), StoreError> {
    let mut tx = db.begin().await?;
    let scope = m.scope();
    leases::release(&mut tx, &lease_table(&scope), m.member).await?;
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
        let partitions: Vec<i32> = offsets.iter().map(|(p, _, _)| int4(*p)).collect();
        let next: Vec<i64> = offsets.iter().map(|(_, o, _)| *o).collect();
        let tokens: Vec<i64> = offsets.iter().map(|(_, _, t)| *t).collect();
        let lost: Option<i32> = sqlx::query_scalar(POSTGRES_COMMIT)
            .bind(m.group)
            .bind(m.topic)
            .bind(&partitions)
            .bind(&next)
            .bind(&tokens)
            .bind(m.member.name.as_str())
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
                .bind(int4(partition))
                .bind(m.member.name.as_str())
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
            .bind(int4(partition))
            .bind(next_offset)
            .bind(now_ms),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(None)
}
