//! km0 as real processes on the embedded default and PostgreSQL: crashes at failpoints, kills,
//! restarts, the operator's commands, TLS, roles and the console.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

#[path = "../common/mod.rs"]
mod common;

mod bench_saga;
mod bench_scale;
mod chaos;
mod cli_processes;
mod console_browser;
mod console_groups;
mod crash_consumer;
mod crash_producer;
mod crash_relay;
mod dead_letter_log;
mod https;
mod least_privilege;
mod log_json;
mod openapi_operations;
mod ops_endpoint;
mod outbox_poison;
mod pagos_crash;
mod pg_failover;
mod pg_faults;
mod pg_tls;
mod readme_by_hand;
mod relay_restart;
mod schema_registry;
mod trace_order;
mod up_saga;
mod wal_relay;
