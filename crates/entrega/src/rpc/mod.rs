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
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use async_trait::async_trait;
//! use entrega::rpc::{RpcClient, RpcHandler, RpcServer, RpcServerConfig};
//! use entrega::seams::RpcMessage;
//! use entrega::{shutdown_token, Broker, HandlerError};
//!
//! /// Authorises every amount up to 500 euros.
//! struct Authorise;
//!
//! #[async_trait]
//! impl RpcHandler for Authorise {
//!     async fn answer(&self, request: &RpcMessage) -> Result<Vec<u8>, HandlerError> {
//!         let body: serde_json::Value =
//!             serde_json::from_slice(&request.payload).map_err(HandlerError::permanent)?;
//!         let granted = body["importe_centimos"].as_i64().is_some_and(|c| c <= 50_000);
//!         Ok(serde_json::json!({ "autorizado": granted }).to_string().into_bytes())
//!     }
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = Broker::connect("sqlite://data/broker.db", Duration::from_secs(10)).await?;
//! let server = RpcServer::new(
//!     broker.rpc(6),
//!     Arc::new(Authorise),
//!     RpcServerConfig::new("pagos.autorizaciones"),
//! );
//! let stop = shutdown_token();
//! tokio::spawn(async move { server.run(stop).await });
//!
//! let client = RpcClient::start(broker.rpc(6)).await?;
//! let request = br#"{"pedido_id": "P-1", "importe_centimos": 1450}"#.to_vec();
//! let reply = client
//!     .call("pagos.autorizaciones", request, Duration::from_secs(5))
//!     .await?;
//! # let _ = reply;
//! # Ok(()) }
//! ```

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
