//! km0 on Apache Kafka and RabbitMQ: end to end, competing consumers, rebalances, outages and
//! broker crashes, dead-letter tooling, sagas, and the seed's Python services.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

#[path = "../common/mod.rs"]
mod common;
mod dlq_steps;
mod interop;

mod amqp_broker_restart;
mod amqp_cluster;
mod amqp_tls;
mod cloudevents_amqp;
mod cloudevents_kafka;
mod demo_hermetic;
mod demo_saga;
mod dlq_cli;
mod dlq_cli_amqp;
mod dlq_held;
mod end_to_end_amqp;
mod end_to_end_kafka;
mod interop_python;
mod interop_python_amqp;
mod kafka_analitica;
mod kafka_broker_crash;
mod kafka_cluster;
mod kafka_competing_consumers;
mod kafka_network;
mod kafka_outage;
mod kafka_rebalance;
mod kafka_tls;
mod lag_cli;
mod no_secrets;
mod pagos;
mod reparto_failures;
mod saga_crash;
mod saga_flow;
mod saga_races;
mod schema_exercise;
