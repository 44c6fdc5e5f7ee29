//! `inventario`: takes stock for every `pedido.creado`, exactly once per event (idempotent
//! consumer: the key and the effect share one transaction).
//!
//! Failpoint (crash tests, `ENTREGA_FAILPOINTS`): [`BEFORE_COMMIT`] (`inventario.before_commit`),
//! stock updated and key claimed, transaction not yet committed.

mod db;
mod domain;
mod messaging;
mod pg_batch;

pub use db::{ApplyError, BatchItem, StockStore, BEFORE_COMMIT};
pub use domain::{PlacedOrder, StockError, StockLine, INITIAL_STOCK};
pub use messaging::{ConsumerStats, StatsSnapshot, StockConsumer, CONSUMER, GROUP, TOPIC};
