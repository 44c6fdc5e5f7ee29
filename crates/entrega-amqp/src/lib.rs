//! entrega on RabbitMQ, through lapin.
//!
//! A topic `T` is a durable fanout exchange; a message's routing key is its shard, computed
//! from its partitioning key (`agregado_id`) with Kafka's placement. Consumer group `G` binds
//! its own direct exchange `G.T` to it, and that exchange routes shard `i` to the group's
//! queue `G.T.i`: one key always lands in the same shard, in order, and each shard queue (a
//! quorum queue) has a single active consumer, so one key's messages are handled one after
//! the other whatever the number of members.
//! Publishing is confirmed and `mandatory`: [`AmqpPublisher`] returns `Ok` only once the
//! broker confirmed every message of the batch *and* routed it to at least one queue; a
//! message the broker acknowledges but returns as unroutable (`basic.return`, 312 NO_ROUTE)
//! is a failure, as a relay must not mark a row that reached no queue.
//!
//! The connection is our own: [`Amqp`] connects with a timeout and, after any connection or
//! channel failure, opens a new one on the next use, waiting a capped, jittered backoff
//! between attempts, rather than relying on lapin's automatic recovery.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use entrega_core::{Headers, OutgoingMessage};
//!
//! let config = entrega_amqp::AmqpConfig::from_url("amqp://guest:guest@127.0.0.1:5672")?;
//! let amqp = entrega_amqp::Amqp::connect(config);
//! amqp.admin().ensure_topic("pedidos.eventos", 6).await?;
//! amqp.publisher().publish(&[OutgoingMessage {
//!     topic: "pedidos.eventos".into(),
//!     key: Some("P-1".into()),
//!     headers: Headers::new().with("tipo", "pedido.creado"),
//!     payload: br#"{"id_evento":"..."}"#.to_vec(),
//! }]).await?;
//! # Ok(()) }
//! ```

mod admin;
mod config;
mod dead_letters;
mod depth;
mod error;
mod in_order;
mod inspector;
mod layout;
mod link;
mod presence;
mod properties;
mod publisher;
mod rpc;
mod side;
mod subscription;
pub mod topology;

pub use admin::AmqpAdmin;
pub use config::{AmqpConfig, AmqpUrlError, ManagementApi};
pub use dead_letters::{LetterSession, QueuedLetter, MAX_SESSION};
pub use depth::QueueDepth;
pub use error::classify;
pub use inspector::AmqpInspector;
pub use layout::{
    wait_level, wait_ms, GroupQueues, GroupSpec, QueueLayout, WAIT_BASE_MS, WAIT_LEVELS,
};
pub use link::{Amqp, RemovedNames};
pub use presence::presence_exchange;
pub use properties::{delivery_headers, delivery_key, KEY_HEADER};
pub use publisher::AmqpPublisher;
pub use rpc::AmqpRpc;
pub use side::AmqpSideQueues;
pub use subscription::{AmqpSubscriber, AmqpSubscription};
