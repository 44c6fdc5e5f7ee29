//! Dead letters and delayed retries in a group's own queues (see [`crate::topology`]).

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{OutgoingMessage, SideQueues, TransportError};
use tokio::sync::Mutex;

use crate::layout::{wait_level, wait_ms, GroupQueues};
use crate::link::Amqp;
use crate::publisher::{shard_of, AmqpPublisher, Routed};
use crate::topology::{declare_group, declare_wait_queue};

/// [`SideQueues`] on RabbitMQ.
///
/// A dead letter is published (confirmed, `mandatory`) to the dead-letter exchange with the
/// group's base name as its key, so it lands in `<base>.dlq` with its `intentos` and `motivo`
/// headers, which a plain reject would not carry. A delayed retry is published to the
/// group's wait exchange with key `<wait ms>.<shard>`: it sits in the wait queue of the first
/// level at least as long as its delay, then expires back into the queue of its shard.
pub struct AmqpSideQueues {
    amqp: Amqp,
    publisher: AmqpPublisher,
    /// Wait queues declared by this handle, as (base, level).
    waits: Mutex<HashSet<(String, u32)>>,
}

impl std::fmt::Debug for AmqpSideQueues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpSideQueues").finish_non_exhaustive()
    }
}

impl AmqpSideQueues {
    /// Side queues on `amqp`'s connection, publishing on a confirm channel of their own.
    pub fn new(amqp: Amqp) -> Self {
        Self {
            publisher: AmqpPublisher::new(amqp.clone()),
            amqp,
            waits: Mutex::default(),
        }
    }

    /// Publishes `batch`; when nothing was bound to take a message (the group's queues were
    /// deleted meanwhile), declares the group again and publishes once more.
    async fn publish(&self, q: &GroupQueues, batch: &[Routed<'_>]) -> Result<(), TransportError> {
        match self.publisher.publish_routed(batch).await {
            Err(TransportError::Rejected { .. } | TransportError::UnknownTopic { .. }) => {
                self.declare(q).await?;
                self.waits.lock().await.retain(|(base, _)| base != &q.base);
                self.declare_waits(q, batch).await?;
                self.publisher.publish_routed(batch).await
            }
            outcome => outcome,
        }
    }

    async fn declare(&self, q: &GroupQueues) -> Result<(), TransportError> {
        let channel = self.amqp.channel().await?;
        let declared = declare_group(&channel, q).await;
        let _ = channel.close(200, "entrega: declared".into()).await;
        declared
    }

    /// Declares the wait queues `batch` goes through that this handle has not declared yet.
    async fn declare_waits(
        &self,
        q: &GroupQueues,
        batch: &[Routed<'_>],
    ) -> Result<(), TransportError> {
        let mut waits = self.waits.lock().await;
        let mut missing: Vec<u32> = batch
            .iter()
            .filter_map(|r| level_of_key(&r.routing_key))
            .filter(|l| !waits.contains(&(q.base.clone(), *l)))
            .collect();
        missing.sort_unstable();
        missing.dedup();
        if missing.is_empty() {
            return Ok(());
        }
        let channel = self.amqp.channel().await?;
        let mut outcome = Ok(());
        for level in missing {
            outcome = declare_wait_queue(&channel, q, level).await;
            if outcome.is_err() {
                break;
            }
            waits.insert((q.base.clone(), level));
        }
        let _ = channel.close(200, "entrega: declared".into()).await;
        outcome
    }
}

/// The level of a wait routing key `<ms>.<shard>`.
fn level_of_key(key: &str) -> Option<u32> {
    let ms: u64 = key.split('.').next()?.parse().ok()?;
    (0..crate::layout::WAIT_LEVELS).find(|&l| wait_ms(l) == ms)
}

#[async_trait]
impl SideQueues for AmqpSideQueues {
    async fn dead_letter(
        &self,
        group: &str,
        topic: &str,
        letters: &[OutgoingMessage],
    ) -> Result<(), TransportError> {
        let q = self.amqp.group_queues(group, topic);
        let routed: Vec<Routed<'_>> = letters
            .iter()
            .map(|message| Routed {
                exchange: q.dead_letter_exchange.clone(),
                routing_key: q.base.clone(),
                message,
            })
            .collect();
        self.publish(&q, &routed).await
    }

    async fn delay(
        &self,
        group: &str,
        topic: &str,
        messages: &[(OutgoingMessage, Duration)],
    ) -> Result<(), TransportError> {
        let q = self.amqp.group_queues(group, topic);
        let routed: Vec<Routed<'_>> = messages
            .iter()
            .map(|(message, delay)| Routed {
                exchange: q.wait_exchange(),
                routing_key: format!(
                    "{}.{}",
                    wait_ms(wait_level(*delay)),
                    shard_of(message, q.shards)
                ),
                message,
            })
            .collect();
        self.declare_waits(&q, &routed).await?;
        self.publish(&q, &routed).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_keys_name_their_level() {
        assert_eq!(level_of_key("800.3"), Some(3));
        assert_eq!(level_of_key("100.0"), Some(0));
        assert_eq!(level_of_key("801.0"), None);
        assert_eq!(level_of_key("x.0"), None);
    }
}
