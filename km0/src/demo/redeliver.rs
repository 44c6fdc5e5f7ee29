//! Redelivery on purpose: the demo publishes some already-delivered events a second time,
//! byte for byte (same `id_evento`), as a relay that died between publish and mark would.
//! The inventory consumer must recognise every one as a duplicate and change nothing.
//!
//! On a log the demo reads the events back from the run's start offsets. A RabbitMQ queue
//! forgets what was acked, so there the demo subscribes a tap group of its own before the run:
//! the topic's fanout exchange gives it a copy of every event, which it publishes again.

use std::time::{Duration, Instant};

use entrega_core::{OutgoingMessage, Subscription};

use crate::wiring::Broker;

/// Longest wait for the tap's copies.
const TAP_WAIT: Duration = Duration::from_secs(10);

/// Where the demo takes the events of one topic it publishes again.
pub struct Replayable {
    topic: String,
    source: Source,
}

enum Source {
    /// A log, read back from these per-partition offsets (its ends before the run).
    Log(Vec<(u32, i64)>),
    /// RabbitMQ: the demo's tap group on the topic.
    Tap {
        /// The tap's group, deleted after use.
        group: String,
        /// Its subscription.
        sub: Box<dyn Subscription>,
    },
}

impl Replayable {
    /// Marks where this run starts on `topic` of `broker`: the topic's ends on a log, a
    /// new tap group (named after `run` and the topic) on RabbitMQ.
    pub async fn open(broker: &Broker, run: &str, topic: &str) -> anyhow::Result<Self> {
        let source = if broker.is_amqp() {
            let group = format!("km0-demo-tap-{run}-{topic}");
            let sub = broker.subscriber().subscribe(&group, topic, &group).await?;
            Source::Tap { group, sub }
        } else {
            Source::Log(broker.end_offsets(topic).await?)
        };
        Ok(Self {
            topic: topic.to_owned(),
            source,
        })
    }

    /// Publishes again up to `count` events of this run (see [`redeliver`]); a tap is then
    /// removed. Returns how many.
    pub async fn redeliver(self, broker: &Broker, count: usize) -> anyhow::Result<usize> {
        let topic = self.topic;
        match self.source {
            Source::Log(from) => redeliver(broker, &topic, &from, count).await,
            Source::Tap { group, mut sub } => {
                let mut picked: Vec<OutgoingMessage> = Vec::with_capacity(count);
                let until = Instant::now() + TAP_WAIT;
                while picked.len() < count && Instant::now() < until {
                    let records = sub
                        .poll(count - picked.len(), Duration::from_millis(200))
                        .await?;
                    picked.extend(records.into_iter().map(|r| OutgoingMessage {
                        topic: r.topic,
                        key: r.key,
                        headers: r.headers,
                        payload: r.payload,
                    }));
                }
                sub.close().await?;
                broker.publisher().publish(&picked).await?;
                remove_tap(broker, &group, &topic).await?;
                Ok(picked.len())
            }
        }
    }

    /// Removes the tap, when there is one, without publishing anything.
    pub async fn discard(self, broker: &Broker) -> anyhow::Result<()> {
        if let Source::Tap { group, mut sub } = self.source {
            sub.close().await?;
            remove_tap(broker, &group, &self.topic).await?;
        }
        Ok(())
    }
}

async fn remove_tap(broker: &Broker, group: &str, topic: &str) -> anyhow::Result<()> {
    if let Some(amqp) = broker.as_amqp() {
        amqp.delete_group(group, topic).await?;
    }
    Ok(())
}

/// Publishes again up to `count` records of `topic` written during this run (from the
/// per-partition offsets in `from`, the ends before the run; partitions not listed start at
/// 0), taken round-robin across partitions from the oldest, with their original key, headers
/// and payload. Returns how many.
pub async fn redeliver(
    broker: &Broker,
    topic: &str,
    from: &[(u32, i64)],
    count: usize,
) -> anyhow::Result<usize> {
    if count == 0 {
        return Ok(0);
    }
    let start = |partition: u32| {
        from.iter()
            .find(|(p, _)| *p == partition)
            .map_or(0, |(_, offset)| *offset)
    };
    let written: Vec<(u32, i64)> = broker
        .end_offsets(topic)
        .await?
        .into_iter()
        .filter(|(partition, end)| *end > start(*partition))
        .collect();
    let per_partition = count.div_ceil(written.len().max(1));
    let mut picked: Vec<OutgoingMessage> = Vec::with_capacity(count);
    for (partition, _) in &written {
        let records = broker
            .read(topic, *partition, start(*partition), per_partition)
            .await?;
        picked.extend(records.into_iter().map(|r| OutgoingMessage {
            topic: r.topic,
            key: r.key,
            headers: r.headers,
            payload: r.payload,
        }));
    }
    picked.truncate(count);
    broker.publisher().publish(&picked).await?;
    Ok(picked.len())
}
