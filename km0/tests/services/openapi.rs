//! The OpenAPI 3.1 descriptions of pedidos and of the gateway (pasarela) against their running
//! servers (a real listener, a real SQLite database): the committed `docs/openapi.json` and
//! `docs/openapi-pasarela.json` are the generated ones and are what each server serves at
//! `/openapi.json`; every documented operation is called, on its success and on its documented
//! failures, and each answer's status is one it documents with a body that fits the documented
//! schema; any other method on a documented path, or any other path, is refused (405, 404): no
//! route exists beside the documented ones.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::net::SocketAddr;

use std::collections::BTreeSet;

use km0::services::pasarela::{Faults, Ledger, PasarelaState};
use km0::services::pedidos::{app, openapi, Coverage, OrderStore, PedidosState};
use serde_json::{json, Value};

use common::TestDb;

struct Server {
    addr: SocketAddr,
    http: reqwest::Client,
    doc: Value,
    _db: TestDb,
}

impl Server {
    /// pedidos, asking reparto for its cities through `coverage`.
    async fn pedidos(coverage: Coverage) -> Self {
        let test_db = TestDb::sqlite().await;
        let store = OrderStore::new(test_db.db.clone());
        store.migrate().await.unwrap();
        let doc = serde_json::to_value(openapi()).unwrap();
        let state = PedidosState::new(store).with_coverage(coverage);
        Self::serve(app(state), doc, test_db).await
    }

    async fn pasarela() -> Self {
        let test_db = TestDb::sqlite().await;
        let ledger = Ledger::new(test_db.db.clone());
        ledger.migrate().await.unwrap();
        let faults = Faults {
            declined_cards: vec!["tok_rechazada".into()],
            ..Faults::default()
        };
        let doc = serde_json::to_value(km0::services::pasarela::openapi()).unwrap();
        let router = km0::services::pasarela::app(PasarelaState::new(ledger, faults));
        Self::serve(router, doc, test_db).await
    }

    async fn serve(router: axum::Router, doc: Value, test_db: TestDb) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        let server = Self {
            addr,
            http: reqwest::Client::new(),
            doc,
            _db: test_db,
        };
        // The server describes itself with the same document.
        let served: Value = reqwest::get(format!("http://{addr}/openapi.json"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(served, server.doc);
        server
    }

    /// Every operation the document describes, as (METHOD, path template).
    fn operations(&self) -> BTreeSet<(String, String)> {
        self.doc["paths"]
            .as_object()
            .unwrap()
            .iter()
            .flat_map(|(path, ops)| {
                ops.as_object()
                    .unwrap()
                    .keys()
                    .filter(|k| *k != "parameters")
                    .map(|m| (m.to_uppercase(), path.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Asserts `method path` is refused with `status` (no such route or method).
    async fn refused(&self, method: &str, path: &str, status: u16) {
        let answer = self
            .http
            .request(
                method.parse().unwrap(),
                format!("http://{}{path}", self.addr),
            )
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(answer, status, "{method} {path}");
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
        self.call_keyed(method, template, path, body, None).await
    }

    /// [`Server::call`] with an `Idempotency-Key`.
    async fn call_keyed(
        &self,
        method: &str,
        template: &str,
        path: &str,
        body: Option<Value>,
        key: Option<&str>,
    ) -> (u16, Value) {
        let url = format!("http://{}{path}", self.addr);
        let mut request = self
            .http
            .request(method.parse().unwrap(), &url)
            .header("Content-Type", "application/json");
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        if let Some(body) = body {
            request = request.body(body.to_string());
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body: Value = response.json().await.unwrap();
        let template = template.split('?').next().unwrap_or(template);
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
fn the_committed_descriptions_are_the_generated_ones() {
    for (api, file) in km0::contracts::HTTP_APIS {
        let committed =
            std::fs::read_to_string(format!("{}/../{file}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        assert_eq!(
            committed,
            km0::contracts::openapi_json(api).unwrap(),
            "{file} is behind the code: run `km0 contracts openapi --api {api} --out {file}`"
        );
        let doc: Value = serde_json::from_str(&committed).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
    }
}

#[tokio::test]
async fn every_operation_of_pedidos_answers_as_documented() {
    // reparto answers which cities it covers, on the deployment's log.
    let system = common::test_system("sqlite");
    let reparto = common::coverage::CoverageServer::start(&system).await;
    let server = Server::pedidos(Coverage::new(system.clone())).await;
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
    // The same request again is answered as the first time; another under its id conflicts.
    assert_eq!(
        server.call(m, t, "/pedidos", Some(order("P-OA-1"))).await.0,
        201
    );
    let mut other = order("P-OA-1");
    other["cliente"] = json!("marc");
    assert_eq!(server.call(m, t, "/pedidos", Some(other)).await.0, 409);
    let keyed = |id| (Some(order(id)), Some("k-oa"));
    let (body, key) = keyed("P-OA-K1");
    assert_eq!(server.call_keyed(m, t, "/pedidos", body, key).await.0, 201);
    let (body, key) = keyed("P-OA-K2");
    assert_eq!(server.call_keyed(m, t, "/pedidos", body, key).await.0, 422);
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

    let (m, t) = call("GET", "/ciudades");
    let (status, body) = server.call(m, t, "/ciudades", None).await;
    assert_eq!(
        (status, body["ciudades"][0].as_str()),
        (200, Some("Barcelona"))
    );
    reparto.stop().await;
    let without_reparto = Server::pedidos(Coverage::new(system.clone())).await;
    assert_eq!(
        without_reparto.call(m, t, "/ciudades", None).await.0,
        503,
        "reparto stopped"
    );
    system.destroy().await.unwrap();

    let (m, t) = call("GET", "/salud");
    assert_eq!(server.call(m, t, "/salud", None).await.0, 200);

    // Every documented operation was called.
    let called: BTreeSet<(String, String)> = called
        .into_iter()
        .map(|(m, t)| (m.to_owned(), t.to_owned()))
        .collect();
    assert_eq!(called, server.operations());

    // Nothing else answers: another method on a documented path, or another path.
    for (method, path) in [
        ("DELETE", "/pedidos"),
        ("PUT", "/pedidos/P-OA-1"),
        ("GET", "/pedidos/P-OA-1/cancelacion"),
        ("POST", "/salud"),
    ] {
        server.refused(method, path, 405).await;
    }
    for path in ["/", "/pedido", "/pedidos/P-OA-1/pago", "/api/pedidos"] {
        server.refused("GET", path, 404).await;
    }
}

#[tokio::test]
async fn every_operation_of_the_gateway_answers_as_documented() {
    let server = Server::pasarela().await;
    let mut called = BTreeSet::new();
    let charge =
        |card: &str| json!({"tarjeta": card, "importe_centimos": 1250, "referencia": "P-OA"});

    called.insert(("POST".to_owned(), "/cargos".to_owned()));
    let post = |body, key| server.call_keyed("POST", "/cargos", "/cargos", Some(body), key);
    assert_eq!(post(charge("tok_visa"), Some("cobro-P-OA")).await.0, 201);
    assert_eq!(
        post(charge("tok_visa"), Some("cobro-P-OA")).await.0,
        201,
        "replayed"
    );
    assert_eq!(post(charge("tok_otra"), Some("cobro-P-OA")).await.0, 422);
    assert_eq!(
        post(charge("tok_rechazada"), Some("cobro-P-OB")).await.0,
        402
    );
    assert_eq!(post(charge("tok_visa"), None).await.0, 400);
    let (status, body) = post(json!({"tarjeta": "t", "referencia": "P"}), Some("k")).await;
    assert_eq!(status, 400);
    assert!(
        body["error"].as_str().unwrap().contains("importe_centimos"),
        "{body}"
    );

    called.insert(("POST".to_owned(), "/reembolsos".to_owned()));
    for (charge_key, key, status) in [
        ("cobro-P-OA", "reembolso-P-OA", 201),
        ("cobro-nunca", "reembolso-nunca", 200),
    ] {
        let body = json!({"clave_cargo": charge_key, "referencia": "P-OA"});
        let answer = server
            .call_keyed("POST", "/reembolsos", "/reembolsos", Some(body), Some(key))
            .await;
        assert_eq!(answer.0, status, "{charge_key}");
    }

    called.insert(("GET".to_owned(), "/cargos".to_owned()));
    let (status, ledger) = server
        .call("GET", "/cargos", "/cargos?referencia=P-OA", None)
        .await;
    assert_eq!(status, 200);
    // The approved charge and the declined one (same reference, another key).
    assert_eq!(ledger["cargos"].as_array().unwrap().len(), 2);
    assert_eq!(ledger["reembolsos"].as_array().unwrap().len(), 1);

    called.insert(("GET".to_owned(), "/fallos".to_owned()));
    called.insert(("PUT".to_owned(), "/fallos".to_owned()));
    assert_eq!(server.call("GET", "/fallos", "/fallos", None).await.0, 200);
    let faults = json!({"latencia_ms": 0, "fallar_503": 1});
    assert_eq!(
        server
            .call("PUT", "/fallos", "/fallos", Some(faults))
            .await
            .0,
        200
    );
    assert_eq!(post(charge("tok_visa"), Some("cobro-P-OC")).await.0, 503);
    let unknown = json!({"latencia": 5});
    assert_eq!(
        server
            .call("PUT", "/fallos", "/fallos", Some(unknown))
            .await
            .0,
        400
    );

    called.insert(("GET".to_owned(), "/salud".to_owned()));
    assert_eq!(server.call("GET", "/salud", "/salud", None).await.0, 200);
    assert_eq!(called, server.operations());

    server.refused("DELETE", "/cargos", 405).await;
    server.refused("GET", "/reembolsos", 405).await;
    server.refused("GET", "/cargos/ch_1", 404).await;
}
