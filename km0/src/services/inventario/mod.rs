//! `inventario`: takes stock for every `pedido.creado`, exactly once per event (idempotent
//! consumer: the key and the effect share one transaction).

mod db;
mod domain;
mod messaging;

pub use db::{ApplyError, BatchItem, StockStore};
pub use domain::{PlacedOrder, StockError, StockLine, INITIAL_STOCK};
pub use messaging::{ConsumerStats, StatsSnapshot, StockConsumer, CONSUMER, GROUP, TOPIC};
