//! km0's services in process: each service's rules, HTTP API and messaging on SQLite and
//! PostgreSQL, the seed's tables, the alert rules.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

#[path = "../common/mod.rs"]
mod common;

mod alert_rules;
mod catalogo_flow;
mod contracts;
mod covered_cities;
mod end_to_end;
mod http_limits;
mod inventario_batch_paths;
mod inventario_consumer;
mod inventario_reservas;
mod inventario_reservas_faults;
mod lab;
mod openapi;
mod otel_ids;
mod pagos_commands;
mod pasarela_http;
mod pasarela_refunds;
mod pedidos_http;
mod reparto_commands;
mod seed_compat;
