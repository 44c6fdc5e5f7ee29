//! The broker, whichever it is, chosen at run time from its URL: the log transport in an
//! SQLite or PostgreSQL database, a Kafka cluster (feature `kafka`) or RabbitMQ (feature
//! `amqp`; a queue, not a log: no offsets to inspect or replay). Publishing,
//! consuming, creating topics and reading positions all go through [`Broker`].
//!
//! ```no_run
//! # async fn run() -> Result<(), entrega::broker::BrokerError> {
//! use std::time::Duration;
//! let broker = entrega::Broker::connect("sqlite://data/broker.db", Duration::from_secs(10)).await?;
//! let publisher = broker.publisher();
//! # let _ = publisher; Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use crate::db::{Backend, Db};
pub use crate::store::log::{DbLog, LogConfig};
use entrega_core::{
    Clock, LogInspector, MigrationSet, Publisher, Record, StoreError, Subscriber, SystemClock,
    TopicAdmin, TransportError,
};

/// Why the broker could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// Neither `sqlite:`, `postgres://`, `kafka://` nor `amqp://`.
    #[error(
        "unsupported broker url `{url}`: expected sqlite://FILE, \
         postgres://USER@HOST:PORT/DB, kafka://HOST:PORT[,HOST:PORT...][?PROPS] or \
         amqp://USER:PASS@HOST:PORT[/VHOST][?PARAMS]"
    )]
    UnknownScheme {
        /// The URL as given.
        url: String,
    },
    /// A `kafka://` URL in a build without the `kafka` feature.
    #[error("broker url `{url}` names a kafka cluster, and this build has no kafka support")]
    KafkaDisabled {
        /// The URL as given.
        url: String,
    },
    /// An `amqp://` URL in a build without the `amqp` feature.
    #[error("broker url `{url}` names RabbitMQ, and this build has no amqp support")]
    AmqpDisabled {
        /// The URL as given.
        url: String,
    },
    /// An `amqp://` URL whose entrega parameters do not read.
    #[cfg(feature = "amqp")]
    #[error("invalid amqp broker url `{url}`")]
    AmqpUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        #[source]
        source: entrega_amqp::AmqpUrlError,
    },
    /// A `kafka://` URL that does not read: no host, a bad port, a malformed parameter.
    #[cfg(feature = "kafka")]
    #[error("invalid kafka broker url `{url}`")]
    KafkaUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        #[source]
        source: entrega_kafka::KafkaUrlError,
    },
    /// The log transport's database could not be opened or migrated.
    #[error("opening the log broker's database")]
    Store(#[from] StoreError),
    /// The Kafka client could not be set up.
    #[error("setting up the kafka clients")]
    Transport(#[from] TransportError),
}

/// A connected broker; cheap to clone.
#[derive(Debug, Clone)]
pub struct Broker {
    transport: Transport,
}

#[derive(Debug, Clone)]
enum Transport {
    Log(DbLog),
    #[cfg(feature = "kafka")]
    Kafka(entrega_kafka::Kafka),
    #[cfg(feature = "amqp")]
    Amqp(entrega_amqp::Amqp),
}

/// Whether a URL names RabbitMQ (`amqp://` or `amqps://`, any case).
pub fn is_amqp_url(url: &str) -> bool {
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    lower.starts_with("amqp://") || lower.starts_with("amqps://")
}

/// Whether a URL names a Kafka cluster (`kafka://`, any case).
pub fn is_kafka_url(url: &str) -> bool {
    url.get(..8)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("kafka://"))
}

impl Broker {
    /// Opens the broker named by `url`. `sqlite://FILE` and `postgres://USER@HOST:PORT/DB`
    /// name the log transport's database (an SQLite file is created if missing; both are
    /// migrated); a group member of the log silent for `lease_ttl` loses its partitions.
    /// `kafka://HOST:PORT[,...][?PROPS]` builds Kafka clients with the URL's settings
    /// (they connect in the background); `lease_ttl` does not apply there, the URL's
    /// `session_timeout_ms` does.
    pub async fn connect(url: &str, lease_ttl: Duration) -> Result<Self, BrokerError> {
        if is_kafka_url(url) {
            return Self::connect_kafka(url);
        }
        if is_amqp_url(url) {
            return Self::connect_amqp(url);
        }
        if Backend::of_url(url).is_none() {
            return Err(BrokerError::UnknownScheme {
                url: entrega_core::redact_url(url),
            });
        }
        let db = Db::connect(url).await?;
        db.migrate(&[MigrationSet::Log]).await?;
        Ok(Self::log(&db, lease_ttl))
    }

    #[cfg(feature = "kafka")]
    fn connect_kafka(url: &str) -> Result<Self, BrokerError> {
        let config =
            entrega_kafka::KafkaConfig::from_url(url).map_err(|source| BrokerError::KafkaUrl {
                url: entrega_core::redact_url(url),
                source,
            })?;
        Ok(Self::kafka(entrega_kafka::Kafka::connect(config)?))
    }

    #[cfg(feature = "amqp")]
    fn connect_amqp(url: &str) -> Result<Self, BrokerError> {
        let config =
            entrega_amqp::AmqpConfig::from_url(url).map_err(|source| BrokerError::AmqpUrl {
                url: entrega_core::redact_url(url),
                source,
            })?;
        Ok(Self {
            transport: Transport::Amqp(entrega_amqp::Amqp::connect(config)),
        })
    }

    #[cfg(not(feature = "amqp"))]
    fn connect_amqp(url: &str) -> Result<Self, BrokerError> {
        Err(BrokerError::AmqpDisabled {
            url: entrega_core::redact_url(url),
        })
    }

    #[cfg(not(feature = "kafka"))]
    fn connect_kafka(url: &str) -> Result<Self, BrokerError> {
        Err(BrokerError::KafkaDisabled {
            url: entrega_core::redact_url(url),
        })
    }

    /// The log transport in `db` (already migrated with [`MigrationSet::Log`]).
    pub fn log(db: &Db, lease_ttl: Duration) -> Self {
        let config = LogConfig {
            lease_ttl,
            heartbeat: lease_ttl / 3,
            ..LogConfig::default()
        };
        Self::log_with(db, config, Arc::new(SystemClock))
    }

    /// The log transport in `db` with explicit tuning and clock (leases, heartbeats, pauses
    /// and append times read `clock`).
    pub fn log_with(db: &Db, config: LogConfig, clock: Arc<dyn Clock>) -> Self {
        Self {
            transport: Transport::Log(DbLog::new(db.clone(), config, clock)),
        }
    }

    /// A Kafka cluster's clients.
    #[cfg(feature = "kafka")]
    pub fn kafka(kafka: entrega_kafka::Kafka) -> Self {
        Self {
            transport: Transport::Kafka(kafka),
        }
    }

    /// The Kafka clients, for what only Kafka offers (transactions); `None` on the log
    /// transport.
    #[cfg(feature = "kafka")]
    pub fn as_kafka(&self) -> Option<&entrega_kafka::Kafka> {
        match &self.transport {
            Transport::Kafka(kafka) => Some(kafka),
            _ => None,
        }
    }

    /// The clients of the broker's read-process-write transactions, when it has them
    /// (Kafka's: a batch's output and its input offsets commit together); `None` on the log
    /// transports and RabbitMQ.
    #[cfg(feature = "kafka")]
    pub fn transactions(&self) -> Option<&entrega_kafka::Kafka> {
        self.as_kafka()
    }

    /// The RabbitMQ handle, for what only RabbitMQ has (deleting a group's queues); `None`
    /// on the other transports.
    #[cfg(feature = "amqp")]
    pub fn as_amqp(&self) -> Option<&entrega_amqp::Amqp> {
        match &self.transport {
            Transport::Amqp(amqp) => Some(amqp),
            _ => None,
        }
    }

    /// The transport's own dead-letter and delay queues (RabbitMQ's), for
    /// [`crate::Worker::with_side_queues`]; `None` on the log transports and Kafka, whose
    /// dead letters and retries are topics.
    pub fn side_queues(&self) -> Option<Arc<dyn entrega_core::SideQueues>> {
        match &self.transport {
            #[cfg(feature = "amqp")]
            Transport::Amqp(amqp) => Some(amqp.side_queues()),
            _ => None,
        }
    }

    /// Names the queues of `group` on `topic` after `base` on a broker that keeps a
    /// group's messages in queues of its own (RabbitMQ: `<base>.*`, in the URL's layout);
    /// nothing on a log, whose groups are offsets.
    pub fn name_group(&self, group: &str, topic: &str, base: &str) {
        #[cfg(feature = "amqp")]
        if let Transport::Amqp(amqp) = &self.transport {
            let spec = entrega_amqp::GroupSpec {
                base: Some(base.to_owned()),
                layout: amqp.config().layout,
            };
            amqp.set_group(group, topic, spec);
        }
        let _ = (group, topic, base);
    }

    /// Makes `group`'s place on `topic` before anything is published: on a broker that
    /// refuses a message no queue takes (RabbitMQ, `mandatory`), the group's queues; nothing
    /// on a log, which keeps every record for groups that join later.
    pub async fn declare_group(&self, group: &str, topic: &str) -> Result<(), TransportError> {
        #[cfg(feature = "amqp")]
        if let Transport::Amqp(amqp) = &self.transport {
            return amqp.declare_group(group, topic).await;
        }
        let _ = (group, topic);
        Ok(())
    }

    /// Where `group`'s dead letters from `topic` go: its dead-letter queue on a broker with
    /// queues per group (RabbitMQ), else the topic `<topic>.dlq`.
    pub fn dead_letter_place(&self, group: &str, topic: &str) -> String {
        #[cfg(feature = "amqp")]
        if let Transport::Amqp(amqp) = &self.transport {
            return amqp.group_queues(group, topic).dead_letter_queue();
        }
        let _ = group;
        format!("{topic}.dlq")
    }

    /// Removes `group`'s place on `topic` on a broker that keeps one per group (RabbitMQ's
    /// queues, with what they still hold); nothing on a log, where a group is only offsets.
    pub async fn delete_group(&self, group: &str, topic: &str) -> Result<(), TransportError> {
        #[cfg(feature = "amqp")]
        if let Transport::Amqp(amqp) = &self.transport {
            return amqp.delete_group(group, topic).await;
        }
        let _ = (group, topic);
        Ok(())
    }

    /// Whether records stay on their topic at offsets that can be read again (a log or
    /// Kafka); `false` for a broker whose messages leave the queue once acknowledged
    /// (RabbitMQ).
    pub fn has_offsets(&self) -> bool {
        !self.is_amqp()
    }

    /// Request and reply queues: RabbitMQ's own, or topics of the log (or Kafka) read as
    /// queues ([`crate::rpc::LogRpc`], request topics of `partitions` partitions).
    pub fn rpc(&self, partitions: u32) -> Arc<dyn entrega_core::RpcTransport> {
        #[cfg(feature = "amqp")]
        if let Transport::Amqp(amqp) = &self.transport {
            return amqp.rpc();
        }
        Arc::new(crate::rpc::LogRpc::new(
            self.publisher(),
            self.subscriber(),
            self.admin(),
            partitions,
        ))
    }

    /// Whether this is RabbitMQ: a queue, not a log (no offsets to inspect or replay).
    pub fn is_amqp(&self) -> bool {
        #[cfg(feature = "amqp")]
        if let Transport::Amqp(_) = self.transport {
            return true;
        }
        false
    }

    /// `sqlite log`, `postgres log`, `kafka` or `rabbitmq`, for people and reports.
    pub fn kind(&self) -> &'static str {
        match &self.transport {
            Transport::Log(log) => match log.db().backend() {
                Backend::Sqlite => "sqlite log",
                Backend::Postgres => "postgres log",
            },
            #[cfg(feature = "kafka")]
            Transport::Kafka(_) => "kafka",
            #[cfg(feature = "amqp")]
            Transport::Amqp(_) => "rabbitmq",
        }
    }

    /// Whether this is a Kafka cluster rather than the log transport in a database.
    pub fn is_kafka(&self) -> bool {
        #[cfg(feature = "kafka")]
        if let Transport::Kafka(_) = self.transport {
            return true;
        }
        false
    }

    /// The database of the log transport (`None` on Kafka).
    pub fn log_db(&self) -> Option<Db> {
        match &self.transport {
            Transport::Log(log) => Some(log.db().clone()),
            #[cfg(feature = "kafka")]
            Transport::Kafka(_) => None,
            #[cfg(feature = "amqp")]
            Transport::Amqp(_) => None,
        }
    }

    /// Publishing side.
    pub fn publisher(&self) -> Arc<dyn Publisher> {
        match &self.transport {
            Transport::Log(log) => Arc::new(log.clone()),
            #[cfg(feature = "kafka")]
            Transport::Kafka(kafka) => kafka.publisher(),
            #[cfg(feature = "amqp")]
            Transport::Amqp(amqp) => amqp.publisher(),
        }
    }

    /// Consuming side.
    pub fn subscriber(&self) -> Arc<dyn Subscriber> {
        match &self.transport {
            Transport::Log(log) => Arc::new(log.clone()),
            #[cfg(feature = "kafka")]
            Transport::Kafka(kafka) => kafka.subscriber(),
            #[cfg(feature = "amqp")]
            Transport::Amqp(amqp) => amqp.subscriber(),
        }
    }

    /// Topic creation.
    pub fn admin(&self) -> Arc<dyn TopicAdmin> {
        match &self.transport {
            Transport::Log(log) => Arc::new(log.clone()),
            #[cfg(feature = "kafka")]
            Transport::Kafka(kafka) => kafka.admin(),
            #[cfg(feature = "amqp")]
            Transport::Amqp(amqp) => amqp.admin(),
        }
    }

    /// Positions and records, read without joining any group.
    pub fn inspector(&self) -> Arc<dyn LogInspector> {
        match &self.transport {
            Transport::Log(log) => Arc::new(log.clone()),
            #[cfg(feature = "kafka")]
            Transport::Kafka(kafka) => kafka.inspector(),
            #[cfg(feature = "amqp")]
            Transport::Amqp(amqp) => amqp.inspector(),
        }
    }

    /// Deletes everything of the URL's `namespace` on a shared broker (Kafka: every topic
    /// and consumer group under the prefix; RabbitMQ: the queues and exchanges named under
    /// it) and returns the names removed, as the broker knew them. Refused without a
    /// namespace; nothing to do on the log transports, whose records live in a database of
    /// their own.
    pub async fn remove_namespace(&self) -> Result<Vec<String>, TransportError> {
        match &self.transport {
            Transport::Log(_) => Ok(Vec::new()),
            #[cfg(feature = "kafka")]
            Transport::Kafka(kafka) => {
                let removed = kafka.remove_namespace().await?;
                Ok(removed.topics.into_iter().chain(removed.groups).collect())
            }
            #[cfg(feature = "amqp")]
            Transport::Amqp(amqp) => {
                let removed = amqp.remove_namespace().await?;
                Ok(removed
                    .groups
                    .into_iter()
                    .chain(removed.queues)
                    .chain(removed.exchanges)
                    .collect())
            }
        }
    }

    /// [`Self::remove_namespace`], tried again each half second for up to `within` while the
    /// broker refuses (a consumer group that still has a member: a killed one's session has
    /// not ended yet).
    pub async fn remove_namespace_within(
        &self,
        within: Duration,
    ) -> Result<Vec<String>, TransportError> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match self.remove_namespace().await {
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(error = %e, "the broker's namespace is not removable yet");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                done => return done,
            }
        }
    }

    /// Releases the broker's connections.
    pub async fn close(&self) {
        match &self.transport {
            Transport::Log(log) => log.db().close().await,
            // Publishing waits for every acknowledgement: nothing is left to flush, and the
            // clients go with the last clone of the handle.
            #[cfg(feature = "kafka")]
            Transport::Kafka(_) => {}
            #[cfg(feature = "amqp")]
            Transport::Amqp(_) => {}
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
