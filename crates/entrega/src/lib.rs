//! The entrega engine: the [`Relay`] that publishes the transactional outbox and the
//! [`Worker`] that consumes a topic through classified outcomes (ack, retry with backoff,
//! dead letter). The database is one handle for SQLite and PostgreSQL ([`Db`], [`Tx`]), the
//! broker one for the log transport in a database and Kafka ([`Broker`]); both are chosen at
//! run time from their URLs. Underneath, everything works through the small traits of
//! `entrega-core`, so another backend plugs in the same way.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use entrega::{
//!     shutdown_token, Broker, Db, Handler, Relay, RelayConfig, Router, SystemClock,
//!     TopicRouting, Worker, WorkerConfig,
//! };
//!
//! # async fn run(take_stock: Arc<dyn Handler>) -> Result<(), Box<dyn std::error::Error>> {
//! let db = Db::connect("sqlite://data/pedidos.db").await?;
//! let broker = Broker::connect("sqlite://data/broker.db", Duration::from_secs(10)).await?;
//! let routing = TopicRouting::new().route("pedido", "pedidos.eventos");
//! let relay = Relay::new(db.outbox(), broker.publisher(), Arc::new(SystemClock),
//!                        RelayConfig::new("pedidos", routing));
//! let router = Router::new().route("pedido.creado", take_stock);
//! let worker = Worker::new(broker.subscriber(), broker.publisher(), router,
//!                          WorkerConfig::new("inventario", "pedidos.eventos"));
//! let shutdown = shutdown_token();
//! let (relayed, consumed) = tokio::join!(relay.run(shutdown.clone()), worker.run(shutdown));
//! relayed?;
//! consumed?;
//! # Ok(()) }
//! ```
//!
//! `cargo run -p entrega --example sqlite` (or `postgres`) runs the whole round trip: orders
//! with their events in one transaction, the relay, an idempotent consumer and a redelivery.

mod backoff;
pub mod broker;
pub mod cloudevents;
pub mod db;
pub mod dlq;
mod idempotent;
pub mod metrics;
mod once_all;
mod relay;
mod relay_config;
pub mod rpc;
pub mod saga;
mod shutdown;
mod store;
pub mod trace;
mod wal_relay;
mod worker;

pub use backoff::Backoff;
pub use broker::{Broker, BrokerError};
pub use db::{Db, Tx};
/// Named failure points for crash tests (defined in `entrega-core`, so every crate's engine
/// code can pass them).
pub use entrega_core::failpoint;
pub use idempotent::{Apply, Idempotent, IdempotentStats};
pub use once_all::{apply_all_or_each, ApplyAll, ClaimedBatch};
pub use relay::{Relay, RelayError};
pub use relay_config::{OutboxPorts, RelayConfig, RelayStats, TopicRouting};
pub use shutdown::{shutdown_token, signal};
pub use wal_relay::{SlotGauges, WalConfig, WalError, WalRelay};
pub use worker::{
    handle_each, Handler, Message, RetryStrategy, Router, Worker, WorkerConfig, WorkerError,
    WorkerStats, DEFAULT_MAX_BATCH,
};

pub use tokio_util::sync::CancellationToken;

/// Event contracts: typed events, their schemas, compatibility checks, upcasting.
pub use entrega_contracts as contracts;
pub use entrega_contracts::{Catalog, Compatibility, Event, Transitions, Upcasters, View};

/// The README's code, compiled with the crate's doctests so its quickstart keeps working.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

// The vocabulary a service speaks, so it needs only this crate: events and messages, what a
// handler answers, the errors of the seams, time, entrega's migration sets, trace context.
pub use entrega_core::headers;
pub use entrega_core::{
    now_ms, Clock, ContractError, DeadClass, DeadReason, Envelope, EnvelopeError, ErrorClass,
    HandlerError, Headers, Limits, ManualClock, MigrationSet, NewEvent, OutgoingMessage, Processed,
    RawJson, Record, ReplayKey, StoreError, SystemClock, TraceContext, TransportError, TRACEPARENT,
};

/// The seams between the engine and what it runs on: transports (publish, subscribe, topic
/// admin, inspection, request/reply, side queues), the outbox's ports (lane leases, pending
/// rows, maintenance, wake-up) and the consumer's stores (parking, dead-letter marks, held
/// letters). What a new backend implements; an application rarely names them.
pub mod seams {
    pub use entrega_core::migration::{Migration as BackendMigration, Step as MigrationStep};
    pub use entrega_core::{
        fair_share, group_lag, lane_of, partition_for, plan_balance, BalancePlan, BlockedRow,
        DeadLetterId, DeadLetterMark, DeadLetterState, DlqAction, DlqAuditEntry, DlqStore, HeldId,
        HeldLetter, HeldLetterStore, Holder, LaneCursor, LaneLease, LaneLeases, LaneMark, LaneRows,
        LogInspector, OutboxMaintenance, OutboxReader, OutboxRow, OutboxStatus, OutboxWakeup,
        ParkedAt, ParkedRecord, ParkingStore, PartitionLag, Publisher, Refusal, ReleaseError,
        RpcDelivery, RpcInbox, RpcMessage, RpcTransport, SideQueues, SlotLease, Subscriber,
        Subscription, TopicAdmin, LANES,
    };
}
