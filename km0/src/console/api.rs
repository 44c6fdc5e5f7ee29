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
use entrega_core::{DeadClass, DeadLetterId};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::{refused, Refusal, RefusalBody};
use super::Console;

/// Largest accepted action body.
const MAX_BODY: usize = 64 * 1024;

/// Which dead letters an action is on: `ids`, or every pending one `filter` selects, with the
/// count (and the dry run's selection token) a real bulk action confirms.
struct Selection<'a> {
    ids: &'a [String],
    filter: Option<&'a FilterBody>,
    expected: Option<usize>,
    selection: Option<&'a str>,
}

/// What a real bulk action confirms of its dry run: how many dead letters matched, and which.
#[derive(Debug, Default)]
struct Confirmed {
    expected: Option<usize>,
    selection: Option<String>,
}

/// A dead-letter action's body: which letters, and whether it is a dry run.
trait Selects {
    fn selects(&self) -> (Selection<'_>, bool);
}

/// `Selects` for a body with the selection's members.
macro_rules! selects {
    ($body:ty) => {
        impl Selects for $body {
            fn selects(&self) -> (Selection<'_>, bool) {
                let which = Selection {
                    ids: &self.ids,
                    filter: self.filter.as_ref(),
                    expected: self.expected,
                    selection: self.selection.as_deref(),
                };
                (which, self.dry_run)
            }
        }
    };
}
selects!(ReplayBody);
selects!(DiscardBody);

/// The filters of the dead-letter list, as a bulk action names them.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct FilterBody {
    /// Only this event type.
    #[serde(default, rename = "type")]
    kind: Option<String>,
    /// Only reasons containing this text, ignoring case.
    #[serde(default)]
    reason: Option<String>,
    /// Only this kind of failure.
    #[serde(default)]
    failure: Option<String>,
}

/// Replay dead letters to their origin topic: those of `ids`, or every pending one `filter`
/// selects.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ReplayBody {
    /// The dead letters, `<dlq-topic>/<partition>/<offset>`.
    #[serde(default)]
    ids: Vec<String>,
    /// Instead of `ids`: every pending dead letter these select.
    #[serde(default)]
    filter: Option<FilterBody>,
    /// With `filter`, outside a dry run: how many dead letters the dry run matched; the
    /// action is refused (409) if that many do not match now.
    #[serde(default)]
    expected: Option<usize>,
    /// With `filter`, outside a dry run: the dry run's `selection`; the action is refused
    /// (409) unless the very same dead letters match now.
    #[serde(default)]
    selection: Option<String>,
    /// Say what would happen; publish and mark nothing (audited).
    #[serde(default)]
    dry_run: bool,
}

/// Set dead letters aside for good: those of `ids`, or every pending one `filter` selects.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct DiscardBody {
    /// The dead letters, `<dlq-topic>/<partition>/<offset>`.
    #[serde(default)]
    ids: Vec<String>,
    /// Instead of `ids`: every pending dead letter these select.
    #[serde(default)]
    filter: Option<FilterBody>,
    /// With `filter`, outside a dry run: how many dead letters the dry run matched.
    #[serde(default)]
    expected: Option<usize>,
    /// With `filter`, outside a dry run: the dry run's `selection`.
    #[serde(default)]
    selection: Option<String>,
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
    /// A token naming exactly those: a confirmation of a dry run sends it back.
    selection: String,
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

/// `POST /console/api/dlq/replay` `{"ids": [...] | "filter": {...}, "expected": n, "selection": "...", "dry_run": bool}`.
#[utoipa::path(
    post,
    path = "/console/api/dlq/replay",
    tag = "console-api",
    security(("operator" = [])),
    request_body(content = ReplayBody, content_type = "application/json"),
    responses(
        (status = 200, description = "What was replayed and what refused, audited.", body = ActionReport),
        (status = 400, description = "A body that is not one, no dead letter named, or a bulk action without `expected`.", body = RefusalBody),
        (status = 401, description = "No token, or not one.", body = RefusalBody),
        (status = 403, description = "No operator is configured.", body = RefusalBody),
        (status = 409, description = "The filter's selection changed since the dry run, or another action is under way; nothing was done.", body = RefusalBody),
        (status = 413, description = "Body too large.", body = RefusalBody),
        (status = 503, description = "The broker or a database is away.", body = RefusalBody),
    )
)]
pub(super) async fn replay(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (operator, body, filter, confirmed) = match action::<ReplayBody>(&console, &headers, &body)
    {
        Ok(ready) => ready,
        Err(refusal) => return refusal.into_response(),
    };
    let mut options = ReplayOptions::new(operator);
    options.dry_run = body.dry_run;
    options.expect_matched = confirmed.expected;
    options.expect_selection = confirmed.selection;
    // On a task of its own: a client that goes away must not cut an action off midway.
    let acting = Arc::clone(&console);
    report(to_completion(async move { acting.letters.replay(&filter, &options).await }).await)
}

/// `POST /console/api/dlq/discard` `{"ids": [...] | "filter": {...}, "expected": n, "selection": "...", "reason": "...", "dry_run": bool}`.
#[utoipa::path(
    post,
    path = "/console/api/dlq/discard",
    tag = "console-api",
    security(("operator" = [])),
    request_body(content = DiscardBody, content_type = "application/json"),
    responses(
        (status = 200, description = "What was discarded and what refused, audited.", body = ActionReport),
        (status = 400, description = "A body that is not one, no dead letter named, or a bulk action without `expected`.", body = RefusalBody),
        (status = 401, description = "No token, or not one.", body = RefusalBody),
        (status = 403, description = "No operator is configured.", body = RefusalBody),
        (status = 409, description = "The filter's selection changed since the dry run, or another action is under way; nothing was done.", body = RefusalBody),
        (status = 413, description = "Body too large.", body = RefusalBody),
        (status = 503, description = "The broker or a database is away.", body = RefusalBody),
    )
)]
pub(super) async fn discard(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (operator, body, filter, confirmed) = match action::<DiscardBody>(&console, &headers, &body)
    {
        Ok(ready) => ready,
        Err(refusal) => return refusal.into_response(),
    };
    let mut options = DiscardOptions::new(operator, body.reason);
    options.dry_run = body.dry_run;
    options.expect_matched = confirmed.expected;
    options.expect_selection = confirmed.selection;
    let acting = Arc::clone(&console);
    report(to_completion(async move { acting.letters.discard(&filter, &options).await }).await)
}

/// Runs a dead-letter action on a task of its own, so it finishes even if the request that
/// asked for it is dropped (the client went away).
async fn to_completion(
    action: impl std::future::Future<Output = Result<entrega::dlq::ActionReport, DlqError>>
        + Send
        + 'static,
) -> Result<entrega::dlq::ActionReport, DlqError> {
    match tokio::spawn(action).await {
        Ok(outcome) => outcome,
        Err(e) => Err(DlqError::Store(entrega::StoreError::rejected(format!(
            "the action's task ended abnormally: {e}"
        )))),
    }
}

/// What every dead-letter action starts with: the operator its token names, its body, the
/// dead letters the body selects, and what a bulk action confirms of its dry run.
fn action<T: serde::de::DeserializeOwned + Selects>(
    console: &Console,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(String, T, DlqFilter, Confirmed), Refusal> {
    let operator = console.operators.require(headers).inspect_err(|r| {
        tracing::warn!(reason = %r.reason, "console action refused");
    })?;
    let body: T = parse(body)?;
    let (which, dry_run) = body.selects();
    let (filter, confirmed) = selection(&which, dry_run)?;
    Ok((operator, body, filter, confirmed))
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

/// The dead letters a body selects: named exactly, or every pending one a filter selects (a
/// real bulk action must name the count its dry run showed, and may name its selection
/// token). Never an empty selection.
fn selection(which: &Selection<'_>, dry_run: bool) -> Result<(DlqFilter, Confirmed), Refusal> {
    let bad = |why: &str| refused(StatusCode::BAD_REQUEST, why);
    match (which.filter, which.ids.is_empty()) {
        (Some(_), false) => Err(bad(
            "name dead letters in `ids` or select them with `filter`, not both",
        )),
        (None, true) => Err(bad(
            "name at least one dead letter in `ids`, or select them with `filter`",
        )),
        (None, false) => {
            if which.expected.is_some() || which.selection.is_some() {
                return Err(bad("`expected` and `selection` go with `filter`"));
            }
            let mut filter = DlqFilter::all();
            for id in which.ids {
                let id: DeadLetterId = id.parse().map_err(|e| bad(&format!("{e}")))?;
                filter.ids.push(id);
            }
            Ok((filter, Confirmed::default()))
        }
        (Some(f), true) => {
            if !dry_run && which.expected.is_none() {
                return Err(bad(
                    "an action on every dead letter a filter selects needs `expected`: the \
                     count its dry run matched",
                ));
            }
            let text = |v: &Option<String>| {
                v.as_deref()
                    .map(str::trim)
                    .filter(|v| !v.is_empty())
                    .map(str::to_owned)
            };
            let mut filter = DlqFilter::all();
            if let Some(kind) = text(&f.kind) {
                filter = filter.with_kind(kind);
            }
            if let Some(reason) = text(&f.reason) {
                filter = filter.with_reason(reason);
            }
            if let Some(class) = text(&f.failure) {
                let class = DeadClass::parse(&class)
                    .ok_or_else(|| bad(&format!("unknown kind of failure: {class}")))?;
                filter = filter.with_failure(class);
            }
            let confirmed = if dry_run {
                Confirmed::default()
            } else {
                Confirmed {
                    expected: which.expected,
                    selection: which.selection.map(str::to_owned),
                }
            };
            Ok((filter, confirmed))
        }
    }
}

fn report(outcome: Result<entrega::dlq::ActionReport, DlqError>) -> Response {
    match outcome {
        Ok(report) => Json(report).into_response(),
        Err(
            e @ (DlqError::SelectionChanged { .. }
            | DlqError::SelectionReplaced { .. }
            | DlqError::Busy),
        ) => refused(StatusCode::CONFLICT, &e.to_string()).into_response(),
        Err(e) if e.is_usage() => refused(StatusCode::BAD_REQUEST, &e.to_string()).into_response(),
        Err(e) => refused(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()).into_response(),
    }
}
