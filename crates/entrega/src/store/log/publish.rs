//! Appending to the log: each partition's offsets handed out under the partition row's lock,
//! so they become visible in the order they were allocated (a reader that has seen offset `k`
//! never later finds a smaller one appear).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::OnceLock;

use async_trait::async_trait;
use entrega_core::{partition_for, OutgoingMessage, Publisher, StoreError, TransportError};
use sqlx::PgConnection;

use super::{Appends, DbLog, LOG_CHANNEL};
use crate::db::{query, Pool, Tx};
use crate::store::int4;

/// PostgreSQL: a run of messages appended to one partition by one statement. The `UPDATE`
/// reserves the offsets and keeps the partition row locked until the transaction ends, so a
/// concurrent append waits and takes the offsets after these. Subscribers are notified once
/// the append has committed, in a statement of its own ([`notify_topics`]): a `NOTIFY` in the
/// append's transaction would hold the server's one notification lock until its commit is on
/// disk, and every publisher would wait for the others' disk writes.
const POSTGRES_APPEND: &str = "
WITH p AS (
    UPDATE entrega_partitions SET next_offset = next_offset + $3
    WHERE topic = $1 AND partition_no = $2
    RETURNING next_offset - $3 AS base
), ins AS (
    INSERT INTO entrega_log (topic, partition_no, log_offset, msg_key, headers, payload, appended_at_ms)
    SELECT $1, $2, p.base + m.ord - 1, m.k, m.h, m.b, $7
    FROM p, UNNEST($4::text[], $5::text[], $6::bytea[]) WITH ORDINALITY AS m(k, h, b, ord)
    RETURNING 1
)
SELECT count(*) FROM ins";

/// Messages of one call grouped by topic and partition, sorted: concurrent publishers lock
/// partition rows in the same order and cannot deadlock. Within a group messages keep the
/// batch's order, which is all per-key order needs (a key always maps to one partition).
type Groups<'a> = BTreeMap<(&'a str, u32), Vec<&'a OutgoingMessage>>;

impl DbLog {
    /// Where each message of `batch` goes: a keyed one to its key's partition (Kafka's
    /// placement); the keyless ones of one call together to one partition per topic, in their
    /// order, the next call's to the next partition (Kafka's sticky partitioner).
    async fn placed<'a>(&self, batch: &'a [OutgoingMessage]) -> Result<Groups<'a>, TransportError> {
        let mut counts: HashMap<&str, u32> = HashMap::new();
        let mut keyless: HashMap<&str, u32> = HashMap::new();
        let mut groups: Groups<'a> = BTreeMap::new();
        for m in batch {
            let topic = m.topic.as_str();
            let n = match counts.get(topic) {
                Some(n) => *n,
                None => {
                    let n = self.require_topic(topic).await?;
                    counts.insert(topic, n);
                    n
                }
            };
            let partition = match &m.key {
                Some(key) => partition_for(key, n),
                None => *keyless
                    .entry(topic)
                    .or_insert_with(|| self.round_robin.fetch_add(1, Ordering::Relaxed) % n.max(1)),
            };
            groups.entry((topic, partition)).or_default().push(m);
        }
        Ok(groups)
    }

    /// The topic's partition row is gone (the topic was dropped behind the cache): forget it.
    fn unknown(&self, topic: &str) -> TransportError {
        self.forget(topic);
        TransportError::UnknownTopic {
            topic: topic.to_owned(),
        }
    }
}

/// Appends one partition's messages in `tx` (SQLite): reserve the offsets, then write them.
/// Bumping the counter takes the write lock (held already: `BEGIN IMMEDIATE`) until commit.
async fn append(
    log: &DbLog,
    tx: &mut Tx,
    (topic, partition): (&str, u32),
    messages: &[&OutgoingMessage],
    now_ms: i64,
) -> Result<(), TransportError> {
    let count = i64::try_from(messages.len()).unwrap_or(i64::MAX);
    let end: Option<i64> = tx
        .scalar(
            query(
                "UPDATE entrega_partitions SET next_offset = next_offset + $3
                 WHERE topic = $1 AND partition_no = $2 RETURNING next_offset",
            )
            .bind(topic)
            .bind(int4(partition))
            .bind(count),
        )
        .await?;
    let end = end.ok_or_else(|| log.unknown(topic))?;
    let mut offset = end - count;
    for rows in messages.chunks(SQLITE_ROWS_PER_INSERT) {
        let statement = rows.iter().fold(
            query(sqlite_insert(rows.len()))
                .bind(topic)
                .bind(int4(partition))
                .bind(now_ms),
            |q, message| {
                let q = q
                    .bind(offset)
                    .bind(message.key.as_deref())
                    .bind(message.headers.to_json())
                    .bind(message.payload.as_slice());
                offset += 1;
                q
            },
        );
        tx.execute(statement).await?;
    }
    Ok(())
}

/// Records per SQLite insert statement (four parameters each, three shared).
const SQLITE_ROWS_PER_INSERT: usize = 64;

/// SQLite: the insert of `rows` records of one partition (1 to [`SQLITE_ROWS_PER_INSERT`]):
/// `$1` topic, `$2` partition, `$3` append time, then offset, key, headers and payload per
/// record. Each text is built once; a statement per record cost more than its row.
fn sqlite_insert(rows: usize) -> &'static str {
    static TEXTS: OnceLock<Vec<String>> = OnceLock::new();
    let texts = TEXTS.get_or_init(|| {
        (1..=SQLITE_ROWS_PER_INSERT)
            .map(|n| {
                let values: Vec<String> = (0..n)
                    .map(|k| {
                        let p = 4 + 4 * k;
                        format!("($1, $2, ${p}, ${}, ${}, ${}, $3)", p + 1, p + 2, p + 3)
                    })
                    .collect();
                format!(
                    "INSERT INTO entrega_log \
                     (topic, partition_no, log_offset, msg_key, headers, payload, appended_at_ms) \
                     VALUES {}",
                    values.join(", ")
                )
            })
            .collect()
    });
    texts
        .get(rows.clamp(1, SQLITE_ROWS_PER_INSERT) - 1)
        .map_or("", String::as_str)
}

/// Appends one partition's messages on PostgreSQL with [`POSTGRES_APPEND`]; returns how many
/// were written (none when the partition row is gone).
async fn append_postgres(
    conn: &mut PgConnection,
    (topic, partition): (&str, u32),
    messages: &[&OutgoingMessage],
    now_ms: i64,
) -> Result<usize, StoreError> {
    let keys: Vec<Option<&str>> = messages.iter().map(|m| m.key.as_deref()).collect();
    let headers: Vec<String> = messages.iter().map(|m| m.headers.to_json()).collect();
    let payloads: Vec<&[u8]> = messages.iter().map(|m| m.payload.as_slice()).collect();
    let n = i64::try_from(messages.len()).unwrap_or(i64::MAX);
    let written: i64 = sqlx::query_scalar(POSTGRES_APPEND)
        .bind(topic)
        .bind(int4(partition))
        .bind(n)
        .bind(&keys)
        .bind(&headers)
        .bind(&payloads)
        .bind(now_ms)
        .fetch_one(conn)
        .await
        .map_err(entrega_postgres::classify)?;
    Ok(usize::try_from(written).unwrap_or(0))
}

#[async_trait]
impl Publisher for DbLog {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<(), TransportError> {
        if batch.is_empty() {
            return Ok(());
        }
        let groups = self.placed(batch).await?;
        let now = self.clock.now_ms();
        match &self.db.pool {
            Pool::Sqlite(_) => {
                let mut tx = self.db.begin().await?;
                for (place, messages) in &groups {
                    append(self, &mut tx, *place, messages, now).await?;
                }
                tx.commit().await?;
                // Wake this process's subscribers now (pools from `connect` also do on
                // release).
                if let Appends::Signalled(waiter) = &self.appends {
                    waiter.fire();
                }
                Ok(())
            }
            Pool::Postgres(pool) => {
                if let [(place, messages)] = groups.iter().collect::<Vec<_>>()[..] {
                    // One partition: the append alone is atomic and commits on its own,
                    // holding the row lock until then; BEGIN and COMMIT would only add round
                    // trips. sqlx reads every reply up to ReadyForQuery, so `Ok` comes after
                    // the commit.
                    let mut conn = pool.acquire().await.map_err(entrega_postgres::classify)?;
                    if append_postgres(&mut conn, *place, messages, now).await? != messages.len() {
                        return Err(self.unknown(place.0));
                    }
                    notify_topics(&mut conn, &[place.0]).await;
                    return Ok(());
                }
                let mut tx = self.db.begin().await?;
                for (place, messages) in &groups {
                    let conn = tx.postgres().ok_or_else(|| self.unknown(place.0))?;
                    if append_postgres(conn, *place, messages, now).await? != messages.len() {
                        return Err(self.unknown(place.0));
                    }
                }
                // Commit is the durable confirmation the Publisher contract promises.
                tx.commit().await?;
                let mut topics: Vec<&str> = groups.keys().map(|(topic, _)| *topic).collect();
                topics.dedup();
                let mut conn = pool.acquire().await.map_err(entrega_postgres::classify)?;
                notify_topics(&mut conn, &topics).await;
                Ok(())
            }
        }
    }
}

/// Wakes the subscribers of `topics` (the notification's payload is the topic), after the
/// append committed. If it fails the append still stands, and subscribers find the records
/// on their next poll.
async fn notify_topics(conn: &mut PgConnection, topics: &[&str]) {
    let notify = sqlx::query("SELECT pg_notify($1, t) FROM UNNEST($2::text[]) AS t")
        .bind(LOG_CHANNEL)
        .bind(topics)
        .execute(conn)
        .await;
    if let Err(e) = notify {
        tracing::debug!(error = %e, "notifying the log's subscribers failed: they will poll");
    }
}
