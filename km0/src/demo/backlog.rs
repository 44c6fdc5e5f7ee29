//! What km0's consumer groups have not consumed yet, and what they set aside, over every
//! group and topic km0 runs: offsets behind the end on a log (the transport's own or
//! Kafka), messages ready or unacknowledged in the groups' queues on RabbitMQ.

use entrega_core::group_lag;

use crate::wiring::{groups, Broker};

/// Messages not consumed and messages dead-lettered, summed over km0's groups.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Records (or queued messages) some group has not consumed yet.
    pub unconsumed: u64,
    /// Messages in the groups' dead-letter topics (or queues).
    pub dead_letters: u64,
    /// Each dead-letter topic (or queue) holding any, with how many.
    pub dead_letters_in: Vec<(String, u64)>,
}

impl Backlog {
    /// The dead-letter places that hold more than they did in `before`, with how many more.
    pub fn new_dead_letters(&self, before: &Self) -> Vec<(String, u64)> {
        self.dead_letters_in
            .iter()
            .filter_map(|(place, n)| {
                let was = before
                    .dead_letters_in
                    .iter()
                    .find(|(p, _)| p == place)
                    .map_or(0, |(_, n)| *n);
                (*n > was).then(|| (place.clone(), n - was))
            })
            .collect()
    }

    fn dead_letters_at(&mut self, place: String, n: u64) {
        if n > 0 {
            self.dead_letters += n;
            self.dead_letters_in.push((place, n));
        }
    }
}

impl Backlog {
    /// Reads the backlog of every consumer group km0's components own ([`groups`]: each
    /// group and the topic it consumes, whatever the broker).
    pub async fn read(broker: &Broker) -> anyhow::Result<Self> {
        let mut backlog = Self::default();
        if let Some(amqp) = broker.as_amqp() {
            for owned in groups() {
                let names = amqp.group_queues(owned.group, owned.topic);
                let mut queues = names.queues();
                let dead_letter_queue = names.dead_letter_queue();
                queues.push(dead_letter_queue.clone());
                let depths = amqp.queue_depths(&queues).await?;
                for (n, depth) in depths.iter().enumerate() {
                    let held = depth.ready + depth.unacked.unwrap_or(0);
                    if n + 1 == depths.len() {
                        backlog.dead_letters_at(dead_letter_queue.clone(), held);
                    } else {
                        backlog.unconsumed += held;
                    }
                }
            }
            return Ok(backlog);
        }
        let inspector = broker.inspector();
        // One group's committed offsets are a round trip to its coordinator on Kafka: ask
        // for all at once.
        let lags = futures::future::try_join_all(
            groups()
                .into_iter()
                .map(|owned| group_lag(inspector.as_ref(), owned.group, owned.topic)),
        )
        .await?;
        for partition in lags.iter().flatten() {
            backlog.unconsumed += u64::try_from(partition.lag()).unwrap_or(0);
        }
        let mut topics: Vec<&str> = Vec::new();
        for owned in groups() {
            if !topics.contains(&owned.topic) {
                topics.push(owned.topic);
            }
        }
        for topic in topics {
            let place = format!("{topic}.dlq");
            let n = broker.topic_total(&place).await?;
            backlog.dead_letters_at(place, n);
        }
        Ok(backlog)
    }
}
