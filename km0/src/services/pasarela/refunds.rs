//! Refunds at the gateway: `POST /reembolsos` with `Idempotency-Key` and
//! `{"clave_cargo", "referencia"}` refunds the charge made under the key `clave_cargo`.
//!
//! - 201 `{"id", "estado": "reembolsado", "cargo", "importe_centimos", "referencia"}`: the
//!   charge is refunded now (or was, under another refund key: the same refund again).
//! - 200 `{"estado": "sin_cargo"}`: nothing was charged under that key (never used, declined,
//!   or failed before charging): nothing to give back.
//! - 409 while the charge under `clave_cargo` is still running, or another request holds
//!   this refund's key; 422 for the key used with another body; 400 for a bad body; 503 as
//!   injected (`fail_503`) or when the ledger fails.
//!
//! The same key and body get the stored answer (`Idempotent-Replayed: true`): a refund
//! delivered twice gives the money back once.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use entrega_core::now_ms;

use super::api::{ErrorBody, RefundAnswer, RefundBody, RefundState};
use super::db::{ChargeLookup, Refund};
use super::domain::RefundRequest;
use super::http::{error, idempotency_key, stored, take_key, PasarelaState, MAX_BODY};

/// Gives back the charge made under `clave_cargo`, once per Idempotency-Key.
#[utoipa::path(
    post,
    path = "/reembolsos",
    tag = "pasarela",
    params(("Idempotency-Key" = String, Header, description = "The refund's own key")),
    request_body(content = RefundBody, content_type = "application/json"),
    responses(
        (status = 201, description = "Given back.", body = RefundAnswer),
        (status = 200, description = "Nothing was charged under that key.", body = RefundAnswer),
        (status = 400, description = "No Idempotency-Key, or not a refund.", body = ErrorBody),
        (status = 409, description = "The charge, or another request with this key, is running.", body = ErrorBody),
        (status = 413, description = "Body too large.", body = ErrorBody),
        (status = 422, description = "This key was used with another request.", body = ErrorBody),
        (status = 503, description = "Unavailable (injected, or the ledger fails); retry.", body = ErrorBody),
    )
)]
pub(super) async fn refund(
    State(state): State<PasarelaState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(key) = idempotency_key(&headers) else {
        return error(
            StatusCode::BAD_REQUEST,
            "the Idempotency-Key header is missing",
        );
    };
    if body.len() > MAX_BODY {
        return error(StatusCode::PAYLOAD_TOO_LARGE, "the body is too large");
    }
    let request = match RefundRequest::from_json(&body) {
        Ok(request) => request,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let (latency, fail) = state.latency_and_503().await;
    let ledger = state.ledger();
    if let Err(answer) = take_key(ledger, key, &request.fingerprint()).await {
        return answer;
    }
    let charge = match ledger.charge_under(&request.charge_key).await {
        Ok(ChargeLookup::InProgress) => {
            let _ = ledger.release(key).await;
            return error(
                StatusCode::CONFLICT,
                "the charge under that key is in progress",
            );
        }
        Ok(ChargeLookup::Approved(charge)) => Some(charge),
        Ok(ChargeLookup::Nothing) => None,
        Err(e) => {
            let _ = ledger.release(key).await;
            return unavailable(&e);
        }
    };
    // The refund's own processing time, after the charge was looked up.
    if latency > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(latency)).await;
    }
    if fail {
        let _ = ledger.release(key).await;
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway is unavailable",
        );
    }
    let (status, body, refund) = match charge {
        Some(charge) => {
            let refund = Refund {
                id: format!("re_{}", uuid::Uuid::new_v4().simple()),
                key: key.to_owned(),
                charge: charge.id.clone(),
                reference: charge.reference.clone(),
                amount_cents: charge.amount_cents,
            };
            let body = RefundAnswer {
                id: Some(refund.id.clone()),
                estado: RefundState::Refunded,
                cargo: Some(charge.id.clone()),
                importe_centimos: Some(charge.amount_cents),
                referencia: charge.reference.clone(),
            };
            (201, body, Some(refund))
        }
        None => (
            200,
            RefundAnswer {
                id: None,
                estado: RefundState::NothingCharged,
                cargo: None,
                importe_centimos: None,
                referencia: request.reference.clone(),
            },
            None,
        ),
    };
    let text = serde_json::to_string(&body).unwrap_or_default();
    match ledger
        .complete_refund(key, refund.as_ref(), status, &text, now_ms())
        .await
    {
        Ok(text) => stored(status, &text, false),
        Err(e) => {
            let _ = ledger.release(key).await;
            unavailable(&e)
        }
    }
}

fn unavailable(e: &entrega_core::StoreError) -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("charge ledger: {e}"),
    )
}
