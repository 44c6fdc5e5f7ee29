//! `GET /openapi.json` on each of km0's HTTP APIs: the API's OpenAPI 3.1 description,
//! serialized once when the routes are built and served as those bytes.

use axum::body::Bytes;
use axum::http::header;
use axum::response::IntoResponse as _;
use axum::Router;

/// `router` with `GET /openapi.json` answering `api`.
pub fn with_openapi<S>(router: Router<S>, api: &utoipa::openapi::OpenApi) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    // Serializing a description built from the handlers cannot fail; were it to, the route
    // answers an empty object rather than the process failing to start.
    let body = Bytes::from(serde_json::to_vec(api).unwrap_or_else(|_| b"{}".to_vec()));
    router.route(
        "/openapi.json",
        axum::routing::get(move || {
            let body = body.clone();
            async move { ([(header::CONTENT_TYPE, "application/json")], body).into_response() }
        }),
    )
}
