//! The cities km0 delivers in, as pedidos learns them: asked of reparto over request/reply
//! (`reparto.cobertura`), since reparto's couriers live in reparto's database, and kept for
//! [`KEEP_FOR`]. The broker is opened at the first question, so pedidos without the saga
//! needs none until then.

use std::sync::Arc;
use std::time::{Duration, Instant};

use entrega::rpc::{RpcClient, RpcError};
use tokio::sync::{Mutex, OnceCell};

use crate::contracts::delivery::{CoverageReply, CoverageRequest};
use crate::services::reparto::COVERAGE;
use crate::wiring::System;

/// How long an answer is used before reparto is asked again.
pub const KEEP_FOR: Duration = Duration::from_secs(30);
/// How long reparto has to answer.
pub const ASK_WITHIN: Duration = Duration::from_secs(3);

/// Why the covered cities are not known.
#[derive(Debug, thiserror::Error)]
pub enum CoverageError {
    /// The broker could not be opened, or the request not sent.
    #[error("reparto cannot be asked: {0}")]
    Broker(String),
    /// reparto did not answer in time: it is not running, or behind.
    #[error("reparto did not answer within {}s: is `km0 run reparto` running?", ASK_WITHIN.as_secs())]
    NoAnswer,
    /// reparto answered something that is not a coverage reply.
    #[error("reparto's answer is not a list of cities: {0}")]
    Answer(String),
}

/// The last answer and when it came.
type Known = Option<(Instant, Vec<String>)>;

/// Asks reparto which cities it covers, and remembers the answer.
#[derive(Clone)]
pub struct Coverage {
    system: System,
    client: Arc<OnceCell<RpcClient>>,
    known: Arc<Mutex<Known>>,
}

impl std::fmt::Debug for Coverage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coverage").finish_non_exhaustive()
    }
}

impl Coverage {
    /// Asks through `system`'s broker.
    pub fn new(system: System) -> Self {
        Self {
            system,
            client: Arc::default(),
            known: Arc::default(),
        }
    }

    /// The covered cities, in order: remembered for [`KEEP_FOR`], else asked of reparto.
    pub async fn cities(&self) -> Result<Vec<String>, CoverageError> {
        let mut known = self.known.lock().await;
        if let Some((at, cities)) = known.as_ref() {
            if at.elapsed() < KEEP_FOR {
                return Ok(cities.clone());
            }
        }
        let client = self
            .client
            .get_or_try_init(|| async {
                let broker = self.system.broker().await.map_err(|e| e.to_string())?;
                RpcClient::start(broker.rpc(1))
                    .await
                    .map_err(|e| e.to_string())
            })
            .await
            .map_err(CoverageError::Broker)?;
        let request = serde_json::to_vec(&CoverageRequest::default())
            .map_err(|e| CoverageError::Broker(e.to_string()))?;
        let answer = match client.call(COVERAGE, request, ASK_WITHIN).await {
            Ok(answer) => answer,
            Err(RpcError::Timeout { .. }) => return Err(CoverageError::NoAnswer),
            Err(e) => return Err(CoverageError::Broker(e.to_string())),
        };
        let reply: CoverageReply =
            serde_json::from_slice(&answer).map_err(|e| CoverageError::Answer(e.to_string()))?;
        *known = Some((Instant::now(), reply.cities.clone()));
        Ok(reply.cities)
    }
}
