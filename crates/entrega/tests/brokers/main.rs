//! The engine's tests on RabbitMQ (and the delivery conformance suite on every broker): workers,
//! side queues, request/reply, durable request/reply with a killed requester.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

#[path = "../support/mod.rs"]
mod support;

mod delivery_conformance;
mod group_places;
mod rpc;
mod rpc_durable;
mod worker_amqp;
mod worker_amqp_side;
