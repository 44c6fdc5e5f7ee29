//! The cities reparto delivers in, answered by request/reply on `reparto.cobertura`: how
//! pedidos lists them (`GET /ciudades`) without reading reparto's database.

use async_trait::async_trait;
use entrega::rpc::{RpcHandler, RpcServerConfig};
use entrega::HandlerError;
use entrega_core::RpcMessage;

use super::db::DeliveryStore;
use crate::contracts::delivery::{CoverageReply, CoverageRequest};

/// The request/reply queue of the coverage question.
pub const COVERAGE: &str = "reparto.cobertura";

/// Answers [`CoverageRequest`]s with the cities of reparto's couriers.
#[derive(Debug, Clone)]
pub struct CoverageAnswers {
    store: DeliveryStore,
}

impl CoverageAnswers {
    /// Answers from `store`.
    pub fn new(store: DeliveryStore) -> Self {
        Self { store }
    }

    /// The server's settings: one request at a time (a read of a handful of rows).
    pub fn config() -> RpcServerConfig {
        RpcServerConfig::new(COVERAGE)
    }
}

#[async_trait]
impl RpcHandler for CoverageAnswers {
    async fn answer(&self, request: &RpcMessage) -> Result<Vec<u8>, HandlerError> {
        serde_json::from_slice::<CoverageRequest>(&request.payload).map_err(|e| {
            HandlerError::permanent(format!("a coverage request must be `{{}}`: {e}"))
        })?;
        let cities = self.store.cities().await.map_err(HandlerError::transient)?;
        serde_json::to_vec(&CoverageReply { cities }).map_err(HandlerError::permanent)
    }
}
