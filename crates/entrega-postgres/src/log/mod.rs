//! The database-backed log transport: partitioned topics in `entrega_log`, consumer groups
//! with fenced partition leases, and `LISTEN`/`NOTIFY` wake-ups.

mod admin;
mod group;
mod inspect;
mod publish;
mod subscription;

use std::collections::HashMap;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use entrega_core::{Clock, Headers, Record, StoreError, SystemClock, TransportError};
use sqlx::postgres::{PgPool, PgRow};
use sqlx::Row;

use crate::errors::{classify, transport};
use crate::wakeup::Listener;

pub use subscription::PgSubscription;

/// Channel every append notifies, with the topic as payload.
pub const LOG_CHANNEL: &str = "entrega_log";

/// Tuning of the log transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// How long a member keeps its partitions without heartbeating (default 10 s).
    pub lease_ttl: Duration,
    /// How often a member heartbeats and rebalances while polling (default `lease_ttl / 3`).
    pub heartbeat: Duration,
    /// How long an idle poll waits between looks at the table when notifications are not
    /// available, and how often paused partitions are re-checked (default 50 ms).
    pub poll_interval: Duration,
    /// Create unknown topics on first publish or subscribe with this many partitions
    /// (default `None`: unknown topics are an error).
    pub auto_create_partitions: Option<u32>,
}

impl Default for LogConfig {
    fn default() -> Self {
        let lease_ttl = Duration::from_secs(10);
        Self {
            lease_ttl,
            heartbeat: lease_ttl / 3,
            poll_interval: Duration::from_millis(50),
            auto_create_partitions: None,
        }
    }
}

/// The log transport on PostgreSQL. Cheap to clone: clones share the pool, the partition-count
/// cache and one notification listener.
#[derive(Debug, Clone)]
pub struct PgLog {
    pub(crate) pool: PgPool,
    pub(crate) config: LogConfig,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) listener: Listener,
    /// Partition counts of known topics; a topic's count never changes once created.
    pub(crate) topics: Arc<Mutex<HashMap<String, u32>>>,
    /// Spreads keyless messages over partitions.
    pub(crate) round_robin: Arc<AtomicU32>,
}

impl PgLog {
    /// A log on `pool` with the default configuration and the system clock.
    pub fn new(pool: PgPool) -> Self {
        Self::with_config(pool, LogConfig::default(), Arc::new(SystemClock))
    }

    /// A log on `pool` with explicit configuration and clock (leases, heartbeats and pauses
    /// follow the clock).
    pub fn with_config(pool: PgPool, config: LogConfig, clock: Arc<dyn Clock>) -> Self {
        let listener = Listener::new(pool.clone(), LOG_CHANNEL);
        Self {
            pool,
            config,
            clock,
            listener,
            topics: Arc::new(Mutex::new(HashMap::new())),
            round_robin: Arc::new(AtomicU32::new(0)),
        }
    }

    /// The pool this log works on.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The configuration in force.
    pub fn config(&self) -> &LogConfig {
        &self.config
    }

    /// Next offset to be written, per partition of `topic` (empty for an unknown topic).
    pub async fn end_offsets(&self, topic: &str) -> Result<Vec<(u32, i64)>, StoreError> {
        let rows = sqlx::query(
            "SELECT partition_no, next_offset FROM entrega_partitions
             WHERE topic = $1 ORDER BY partition_no",
        )
        .bind(topic)
        .fetch_all(&self.pool)
        .await
        .map_err(classify)?;
        pairs(&rows, "entrega_partitions")
    }

    /// Committed next offsets of `group` per partition of `topic` (only partitions with a
    /// commit).
    pub async fn committed(&self, group: &str, topic: &str) -> Result<Vec<(u32, i64)>, StoreError> {
        let rows = sqlx::query(
            "SELECT partition_no, next_offset FROM entrega_group_offsets
             WHERE group_id = $1 AND topic = $2 ORDER BY partition_no",
        )
        .bind(group)
        .bind(topic)
        .fetch_all(&self.pool)
        .await
        .map_err(classify)?;
        pairs(&rows, "entrega_group_offsets")
    }

    /// Up to `max` records of one partition from offset `from` on, without any group.
    pub async fn read(
        &self,
        topic: &str,
        partition: u32,
        from: i64,
        max: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let rows = sqlx::query(
            "SELECT partition_no, log_offset, msg_key, headers, payload, appended_at_ms
             FROM entrega_log
             WHERE topic = $1 AND partition_no = $2 AND log_offset >= $3
             ORDER BY log_offset LIMIT $4",
        )
        .bind(topic)
        .bind(partition_i32(partition)?)
        .bind(from)
        .bind(i64::try_from(max).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(classify)?;
        rows.iter().map(|r| record_of(topic, r)).collect()
    }

    /// The cached partition count of `topic`, looked up on a miss; `None` if unknown.
    pub(crate) async fn partitions_of(&self, topic: &str) -> Result<Option<u32>, TransportError> {
        if let Some(n) = self.cached(topic) {
            return Ok(Some(n));
        }
        let n: Option<i32> =
            sqlx::query_scalar("SELECT partitions FROM entrega_topics WHERE topic = $1")
                .bind(topic)
                .fetch_optional(&self.pool)
                .await
                .map_err(transport)?;
        let n = n.and_then(|n| u32::try_from(n).ok());
        if let Some(n) = n {
            self.remember(topic, n);
        }
        Ok(n)
    }

    /// The partition count of `topic`, creating the topic if configured to; else
    /// [`TransportError::UnknownTopic`].
    pub(crate) async fn require_topic(&self, topic: &str) -> Result<u32, TransportError> {
        match self.partitions_of(topic).await? {
            Some(n) => Ok(n),
            None => match self.config.auto_create_partitions {
                Some(n) => self.create_topic(topic, n).await,
                None => Err(TransportError::UnknownTopic {
                    topic: topic.to_owned(),
                }),
            },
        }
    }

    fn cached(&self, topic: &str) -> Option<u32> {
        let topics = self
            .topics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        topics.get(topic).copied()
    }

    pub(crate) fn remember(&self, topic: &str, partitions: u32) {
        let mut topics = self
            .topics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        topics.insert(topic.to_owned(), partitions);
    }

    pub(crate) fn forget(&self, topic: &str) {
        let mut topics = self
            .topics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        topics.remove(topic);
    }
}

/// A partition number as stored (INT).
pub(crate) fn partition_i32(partition: u32) -> Result<i32, StoreError> {
    i32::try_from(partition)
        .map_err(|_| crate::errors::invalid(format!("partition {partition} out of range")))
}

/// A stored partition number.
pub(crate) fn partition_u32(partition: i32, table: &'static str) -> Result<u32, StoreError> {
    u32::try_from(partition).map_err(|_| StoreError::Corrupt {
        table,
        reason: format!("negative partition {partition}"),
    })
}

fn pairs(rows: &[PgRow], table: &'static str) -> Result<Vec<(u32, i64)>, StoreError> {
    rows.iter()
        .map(|r| {
            let p: i32 = r.try_get("partition_no").map_err(classify)?;
            let o: i64 = r.try_get("next_offset").map_err(classify)?;
            Ok((partition_u32(p, table)?, o))
        })
        .collect()
}

/// Decodes an `entrega_log` row selected with the columns `read` uses.
pub(crate) fn record_of(topic: &str, row: &PgRow) -> Result<Record, StoreError> {
    let partition: i32 = row.try_get("partition_no").map_err(classify)?;
    let headers: String = row.try_get("headers").map_err(classify)?;
    let headers = Headers::from_json(&headers).map_err(|e| StoreError::Corrupt {
        table: "entrega_log",
        reason: format!("headers are not JSON pairs: {e}"),
    })?;
    Ok(Record {
        topic: topic.to_owned(),
        partition: partition_u32(partition, "entrega_log")?,
        offset: row.try_get("log_offset").map_err(classify)?,
        key: row.try_get("msg_key").map_err(classify)?,
        headers,
        payload: row.try_get("payload").map_err(classify)?,
        timestamp_ms: row.try_get("appended_at_ms").map_err(classify)?,
    })
}

/// Slot numbers as stored (INT columns).
pub(crate) fn slots_i32(slots: &[u32]) -> Vec<i32> {
    slots
        .iter()
        .filter_map(|s| i32::try_from(*s).ok())
        .collect()
}

/// Lease duration in ms, saturating for absurd values.
pub(crate) fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX / 4)
}
