//! `inventario`: takes stock for every `pedido.creado`, exactly once per event (idempotent
//! consumer: the key and the effect share one transaction), and reserves and releases stock
//! for the order saga (idempotent by `id_reserva`). Every stock change writes
//! `stock.actualizado` to its outbox in the same transaction (the seed's exercise 2).
//!
//! Failpoint (crash tests, `ENTREGA_FAILPOINTS`): [`BEFORE_COMMIT`] (`inventario.before_commit`),
//! stock updated and key claimed, transaction not yet committed.

mod batch_plan;
mod commands;
mod component;
mod db;
mod domain;
mod messaging;
mod pg_batch;
mod reservations;
mod set_batch;
mod stock_moves;

pub use commands::{CommandConsumer, COMMANDS_CONSUMER, COMMANDS_GROUP};
pub use component::{routing, Inventario, COMPONENT, DATABASE, SOURCE};
pub use db::{reservation_id, ApplyError, BatchItem, BatchMode, StockStore, BEFORE_COMMIT};
pub use domain::{PlacedOrder, StockError, StockLine, INITIAL_STOCK};
pub use messaging::{ConsumerStats, StatsSnapshot, StockConsumer, CONSUMER, GROUP, TOPIC};
pub use reservations::{
    release_answer, reservation_answer, stock_updated, Motive, ReleaseCommand, ReservationState,
    ReserveCommand, COMMANDS_TOPIC, EVENTS_TOPIC, REFUSED, RELEASE, RELEASED,
    RESERVATION_AGGREGATE, RESERVE, RESERVED, STOCK_AGGREGATE, STOCK_UPDATED,
};
pub use stock_moves::{Released, Reserved, StoredReservation};
