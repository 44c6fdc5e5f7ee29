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
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::{refused, Refusal, RefusalBody};
use super::Console;

/// Largest accepted action body.
const MAX_BODY: usize = 64 * 1024;

/// Replay dead letters to their origin topic.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ReplayBody {
    /// The dead letters, `<dlq-topic>/<partition>/<offset>`; at least one.
    ids: Vec<String>,
    /// Say what would happen; publish and mark nothing (audited).
    #[serde(default)]
    dry_run: bool,
}

/// Set dead letters aside for good.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct DiscardBody {
    /// The dead letters; at least one.
    ids: Vec<String>,
    /// Why, kept with each and in the audit.
    reason: String,
    /// Say what would happen; mark nothing (audited).
    #[serde(default)]
    dry_run: bool,
}

/// The operator a token names.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Operator {
    /// The operator's name.
    operator: String,
}

/// A saga run again by an operator.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Retried {
    /// The saga (its order).
    saga: String,
    /// Who.
    retried_by: String,
}

/// What a dead-letter action did: `entrega::dlq::ActionReport` as the API writes it (the
/// OpenAPI test checks a real report against this schema).
#[derive(ToSchema)]
#[allow(dead_code)]
pub(super) struct ActionReport {
    /// `replay` or `discard`.
    action: String,
    /// Whether nothing was done.
    dry_run: bool,
    /// Dead letters the request named.
    matched: u64,
    /// Those acted on.
    applied: Vec<AppliedLetter>,
    /// Those refused, with why.
    refused: Vec<RefusedLetter>,
}

/// A dead letter acted on.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(super) struct AppliedLetter {
    /// `<dlq-topic>/<partition>/<offset>`.
    id: String,
    /// Where it went (the origin topic for a replay).
    topic: String,
    /// Its key.
    key: Option<String>,
    /// Times it was replayed, this one included.
    replays: u32,
}

/// A dead letter refused.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(super) struct RefusedLetter {
    /// `<dlq-topic>/<partition>/<offset>`.
    id: String,
    /// Its key.
    key: Option<String>,
    /// Why.
    reason: String,
}

/// `GET /console/api/whoami`: the operator a token names.
#[utoipa::path(
    get,
    path = "/console/api/whoami",
    tag = "console-api",
    security(("operator" = [])),
    responses(
        (status = 200, description = "The operator the token names.", body = Operator),
        (status = 401, description = "No token, or not one.", body = RefusalBody),
        (status = 403, description = "No operator is configured.", body = RefusalBody),
    )
)]
pub(super) async fn whoami(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    match console.operators.require(&headers) {
        Ok(operator) => Json(Operator { operator }).into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

/// `POST /console/api/dlq/replay` `{"ids": [...], "dry_run": bool}`.
#[utoipa::path(
    post,
    path = "/console/api/dlq/replay",
    tag = "console-api",
    security(("operator" = [])),
    request_body(content = ReplayBody, content_type = "application/json"),
    responses(
        (status = 200, description = "What was replayed and what refused, audited.", body = ActionReport),
        (status = 400, description = "A body that is not one, or no dead letter named.", body = RefusalBody),
        (status = 401, description = "No token, or not one.", body = RefusalBody),
        (status = 403, description = "No operator is configured.", body = RefusalBody),
        (status = 413, description = "Body too large.", body = RefusalBody),
        (status = 503, description = "The broker or a database is away.", body = RefusalBody),
    )
)]
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
#[utoipa::path(
    post,
    path = "/console/api/dlq/discard",
    tag = "console-api",
    security(("operator" = [])),
    request_body(content = DiscardBody, content_type = "application/json"),
    responses(
        (status = 200, description = "What was discarded and what refused, audited.", body = ActionReport),
        (status = 400, description = "A body that is not one, or no dead letter named.", body = RefusalBody),
        (status = 401, description = "No token, or not one.", body = RefusalBody),
        (status = 403, description = "No operator is configured.", body = RefusalBody),
        (status = 413, description = "Body too large.", body = RefusalBody),
        (status = 503, description = "The broker or a database is away.", body = RefusalBody),
    )
)]
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
#[utoipa::path(
    post,
    path = "/console/api/sagas/{id}/retry",
    tag = "console-api",
    security(("operator" = [])),
    params(("id" = String, Path, description = "The saga (its order)")),
    responses(
        (status = 200, description = "Running again.", body = Retried),
        (status = 401, description = "No token, or not one.", body = RefusalBody),
        (status = 403, description = "No operator is configured.", body = RefusalBody),
        (status = 409, description = "Not waiting for an operator.", body = RefusalBody),
        (status = 503, description = "The database is away.", body = RefusalBody),
    )
)]
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
        Ok(()) => Json(Retried {
            saga: id,
            retried_by: operator,
        })
        .into_response(),
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
