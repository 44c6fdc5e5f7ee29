//! entrega on Kafka: the conformance suites and broker round trips on Apache Kafka, rebalancing,
//! transactions, and faults on librdkafka's mock cluster.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

#[path = "../support/mod.rs"]
mod support;

mod broker;
mod conformance;
mod mock_cluster;
mod rebalance;
mod subscription;
mod transactions;
