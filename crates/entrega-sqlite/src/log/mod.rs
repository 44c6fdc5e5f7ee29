//! The database-backed log transport: partitioned topics in SQLite tables, consumer groups
//! with fenced partition leases, offsets committed after processing.

mod admin;
mod group;
mod inspect;
mod publish;
mod subscription;

use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{Clock, Subscriber, Subscription, SystemClock, TransportError};
use sqlx::SqlitePool;

use crate::wakeup::{signals_for, DbSignals};
use subscription::SqliteSubscription;

/// Tuning of the log transport's consumer groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// How long a partition lease lasts without renewal; a member silent this long loses its
    /// partitions to the others. Default 10 s.
    pub lease_ttl: Duration,
    /// How often a member heartbeats and rebalances (at most). Default `lease_ttl / 3`.
    pub heartbeat: Duration,
    /// How often an idle `poll` looks for new records when no in-process wake-up came (writes
    /// from other processes). Default 50 ms.
    pub poll_interval: Duration,
    /// Partitions of a topic created on first publish or subscribe; `None` (the default)
    /// makes an unknown topic an error.
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

/// The log transport on a SQLite database: [`entrega_core::Publisher`],
/// [`entrega_core::TopicAdmin`] and [`Subscriber`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SqliteLog {
    pool: SqlitePool,
    config: Arc<LogConfig>,
    clock: Arc<dyn Clock>,
    signals: Arc<DbSignals>,
    /// Spreads keyless messages over partitions.
    round_robin: Arc<AtomicU32>,
}

impl SqliteLog {
    /// The log of `pool`'s database, with the default [`LogConfig`] and the system clock.
    pub fn new(pool: SqlitePool) -> Self {
        Self::with_config(pool, LogConfig::default(), Arc::new(SystemClock))
    }

    /// The log of `pool`'s database with explicit tuning and clock (leases, heartbeats and
    /// append times read `clock`).
    pub fn with_config(pool: SqlitePool, config: LogConfig, clock: Arc<dyn Clock>) -> Self {
        let signals = signals_for(&pool.connect_options());
        Self {
            pool,
            config: Arc::new(config),
            clock,
            signals,
            round_robin: Arc::new(AtomicU32::new(0)),
        }
    }

    /// The pool this log works on.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The tuning this log was built with.
    pub fn config(&self) -> &LogConfig {
        &self.config
    }
}

#[async_trait]
impl Subscriber for SqliteLog {
    async fn subscribe(
        &self,
        group: &str,
        topic: &str,
        member: &str,
    ) -> Result<Box<dyn Subscription>, TransportError> {
        if self.topic_partitions(topic).await?.is_none() {
            match self.config.auto_create_partitions {
                Some(partitions) => {
                    self.create_topic(topic, partitions).await?;
                }
                None => {
                    return Err(TransportError::UnknownTopic {
                        topic: topic.to_owned(),
                    })
                }
            }
        }
        // Only announce the member here; partitions are taken on the first poll, so members
        // that start together split the topic at once instead of the first taking it all.
        group::heartbeat(&self.pool, group, topic, member, self.clock.now_ms()).await?;
        Ok(Box::new(SqliteSubscription::new(
            self.clone(),
            group.to_owned(),
            topic.to_owned(),
            member.to_owned(),
        )))
    }
}

/// A list of slot numbers as a JSON array, for `IN (SELECT value FROM json_each(?))`.
pub(crate) fn json_slots(slots: &[u32]) -> String {
    serde_json::Value::from(slots.to_vec()).to_string()
}

/// Lease duration in ms, saturating instead of overflowing on absurd TTLs.
pub(crate) fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX / 2)
}
