//! entrega on PostgreSQL: the store conformance suites, outbox, inbox, log transport and its
//! groups, dead letters, migrations, the seed's tables and TLS.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

#[path = "../common/mod.rs"]
mod common;

mod conformance;
mod dlq;
mod log;
mod log_groups;
mod migrations;
mod tls;
