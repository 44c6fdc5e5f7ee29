//! Topics as durable fanout exchanges; each consumer group hangs its own exchange and shard
//! queues off one (see [`crate::topology`]).

use async_trait::async_trait;
use entrega_core::{TopicAdmin, TransportError};
use lapin::options::ExchangeDeclareOptions;
use lapin::types::FieldTable;
use lapin::ExchangeKind;

use crate::error::{classify, short};
use crate::link::{Amqp, Kind};

/// [`TopicAdmin`] on RabbitMQ: a topic is a durable `fanout` exchange, so every consumer
/// group bound to it gets every message. Its partitions are the shard queues each group binds
/// (through its own exchange): [`AmqpConfig::shards`](crate::AmqpConfig) of them for every
/// topic, which `ensure_topic` returns whatever count it is asked for, as Kafka returns an
/// existing topic's count.
#[derive(Debug, Clone)]
pub struct AmqpAdmin {
    amqp: Amqp,
}

impl AmqpAdmin {
    /// Topic creation on `amqp`'s connection.
    pub fn new(amqp: Amqp) -> Self {
        Self { amqp }
    }
}

#[async_trait]
impl TopicAdmin for AmqpAdmin {
    async fn ensure_topic(&self, topic: &str, partitions: u32) -> Result<u32, TransportError> {
        let topic = &self.amqp.wire(Kind::Exchange, topic);
        let channel = self.amqp.channel().await?;
        let declared = channel
            .exchange_declare(
                short("topic", topic)?,
                ExchangeKind::Fanout,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(classify);
        let _ = channel.close(200, "entrega: declared".into()).await;
        let _ = partitions;
        declared.map(|()| self.amqp.config().shards)
    }
}
