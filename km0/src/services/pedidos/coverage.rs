//! The cities km0 delivers in, as pedidos learns them: asked of reparto over request/reply
//! (`reparto.cobertura`), since reparto's couriers live in reparto's database, and kept for
//! [`KEEP_FOR`]. The broker is opened at the first question, so pedidos without the saga
//! needs none until then.

use std::sync::Arc;
use std::time::{Duration, Instant};

use entrega::rpc::{RpcClient, RpcError, RPC_ERROR};
use entrega::Headers;
use tokio::sync::Mutex;

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
    client: Arc<Mutex<Option<Arc<RpcClient>>>>,
    known: Arc<std::sync::Mutex<Known>>,
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

    /// The covered cities, in order: remembered for [`KEEP_FOR`], else asked of reparto
    /// (callers at the same moment each ask; none waits behind another's question).
    pub async fn cities(&self) -> Result<Vec<String>, CoverageError> {
        if let Some(cities) = self.remembered() {
            return Ok(cities);
        }
        let client = self.client().await?;
        let request = serde_json::to_vec(&CoverageRequest::default())
            .map_err(|e| CoverageError::Broker(e.to_string()))?;
        let reply = match client
            .call_with(COVERAGE, Headers::new(), request, ASK_WITHIN)
            .await
        {
            Ok(reply) => reply,
            Err(RpcError::Timeout { .. }) => return Err(CoverageError::NoAnswer),
            Err(e) => {
                if matches!(e, RpcError::Closed) {
                    // Its reply queue is gone: the next question starts a new client.
                    self.client.lock().await.take();
                }
                return Err(CoverageError::Broker(e.to_string()));
            }
        };
        if reply.headers.get(RPC_ERROR).is_some() {
            return Err(CoverageError::Answer(
                String::from_utf8_lossy(&reply.payload).into_owned(),
            ));
        }
        let reply: CoverageReply = serde_json::from_slice(&reply.payload)
            .map_err(|e| CoverageError::Answer(e.to_string()))?;
        *self.known.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((Instant::now(), reply.cities.clone()));
        Ok(reply.cities)
    }

    /// The last answer, if it is recent enough.
    fn remembered(&self) -> Option<Vec<String>> {
        let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        known
            .as_ref()
            .filter(|(at, _)| at.elapsed() < KEEP_FOR)
            .map(|(_, cities)| cities.clone())
    }

    /// The client questions go through, started at the first.
    async fn client(&self) -> Result<Arc<RpcClient>, CoverageError> {
        let mut client = self.client.lock().await;
        if let Some(client) = client.as_ref() {
            return Ok(Arc::clone(client));
        }
        let broker = self
            .system
            .broker()
            .await
            .map_err(|e| CoverageError::Broker(e.to_string()))?;
        let started = RpcClient::start(broker.rpc(1))
            .await
            .map_err(|e| CoverageError::Broker(e.to_string()))?;
        let started = Arc::new(started);
        *client = Some(Arc::clone(&started));
        Ok(started)
    }
}
