//! Redelivery on purpose: the demo publishes some already-delivered messages a second time,
//! byte for byte (same `id_evento`), as a relay that died between publish and mark would.
//! Each consumer must recognise every one as a duplicate and change nothing: the stock
//! consumer its orders, the saga's participants their commands (every compensation among
//! them: a refund delivered twice must leave the balance as it was), the orchestrator its
//! replies.
//!
//! On a log the demo reads the messages back from the run's start offsets. A RabbitMQ queue
//! forgets what was acked, so there the demo subscribes a tap group of its own before the run:
//! the topic's fanout exchange gives it a copy of every message, which it publishes again.

use std::time::{Duration, Instant};

use entrega_core::headers::TIPO;
use entrega_core::{OutgoingMessage, Record, Subscription};

use crate::wiring::Broker;

/// Longest wait for the tap's copies.
const TAP_WAIT: Duration = Duration::from_secs(10);
/// A tap that hands over nothing for this long has handed over everything.
const TAP_QUIET: Duration = Duration::from_millis(500);

/// Where the demo takes the messages of one topic it publishes again.
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

/// Which messages of a topic to publish again.
#[derive(Debug, Clone, Copy)]
pub struct Pick<'a> {
    /// The run's first this many (round-robin across partitions on a log, in arrival order
    /// from a tap).
    pub first: usize,
    /// And every message of the run of these types (`tipo`), wherever it is.
    pub every: &'a [&'a str],
}

impl Pick<'_> {
    /// The first `n`, nothing more.
    pub fn first(n: usize) -> Pick<'static> {
        Pick {
            first: n,
            every: &[],
        }
    }

    fn wants_all(&self) -> bool {
        !self.every.is_empty()
    }

    /// Chooses from the run's messages, in the order given.
    fn choose(&self, records: Vec<Record>) -> Vec<OutgoingMessage> {
        let mut taken = 0;
        records
            .into_iter()
            .filter(|r| {
                let of_type = r
                    .headers
                    .get(TIPO)
                    .is_some_and(|kind| self.every.contains(&kind));
                let first = taken < self.first;
                if first {
                    taken += 1;
                }
                first || of_type
            })
            .map(|r| OutgoingMessage {
                topic: r.topic,
                key: r.key,
                headers: r.headers,
                payload: r.payload,
            })
            .collect()
    }
}

impl Replayable {
    /// Marks where this run starts on `topic` of `broker`: the topic's ends on a log, a
    /// new tap group (named after `run` and the topic) on RabbitMQ.
    pub async fn open(broker: &Broker, run: &str, topic: &str) -> anyhow::Result<Self> {
        let source = if !broker.has_offsets() {
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

    /// Publishes again the messages of this run that `pick` names; a tap is then removed.
    /// Returns how many.
    pub async fn redeliver(self, broker: &Broker, pick: Pick<'_>) -> anyhow::Result<usize> {
        let topic = self.topic;
        let records = match self.source {
            Source::Log(from) => {
                let limit = (!pick.wants_all()).then_some(pick.first);
                read_run(broker, &topic, &from, limit).await?
            }
            Source::Tap { group, mut sub } => {
                let records = drain_tap(sub.as_mut(), pick).await?;
                sub.close().await?;
                remove_tap(broker, &group, &topic).await?;
                records
            }
        };
        let picked = pick.choose(records);
        broker.publisher().publish(&picked).await?;
        Ok(picked.len())
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

/// The tap's copies: the first `pick.first`, or all of them when `pick` wants every message
/// of some types (until the tap is quiet).
async fn drain_tap(sub: &mut dyn Subscription, pick: Pick<'_>) -> anyhow::Result<Vec<Record>> {
    let mut records: Vec<Record> = Vec::new();
    let until = Instant::now() + TAP_WAIT;
    let mut quiet_since = Instant::now();
    loop {
        let enough = !pick.wants_all() && records.len() >= pick.first;
        let quiet = pick.wants_all() && quiet_since.elapsed() >= TAP_QUIET;
        if enough || quiet || Instant::now() >= until {
            return Ok(records);
        }
        let batch = sub.poll(256, Duration::from_millis(100)).await?;
        if !batch.is_empty() {
            quiet_since = Instant::now();
        }
        records.extend(batch);
    }
}

async fn remove_tap(broker: &Broker, group: &str, topic: &str) -> anyhow::Result<()> {
    Ok(broker.delete_group(group, topic).await?)
}

/// The records of `topic` written during this run (from the per-partition offsets in `from`,
/// the ends before the run; partitions not listed start at 0), at most `limit` taken
/// round-robin across partitions from the oldest, or all of them.
async fn read_run(
    broker: &Broker,
    topic: &str,
    from: &[(u32, i64)],
    limit: Option<usize>,
) -> anyhow::Result<Vec<Record>> {
    if limit == Some(0) {
        return Ok(Vec::new());
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
    let per_partition = match limit {
        Some(n) => n.div_ceil(written.len().max(1)),
        None => usize::MAX,
    };
    let mut records: Vec<Record> = Vec::new();
    for (partition, end) in &written {
        let first = start(*partition);
        let wanted = per_partition.min(usize::try_from(end - first).unwrap_or(usize::MAX));
        records.extend(broker.read(topic, *partition, first, wanted).await?);
    }
    if let Some(n) = limit {
        records.truncate(n);
    }
    Ok(records)
}
