//! The entrega engine: the [`Relay`] that publishes the transactional outbox and the
//! [`Worker`] that consumes a topic through classified outcomes (ack, retry with backoff,
//! dead letter). Both work through the small traits of `entrega-core`, so any backend
//! (`entrega-sqlite`, `entrega-postgres`, ...) plugs in.
//!
//! ```ignore
//! let outbox = Arc::new(SqliteOutbox::new(pool.clone()));
//! let relay = Relay::new(OutboxPorts::new(outbox), Arc::new(log.clone()), Arc::new(SystemClock),
//!                        RelayConfig::new("pedidos"));
//! let router = Router::new().route("pedido.creado", Arc::new(DescontarStock::new(db)));
//! let worker = Worker::new(Arc::new(log.clone()), Arc::new(log.clone()), router,
//!                          WorkerConfig::new("inventario", "pedidos.eventos"));
//! let shutdown = shutdown_token();
//! tokio::try_join!(relay.run(shutdown.clone()), worker.run(shutdown))?;
//! ```

mod backoff;
pub mod dlq;
mod relay;
mod relay_config;
mod shutdown;
mod worker;

pub use backoff::Backoff;
/// Named failure points for crash tests (defined in `entrega-core`, so every crate's engine
/// code can pass them).
pub use entrega_core::failpoint;
pub use relay::{Relay, RelayError};
pub use relay_config::{OutboxPorts, RelayConfig, RelayStats, TopicRouting};
pub use shutdown::{shutdown_token, signal};
pub use worker::{
    Handler, Message, RetryStrategy, Router, Worker, WorkerConfig, WorkerError, WorkerStats,
};

/// Re-exported so handlers and wiring need only this crate.
pub use entrega_core;
pub use tokio_util::sync::CancellationToken;
