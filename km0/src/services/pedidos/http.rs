//! The HTTP API of `pedidos`: create an order (with its event), read it back, health.
//!
//! Every answer is JSON, errors included: `{"error": "...", "campo": "<field>"}`. Bodies go
//! through [`OrderBody`], our own extractor, because axum's `Json` rejects with plain text
//! and cannot name the field a business rule failed on.

use axum::body::Bytes;
use axum::extract::{FromRequest, Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use super::db::{CreateOrderError, OrderStore};
use super::domain::NewOrder;
use super::saga::OrderSaga;
use entrega::saga::{CancelOutcome, SagaError, Sagas};

/// Largest accepted request body, in bytes. An order of the maximum number of lines fits.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct PedidosState {
    store: OrderStore,
    sagas: Option<Sagas>,
}

impl PedidosState {
    /// State over an orders store (already migrated).
    pub fn new(store: OrderStore) -> Self {
        Self { store, sagas: None }
    }

    /// The same, with every new order run by the order saga of `sagas` (migrated, in the
    /// orders database).
    pub fn with_sagas(store: OrderStore, sagas: Sagas) -> Self {
        Self {
            store,
            sagas: Some(sagas),
        }
    }
}

/// The routes of `pedidos`: `POST /pedidos`, `GET /pedidos/{id}`,
/// `POST /pedidos/{id}/cancelacion` (with the order saga), `GET /salud`.
pub fn app(state: PedidosState) -> Router {
    Router::new()
        .route("/pedidos", post(create_order))
        .route("/pedidos/{id}", get(get_order))
        .route("/pedidos/{id}/cancelacion", post(cancel_order))
        .route("/salud", get(health))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(axum::middleware::from_fn(crate::telemetry::http::traced))
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
        let mut body = json!({ "error": self.error });
        if let Some(field) = self.field {
            body["campo"] = Value::String(field);
        }
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
                format!("el cuerpo supera el máximo de {MAX_BODY_BYTES} bytes"),
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
                    "JSON mal formado en la línea {}, columna {}: {e}",
                    e.line(),
                    e.column()
                ),
            )
        })?;
        NewOrder::from_json(&value)
            .map(OrderBody)
            .map_err(|e| ApiError::bad_request(e.field, e.message))
    }
}

fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let wrong = || {
        ApiError::bad_request(
            "content-type",
            "el cuerpo debe enviarse como application/json",
        )
    };
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

async fn create_order(
    State(state): State<PedidosState>,
    OrderBody(order): OrderBody,
) -> Result<Response, ApiError> {
    let created = match &state.sagas {
        Some(sagas) => {
            let input = OrderSaga::input(&order).map_err(|e| ApiError {
                status: StatusCode::BAD_REQUEST,
                error: e.message.clone(),
                field: Some(e.field.clone()),
            })?;
            state.store.create_in_saga(&order, sagas, input).await
        }
        None => state.store.create(&order).await,
    };
    match created {
        Ok(event_id) => {
            let location = format!("/pedidos/{}", order.id);
            let mut response = (
                StatusCode::CREATED,
                Json(json!({ "id": order.id, "id_evento": event_id })),
            )
                .into_response();
            if let Ok(value) = HeaderValue::from_str(&location) {
                response.headers_mut().insert(header::LOCATION, value);
            }
            Ok(response)
        }
        Err(CreateOrderError::Duplicate { id }) => Err(ApiError {
            status: StatusCode::CONFLICT,
            error: format!("el pedido {id} ya existe"),
            field: Some("id".to_owned()),
        }),
        Err(CreateOrderError::Store(e)) => Err(store_error(&e)),
    }
}

/// `POST /pedidos/{id}/cancelacion`: 202 while the saga undoes what it did, 409 once the
/// order is paid (too late), 404 for an unknown order, 501 without the order saga.
async fn cancel_order(
    State(state): State<PedidosState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let Some(sagas) = &state.sagas else {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "las cancelaciones necesitan la saga de pedidos",
        ));
    };
    match sagas.cancel(&id, "cancelado por el cliente").await {
        Ok(CancelOutcome::Cancelling | CancelOutcome::AlreadyCancelled) => Ok((
            StatusCode::ACCEPTED,
            Json(json!({ "id": id, "estado": "cancelando" })),
        )
            .into_response()),
        Ok(CancelOutcome::Completed) => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("el pedido {id} ya está pagado"),
        )),
        Err(SagaError::NotFound { .. }) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no existe el pedido {id}"),
        )),
        Err(SagaError::Store(e)) => Err(store_error(&e)),
        Err(e) if e.is_transient() => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "inténtalo de nuevo",
        )),
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            e.to_string(),
        )),
    }
}

async fn get_order(
    State(state): State<PedidosState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    match state.store.find(&id).await {
        Ok(Some(order)) => Ok((StatusCode::OK, Json(order)).into_response()),
        Ok(None) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no existe el pedido {id}"),
        )),
        Err(e) => Err(store_error(&e)),
    }
}

async fn health(State(state): State<PedidosState>) -> Response {
    match state.store.db().ping().await {
        Ok(()) => (StatusCode::OK, Json(json!({ "estado": "ok" }))).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "health check: database unavailable");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({ "estado": "sin base de datos" })),
            )
                .into_response()
        }
    }
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "ruta desconocida")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "método no permitido")
}

/// Transient database failures are 503 (retry later); anything else is a 500. The details
/// stay in the log: they may describe the schema.
fn store_error(e: &entrega_core::StoreError) -> ApiError {
    if e.is_transient() {
        tracing::warn!(error = %e, "database unavailable");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "base de datos no disponible, reintente",
        )
    } else {
        tracing::error!(error = %e, "database error");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "error interno")
    }
}
