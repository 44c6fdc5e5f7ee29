//! The log transport in a database (`entrega_topics`, `entrega_partitions`, `entrega_log`,
//! consumer groups in `entrega_group_members`, `entrega_partition_leases` and
//! `entrega_group_offsets`; log migration set): partitioned topics with dense offsets handed
//! out in commit order, consumer groups with fenced partition leases, offsets committed after
//! processing. Written once for SQLite and PostgreSQL; where PostgreSQL has a faster shape
//! (one statement per append with `UNNEST` and `pg_notify`, one statement per fetch across
//! partitions, one fenced commit) it is kept as a specialisation beside the common path.

mod admin;
mod group;
mod publish;
mod subscription;

use std::collections::HashMap;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use entrega_core::{Clock, StoreError, SystemClock};
use entrega_postgres::Listener;

use crate::db::{Db, Pool};

/// Tuning of the log transport's consumer groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// How long a partition lease lasts without renewal; a member silent this long loses its
    /// partitions to the others. Default 10 s.
    pub lease_ttl: Duration,
    /// How often a member heartbeats and rebalances (at most). Default `lease_ttl / 3`.
    pub heartbeat: Duration,
    /// How often an idle `poll` looks at the log when no wake-up came (writes from other
    /// processes on SQLite, a lost notification connection on PostgreSQL), and how often
    /// paused partitions are looked at again. Default 50 ms.
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

/// The log transport in one database, SQLite or PostgreSQL: [`entrega_core::Publisher`],
/// [`entrega_core::Subscriber`], [`entrega_core::TopicAdmin`] and
/// [`entrega_core::LogInspector`]. Usually reached through [`crate::Broker`]. Cheap to clone:
/// clones share the partition-count cache and, on PostgreSQL, one notification listener.
#[derive(Debug, Clone)]
pub struct DbLog {
    db: Db,
    config: Arc<LogConfig>,
    clock: Arc<dyn Clock>,
    /// Partition counts of known topics; a topic's count never changes once created.
    topics: Arc<Mutex<HashMap<String, u32>>>,
    /// Spreads keyless messages over partitions, one partition per topic and call.
    round_robin: Arc<AtomicU32>,
    /// How this process's subscribers learn of appends.
    appends: Appends,
}

/// How appends wake subscribers: each backend has its own way.
#[derive(Debug, Clone)]
enum Appends {
    /// PostgreSQL's notifications, keyed by topic.
    Notified(Listener),
    /// SQLite's in-process signal after a commit.
    Signalled(Arc<entrega_sqlite::CommitWaiter>),
}

/// Channel every append notifies on PostgreSQL, with the topic as payload.
const LOG_CHANNEL: &str = "entrega_log";

impl DbLog {
    /// The log in `db` (migrated with the log set), with its tuning and the clock its leases,
    /// heartbeats, pauses and append times read.
    pub fn new(db: Db, config: LogConfig, clock: Arc<dyn Clock>) -> Self {
        let appends = match &db.pool {
            Pool::Postgres(pool) => Appends::Notified(Listener::new(pool.clone(), LOG_CHANNEL)),
            Pool::Sqlite(pool) => Appends::Signalled(Arc::new(entrega_sqlite::CommitWaiter::new(
                pool,
                entrega_sqlite::Watched::Log,
            ))),
        };
        Self {
            db,
            config: Arc::new(config),
            clock,
            topics: Arc::new(Mutex::new(HashMap::new())),
            round_robin: Arc::new(AtomicU32::new(0)),
            appends,
        }
    }

    /// The log in `db` with the default tuning and the system clock.
    pub fn with_defaults(db: Db) -> Self {
        Self::new(db, LogConfig::default(), Arc::new(SystemClock))
    }

    /// The database of this log.
    pub fn db(&self) -> &Db {
        &self.db
    }

    fn cached(&self, topic: &str) -> Option<u32> {
        let topics = self.topics.lock().unwrap_or_else(PoisonError::into_inner);
        topics.get(topic).copied()
    }

    fn remember(&self, topic: &str, partitions: u32) {
        let mut topics = self.topics.lock().unwrap_or_else(PoisonError::into_inner);
        topics.insert(topic.to_owned(), partitions);
    }

    fn forget(&self, topic: &str) {
        let mut topics = self.topics.lock().unwrap_or_else(PoisonError::into_inner);
        topics.remove(topic);
    }
}

/// A stored partition number.
fn partition_of(value: i64, table: &'static str) -> Result<u32, StoreError> {
    u32::try_from(value).map_err(|_| StoreError::Corrupt {
        table,
        reason: format!("partition {value} out of range"),
    })
}

/// A duration in ms, saturating for absurd values.
fn ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX / 4)
}
