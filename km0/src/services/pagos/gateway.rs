//! pagos' client of the payment gateway (`km0 run pasarela`, or any gateway with the same
//! API): `POST /cargos` with the order's Idempotency-Key, `POST /reembolsos` with the
//! refund's.
//!
//! A decline is a business outcome, not an error. A 5xx, a 409 (the same key still running
//! elsewhere), a 429, a timeout or a refused connection mean "unknown, ask again with the
//! same key": transient, asked again here a few times when the answer came at once
//! ([`QUICK_TRIES`]), then left to the consumer's retries. Any other refusal (400, 422: a key
//! reused with another request) is permanent.

use std::time::Duration;

use serde_json::Value;

use crate::services::pasarela::api::{
    ChargeAnswer, ChargeBody, ChargeState, RefundAnswer, RefundBody, RefundState,
};

use super::db::ChargeOutcome;
use super::domain::OrderToCharge;
use super::refunds::{RefundOutcome, RefundRequest};

/// Longest wait for the gateway's answer.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// Tries of one request whose "ask again" comes back at once (5xx, 409, 429, a refused
/// connection): the first and up to three more, 100, 200 and 400 ms apart, under the same
/// key, before the failure goes to the consumer's retries. A timeout is not tried again
/// here: it has already taken [`TIMEOUT`].
pub const QUICK_TRIES: u32 = 4;
const QUICK_PAUSE: Duration = Duration::from_millis(100);

/// Why the gateway gave no answer to act on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// Down, slow, busy with the same key: ask again later with the same key.
    #[error("payment gateway unavailable: {0}")]
    Unavailable(String),
    /// The gateway refused the request itself; asking again will not help.
    #[error("payment gateway refused the request: {0}")]
    Refused(String),
}

impl GatewayError {
    /// Whether asking again later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

/// How one request failed: at once (worth asking again in a moment) or after a wait.
enum Failure {
    AtOnce(GatewayError),
    Slow(GatewayError),
}

/// The gateway over HTTP.
#[derive(Debug, Clone)]
pub struct Gateway {
    http: reqwest::Client,
    base: String,
}

impl Gateway {
    /// A client of the gateway at `base` (e.g. `http://127.0.0.1:8095`).
    pub fn new(base: &str, timeout: Duration) -> Result<Self, GatewayError> {
        Self::with_builder(base, timeout, reqwest::Client::builder())
    }

    /// A client of the gateway at `base` built from `builder` (e.g. one that trusts a
    /// private certificate authority for `https://`), each call bounded by `timeout`.
    pub fn with_builder(
        base: &str,
        timeout: Duration,
        builder: reqwest::ClientBuilder,
    ) -> Result<Self, GatewayError> {
        let http = builder
            .timeout(timeout)
            .build()
            .map_err(|e| GatewayError::Refused(format!("building the HTTP client: {e}")))?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
        })
    }

    /// Gives back the charge made under `request`'s charge key, under the refund's own
    /// Idempotency-Key: refunded (how much), or nothing had been charged.
    pub async fn refund(&self, request: &RefundRequest) -> Result<RefundOutcome, GatewayError> {
        let body = RefundBody {
            clave_cargo: request.charge_key(),
            referencia: request.order_id.clone(),
        };
        let (status, body) = self.post("reembolsos", &request.key, &body).await?;
        let refused = || GatewayError::Refused(format!("HTTP {status}: {body}"));
        if !matches!(status.as_u16(), 200 | 201) {
            return Err(refused());
        }
        let answer: RefundAnswer = serde_json::from_value(body.clone()).map_err(|_| refused())?;
        Ok(match answer.estado {
            RefundState::Refunded => RefundOutcome::Refunded(answer.importe_centimos.unwrap_or(0)),
            RefundState::NothingCharged => RefundOutcome::NothingCharged,
        })
    }

    /// `POST /<path>` of `body` under `key`: the status and the JSON answer of one the
    /// gateway settled. Unreachable, 5xx, 409 (the key in use), 429 or an unreadable answer
    /// is [`GatewayError::Unavailable`], after [`QUICK_TRIES`] when it came back at once.
    async fn post(
        &self,
        path: &str,
        key: &str,
        body: &impl serde::Serialize,
    ) -> Result<(reqwest::StatusCode, Value), GatewayError> {
        let mut tries = 1;
        loop {
            match self.post_once(path, key, body).await {
                Ok(answer) => return Ok(answer),
                Err(Failure::AtOnce(e)) if tries < QUICK_TRIES => {
                    tracing::debug!(path, key, error = %e, tries, "gateway: asking again");
                    tokio::time::sleep(QUICK_PAUSE * 2u32.pow(tries - 1)).await;
                    tries += 1;
                }
                Err(Failure::AtOnce(e) | Failure::Slow(e)) => return Err(e),
            }
        }
    }

    async fn post_once(
        &self,
        path: &str,
        key: &str,
        body: &impl serde::Serialize,
    ) -> Result<(reqwest::StatusCode, Value), Failure> {
        let request = self.http.post(format!("{}/{path}", self.base));
        let response = crate::telemetry::http::outgoing(request)
            .header("Idempotency-Key", key)
            .json(body)
            .send()
            .await
            .map_err(|e| {
                let slow = e.is_timeout();
                let e = GatewayError::Unavailable(e.to_string());
                if slow {
                    Failure::Slow(e)
                } else {
                    Failure::AtOnce(e)
                }
            })?;
        let status = response.status();
        if status.is_server_error()
            || status == reqwest::StatusCode::CONFLICT
            || status == reqwest::StatusCode::TOO_MANY_REQUESTS
        {
            return Err(Failure::AtOnce(GatewayError::Unavailable(format!(
                "HTTP {status}"
            ))));
        }
        let body: Value = response.json().await.map_err(|e| {
            Failure::Slow(GatewayError::Unavailable(format!("unreadable answer: {e}")))
        })?;
        Ok((status, body))
    }

    /// Charges `order` under its Idempotency-Key.
    pub async fn charge(&self, order: &OrderToCharge) -> Result<ChargeOutcome, GatewayError> {
        let body = ChargeBody {
            importe_centimos: order.amount_cents,
            referencia: order.order_id.clone(),
            tarjeta: order.card.clone(),
        };
        let (status, body) = self.post("cargos", &order.charge_key(), &body).await?;
        let refused = || GatewayError::Refused(format!("HTTP {status}: {body}"));
        if !matches!(status.as_u16(), 200 | 201 | 402) {
            return Err(refused());
        }
        let answer: ChargeAnswer = serde_json::from_value(body.clone()).map_err(|_| refused())?;
        Ok(match answer.estado {
            ChargeState::Approved => ChargeOutcome::Approved(answer.id),
            ChargeState::Declined => {
                ChargeOutcome::Declined(answer.motivo.unwrap_or_else(|| "rechazado".to_owned()))
            }
        })
    }
}
