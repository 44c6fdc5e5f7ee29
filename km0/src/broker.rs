//! The broker of a deployment, whichever it is: the log transport in an SQLite or PostgreSQL
//! database, or a Kafka cluster. Everything km0 does with the broker goes through [`Broker`]:
//! publishing, consuming, creating topics and reading positions ([`LogInspector`]).

use std::sync::Arc;
use std::time::Duration;

use entrega_core::{
    Clock, LogInspector, MigrationSet, Publisher, Record, StoreError, Subscriber, SystemClock,
    TopicAdmin, TransportError,
};
use entrega_postgres::PgLog;
use entrega_sqlite::SqliteLog;

use entrega_kafka::Kafka;

use crate::config::{connect_broker, BrokerUrl, BrokerUrlError, Db};

/// Why the broker could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// The `--broker` URL is not one km0 can use.
    #[error(transparent)]
    Url(#[from] BrokerUrlError),
    /// The log transport's database could not be opened or migrated.
    #[error("opening the log broker's database")]
    Store(#[from] StoreError),
    /// The Kafka client could not be set up.
    #[error("setting up the kafka clients")]
    Transport(#[from] TransportError),
}

/// A connected broker; cheap to clone.
#[derive(Debug, Clone)]
pub enum Broker {
    /// The log transport on SQLite.
    Sqlite(SqliteLog),
    /// The log transport on PostgreSQL.
    Postgres(PgLog),
    /// A Kafka cluster.
    Kafka(Kafka),
}

impl Broker {
    /// Opens the broker named by `url`: the log transport's database is created if missing
    /// and migrated, and a group member of the log silent for `lease_ttl` loses its
    /// partitions; Kafka's clients are built (they connect in the background) with the
    /// URL's settings, its group members keeping their partitions for `session_timeout_ms`.
    pub async fn connect(url: &BrokerUrl, lease_ttl: Duration) -> Result<Self, BrokerError> {
        match url {
            BrokerUrl::SqliteLog(url) | BrokerUrl::PostgresLog(url) => {
                let db = connect_broker(url).await?;
                db.migrate_entrega(&[MigrationSet::Log]).await?;
                Ok(Self::log(&db, lease_ttl))
            }
            BrokerUrl::Kafka(_, config) => Ok(Self::Kafka(Kafka::connect(config.clone())?)),
        }
    }

    /// The log transport in `db` (already migrated).
    pub fn log(db: &Db, lease_ttl: Duration) -> Self {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        match db {
            Db::Sqlite(pool) => {
                let config = entrega_sqlite::LogConfig {
                    lease_ttl,
                    heartbeat: lease_ttl / 3,
                    ..entrega_sqlite::LogConfig::default()
                };
                Self::Sqlite(SqliteLog::with_config(pool.clone(), config, clock))
            }
            Db::Postgres(pool) => {
                let config = entrega_postgres::LogConfig {
                    lease_ttl,
                    heartbeat: lease_ttl / 3,
                    ..entrega_postgres::LogConfig::default()
                };
                Self::Postgres(PgLog::with_config(pool.clone(), config, clock))
            }
        }
    }

    /// `sqlite log`, `postgres log` or `kafka`, for people and reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Sqlite(_) => "sqlite log",
            Self::Postgres(_) => "postgres log",
            Self::Kafka(_) => "kafka",
        }
    }

    /// The database of the log transport (`None` on Kafka).
    pub fn log_db(&self) -> Option<Db> {
        match self {
            Self::Sqlite(log) => Some(Db::Sqlite(log.pool().clone())),
            Self::Postgres(log) => Some(Db::Postgres(log.pool().clone())),
            Self::Kafka(_) => None,
        }
    }

    /// Publishing side.
    pub fn publisher(&self) -> Arc<dyn Publisher> {
        match self {
            Self::Sqlite(log) => Arc::new(log.clone()),
            Self::Postgres(log) => Arc::new(log.clone()),
            Self::Kafka(kafka) => kafka.publisher(),
        }
    }

    /// Consuming side.
    pub fn subscriber(&self) -> Arc<dyn Subscriber> {
        match self {
            Self::Sqlite(log) => Arc::new(log.clone()),
            Self::Postgres(log) => Arc::new(log.clone()),
            Self::Kafka(kafka) => kafka.subscriber(),
        }
    }

    /// Topic creation.
    pub fn admin(&self) -> Arc<dyn TopicAdmin> {
        match self {
            Self::Sqlite(log) => Arc::new(log.clone()),
            Self::Postgres(log) => Arc::new(log.clone()),
            Self::Kafka(kafka) => kafka.admin(),
        }
    }

    /// Positions and records, read without joining any group.
    pub fn inspector(&self) -> Arc<dyn LogInspector> {
        match self {
            Self::Sqlite(log) => Arc::new(log.clone()),
            Self::Postgres(log) => Arc::new(log.clone()),
            Self::Kafka(kafka) => kafka.inspector(),
        }
    }

    /// Releases the broker's connections.
    pub async fn close(&self) {
        match self {
            Self::Sqlite(log) => log.pool().close().await,
            Self::Postgres(log) => log.pool().close().await,
            // Publishing waits for every acknowledgement: nothing is left to flush, and the
            // clients go with the last clone of the handle.
            Self::Kafka(_) => {}
        }
    }

    /// End offset (next offset to be written) of each partition of `topic`; empty when the
    /// topic does not exist.
    pub async fn end_offsets(&self, topic: &str) -> Result<Vec<(u32, i64)>, TransportError> {
        self.inspector().end_offsets(topic).await
    }

    /// Committed next offset of `group` per partition of `topic` it has committed.
    pub async fn committed(
        &self,
        group: &str,
        topic: &str,
    ) -> Result<Vec<(u32, i64)>, TransportError> {
        self.inspector().committed(group, topic).await
    }

    /// Up to `max` records of one partition from offset `from` on (tests, tooling).
    pub async fn read(
        &self,
        topic: &str,
        partition: u32,
        from: i64,
        max: usize,
    ) -> Result<Vec<Record>, TransportError> {
        self.inspector().read(topic, partition, from, max).await
    }

    /// Messages ever appended to `topic` (0 if it does not exist).
    pub async fn topic_total(&self, topic: &str) -> Result<u64, TransportError> {
        let ends = self.end_offsets(topic).await?;
        Ok(ends
            .iter()
            .map(|(_, end)| u64::try_from(*end).unwrap_or(0))
            .sum())
    }
}
