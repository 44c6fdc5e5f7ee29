//! Request/reply over messaging: a requester sends a request with `reply_to` and
//! `correlation_id` and waits, with a timeout, for the reply; servers compete for the request
//! queue and answer each request once, by its key, with the stored answer on a repeat.
//!
//! - [`RpcClient`]: many calls in flight on one private reply queue, each with its own
//!   timeout; a reply that comes after its call gave up is counted and dropped, and the
//!   call's entry is gone already (nothing grows with timed-out calls).
//! - [`RpcServer`]: requests handled in batches (the requests waiting when a lane is free),
//!   each acknowledged only after its answer was sent (a crash before that redelivers it),
//!   transient failures given back, permanent ones answered with an error body.
//! - [`StoredAnswers`]: the idempotent handler, the answer stored with the effect in one
//!   transaction, by the request's own key; a batch is applied in one transaction.
//! - [`DurableRequester`]: the durable mode, requests recorded in the requester's database and
//!   replies applied through its inbox from a durable queue, so a requester killed with calls
//!   in flight applies every reply once after its restart.
//!
//! The transport is RabbitMQ ([`entrega_amqp::AmqpRpc`](https://docs.rs/entrega-amqp), the
//! seed's queues and properties) or any log ([`LogRpc`]), so the embedded default needs no
//! broker: [`crate::Broker::rpc`] picks it.

mod client;
mod durable;
mod lanes;
mod log;
mod server;
mod stored;

pub use client::{RpcClient, RpcClientStats, RpcError};
pub use durable::{DurableConfig, DurableRequester, DurableStats, PendingRequest, ReplyHandler};
pub use log::{LogRpc, CORRELATION_ID, EXPIRES_AT, REPLY_TO};
pub use server::{RpcHandler, RpcServer, RpcServerConfig, RpcServerStats, RPC_ERROR};
pub use stored::{AnswerInTx, StoredAnswerStats, StoredAnswers, Writes};
