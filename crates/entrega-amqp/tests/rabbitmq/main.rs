//! entrega on RabbitMQ: confirmed publishing, subscriptions with native dead letters, competing
//! consumers and request/reply acknowledgements.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod competing;
mod publisher;
mod rpc_acks;
mod subscription;
