//! Kilómetro Cero (km0): the reference order/inventory system built on entrega.
//!
//! `pedidos` stores orders and their events in one transaction (outbox); the relay publishes
//! them to the broker (the log transport in a database, or Kafka); `inventario` takes the
//! stock once per event (idempotent consumer). Each runs in its own process (`km0 run ...`)
//! or all together (`km0 up`, `km0 demo`).
//!
//! - [`services`]: one folder per service, its rules, database, API and events.
//! - [`wiring`]: the deployment's databases and broker, and starting components.
//! - [`ops`]: the operator's commands, and [`console`]: the web console.
//! - [`telemetry`]: trace context over HTTP and the export of spans (OTLP).
//! - [`cli`]: the command line that drives all of it.
//! - [`demo`] and [`bench`]: the guided demo and the benchmarks, apart from the services.

pub mod bench;
pub mod cli;
pub mod console;
pub mod contracts;
pub mod demo;
pub mod lab;
pub mod ops;
pub mod services;
pub mod telemetry;
pub mod wiring;
