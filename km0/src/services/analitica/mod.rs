//! `analitica`: sales per market from the orders' events, exactly once, with Kafka
//! transactions (the seed's "Kafka → Kafka" case). It reads `pedidos.eventos` and writes
//! `analitica.ventas` through `entrega_kafka::KafkaTransformer`: the sales of a batch and the
//! group's offsets for it commit together, so a `read_committed` reader counts each order once
//! however often analitica dies. It has no database and needs a Kafka broker.
//!
//! The same trick cannot make inventario's stock update exactly-once: the update is a
//! PostgreSQL transaction, and no Kafka transaction can include it. Between the database
//! commit and the offset commit there is always a moment to die in, which is why inventario
//! records each event's key in the same database transaction (the idempotent inbox).

mod component;
mod domain;
mod messaging;

pub use component::{Analitica, COMPONENT};
pub use domain::{per_market, MarketSales, Sale, SaleError};
pub use messaging::{SalesTransform, GROUP, MARKET_SALES, OUTPUT_PARTITIONS, OUTPUT_TOPIC, SOURCE};
