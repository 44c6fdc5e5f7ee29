//! Topic metadata lookups and running blocking librdkafka calls off the async runtime.

use std::time::Duration;

use entrega_core::TransportError;
use rdkafka::client::{Client, ClientContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::types::RDKafkaRespErr;

/// Runs a blocking librdkafka call on tokio's blocking pool.
pub(crate) async fn blocking<T, F>(f: F) -> Result<T, TransportError>
where
    F: FnOnce() -> Result<T, TransportError> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(TransportError::unavailable)?
}

/// What the brokers say of one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopicInfo {
    /// Partition ids, ascending.
    pub partitions: Vec<u32>,
    /// Whether every partition has a leader, so produce and fetch requests can be served.
    pub ready: bool,
}

/// The topic's partitions, or `None` when the brokers do not know it. Blocking.
pub(crate) fn topic_info<C: ClientContext>(
    client: &Client<C>,
    topic: &str,
    timeout: Duration,
) -> Result<Option<TopicInfo>, KafkaError> {
    let metadata = client.fetch_metadata(Some(topic), timeout)?;
    let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
        return Ok(None);
    };
    if let Some(err) = found.error() {
        let code = RDKafkaErrorCode::from(err);
        return match code {
            RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic => Ok(None),
            // A topic just created: its leaders are still being elected or announced.
            RDKafkaErrorCode::LeaderNotAvailable | RDKafkaErrorCode::NotLeaderForPartition => {
                Ok(Some(TopicInfo {
                    partitions: Vec::new(),
                    ready: false,
                }))
            }
            other => Err(KafkaError::MetadataFetch(other)),
        };
    }
    let mut partitions: Vec<u32> = found
        .partitions()
        .iter()
        .filter_map(|p| u32::try_from(p.id()).ok())
        .collect();
    partitions.sort_unstable();
    let ready = !partitions.is_empty()
        && found.partitions().iter().all(|p| {
            p.leader() >= 0
                && p.error()
                    .is_none_or(|e| e == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR)
        });
    Ok(Some(TopicInfo { partitions, ready }))
}

/// [`topic_info`] of a topic whose partitions all have a leader: a topic just created (or
/// whose leaders move) is asked again until it is, for up to `timeout`. `None` when the
/// brokers do not know the topic. Blocking.
pub(crate) fn ready_topic_info<C: ClientContext>(
    client: &Client<C>,
    topic: &str,
    timeout: Duration,
) -> Result<Option<TopicInfo>, KafkaError> {
    let deadline = after(timeout);
    loop {
        match topic_info(client, topic, timeout)? {
            Some(info) if !info.ready => {
                if std::time::Instant::now() >= deadline {
                    return Err(KafkaError::MetadataFetch(
                        RDKafkaErrorCode::LeaderNotAvailable,
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            found => return Ok(found),
        }
    }
}

/// The instant `d` from now; a duration too long to represent means "a century from now"
/// rather than a panic.
pub(crate) fn after(d: Duration) -> std::time::Instant {
    let now = std::time::Instant::now();
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
        .unwrap_or(now)
}

/// A partition number as librdkafka takes it.
pub(crate) fn partition_id(partition: u32) -> Result<i32, TransportError> {
    i32::try_from(partition)
        .map_err(|_| crate::error::invalid(format!("partition {partition} is out of range")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn far_deadlines_do_not_overflow() {
        let now = std::time::Instant::now();
        assert!(after(Duration::MAX) > now + Duration::from_secs(3600));
        assert!(after(Duration::from_secs(1)) > now);
        assert!(partition_id(u32::MAX).is_err());
        assert_eq!(partition_id(7).ok(), Some(7));
    }
}
