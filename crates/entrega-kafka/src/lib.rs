//! The Kafka transport of entrega, on librdkafka (`rdkafka`).
//!
//! [`Kafka`] is a cheap-clone handle over one cluster, built from a [`KafkaConfig`] (or a
//! `kafka://host:port?...` URL). It hands out the `entrega-core` seams:
//!
//! - [`KafkaPublisher`]: an idempotent producer (`acks=all`, Java-compatible `murmur2_random`
//!   placement); `publish` returns only after every message of the batch is acknowledged.
//! - [`KafkaSubscriber`] / [`KafkaSubscription`]: one consumer per group member, dynamic
//!   membership, cooperative-sticky rebalancing, offsets committed only explicitly.
//! - [`KafkaAdmin`]: topic creation that waits until the topic is usable.
//! - [`KafkaInspector`]: end offsets, committed offsets and direct reads, without joining
//!   any group.
//! - [`KafkaTransformer`]: read-process-write inside Kafka transactions (a [`Transform`]'s
//!   output and the group's offsets commit together), for pipelines from Kafka to Kafka.
//!
//! Closing a subscription leaves its group within a bounded time; rust-rdkafka then logs one
//! expected `ERROR rdkafka::consumer::base_consumer: Failed to close consumer queue on drop`
//! per consumer (see `KafkaSubscription::close`): filter that target's ERROR level to keep
//! clean shutdowns quiet.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use entrega_kafka::{Kafka, KafkaConfig};
//!
//! let kafka = Kafka::connect(KafkaConfig::from_url("kafka://127.0.0.1:9092")?)?;
//! let partitions = kafka.admin().ensure_topic("pedidos.eventos", 3).await?;
//! # let _ = partitions;
//! # Ok(())
//! # }
//! ```

mod admin;
mod assignment;
mod config;
mod error;
mod group;
mod handle;
mod inspector;
mod meta;
mod publisher;
mod record;
mod scope;
mod subscriber;
mod subscription;
mod transform;
mod transform_error;

pub use admin::{KafkaAdmin, RemovedNamespace};
pub use assignment::{assigned_partitions, subscribes_to};
pub use config::{
    KafkaConfig, KafkaUrlError, CLUSTER_SESSION_TIMEOUT, SINGLE_BROKER_SESSION_TIMEOUT,
};
pub use handle::Kafka;
pub use inspector::KafkaInspector;
pub use publisher::KafkaPublisher;
pub use subscriber::KafkaSubscriber;
pub use subscription::KafkaSubscription;
pub use transform::{KafkaTransformer, Transform, TransformStats, TransformerConfig};
pub use transform_error::TransformError;
