//! entrega on PostgreSQL: its migration runner and migration sets, and TLS. (The stores
//! themselves are tested through `entrega::Db` in `crates/entrega/tests/engine/store/`.)

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

#[path = "../common/mod.rs"]
mod common;

mod dlq;
mod migrations;
mod tls;
