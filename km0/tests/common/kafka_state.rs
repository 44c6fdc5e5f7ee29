//! What a Kafka process test asserts on, read with a plain librdkafka client of the test's
//! own, never through km0: end and committed offsets and every record of a topic
//! ([`KafkaView`]); the orders the tests place ([`orders`]) and the end state they must reach
//! ([`checks`]).

#![allow(clippy::panic)]

pub mod checks;
pub mod orders;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::{Headers as _, Message as _};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// Longest wait of one request to the broker.
const REQUEST: Duration = Duration::from_secs(10);
/// Longest time to read a whole topic.
const READ_ALL_WITHIN: Duration = Duration::from_secs(60);
/// How long no record may come, once every partition reached its reported watermark, before
/// a read counts as complete. A fetched batch is handed over at once, so this is short; a
/// read also stops five times this long after the watermarks were reached, on a topic that
/// is being written to.
const QUIET: Duration = Duration::from_millis(100);

/// One record of a topic, as far as the tests care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaRecord {
    /// Its partition.
    pub partition: u32,
    /// Its offset in the partition.
    pub offset: i64,
    /// Its key (`agregado_id`).
    pub key: Option<String>,
    /// The `id_evento` header.
    pub id_evento: Option<String>,
    /// The `tipo` header.
    pub tipo: Option<String>,
}

/// Reads a cluster through `bootstrap` without joining any group.
#[derive(Debug, Clone)]
pub struct KafkaView {
    bootstrap: String,
}

impl KafkaView {
    /// A view of the cluster at `bootstrap` (`host:port`).
    pub fn new(bootstrap: impl Into<String>) -> Self {
        Self {
            bootstrap: bootstrap.into(),
        }
    }

    fn client(&self, group: &str) -> BaseConsumer {
        ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", group)
            .set("client.id", "km0-test-view")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("auto.offset.reset", "earliest")
            .create()
            .expect("kafka client")
    }

    /// Partitions of `topic` (empty if it does not exist).
    fn partitions(client: &BaseConsumer, topic: &str) -> Vec<i32> {
        let metadata = client
            .fetch_metadata(Some(topic), REQUEST)
            .expect("topic metadata");
        metadata
            .topics()
            .iter()
            .filter(|t| t.name() == topic && t.error().is_none())
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect()
    }

    /// End offset (next offset to be written) per partition of `topic`. Read, not taken
    /// from the reported high watermark alone, as the inspector does (some Kafka-protocol
    /// brokers report it short of the end).
    pub async fn ends(&self, topic: &str) -> BTreeMap<u32, i64> {
        let (view, topic) = (self.clone(), topic.to_owned());
        blocking(move || view.scan(&topic, false).1).await
    }

    /// Committed next offset of `group` per partition of `topic` it has committed.
    pub async fn committed(&self, group: &str, topic: &str) -> BTreeMap<u32, i64> {
        self.try_committed(group, topic)
            .await
            .unwrap_or_else(|e| panic!("committed offsets: {e}"))
    }

    /// [`Self::committed`], or the error while the cluster cannot answer (its group
    /// coordinator just died, say).
    pub async fn try_committed(
        &self,
        group: &str,
        topic: &str,
    ) -> Result<BTreeMap<u32, i64>, rdkafka::error::KafkaError> {
        let (view, group, topic) = (self.clone(), group.to_owned(), topic.to_owned());
        blocking(move || {
            let client = view.client(&group);
            let mut wanted = TopicPartitionList::new();
            for p in Self::partitions(&client, &topic) {
                wanted.add_partition(&topic, p);
            }
            Ok(client
                .committed_offsets(wanted, REQUEST)?
                .elements()
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(next) => Some((to_u32(e.partition()), next)),
                    _ => None,
                })
                .collect())
        })
        .await
    }

    /// The partitions of `topic` the broker has assigned to the member of `group` whose
    /// `client.id` is `client` (entrega's consumers use their member name), as the group
    /// coordinator describes the group; empty while it holds none.
    pub async fn assigned(&self, group: &str, topic: &str, client: &str) -> BTreeSet<u32> {
        let (view, group, topic, client) = (
            self.clone(),
            group.to_owned(),
            topic.to_owned(),
            client.to_owned(),
        );
        blocking(move || {
            let groups = view
                .client(&format!("km0-test-describer-{}", uuid::Uuid::new_v4()))
                .fetch_group_list(Some(&group), REQUEST)
                .expect("describe group");
            groups
                .groups()
                .iter()
                .filter(|g| g.name() == group)
                .flat_map(|g| g.members())
                .filter(|m| m.client_id() == client)
                .filter_map(|m| m.assignment())
                .flat_map(|bytes| entrega_kafka::assigned_partitions(bytes, &topic))
                .collect()
        })
        .await
    }

    /// Whether `group` committed every record `topic` holds (and the topic exists).
    pub async fn caught_up(&self, group: &str, topic: &str) -> bool {
        let ends = self.ends(topic).await;
        let committed = self.committed(group, topic).await;
        !ends.is_empty()
            && ends
                .iter()
                .all(|(p, end)| *end == 0 || committed.get(p) == Some(end))
    }

    /// Every record of `topic`, partition by partition, in offset order.
    pub async fn records(&self, topic: &str) -> Vec<KafkaRecord> {
        let (view, topic) = (self.clone(), topic.to_owned());
        blocking(move || view.scan(&topic, true).0).await
    }

    /// Reads every partition of `topic` from its start (`all`) or from the last record the
    /// high watermark admits, until no record comes for [`QUIET`] after every partition
    /// reached its reported watermark. Returns the records read and each partition's end:
    /// at least the end when the read began.
    fn scan(&self, topic: &str, all: bool) -> (Vec<KafkaRecord>, BTreeMap<u32, i64>) {
        let client = self.client(&format!("km0-test-reader-{}", uuid::Uuid::new_v4()));
        let mut ends = BTreeMap::new();
        // Partitions with records, and the watermark each must be read up to.
        let mut assigned: BTreeMap<u32, i64> = BTreeMap::new();
        let mut assignment = TopicPartitionList::new();
        for p in Self::partitions(&client, topic) {
            let (low, high) = client
                .fetch_watermarks(topic, p, REQUEST)
                .expect("watermarks");
            ends.insert(to_u32(p), high);
            if high > low {
                assigned.insert(to_u32(p), high);
                let from = if all { low } else { high - 1 };
                assignment
                    .add_partition_offset(topic, p, Offset::Offset(from))
                    .expect("partition offset");
            }
        }
        let reported = ends.clone();
        let mut read: BTreeMap<u32, i64> = BTreeMap::new();
        if assignment.count() == 0 {
            return (Vec::new(), ends);
        }
        client.assign(&assignment).expect("assign");
        let mut by_partition: BTreeMap<u32, Vec<KafkaRecord>> = BTreeMap::new();
        let deadline = Instant::now() + READ_ALL_WITHIN;
        let mut quiet_since: Option<Instant> = None;
        let mut reached_at: Option<Instant> = None;
        loop {
            assert!(
                Instant::now() < deadline,
                "could not read {topic} to its end offsets {reported:?}"
            );
            let reached = assigned
                .iter()
                .all(|(p, high)| read.get(p).is_some_and(|next| next >= high));
            if reached {
                let since = *reached_at.get_or_insert_with(Instant::now);
                // Records keep coming on a topic being written: stop at some point.
                if since.elapsed() >= QUIET * 5 {
                    break;
                }
            }
            match client.poll(Duration::from_millis(20)) {
                None if reached => {
                    let since = *quiet_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= QUIET {
                        break;
                    }
                }
                None => {}
                Some(Err(e)) => panic!("reading {topic}: {e}"),
                Some(Ok(m)) => {
                    quiet_since = None;
                    let partition = to_u32(m.partition());
                    let end = ends.entry(partition).or_insert(0);
                    *end = (*end).max(m.offset() + 1);
                    let next = read.entry(partition).or_insert(0);
                    *next = (*next).max(m.offset() + 1);
                    if all {
                        by_partition
                            .entry(partition)
                            .or_default()
                            .push(to_record(&m, partition));
                    }
                }
            }
        }
        let records = by_partition
            .into_values()
            .flat_map(|mut rs| {
                rs.sort_by_key(|r| r.offset);
                rs.dedup_by_key(|r| r.offset);
                rs
            })
            .collect();
        (records, ends)
    }
}

fn to_record(m: &rdkafka::message::BorrowedMessage<'_>, partition: u32) -> KafkaRecord {
    let header = |name: &str| {
        m.headers().and_then(|hs| {
            hs.iter()
                .find(|h| h.key == name)
                .and_then(|h| h.value)
                .map(|v| String::from_utf8_lossy(v).into_owned())
        })
    };
    KafkaRecord {
        partition,
        offset: m.offset(),
        key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
        id_evento: header("id_evento"),
        tipo: header("tipo"),
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking task")
}

fn to_u32(p: i32) -> u32 {
    u32::try_from(p).expect("partition id")
}

/// Session timeout of the Kafka process tests' consumers: a killed member is expelled after it.
pub const SESSION_TIMEOUT_MS: u64 = 6_000;
/// Relay lane lease of the Kafka process tests.
pub const LEASE_TTL_MS: u64 = 1_000;

/// What a Kafka process test starts from: an Apache Kafka broker of its own, a km0 deployment on fresh
/// PostgreSQL databases using it, the state and broker views the checks read, and the stock
/// the test filled in.
pub struct KafkaRig {
    /// The broker; stopped when the rig is dropped.
    pub broker: super::kafka::KafkaBroker,
    /// Starts km0 processes on the broker.
    pub deployment: super::process::Deployment,
    /// The deployment's databases.
    pub state: super::state::DbState,
    /// The broker seen with a client of the test's own.
    pub view: KafkaView,
    /// Stock per product before any order.
    pub start: BTreeMap<String, i64>,
}

impl KafkaRig {
    /// Starts the broker, creates the deployment and fills the stock.
    pub async fn start() -> Self {
        let kafka = super::kafka::KafkaBroker::start();
        let url = format!("{}?session_timeout_ms={SESSION_TIMEOUT_MS}", kafka.url());
        let deployment = super::process::Deployment::with_broker("postgres", &url, LEASE_TTL_MS);
        let state = deployment.state().await;
        let view = KafkaView::new(kafka.bootstrap());
        let start = orders::fill_stock(&state).await;
        Self {
            broker: kafka,
            deployment,
            state,
            view,
            start,
        }
    }
}

/// The deployment's databases, without a Kafka client of the test's own: one would connect
/// through a test's proxy too (and count among its connections). The test reads the broker
/// with [`KafkaView`] instead, when the proxy forwards.
pub async fn databases_without_kafka(
    deployment: &super::process::Deployment,
) -> super::state::DbState {
    let system = &deployment.system;
    let pedidos = system.pedidos().await.expect("pedidos db").db().clone();
    let inventario = system
        .inventario()
        .await
        .expect("inventario db")
        .db()
        .clone();
    // Never used for Kafka reads; a log broker over the pedidos database costs no connection.
    let broker = km0::wiring::Broker::log(&pedidos, std::time::Duration::from_millis(LEASE_TTL_MS));
    super::state::DbState {
        pedidos,
        inventario,
        broker,
    }
}

/// Ids of the outbox rows marked published.
pub async fn marked_published(pedidos: &entrega::Db) -> HashSet<String> {
    let Some(pool) = pedidos.postgres() else {
        panic!("the Kafka process tests run on PostgreSQL");
    };
    let ids: Vec<String> =
        sqlx::query_scalar("SELECT CAST(id AS TEXT) FROM outbox WHERE publicado_en IS NOT NULL")
            .fetch_all(pool)
            .await
            .expect("marked rows");
    ids.into_iter().collect()
}
