//! The engine's in-process tests: relay, worker, dead letters, request/reply, sagas and the
//! database seam on memory, SQLite and PostgreSQL, with crash tests that re-run this binary as a
//! child.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

#[path = "../dlq_support/mod.rs"]
mod dlq_support;
#[path = "../support/mod.rs"]
mod support;

mod crash;
mod db;
mod db_write_batch;
mod dlq;
mod dlq_replay;
mod idempotent;
mod once_all;
mod outbox_notify;
mod relay;
mod relay_clock_skew;
mod relay_crash;
mod relay_pipeline;
mod relay_refused;
mod relay_rounds;
mod relay_sources;
mod rpc_batches;
mod saga;
mod saga_batch;
mod store;
mod trace;
mod trace_hook;
mod transition;
mod wal_relay;
mod worker;
mod worker_faults;
mod worker_held;
mod worker_keys;
mod worker_keys_faults;
mod worker_keys_measure;
mod worker_only_group;
mod worker_ordered;
mod worker_retry_topic;
