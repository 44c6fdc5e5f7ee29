//! The HTTP API of `pedidos`: create an order (with its event), read it back, health.
//!
//! Every answer is JSON, errors included: `{"error": "...", "campo": "<field>"}`. Bodies go
//! through [`OrderBody`], our own extractor, because axum's `Json` rejects with plain text
//! and cannot name the field a business rule failed on.

use axum::body::Bytes;
use axum::extract::{FromRequest, Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde::Serialize;
use serde_json::Value;
use utoipa::{OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::coverage::Coverage;
use super::db::{CreateOrderError, OrderStore};
use super::domain::{Address, NewOrder, Order, OrderLine, OrderState};
use super::requests::{valid_key, EarlierAnswer, MAX_KEY_LEN};
use super::saga::OrderSaga;
use entrega::saga::{CancelOutcome, SagaError, Sagas};

/// Largest accepted request body, in bytes. An order of the maximum number of lines fits.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct PedidosState {
    store: OrderStore,
    sagas: Option<Sagas>,
    coverage: Option<Coverage>,
}

impl PedidosState {
    /// State over an orders store (already migrated).
    pub fn new(store: OrderStore) -> Self {
        Self {
            store,
            sagas: None,
            coverage: None,
        }
    }

    /// The same, with every new order run by the order saga of `sagas` (migrated, in the
    /// orders database).
    pub fn with_sagas(store: OrderStore, sagas: Sagas) -> Self {
        Self {
            sagas: Some(sagas),
            ..Self::new(store)
        }
    }

    /// The same, answering `GET /ciudades` by asking reparto through `coverage`.
    pub fn with_coverage(self, coverage: Coverage) -> Self {
        Self {
            coverage: Some(coverage),
            ..self
        }
    }
}

/// The routes of `pedidos`: `POST /pedidos`, `GET /pedidos/{id}`,
/// `POST /pedidos/{id}/cancelacion` (with the order saga), `GET /ciudades` (the cities with
/// couriers, asked of reparto), `GET /salud`, and the API's own
/// OpenAPI 3.1 description at `GET /openapi.json`.
pub fn app(state: PedidosState) -> Router {
    let (router, api) = documented();
    crate::wiring::openapi_route::with_openapi(router, &api)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(axum::middleware::from_fn(crate::telemetry::http::traced))
}

/// The OpenAPI 3.1 description of pedidos' API (committed as `docs/openapi.json`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    documented().1
}

/// Every route with its description: a route exists only through its documented handler.
fn documented() -> (Router<PedidosState>, utoipa::openapi::OpenApi) {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(create_order))
        .routes(routes!(get_order))
        .routes(routes!(cancel_order))
        .routes(routes!(covered_cities))
        .routes(routes!(health))
        .split_for_parts()
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "km0 pedidos",
        description = "Orders of Kilómetro Cero: create one (stored with its `pedido.creado` in \
                       the outbox, in one transaction), read it back, cancel it under the order \
                       saga. Every answer is JSON, errors included.",
        license(name = "MIT OR Apache-2.0")
    ),
    components(schemas(NewOrder, OrderLine, Address, Order, OrderState, ErrorBody, Cities))
)]
struct ApiDoc;

/// An error: what went wrong and, when one is at fault, the field (`campo`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong, for the client.
    pub error: String,
    /// The field at fault, as a path in the body (`lineas[1].cantidad`).
    #[serde(rename = "campo", skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// An order accepted: its id and the id of its `pedido.creado`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Created {
    /// The order.
    pub id: String,
    /// The event that announces it (`id_evento`).
    pub id_evento: String,
}

/// A cancel: under way, or done.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Cancelling {
    /// The order.
    pub id: String,
    /// `cancelando` while the saga undoes what it did, `cancelado` once it has.
    pub estado: String,
}

/// Whether the service can reach its database.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Health {
    /// `ok`, or `sin base de datos`.
    pub estado: String,
}

/// An error answer: a status and `{"error": ..., "campo": ...}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong, for the client.
    pub error: String,
    /// The field at fault, if one is.
    pub field: Option<String>,
}

impl ApiError {
    /// A 400 naming `field`.
    pub fn bad_request(field: impl Into<String>, error: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            error: error.into(),
            field: Some(field.into()),
        }
    }

    fn new(status: StatusCode, error: impl Into<String>) -> Self {
        Self {
            status,
            error: error.into(),
            field: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.error,
            field: self.field,
        };
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            // Tells well-behaved clients the failure is temporary and when to come back.
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// A validated order from a JSON request body; rejects with a JSON 400 naming the problem.
#[derive(Debug, Clone)]
pub struct OrderBody(pub NewOrder);

impl<S: Send + Sync> FromRequest<S> for OrderBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        check_content_type(req.headers())?;
        let too_large = || {
            ApiError::bad_request(
                "cuerpo",
                format!("the body is larger than {MAX_BODY_BYTES} bytes"),
            )
        };
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
            return Err(too_large());
        }
        // The limit also covers bodies without a Content-Length (chunked).
        let bytes: Bytes = axum::body::to_bytes(req.into_body(), MAX_BODY_BYTES)
            .await
            .map_err(|_| too_large())?;
        let value: Value = serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::bad_request(
                "cuerpo",
                format!(
                    "malformed JSON at line {}, column {}: {e}",
                    e.line(),
                    e.column()
                ),
            )
        })?;
        // serde_json keeps the last of two equal keys, other readers the first: refused.
        if let Some(path) = entrega_core::first_duplicate_key(&bytes) {
            return Err(ApiError::bad_request(path, "this key is written twice"));
        }
        NewOrder::from_json(&value)
            .map(OrderBody)
            .map_err(|e| ApiError::bad_request(e.field, e.message))
    }
}

fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let wrong =
        || ApiError::bad_request("content-type", "the body must be sent as application/json");
    let value = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(wrong)?;
    let essence = value.split(';').next().unwrap_or("").trim();
    if essence.eq_ignore_ascii_case("application/json") {
        Ok(())
    } else {
        Err(wrong())
    }
}

/// The header a client sends to make a retried `POST /pedidos` safe whatever the order's id.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Set on an answer given again to a request that was made before (`true`).
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// The request's `Idempotency-Key`, if it sent one; 400 if it is not usable.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    match value.to_str() {
        Ok(key) if valid_key(key) => Ok(Some(key.to_owned())),
        _ => Err(ApiError::bad_request(
            "Idempotency-Key",
            format!("an Idempotency-Key is 1 to {MAX_KEY_LEN} visible ASCII characters"),
        )),
    }
}

/// The 201 of a created order; `replayed` when it is the answer of an earlier request.
fn created_response(id: &str, event_id: uuid::Uuid, replayed: bool) -> Response {
    let created = Created {
        id: id.to_owned(),
        id_evento: event_id.to_string(),
    };
    let mut response = (StatusCode::CREATED, Json(created)).into_response();
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&format!("/pedidos/{id}")) {
        headers.insert(header::LOCATION, value);
    }
    if replayed {
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

/// Creates an order: stored with its `pedido.creado` (version 2) in one transaction; under
/// the order saga, the saga starts in it too. Idempotent: the same request again (same id
/// and contents, or the same `Idempotency-Key` and contents) gets the original answer.
#[utoipa::path(
    post,
    path = "/pedidos",
    tag = "pedidos",
    params(("Idempotency-Key" = Option<String>, Header,
        description = "Makes a retry safe: the same key with the same order gets the original \
                       answer, with another order a 422. 1 to 255 visible ASCII characters.")),
    request_body(content = NewOrder, content_type = "application/json"),
    responses(
        (status = 201, description = "Created (or created before by the same request, then \
            with `Idempotent-Replayed: true`); `Location` names it.", body = Created,
            headers(("Location" = String, description = "`/pedidos/{id}`"))),
        (status = 400, description = "Not an order: the field at fault is named.", body = ErrorBody),
        (status = 409, description = "An order with that id exists with other contents.",
            body = ErrorBody),
        (status = 422, description = "The Idempotency-Key was used for another request.",
            body = ErrorBody),
        (status = 503, description = "The database is unavailable; retry (`Retry-After`).", body = ErrorBody),
    )
)]
async fn create_order(
    State(state): State<PedidosState>,
    headers: HeaderMap,
    OrderBody(order): OrderBody,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    let key = key.as_deref();
    let created = match &state.sagas {
        Some(sagas) => {
            let input = OrderSaga::input(&order).map_err(|e| ApiError {
                status: StatusCode::BAD_REQUEST,
                error: e.message.clone(),
                field: Some(e.field.clone()),
            })?;
            state.store.create_in_saga(&order, key, sagas, input).await
        }
        None => state.store.create(&order, key).await,
    };
    match created {
        Ok(event_id) => Ok(created_response(&order.id, event_id, false)),
        Err(CreateOrderError::Duplicate { .. } | CreateOrderError::KeyTaken { .. }) => {
            match state.store.earlier_answer(&order, key).await {
                Ok(EarlierAnswer::Same(event_id)) => {
                    Ok(created_response(&order.id, event_id, true))
                }
                // A key reused for another request is the client's mistake (422, as the
                // IETF Idempotency-Key draft and the gateway answer); an id taken is a conflict.
                Ok(EarlierAnswer::Conflict { field, why }) => Err(ApiError {
                    status: if field == "id" {
                        StatusCode::CONFLICT
                    } else {
                        StatusCode::UNPROCESSABLE_ENTITY
                    },
                    error: why,
                    field: Some(field.to_owned()),
                }),
                Err(e) => Err(store_error(&e)),
            }
        }
        Err(CreateOrderError::Store(e)) => Err(store_error(&e)),
    }
}

/// `POST /pedidos/{id}/cancelacion`: 202 while the saga undoes what it did, 200 once it has
/// (a cancel asked again answers with the final state), 409 once the order is charged and
/// its courier asked for, or paid (too late), 404 for an unknown order, 501 without the order saga.
#[utoipa::path(
    post,
    path = "/pedidos/{id}/cancelacion",
    tag = "pedidos",
    params(("id" = String, Path, description = "The order")),
    responses(
        (status = 202, description = "The saga undoes what it did (`cancelando`).", body = Cancelling),
        (status = 200, description = "Cancelled already (`cancelado`): asked again, the final state.", body = Cancelling),
        (status = 404, description = "No such order.", body = ErrorBody),
        (status = 409, description = "Charged with its courier asked for, or paid: too late to cancel.", body = ErrorBody),
        (status = 501, description = "pedidos runs without the order saga.", body = ErrorBody),
        (status = 503, description = "The database is unavailable; retry.", body = ErrorBody),
    )
)]
async fn cancel_order(
    State(state): State<PedidosState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let Some(sagas) = &state.sagas else {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "cancelling needs pedidos to run the order saga",
        ));
    };
    match sagas.cancel(&id, "cancelado por el cliente").await {
        Ok(CancelOutcome::AlreadyCancelled) => {
            // Asked again: the answer is where the order stands now.
            let cancelled = match state.store.find(&id).await {
                Ok(Some(order)) => order.state == OrderState::Cancelled,
                Ok(None) => false,
                Err(e) => return Err(store_error(&e)),
            };
            let (status, estado) = if cancelled {
                (StatusCode::OK, "cancelado")
            } else {
                (StatusCode::ACCEPTED, "cancelando")
            };
            let body = Cancelling {
                id,
                estado: estado.to_owned(),
            };
            Ok((status, Json(body)).into_response())
        }
        Ok(CancelOutcome::Cancelling) => Ok((
            StatusCode::ACCEPTED,
            Json(Cancelling {
                id,
                estado: "cancelando".to_owned(),
            }),
        )
            .into_response()),
        Ok(CancelOutcome::Completed) => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("order {id} is paid already"),
        )),
        Ok(CancelOutcome::PastPointOfNoReturn) => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("order {id} is charged and its courier is being assigned: too late to cancel"),
        )),
        Err(SagaError::NotFound { .. }) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no order {id}"),
        )),
        Err(SagaError::Store(e)) => Err(store_error(&e)),
        Err(e) if e.is_transient() => {
            Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "try again"))
        }
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            e.to_string(),
        )),
    }
}

/// An order as stored, with its lines and state.
#[utoipa::path(
    get,
    path = "/pedidos/{id}",
    tag = "pedidos",
    params(("id" = String, Path, description = "The order")),
    responses(
        (status = 200, description = "The order.", body = Order),
        (status = 404, description = "No such order.", body = ErrorBody),
        (status = 503, description = "The database is unavailable; retry.", body = ErrorBody),
    )
)]
async fn get_order(
    State(state): State<PedidosState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    match state.store.find(&id).await {
        Ok(Some(mut order)) => {
            if let (OrderState::Cancelled, Some(sagas)) = (order.state, &state.sagas) {
                order.reason = match sagas.show(&id).await {
                    Ok(found) => found.and_then(|(record, _)| record.reason),
                    Err(SagaError::Store(e)) => return Err(store_error(&e)),
                    Err(e) => {
                        tracing::warn!(error = %e, order = %id, "reading the order's saga");
                        None
                    }
                };
            }
            Ok((StatusCode::OK, Json(order)).into_response())
        }
        Ok(None) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no order {id}"),
        )),
        Err(e) => Err(store_error(&e)),
    }
}

/// The cities km0 delivers in (`ciudades`): an order to any other is cancelled.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Cities {
    /// Every city with a courier, in order; `direccion_entrega.ciudad` matches them without
    /// regard to case.
    pub ciudades: Vec<String>,
}

/// The cities km0 delivers in, as reparto answers (asked at most every 30 s).
#[utoipa::path(
    get,
    path = "/ciudades",
    tag = "pedidos",
    responses(
        (status = 200, description = "The covered cities.", body = Cities),
        (status = 503, description = "reparto did not answer (not running, or behind); retry.", body = ErrorBody),
    )
)]
async fn covered_cities(State(state): State<PedidosState>) -> Result<Response, ApiError> {
    let Some(coverage) = &state.coverage else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "this pedidos has no broker to ask reparto through",
        ));
    };
    match coverage.cities().await {
        Ok(ciudades) => Ok((StatusCode::OK, Json(Cities { ciudades })).into_response()),
        Err(e) => {
            tracing::warn!(error = %e, "the covered cities are not known");
            Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                e.to_string(),
            ))
        }
    }
}

/// Whether pedidos can reach its database.
#[utoipa::path(
    get,
    path = "/salud",
    tag = "operations",
    responses(
        (status = 200, description = "It can.", body = Health),
        (status = 503, description = "It cannot.", body = Health),
    )
)]
async fn health(State(state): State<PedidosState>) -> Response {
    let (status, estado) = match state.store.db().ping().await {
        Ok(()) => (StatusCode::OK, "ok"),
        Err(e) => {
            tracing::warn!(error = %e, "health check: database unavailable");
            (StatusCode::SERVICE_UNAVAILABLE, "sin base de datos")
        }
    };
    let body = Health {
        estado: estado.to_owned(),
    };
    (status, Json(body)).into_response()
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
}

/// Transient database failures are 503 (retry later); anything else is a 500. The details
/// stay in the log: they may describe the schema.
fn store_error(e: &entrega_core::StoreError) -> ApiError {
    if e.is_transient() {
        tracing::warn!(error = %e, "database unavailable");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "database unavailable, retry",
        )
    } else {
        tracing::error!(error = %e, "database error");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
    }
}
