//! pedidos' OpenAPI 3.1 description against the running server (a real listener, a real
//! SQLite database): the committed `docs/openapi.json` is the generated one and is what the
//! server serves at `/openapi.json`; every documented operation is called, on its success and
//! on its documented failures, and each answer's status is one it documents with a body that
//! fits the documented schema; any other method on a documented path, or any other path, is
//! refused (405, 404): no route exists beside the documented ones.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::net::SocketAddr;

use km0::services::pedidos::{app, openapi, OrderStore, PedidosState};
use serde_json::{json, Value};

use common::TestDb;

struct Server {
    addr: SocketAddr,
    http: reqwest::Client,
    doc: Value,
    _db: TestDb,
}

impl Server {
    async fn start() -> Self {
        let test_db = TestDb::sqlite().await;
        let store = OrderStore::new(test_db.db.clone());
        store.migrate().await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = app(PedidosState::new(store));
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        Self {
            addr,
            http: reqwest::Client::new(),
            doc: serde_json::to_value(openapi()).unwrap(),
            _db: test_db,
        }
    }

    /// Calls `method path` (with `body` as JSON); asserts the answer is documented for the
    /// operation `template` and fits its schema; returns the status and body.
    async fn call(
        &self,
        method: &str,
        template: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let url = format!("http://{}{path}", self.addr);
        let mut request = self
            .http
            .request(method.parse().unwrap(), &url)
            .header("Content-Type", "application/json");
        if let Some(body) = body {
            request = request.body(body.to_string());
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body: Value = response.json().await.unwrap();
        let operation = &self.doc["paths"][template][method.to_lowercase()];
        assert!(
            operation.is_object(),
            "{method} {template} is not documented"
        );
        let documented = &operation["responses"][status.to_string()];
        assert!(
            documented.is_object(),
            "{method} {path} answered {status}, which it does not document: {body}"
        );
        let schema = &documented["content"]["application/json"]["schema"];
        if let Some((at, why)) = entrega::contracts::first_failure_in(&self.doc, schema, &body) {
            panic!("{method} {path} {status}: `{at}` {why}: {body}");
        }
        if let Some(declared) = documented["headers"].as_object() {
            for name in declared.keys() {
                assert!(
                    headers.contains_key(name.as_str()),
                    "{method} {path} {status}: no {name} header"
                );
            }
        }
        (status, body)
    }
}

fn order(id: &str) -> Value {
    json!({"id": id, "cliente": "ana", "mercado": "girona",
        "lineas": [{"producto": "queso-curado", "cantidad": 2, "precio_centimos": 1450}],
        "direccion_entrega": {"ciudad": "Girona", "codigo_postal": "17001", "calle": "Carrer Nou 1"}})
}

#[test]
fn the_committed_description_is_the_generated_one() {
    let committed =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json"))
            .unwrap();
    assert_eq!(
        committed,
        km0::contracts::openapi_json().unwrap(),
        "docs/openapi.json is behind the code: run `km0 contracts openapi --out docs/openapi.json`"
    );
    let doc: Value = serde_json::from_str(&committed).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
}

#[tokio::test]
async fn every_documented_operation_answers_as_documented() {
    let server = Server::start().await;
    // The server describes itself with the same document.
    let served: Value = reqwest::get(format!("http://{}/openapi.json", server.addr))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(served, server.doc);
    // The check bites: an answer that does not fit its schema is named.
    let created = &server.doc["paths"]["/pedidos"]["post"]["responses"]["201"]["content"]
        ["application/json"]["schema"];
    let wrong = json!({"id": 7, "id_evento": "x"});
    assert_eq!(
        entrega::contracts::first_failure_in(&server.doc, created, &wrong).map(|f| f.0),
        Some("id".to_owned())
    );
    let order_schema = &server.doc["paths"]["/pedidos/{id}"]["get"]["responses"]["200"]["content"]
        ["application/json"]["schema"];
    let unknown_state = json!({"id": "P", "cliente": "a", "mercado": "m", "estado": "perdido",
        "creado_en": "2026-01-01T00:00:00Z", "lineas": []});
    assert!(
        entrega::contracts::first_failure_in(&server.doc, order_schema, &unknown_state).is_some()
    );

    let mut called = std::collections::BTreeSet::new();
    let mut call = |method: &'static str, template: &'static str| {
        called.insert((method, template));
        (method, template)
    };
    let (m, t) = call("POST", "/pedidos");
    assert_eq!(
        server.call(m, t, "/pedidos", Some(order("P-OA-1"))).await.0,
        201
    );
    assert_eq!(
        server.call(m, t, "/pedidos", Some(order("P-OA-1"))).await.0,
        409
    );
    let mut bad = order("P-OA-2");
    bad["lineas"][0]["cantidad"] = json!(0);
    let (status, body) = server.call(m, t, "/pedidos", Some(bad)).await;
    assert_eq!(
        (status, body["campo"].as_str()),
        (400, Some("lineas[0].cantidad"))
    );
    let mut no_postal_code = order("P-OA-3");
    no_postal_code["direccion_entrega"]
        .as_object_mut()
        .unwrap()
        .remove("codigo_postal");
    let (status, body) = server.call(m, t, "/pedidos", Some(no_postal_code)).await;
    assert_eq!(
        (status, body["campo"].as_str()),
        (400, Some("direccion_entrega.codigo_postal"))
    );

    let (m, t) = call("GET", "/pedidos/{id}");
    let (status, body) = server.call(m, t, "/pedidos/P-OA-1", None).await;
    assert_eq!((status, body["estado"].as_str()), (200, Some("creado")));
    assert_eq!(server.call(m, t, "/pedidos/P-OA-404", None).await.0, 404);

    let (m, t) = call("POST", "/pedidos/{id}/cancelacion");
    assert_eq!(
        server
            .call(m, t, "/pedidos/P-OA-1/cancelacion", None)
            .await
            .0,
        501,
        "without the order saga"
    );

    let (m, t) = call("GET", "/salud");
    assert_eq!(server.call(m, t, "/salud", None).await.0, 200);

    // Every documented operation was called.
    let documented: std::collections::BTreeSet<(String, String)> = server.doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(|m| (m.to_uppercase(), path.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    let called: std::collections::BTreeSet<(String, String)> = called
        .into_iter()
        .map(|(m, t)| (m.to_owned(), t.to_owned()))
        .collect();
    assert_eq!(called, documented);

    // Nothing else answers: another method on a documented path, or another path.
    let url = |path: &str| format!("http://{}{path}", server.addr);
    for (method, path) in [
        ("DELETE", "/pedidos"),
        ("PUT", "/pedidos/P-OA-1"),
        ("GET", "/pedidos/P-OA-1/cancelacion"),
        ("POST", "/salud"),
    ] {
        let status = server
            .http
            .request(method.parse().unwrap(), url(path))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 405, "{method} {path}");
    }
    for path in ["/", "/pedido", "/pedidos/P-OA-1/pago", "/api/pedidos"] {
        assert_eq!(
            reqwest::get(url(path)).await.unwrap().status(),
            404,
            "{path}"
        );
    }
}
