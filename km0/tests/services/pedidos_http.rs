//! The pedidos HTTP API, driven with `oneshot` (no server), against a real SQLite database:
//! every answer is checked together with what is (or is not) stored.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt as _;
use km0::services::pedidos::{app, OrderStore, PedidosState, MAX_BODY_BYTES};
use serde_json::{json, Value};
use tower::ServiceExt as _;

use common::TestDb;

struct Api {
    app: Router,
    test_db: TestDb,
}

impl Api {
    async fn new() -> Self {
        let test_db = TestDb::sqlite().await;
        let store = OrderStore::new(test_db.db.clone());
        store.migrate().await.unwrap();
        Self {
            app: app(PedidosState::new(store)),
            test_db,
        }
    }

    async fn send(&self, request: Request<Body>) -> (StatusCode, Value) {
        let response = self.app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
        };
        (status, body)
    }

    async fn post_raw(
        &self,
        content_type: Option<&str>,
        body: impl Into<Body>,
    ) -> (StatusCode, Value) {
        let mut request = Request::post("/pedidos");
        if let Some(ct) = content_type {
            request = request.header(header::CONTENT_TYPE, ct);
        }
        self.send(request.body(body.into()).unwrap()).await
    }

    async fn post(&self, body: &Value) -> (StatusCode, Value) {
        self.post_raw(Some("application/json"), body.to_string())
            .await
    }

    async fn get(&self, uri: &str) -> (StatusCode, Value) {
        self.send(Request::get(uri).body(Body::empty()).unwrap())
            .await
    }

    fn pool(&self) -> &sqlx::SqlitePool {
        self.test_db.db.sqlite().expect("HTTP tests run on SQLite")
    }

    async fn count(&self, table: &str) -> i64 {
        sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
            .fetch_one(self.pool())
            .await
            .unwrap()
    }

    async fn assert_nothing_stored(&self, case: &str) {
        for table in ["pedidos", "lineas_pedido", "outbox"] {
            assert_eq!(self.count(table).await, 0, "{case}: rows in {table}");
        }
    }
}

fn order(id: &str) -> Value {
    json!({
        "id": id, "cliente": "ana", "mercado": "girona",
        "lineas": [
            {"producto": "queso-curado", "cantidad": 2, "precio_centimos": 1450},
            {"producto": "tomate-rosa", "cantidad": 1, "precio_centimos": 350}
        ]
    })
}

#[tokio::test]
async fn a_valid_order_is_stored_with_its_event_in_the_same_database() {
    let api = Api::new().await;
    let (status, body) = api.post(&order("P-2026-000123")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["id"], "P-2026-000123");
    let event_id = body["id_evento"].as_str().expect("id_evento").to_owned();

    let rows: Vec<(String, String, String, String, String)> =
        sqlx::query_as("SELECT id, agregado, agregado_id, tipo, carga FROM outbox")
            .fetch_all(api.pool())
            .await
            .unwrap();
    assert_eq!(rows.len(), 1);
    let (id, aggregate, aggregate_id, kind, payload) = &rows[0];
    assert_eq!(id, &event_id);
    assert_eq!(
        (aggregate.as_str(), aggregate_id.as_str()),
        ("pedido", "P-2026-000123")
    );
    assert_eq!(kind, "pedido.creado");
    let payload: Value = serde_json::from_str(payload).unwrap();
    assert_eq!(
        payload,
        order("P-2026-000123"),
        "carga is the order as received"
    );

    let state: String = sqlx::query_scalar("SELECT estado FROM pedidos WHERE id = 'P-2026-000123'")
        .fetch_one(api.pool())
        .await
        .unwrap();
    assert_eq!(state, "creado");
    assert_eq!(api.count("lineas_pedido").await, 2);
    api.test_db.remove().await;
}

#[tokio::test]
async fn every_kind_of_invalid_body_is_a_400_naming_the_field_and_stores_nothing() {
    let api = Api::new().await;
    let valid = order("P-1");
    let with = |path: &[&str], value: Value| {
        let mut body = valid.clone();
        let mut target = &mut body;
        for (i, key) in path.iter().enumerate() {
            if i + 1 == path.len() {
                if value.is_null() {
                    target.as_object_mut().unwrap().remove(*key);
                } else {
                    target[*key] = value.clone();
                }
                break;
            }
            target = match key.parse::<usize>() {
                Ok(n) => &mut target[n],
                Err(_) => &mut target[*key],
            };
        }
        body.to_string()
    };
    let oversized = json!({
        "id": "P-1", "cliente": "x".repeat(MAX_BODY_BYTES), "mercado": "m",
        "lineas": [{"producto": "p", "cantidad": 1, "precio_centimos": 1}]
    })
    .to_string();
    let cases: Vec<(&str, Option<&str>, String, &str)> = vec![
        (
            "malformed json",
            Some("application/json"),
            "{\"id\": \"P-1\",".into(),
            "cuerpo",
        ),
        (
            "not an object",
            Some("application/json"),
            "[1, 2]".into(),
            "cuerpo",
        ),
        (
            "missing id",
            Some("application/json"),
            with(&["id"], Value::Null),
            "id",
        ),
        (
            "empty cliente",
            Some("application/json"),
            with(&["cliente"], json!("")),
            "cliente",
        ),
        (
            "missing mercado",
            Some("application/json"),
            with(&["mercado"], Value::Null),
            "mercado",
        ),
        (
            "no lines",
            Some("application/json"),
            with(&["lineas"], json!([])),
            "lineas",
        ),
        (
            "lines missing",
            Some("application/json"),
            with(&["lineas"], Value::Null),
            "lineas",
        ),
        (
            "zero quantity",
            Some("application/json"),
            with(&["lineas", "1", "cantidad"], json!(0)),
            "lineas[1].cantidad",
        ),
        (
            "negative quantity",
            Some("application/json"),
            with(&["lineas", "0", "cantidad"], json!(-2)),
            "lineas[0].cantidad",
        ),
        (
            "empty product",
            Some("application/json"),
            with(&["lineas", "0", "producto"], json!("")),
            "lineas[0].producto",
        ),
        (
            "negative price",
            Some("application/json"),
            with(&["lineas", "0", "precio_centimos"], json!(-1)),
            "lineas[0].precio_centimos",
        ),
        (
            "wrong content type",
            Some("text/plain"),
            valid.to_string(),
            "content-type",
        ),
        ("no content type", None, valid.to_string(), "content-type"),
        ("oversized", Some("application/json"), oversized, "cuerpo"),
    ];
    for (case, content_type, body, field) in cases {
        let (status, answer) = api.post_raw(content_type, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{case}: {answer}");
        assert_eq!(answer["campo"], field, "{case}: {answer}");
        assert!(
            answer["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{case}: error text: {answer}"
        );
        api.assert_nothing_stored(case).await;
    }
    api.test_db.remove().await;
}

#[tokio::test]
async fn a_second_order_with_the_same_id_is_a_409_and_changes_nothing() {
    let api = Api::new().await;
    assert_eq!(api.post(&order("P-7")).await.0, StatusCode::CREATED);
    let mut again = order("P-7");
    again["cliente"] = json!("marc");
    let (status, body) = api.post(&again).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["campo"], "id");
    assert_eq!(api.count("pedidos").await, 1);
    assert_eq!(
        api.count("lineas_pedido").await,
        2,
        "no lines of the refused order"
    );
    assert_eq!(api.count("outbox").await, 1, "no second event");
    let (_, stored) = api.get("/pedidos/P-7").await;
    assert_eq!(stored["cliente"], "ana");
    api.test_db.remove().await;
}

/// A POST with the `Idempotency-Key` header `key`.
async fn post_with_key(api: &Api, key: &str, body: &Value) -> (StatusCode, Value, bool) {
    let request = Request::post("/pedidos")
        .header(header::CONTENT_TYPE, "application/json")
        .header("Idempotency-Key", key)
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = api.app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let replayed = response.headers().get("idempotent-replayed").is_some();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap(), replayed)
}

#[tokio::test]
async fn the_same_order_posted_again_gets_the_original_answer_and_stores_nothing_new() {
    let api = Api::new().await;
    let (status, first) = api.post(&order("P-8")).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    // The same order in another spelling (keys reordered, spaces) is the same request.
    let mut fields: Vec<(String, Value)> = order("P-8")
        .as_object()
        .unwrap()
        .clone()
        .into_iter()
        .collect();
    fields.reverse();
    let respelled = format!(
        "{{ {} }}",
        fields
            .iter()
            .map(|(k, v)| format!("\"{k}\" :  {v}"))
            .collect::<Vec<_>>()
            .join(" , ")
    );
    for _ in 0..2 {
        let (status, again) = api
            .post_raw(Some("application/json"), respelled.clone())
            .await;
        assert_eq!((status, &again), (StatusCode::CREATED, &first));
    }
    let (_, again, replayed) = post_with_key(&api, "k-later", &order("P-8")).await;
    assert_eq!(again, first, "a key sent only on the retry changes nothing");
    assert!(replayed, "the answer says it was given before");
    assert_eq!(api.count("pedidos").await, 1);
    assert_eq!(
        api.count("outbox").await,
        1,
        "one event, not one per request"
    );
    api.test_db.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_order_posted_eight_times_at_once_is_created_once_and_answered_alike() {
    let api = Api::new().await;
    let body = order("P-RACE");
    let answers = futures::future::join_all((0..8).map(|_| api.post(&body))).await;
    for (status, body) in &answers {
        assert_eq!((*status, body), (StatusCode::CREATED, &answers[0].1));
    }
    assert_eq!(api.count("pedidos").await, 1);
    assert_eq!(api.count("outbox").await, 1);
    api.test_db.remove().await;
}

#[tokio::test]
async fn an_idempotency_key_answers_its_own_request_again_and_refuses_another() {
    let api = Api::new().await;
    let (status, first, replayed) = post_with_key(&api, "key-1", &order("P-K1")).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert!(!replayed);
    let (status, again, replayed) = post_with_key(&api, "key-1", &order("P-K1")).await;
    assert_eq!(
        (status, &again, replayed),
        (StatusCode::CREATED, &first, true)
    );

    // The key with another order: refused, and that order is not created.
    let (status, refused, _) = post_with_key(&api, "key-1", &order("P-K2")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert_eq!(refused["campo"], "Idempotency-Key");
    assert_eq!(api.get("/pedidos/P-K2").await.0, StatusCode::NOT_FOUND);
    // Another key for an id taken with other contents: the id conflicts.
    let mut other = order("P-K1");
    other["cliente"] = json!("marc");
    let (status, refused, _) = post_with_key(&api, "key-2", &other).await;
    assert_eq!(
        (status, refused["campo"].as_str()),
        (StatusCode::CONFLICT, Some("id"))
    );
    // A key no one could mean.
    for bad in ["", "with space", &"k".repeat(256)] {
        let (status, refused, _) = post_with_key(&api, bad, &order("P-K3")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad:?}: {refused}");
        assert_eq!(refused["campo"], "Idempotency-Key");
    }
    assert_eq!(api.count("pedidos").await, 1);
    assert_eq!(api.count("outbox").await, 1);
    api.test_db.remove().await;
}

#[tokio::test]
async fn input_that_could_reach_a_terminal_a_path_or_a_second_reader_is_refused() {
    let api = Api::new().await;
    let with = |field: &str, value: Value| {
        let mut o = order("P-SAFE");
        o[field] = value;
        o
    };
    let mut street = order("P-SAFE");
    street["direccion_entrega"] =
        json!({"ciudad": "Girona", "codigo_postal": "17001", "calle": "Nou\u{1b}[2J 1"});
    let mut product = order("P-SAFE");
    product["lineas"][1]["producto"] = json!("tomate\u{202e}rosa");
    let cases = [
        (with("id", json!("P-1\u{1b}[2J")), "id"),
        (with("id", json!("P 15/../x")), "id"),
        (with("id", json!("x".repeat(65))), "id"),
        (with("cliente", json!("ana\n")), "cliente"),
        (street, "direccion_entrega.calle"),
        (product, "lineas[1].producto"),
    ];
    for (body, field) in cases {
        let (status, answer) = api.post(&body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["campo"], field, "{body}: {answer}");
    }
    // Two readers may keep different values of a key written twice: refused, named.
    let twice = r#"{"id": "P-SAFE", "id": "P-OTHER", "cliente": "ana", "mercado": "girona",
        "lineas": [{"producto": "x", "cantidad": 1, "precio_centimos": 1, "cantidad": 9}]}"#;
    let (status, answer) = api.post_raw(Some("application/json"), twice).await;
    assert_eq!(
        (status, answer["campo"].as_str()),
        (StatusCode::BAD_REQUEST, Some("id"))
    );
    api.assert_nothing_stored("unsafe input").await;
    api.test_db.remove().await;
}

#[tokio::test]
async fn an_order_reads_back_with_its_lines_and_a_missing_one_is_a_json_404() {
    let api = Api::new().await;
    assert_eq!(api.post(&order("P-9")).await.0, StatusCode::CREATED);
    let (status, body) = api.get("/pedidos/P-9").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["id"], "P-9");
    assert_eq!(body["cliente"], "ana");
    assert_eq!(body["mercado"], "girona");
    assert_eq!(body["estado"], "creado");
    assert!(
        body["creado_en"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{body}"
    );
    assert_eq!(body["lineas"], order("P-9")["lineas"]);

    let (status, body) = api.get("/pedidos/P-404").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("P-404")),
        "{body}"
    );
    api.test_db.remove().await;
}

#[tokio::test]
async fn health_answers_and_unknown_routes_are_json() {
    let api = Api::new().await;
    let (status, body) = api.get("/salud").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["estado"], "ok");
    let (status, body) = api.get("/nada").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["error"].is_string());
    let (status, body) = api
        .send(Request::delete("/pedidos").body(Body::empty()).unwrap())
        .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(body["error"].is_string());
    api.test_db.remove().await;
}

#[tokio::test]
async fn a_closed_database_is_a_json_error_not_a_panic() {
    let api = Api::new().await;
    api.test_db.db.close().await;
    let (status, body) = api.post(&order("P-1")).await;
    assert!(status.is_server_error(), "{status}: {body}");
    assert!(body["error"].is_string());
    let (status, _) = api.get("/salud").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    api.test_db.remove().await;
}

#[tokio::test]
async fn a_database_locked_past_the_busy_timeout_is_a_503_with_retry_after() {
    let api = Api::new().await;
    // Another process holding the write lock longer than busy_timeout (5 s).
    let other = entrega_sqlite::connect(&api.test_db.url).await.unwrap();
    let lock = entrega_sqlite::begin_immediate(&other).await.unwrap();
    let response = api
        .app
        .clone()
        .oneshot(
            Request::post("/pedidos")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(order("P-busy").to_string()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    drop(lock);
    other.close().await;
    api.assert_nothing_stored("locked").await;
    assert_eq!(
        api.post(&order("P-busy")).await.0,
        StatusCode::CREATED,
        "retrying works"
    );
    api.test_db.remove().await;
}
