//! Kilómetro Cero (km0): the reference order/inventory system built on entrega.
//!
//! `pedidos` stores orders and their events in one transaction (outbox); the relay publishes
//! them to the broker (the log transport in a database, or Kafka); `inventario` takes the stock once per event (idempotent
//! consumer). Each runs in its own process (`km0 run ...`) or all together (`km0 up`,
//! `km0 demo`).

pub mod bench;
pub mod broker;
pub mod cli;
pub mod config;
mod consumers;
pub mod demo;
pub mod dlq;
pub mod lag;
pub mod outbox_cli;
mod schema;
pub mod services;
mod system;
pub mod wiring;
