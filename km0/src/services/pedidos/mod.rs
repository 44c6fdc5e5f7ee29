//! `pedidos`: takes orders over HTTP and stores each with its `pedido.creado` event in one
//! transaction (transactional outbox); the relay publishes the event afterwards. With the
//! order saga on, the same transaction starts the order's saga, which pedidos orchestrates
//! ([`OrderSaga`]).
//!
//! Failpoint (crash tests, `ENTREGA_FAILPOINTS`): [`BEFORE_COMMIT`] (`pedidos.before_commit`),
//! order, lines and outbox row written, transaction not yet committed.

mod component;
mod coverage;
mod db;
mod domain;
mod http;
mod messaging;
mod orchestrator;
mod requests;
mod saga;

pub use component::{Api, OutboxRelay, API, DATABASE, RELAY};
pub use coverage::{Coverage, CoverageError, ASK_WITHIN, KEEP_FOR};
pub use db::{CreateOrderError, OrderStore, BEFORE_COMMIT};
pub use domain::{
    Address, InvalidOrder, NewOrder, Order, OrderLine, OrderState, MAX_LINES, MAX_TEXT_LEN,
};
pub use http::{
    app, openapi, ApiError, Cancelling, Cities, Created, ErrorBody, Health, OrderBody,
    PedidosState, MAX_BODY_BYTES,
};
pub use messaging::{
    order_created, order_created_in_saga, routing, AGGREGATE, ORDER_CANCELLED, ORDER_CREATED,
    ORDER_PAID, PARTITIONS, SOURCE, TOPIC,
};
pub use orchestrator::SAGA_GROUP;
pub use saga::{OrderSaga, SagaTimings, SAGA_KIND};
