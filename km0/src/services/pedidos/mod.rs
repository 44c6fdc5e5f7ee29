//! `pedidos`: takes orders over HTTP and stores each with its `pedido.creado` event in one
//! transaction (transactional outbox); the relay publishes the event afterwards.

mod db;
mod domain;
mod http;
mod messaging;

pub use db::{CreateOrderError, OrderStore};
pub use domain::{InvalidOrder, NewOrder, Order, OrderLine, CREATED, MAX_LINES, MAX_TEXT_LEN};
pub use http::{app, ApiError, OrderBody, PedidosState, MAX_BODY_BYTES};
pub use messaging::{
    order_created, AGGREGATE, ORDER_CANCELLED, ORDER_CREATED, ORDER_PAID, PARTITIONS, SOURCE, TOPIC,
};
