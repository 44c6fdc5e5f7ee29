//! entrega on SQLite: the store conformance suites, outbox, inbox, log transport, dead letters,
//! migrations, and writers in several processes (this binary re-run as children).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

#[path = "../common/mod.rs"]
mod common;

mod concurrent_writers;
mod conformance;
mod dlq;
mod log;
mod migrations;
