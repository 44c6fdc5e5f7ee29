//! The gateway's HTTP API, with Idempotency-Key semantics:
//!
//! - `POST /cargos` with `Idempotency-Key` and `{"tarjeta", "importe_centimos",
//!   "referencia"}`: 201 `{"id", "estado": "aprobado", ...}` charged, 402
//!   `{"estado": "rechazado", "motivo"}` declined. The same key with the same body gets the
//!   stored answer again (header `Idempotent-Replayed: true`), with another body 422, while
//!   the first is still running 409; no key 400.
//! - `POST /reembolsos`: a charge given back, with the same key semantics (see
//!   [`refunds`](super::refunds)).
//! - `GET /cargos?referencia=P-1`: the ledger's charges and refunds of a reference (for
//!   reconciling).
//! - `GET /fallos`, `PUT /fallos`: the faults of this run (see [`Faults`]).
//! - `GET /salud`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use entrega_core::now_ms;
use serde_json::Value;
use tokio::sync::Mutex;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::api::{
    ChargeAnswer, ChargeBody, ChargeState, ErrorBody, Health, LedgerAnswer, RefundAnswer,
    RefundBody, RefundState,
};
use super::db::{Charge, Ledger, Refund, Taken};
use super::domain::{ChargeRequest, Decision, Faults};

/// How long a key stays held by a request before another may take it over.
pub const KEY_LEASE_MS: i64 = 30_000;
/// Largest request body.
pub(super) const MAX_BODY: usize = 16 * 1024;

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct PasarelaState {
    ledger: Ledger,
    faults: Arc<Mutex<Faults>>,
}

impl PasarelaState {
    /// The ledger.
    pub(super) fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// This request's latency, and whether it takes one of the pending 503s.
    pub(super) async fn latency_and_503(&self) -> (u64, bool) {
        let mut f = self.faults.lock().await;
        (f.latency_ms, f.take_503())
    }

    /// The gateway over `ledger` (migrated), with `faults` at start.
    pub fn new(ledger: Ledger, faults: Faults) -> Self {
        Self {
            ledger,
            faults: Arc::new(Mutex::new(faults)),
        }
    }
}

/// The gateway's routes, each through its documented handler, and its OpenAPI 3.1
/// description at `GET /openapi.json`.
pub fn app(state: PasarelaState) -> Router {
    let (router, api) = documented();
    crate::wiring::openapi_route::with_openapi(router, &api)
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such route") })
        .method_not_allowed_fallback(|| async {
            error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        })
        .with_state(state)
        .layer(axum::middleware::from_fn(crate::telemetry::http::traced))
}

/// The OpenAPI 3.1 description of the gateway's API (committed as
/// `docs/openapi-pasarela.json`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    documented().1
}

fn documented() -> (Router<PasarelaState>, utoipa::openapi::OpenApi) {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(charge, charges))
        .routes(routes!(super::refunds::refund))
        .routes(routes!(get_faults, put_faults))
        .routes(routes!(health))
        .split_for_parts()
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "km0 pasarela",
        description = "The payment gateway simulator: charges and refunds with Idempotency-Key \
                       semantics (the same key and body get the stored answer again, with \
                       `Idempotent-Replayed: true`; another body 422; while the first runs 409), \
                       a ledger to reconcile against, and the faults a run injects.",
        license(name = "MIT OR Apache-2.0")
    ),
    components(schemas(
        ChargeBody,
        ChargeAnswer,
        ChargeState,
        RefundBody,
        RefundAnswer,
        RefundState,
        LedgerAnswer,
        Charge,
        Refund,
        Faults,
        Health,
        ErrorBody
    ))
)]
struct ApiDoc;

pub(super) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let body = ErrorBody {
        error: message.into(),
    };
    let mut response = (status, Json(body)).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert("retry-after", HeaderValue::from_static("1"));
    }
    response
}

/// The request's `Idempotency-Key`, if it has a usable one.
pub(super) fn idempotency_key(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|k| !k.is_empty() && k.len() <= 255)
}

pub(super) fn stored(status: u16, body: &str, replayed: bool) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let value: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let mut response = (status, Json(value)).into_response();
    if replayed {
        response
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    response
}

/// Takes `key` for a request with `fingerprint`: `Ok` when this request is to go on; the
/// answer to give otherwise (the stored answer, 409 while another holds it, 422 for another
/// body, 503 when the ledger fails).
pub(super) async fn take_key(
    ledger: &Ledger,
    key: &str,
    fingerprint: &str,
) -> Result<(), Response> {
    match ledger.take(key, fingerprint, now_ms(), KEY_LEASE_MS).await {
        Err(e) => Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("charge ledger: {e}"),
        )),
        Ok(Taken::Replay { status, body }) => Err(stored(status, &body, true)),
        Ok(Taken::InProgress) => Err(error(
            StatusCode::CONFLICT,
            "another request with this Idempotency-Key is in progress",
        )),
        Ok(Taken::Mismatch) => Err(error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "this Idempotency-Key was used with a different request",
        )),
        Ok(Taken::Fresh) => Ok(()),
    }
}

/// Charges a card once per Idempotency-Key.
#[utoipa::path(
    post,
    path = "/cargos",
    tag = "pasarela",
    params(("Idempotency-Key" = String, Header, description = "The charge's key: its retries carry the same")),
    request_body(content = ChargeBody, content_type = "application/json"),
    responses(
        (status = 201, description = "Charged.", body = ChargeAnswer),
        (status = 402, description = "Declined, with `motivo`.", body = ChargeAnswer),
        (status = 400, description = "No Idempotency-Key, or not a charge.", body = ErrorBody),
        (status = 409, description = "Another request with this key is running.", body = ErrorBody),
        (status = 413, description = "Body too large.", body = ErrorBody),
        (status = 422, description = "This key was used with another request.", body = ErrorBody),
        (status = 503, description = "Unavailable (injected, or the ledger fails); retry.", body = ErrorBody),
    )
)]
async fn charge(State(state): State<PasarelaState>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(key) = idempotency_key(&headers) else {
        return error(
            StatusCode::BAD_REQUEST,
            "the Idempotency-Key header is missing",
        );
    };
    if body.len() > MAX_BODY {
        return error(StatusCode::PAYLOAD_TOO_LARGE, "the body is too large");
    }
    let request = match ChargeRequest::from_json(&body) {
        Ok(request) => request,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let (latency, fail) = state.latency_and_503().await;
    if let Err(answer) = take_key(&state.ledger, key, &request.fingerprint()).await {
        return answer;
    }
    // The time the gateway takes to charge, with the key held: a second request with the
    // same key meanwhile is told 409.
    if latency > 0 {
        tokio::time::sleep(Duration::from_millis(latency)).await;
    }
    if fail {
        // Nothing charged: the key is given back, and a retry starts over.
        let _ = state.ledger.release(key).await;
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway is unavailable",
        );
    }
    let (decision, hang) = {
        let mut f = state.faults.lock().await;
        let decision = f.decide(&request);
        (decision, f.take_hang().then_some(f.hang_ms))
    };
    let id = format!("ch_{}", uuid::Uuid::new_v4().simple());
    let (status, body, charge) = match decision {
        Decision::Approved => (
            201,
            ChargeAnswer {
                id: id.clone(),
                estado: ChargeState::Approved,
                importe_centimos: Some(request.amount_cents),
                motivo: None,
                referencia: request.reference.clone(),
            },
            Charge {
                id: id.clone(),
                key: key.to_owned(),
                reference: request.reference.clone(),
                amount_cents: request.amount_cents,
                outcome: "aprobado".into(),
                reason: None,
            },
        ),
        Decision::Declined(reason) => (
            402,
            ChargeAnswer {
                id: id.clone(),
                estado: ChargeState::Declined,
                importe_centimos: None,
                motivo: Some(reason.clone()),
                referencia: request.reference.clone(),
            },
            Charge {
                id: id.clone(),
                key: key.to_owned(),
                reference: request.reference.clone(),
                amount_cents: request.amount_cents,
                outcome: "rechazado".into(),
                reason: Some(reason),
            },
        ),
    };
    let text = serde_json::to_string(&body).unwrap_or_default();
    if let Err(e) = state
        .ledger
        .complete(key, Some(&charge), &request.card, status, &text, now_ms())
        .await
    {
        let _ = state.ledger.release(key).await;
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("charge ledger: {e}"),
        );
    }
    if let Some(ms) = hang {
        // Charged and recorded; the answer comes too late for the client.
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    stored(status, &text, false)
}

/// The reference to reconcile.
#[derive(serde::Deserialize, utoipa::IntoParams)]
struct ByReference {
    /// The merchant's reference (the order id).
    #[serde(rename = "referencia")]
    reference: String,
}

/// A reference's charges and refunds in the ledger.
#[utoipa::path(
    get,
    path = "/cargos",
    tag = "pasarela",
    params(ByReference),
    responses(
        (status = 200, description = "Charges and refunds.", body = LedgerAnswer),
        (status = 400, description = "No `referencia`.", body = ErrorBody),
        (status = 503, description = "The ledger fails; retry.", body = ErrorBody),
    )
)]
async fn charges(State(state): State<PasarelaState>, Query(q): Query<ByReference>) -> Response {
    let found = match state.ledger.charges_for(&q.reference).await {
        Ok(charges) => state
            .ledger
            .refunds_for(&q.reference)
            .await
            .map(|refunds| (charges, refunds)),
        Err(e) => Err(e),
    };
    match found {
        Ok((cargos, reembolsos)) => {
            (StatusCode::OK, Json(LedgerAnswer { cargos, reembolsos })).into_response()
        }
        Err(e) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("charge ledger: {e}"),
        ),
    }
}

/// The faults of this run.
#[utoipa::path(
    get,
    path = "/fallos",
    tag = "faults",
    responses((status = 200, description = "The faults now.", body = Faults))
)]
async fn get_faults(State(state): State<PasarelaState>) -> Response {
    let faults = state.faults.lock().await.clone();
    (StatusCode::OK, Json(faults)).into_response()
}

/// Replaces the faults of this run.
#[utoipa::path(
    put,
    path = "/fallos",
    tag = "faults",
    request_body(content = Faults, content_type = "application/json"),
    responses(
        (status = 200, description = "The faults now.", body = Faults),
        (status = 400, description = "Not faults (an unknown member is refused).", body = ErrorBody),
    )
)]
async fn put_faults(State(state): State<PasarelaState>, body: Bytes) -> Response {
    match serde_json::from_slice::<Faults>(&body) {
        Ok(faults) => {
            *state.faults.lock().await = faults.clone();
            (StatusCode::OK, Json(faults)).into_response()
        }
        Err(e) => error(
            StatusCode::BAD_REQUEST,
            format!("invalid fault settings: {e}"),
        ),
    }
}

/// Whether the gateway reaches its ledger.
#[utoipa::path(
    get,
    path = "/salud",
    tag = "operations",
    responses(
        (status = 200, description = "It does.", body = Health),
        (status = 503, description = "It does not.", body = ErrorBody),
    )
)]
async fn health(State(state): State<PasarelaState>) -> Response {
    match state.ledger.db().ping().await {
        Ok(()) => (
            StatusCode::OK,
            Json(Health {
                estado: "ok".to_owned(),
            }),
        )
            .into_response(),
        Err(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the charge ledger is unavailable",
        ),
    }
}
