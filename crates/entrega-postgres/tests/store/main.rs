//! entrega on PostgreSQL: connecting, session limits, error classification and TLS. (The
//! stores and their migrations are tested through `entrega::Db` in
//! `crates/entrega/tests/engine/store/`.)

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

#[path = "../common/mod.rs"]
mod common;

mod connect;
mod tls;
