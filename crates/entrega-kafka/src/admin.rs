//! Creating topics and waiting until they can be used.

use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{TopicAdmin, TransportError};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tokio::time::Instant;

use crate::error::{invalid, transport};
use crate::meta::{after, blocking, partition_id, topic_info, TopicInfo};
use crate::KafkaConfig;

/// How often to look at the metadata of a topic just created.
const VISIBLE_EVERY: Duration = Duration::from_millis(50);

/// How long one partition's leader is given to answer before the metadata is read again.
const LEADER_PROBE: Duration = Duration::from_secs(1);

/// Creates topics through Kafka's admin API.
pub struct KafkaAdmin {
    admin: std::sync::Arc<AdminClient<DefaultClientContext>>,
    /// The admin client's settings, for a fresh client (see `remove_namespace`).
    settings: rdkafka::ClientConfig,
    request_timeout: Duration,
    replication: i32,
    namespace: entrega_core::Namespace,
}

/// What [`KafkaAdmin::remove_namespace`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemovedNamespace {
    /// Topics deleted, as the broker knew them.
    pub topics: Vec<String>,
    /// Consumer groups deleted, as the broker knew them.
    pub groups: Vec<String>,
}

impl KafkaAdmin {
    /// Builds the admin client; it connects in the background.
    pub fn new(config: &KafkaConfig) -> Result<Self, TransportError> {
        let settings = config.admin();
        let admin: AdminClient<DefaultClientContext> =
            settings.create().map_err(|e| transport(e, ""))?;
        Ok(Self {
            admin: std::sync::Arc::new(admin),
            settings,
            request_timeout: config.request_timeout,
            // -1: the brokers' `default.replication.factor` (CreateTopics v4, Kafka 2.4+).
            replication: config.replication_factor.map_or(-1, i32::from),
            namespace: config.namespace.clone(),
        })
    }

    /// Deletes every topic and consumer group of the configured namespace, as a run that
    /// had it to itself leaves the cluster as it found it. Refused without a namespace: it
    /// would delete everything.
    pub async fn remove_namespace(&self) -> Result<RemovedNamespace, TransportError> {
        if self.namespace.is_none() {
            return Err(invalid("removing a namespace needs one"));
        }
        let (admin, timeout, ns) = (
            self.admin.clone(),
            self.request_timeout,
            self.namespace.clone(),
        );
        let (topics, groups) = blocking(move || {
            let client = admin.inner();
            let metadata = client
                .fetch_metadata(None, timeout)
                .map_err(|e| transport(e, ""))?;
            let topics: Vec<String> = metadata
                .topics()
                .iter()
                .map(|t| t.name().to_owned())
                .filter(|t| ns.owns(t))
                .collect();
            let groups: Vec<String> = client
                .fetch_group_list(None, timeout)
                .map_err(|e| transport(e, ""))?
                .groups()
                .iter()
                .map(|g| g.name().to_owned())
                .filter(|g| ns.owns(g))
                .collect();
            Ok::<_, TransportError>((topics, groups))
        })
        .await?;
        let options = AdminOptions::new()
            .request_timeout(Some(self.request_timeout))
            .operation_timeout(Some(self.request_timeout));
        // Topics first: a group some member still belongs to (a process killed, not yet
        // timed out of its session) cannot be deleted yet, and must not keep the topics.
        if !topics.is_empty() {
            let names: Vec<&str> = topics.iter().map(String::as_str).collect();
            let results = self.admin.delete_topics(&names, &options).await;
            deleted(results, RDKafkaErrorCode::UnknownTopicOrPartition)?;
        }
        if !groups.is_empty() {
            // By a client of its own: librdkafka's admin keeps each group's coordinator until
            // `metadata.max.age.ms` (15 min) after its last use and does not forget one that
            // answered NOT_COORDINATOR, so once a coordinator moved (a leader election of
            // `__consumer_offsets` on a cluster) every retry would ask the same wrong broker.
            let fresh: AdminClient<DefaultClientContext> =
                self.settings.create().map_err(|e| transport(e, ""))?;
            let names: Vec<&str> = groups.iter().map(String::as_str).collect();
            let results = fresh.delete_groups(&names, &options).await;
            deleted(results, RDKafkaErrorCode::GroupIdNotFound)?;
        }
        Ok(RemovedNamespace { topics, groups })
    }

    async fn info(&self, topic: &str) -> Result<Option<TopicInfo>, TransportError> {
        let admin = self.admin.clone();
        let name = topic.to_owned();
        let timeout = self.request_timeout;
        blocking(move || topic_info(admin.inner(), &name, timeout).map_err(|e| transport(e, &name)))
            .await
    }

    /// Whether the leader of every partition of `topic` answers for it (a ListOffsets
    /// request). Metadata names a leader before that broker has set up the partition: a
    /// produce in that window fails with `NOT_LEADER_OR_FOLLOWER` and is retried, and Kafka
    /// brokers before 4.5 then accept a later request of the same producer as the
    /// partition's first (KAFKA-15591), which drops the earlier records while the client
    /// counts them delivered. Waiting for this closes the window for topics made here.
    async fn leaders_answer(&self, topic: &str, partitions: &[u32]) -> bool {
        let admin = self.admin.clone();
        let name = topic.to_owned();
        let partitions = partitions.to_vec();
        let timeout = self.request_timeout.min(LEADER_PROBE);
        blocking(move || {
            Ok::<bool, TransportError>(partitions.iter().all(|&p| {
                partition_id(p)
                    .is_ok_and(|id| admin.inner().fetch_watermarks(&name, id, timeout).is_ok())
            }))
        })
        .await
        .unwrap_or(false)
    }

    /// Waits until every partition of `topic` has a leader that answers for it, so a produce
    /// right after works. A transient metadata error of a topic just created is waited out
    /// like a missing leader.
    async fn wait_ready(&self, topic: &str) -> Result<u32, TransportError> {
        let deadline = Instant::from_std(after(self.request_timeout));
        loop {
            match self.info(topic).await {
                Ok(Some(info))
                    if info.ready && self.leaders_answer(topic, &info.partitions).await =>
                {
                    return u32::try_from(info.partitions.len())
                        .map_err(|_| invalid("partition count out of range"));
                }
                Ok(_) => {}
                Err(e) if e.is_transient() && Instant::now() < deadline => {}
                Err(e) => return Err(e),
            }
            if Instant::now() >= deadline {
                return Err(TransportError::unavailable(KafkaError::MetadataFetch(
                    RDKafkaErrorCode::LeaderNotAvailable,
                )));
            }
            tokio::time::sleep(VISIBLE_EVERY).await;
        }
    }
}

#[async_trait]
impl TopicAdmin for KafkaAdmin {
    async fn ensure_topic(&self, topic: &str, partitions: u32) -> Result<u32, TransportError> {
        let wanted = match i32::try_from(partitions) {
            Ok(n) if n > 0 => n,
            _ => {
                return Err(invalid(format!(
                    "a topic needs 1 to {} partitions, not {partitions}",
                    i32::MAX
                )))
            }
        };
        if topic.is_empty() {
            return Err(invalid("a topic needs a name"));
        }
        let wire = self.namespace.wire(topic);
        let topic = wire.as_str();
        if let Some(info) = self.info(topic).await? {
            if info.ready {
                // Made a moment ago by another client, perhaps: wait as for one made here.
                return self.wait_ready(topic).await;
            }
        }
        let new = NewTopic::new(topic, wanted, TopicReplication::Fixed(self.replication));
        let options = AdminOptions::new()
            .request_timeout(Some(self.request_timeout))
            .operation_timeout(Some(self.request_timeout));
        let results = self
            .admin
            .create_topics([&new], &options)
            .await
            .map_err(|e| transport(e, topic))?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, code)) => return Err(transport(KafkaError::AdminOp(code), topic)),
            }
        }
        self.wait_ready(topic).await
    }
}

/// Fails on the first deletion refused, except for a name already gone (`missing`).
fn deleted(
    results: rdkafka::error::KafkaResult<Vec<Result<String, (String, RDKafkaErrorCode)>>>,
    missing: RDKafkaErrorCode,
) -> Result<(), TransportError> {
    for result in results.map_err(|e| transport(e, ""))? {
        match result {
            Err((name, code)) if code != missing => {
                return Err(transport(KafkaError::AdminOp(code), &name));
            }
            _ => {}
        }
    }
    Ok(())
}

impl std::fmt::Debug for KafkaAdmin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaAdmin").finish_non_exhaustive()
    }
}
