//! The console's actions, as JSON over HTTP. Each needs an operator token (401 without one,
//! 403 when none is configured), answers `{"error": ...}` when refused, and is audited under
//! the token's operator: dead-letter actions (dry runs included) in `entrega_dlq_audit`, a
//! saga's retry in its history.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use entrega::dlq::{DiscardOptions, DlqError, DlqFilter, ReplayOptions};
use entrega::saga::SagaError;
use entrega_core::DeadLetterId;
use serde::Deserialize;
use serde_json::json;

use super::auth::{refused, Refusal};
use super::Console;

/// Largest accepted action body.
const MAX_BODY: usize = 64 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayBody {
    ids: Vec<String>,
    #[serde(default)]
    dry_run: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DiscardBody {
    ids: Vec<String>,
    reason: String,
    #[serde(default)]
    dry_run: bool,
}

/// `GET /console/api/whoami`: the operator a token names.
pub(super) async fn whoami(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    match console.operators.require(&headers) {
        Ok(operator) => Json(json!({ "operator": operator })).into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

/// `POST /console/api/dlq/replay` `{"ids": [...], "dry_run": bool}`.
pub(super) async fn replay(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (operator, body, filter) = match action::<ReplayBody>(&console, &headers, &body, |b| &b.ids)
    {
        Ok(ready) => ready,
        Err(refusal) => return refusal.into_response(),
    };
    let mut options = ReplayOptions::new(operator);
    options.dry_run = body.dry_run;
    report(console.letters.replay(&filter, &options).await)
}

/// `POST /console/api/dlq/discard` `{"ids": [...], "reason": "...", "dry_run": bool}`.
pub(super) async fn discard(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (operator, body, filter) =
        match action::<DiscardBody>(&console, &headers, &body, |b| &b.ids) {
            Ok(ready) => ready,
            Err(refusal) => return refusal.into_response(),
        };
    let mut options = DiscardOptions::new(operator, body.reason);
    options.dry_run = body.dry_run;
    report(console.letters.discard(&filter, &options).await)
}

/// What every dead-letter action starts with: the operator its token names, its body, and
/// the dead letters the body names.
fn action<T: serde::de::DeserializeOwned>(
    console: &Console,
    headers: &HeaderMap,
    body: &[u8],
    ids: impl Fn(&T) -> &[String],
) -> Result<(String, T, DlqFilter), Refusal> {
    let operator = console.operators.require(headers).inspect_err(|r| {
        tracing::warn!(reason = %r.reason, "console action refused");
    })?;
    let body: T = parse(body)?;
    let filter = selection(ids(&body))?;
    Ok((operator, body, filter))
}

/// `POST /console/api/sagas/{id}/retry`: runs a saga waiting for an operator again.
pub(super) async fn retry_saga(
    State(console): State<Arc<Console>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let operator = match console.operators.require(&headers) {
        Ok(operator) => operator,
        Err(refusal) => return refusal.into_response(),
    };
    match console.sagas.retry(&id, &operator).await {
        Ok(()) => Json(json!({ "saga": id, "retried_by": operator })).into_response(),
        Err(e @ SagaError::Store(_)) => {
            refused(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()).into_response()
        }
        Err(e) => refused(StatusCode::CONFLICT, &e.to_string()).into_response(),
    }
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Refusal> {
    if body.len() > MAX_BODY {
        return Err(refused(
            StatusCode::PAYLOAD_TOO_LARGE,
            "the body is too large",
        ));
    }
    serde_json::from_slice(body).map_err(|e| {
        refused(
            StatusCode::BAD_REQUEST,
            &format!("the body is not valid: {e}"),
        )
    })
}

/// The dead letters named exactly; an action never applies to an empty selection.
fn selection(ids: &[String]) -> Result<DlqFilter, Refusal> {
    if ids.is_empty() {
        return Err(refused(
            StatusCode::BAD_REQUEST,
            "name at least one dead letter in `ids`",
        ));
    }
    let mut filter = DlqFilter::all();
    for id in ids {
        let id: DeadLetterId = id
            .parse()
            .map_err(|e| refused(StatusCode::BAD_REQUEST, &format!("{e}")))?;
        filter.ids.push(id);
    }
    Ok(filter)
}

fn report(outcome: Result<entrega::dlq::ActionReport, DlqError>) -> Response {
    match outcome {
        Ok(report) => Json(report).into_response(),
        Err(e) if e.is_usage() => refused(StatusCode::BAD_REQUEST, &e.to_string()).into_response(),
        Err(e) => refused(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()).into_response(),
    }
}
