//! The operations endpoint's OpenAPI 3.1 description (liveness, readiness, metrics and the web
//! console) against a real `km0 up --console-token ...`: it serves the committed description
//! at `/openapi.json`, and every documented operation, called on its success and its
//! documented failures, answers with a documented status, of the documented content type,
//! its JSON body fitting the documented schema (a real dead-letter report included).

use std::collections::BTreeSet;
use std::time::Duration;

use entrega_core::headers::{ID_EVENTO, TIPO};
use entrega_core::{Headers, OutgoingMessage};
use km0::services::pedidos::TOPIC;
use reqwest::Method;
use serde_json::{json, Value};

use crate::common::process::Deployment;
use crate::common::state::eventually;

const SECRET: &str = "un-secreto-de-operaciones";

struct Ops {
    base: String,
    http: reqwest::Client,
    doc: Value,
    called: BTreeSet<(String, String)>,
}

impl Ops {
    /// Calls `method path` (as the documented `template`), with the operator's token when
    /// `token`; asserts the answer is documented and fits; returns its status and JSON body
    /// (`Null` for text and HTML).
    async fn call(
        &mut self,
        method: &str,
        template: &str,
        path: &str,
        body: Option<Value>,
        token: bool,
    ) -> (u16, Value) {
        self.called.insert((method.to_owned(), template.to_owned()));
        let mut request = self.http.request(
            Method::from_bytes(method.as_bytes()).unwrap(),
            format!("{}{path}", self.base),
        );
        if token {
            request = request.bearer_auth(SECRET);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let text = response.text().await.unwrap();
        let documented =
            &self.doc["paths"][template][method.to_lowercase()]["responses"][status.to_string()];
        assert!(
            documented.is_object(),
            "{method} {path} answered {status}, which it does not document: {text}"
        );
        let contents = documented["content"].as_object().unwrap();
        let (declared, content) = contents
            .iter()
            .find(|(ct, _)| content_type.starts_with(ct.as_str()))
            .unwrap_or_else(|| {
                panic!("{method} {path} {status}: content type {content_type} is not documented")
            });
        if declared != "application/json" {
            return (status, Value::Null);
        }
        let body: Value = serde_json::from_str(&text).unwrap();
        if let Some((at, why)) =
            entrega::contracts::first_failure_in(&self.doc, &content["schema"], &body)
        {
            panic!("{method} {path} {status}: `{at}` {why}: {body}");
        }
        (status, body)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_of_the_operations_endpoint_answers_as_documented() {
    let deployment = Deployment::new("sqlite", 1_000);
    let token = format!("ana:{SECRET}");
    let (_up, ops) = deployment
        .start_up("up-1", &["--console-token", &token])
        .await;
    let doc = serde_json::to_value(km0::wiring::ops_openapi()).unwrap();
    let served: Value = reqwest::get(format!("http://{ops}/openapi.json"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(served, doc, "served as generated");
    let mut o = Ops {
        base: format!("http://{ops}"),
        http: reqwest::Client::new(),
        doc,
        called: BTreeSet::new(),
    };

    // A dead letter to act on: an order for a product inventario does not know.
    let broker = deployment.system().broker_log().await.unwrap();
    let event_id = uuid::Uuid::new_v4().to_string();
    let envelope = json!({"id_evento": event_id, "tipo": "pedido.creado", "version": 2,
        "fecha_ms": 1_764_000_000_000i64, "origen": "tienda",
        "datos": {"id": "OA-DLQ", "cliente": "ana",
                  "lineas": [{"producto": "trufa", "cantidad": 1, "precio_centimos": 900}]}});
    broker
        .publisher()
        .publish(&[OutgoingMessage {
            topic: TOPIC.to_owned(),
            key: Some("OA-DLQ".to_owned()),
            headers: Headers::new()
                .with(TIPO, "pedido.creado")
                .with(ID_EVENTO, event_id),
            payload: serde_json::to_vec(&envelope).unwrap(),
        }])
        .await
        .unwrap();
    let dlq = format!("{TOPIC}.dlq");
    let letter = eventually(Duration::from_secs(60), "a dead letter", || async {
        for (partition, end) in broker.end_offsets(&dlq).await.unwrap() {
            for r in broker.read(&dlq, partition, 0, end as usize).await.unwrap() {
                if r.key.as_deref() == Some("OA-DLQ") {
                    return Some(format!("{dlq}/{partition}/{}", r.offset));
                }
            }
        }
        None
    })
    .await;

    assert_eq!(
        o.call("GET", "/healthz", "/healthz", None, false).await.0,
        200
    );
    assert_eq!(
        o.call("GET", "/readyz", "/readyz", None, false).await.0,
        200
    );
    assert_eq!(
        o.call("GET", "/metrics", "/metrics", None, false).await.0,
        200
    );

    // The pages (read from loopback: no token needed).
    assert_eq!(
        o.call("GET", "/console", "/console", None, false).await.0,
        200
    );
    let d = "/console/dlq";
    assert_eq!(o.call("GET", d, d, None, false).await.0, 200);
    let all = "/console/dlq?estado=todos";
    assert_eq!(o.call("GET", d, all, None, false).await.0, 200);
    let l = "/console/dlq/letter";
    let one = format!("{l}?id={letter}");
    assert_eq!(o.call("GET", l, &one, None, false).await.0, 200);
    assert_eq!(o.call("GET", l, l, None, false).await.0, 400);
    let gone = format!("{l}?id={dlq}/0/99999");
    assert_eq!(o.call("GET", l, &gone, None, false).await.0, 404);
    let s = "/console/sagas";
    assert_eq!(o.call("GET", s, s, None, false).await.0, 200);
    let odd = "/console/sagas?estado=raro";
    assert_eq!(o.call("GET", s, odd, None, false).await.0, 400);
    let one_saga = "/console/sagas/{id}";
    assert_eq!(
        o.call("GET", one_saga, "/console/sagas/OA-NONE", None, false)
            .await
            .0,
        404
    );
    let t = "/console/trace";
    assert_eq!(
        o.call("GET", t, "/console/trace?pedido=OA-DLQ", None, false)
            .await
            .0,
        200
    );

    // The actions: a token required, bodies checked, a real report.
    let w = "/console/api/whoami";
    let (status, me) = o.call("GET", w, w, None, true).await;
    assert_eq!((status, me["operator"].as_str()), (200, Some("ana")));
    assert_eq!(o.call("GET", w, w, None, false).await.0, 401);
    let r = "/console/api/dlq/replay";
    let dry = json!({"ids": [letter], "dry_run": true});
    let (status, report) = o.call("POST", r, r, Some(dry), true).await;
    assert_eq!((status, report["matched"].as_u64()), (200, Some(1)));
    assert_eq!(
        o.call("POST", r, r, Some(json!({"ids": []})), true).await.0,
        400
    );
    assert_eq!(
        o.call("POST", r, r, Some(json!({"ids": [letter]})), false)
            .await
            .0,
        401
    );
    let x = "/console/api/dlq/discard";
    let discard = json!({"ids": [letter], "reason": "prueba", "dry_run": true});
    assert_eq!(o.call("POST", x, x, Some(discard), true).await.0, 200);
    assert_eq!(
        o.call("POST", x, x, Some(json!({"ids": [letter]})), true)
            .await
            .0,
        400
    );
    let retry = "/console/api/sagas/{id}/retry";
    let none = "/console/api/sagas/OA-NONE/retry";
    assert_eq!(o.call("POST", retry, none, None, true).await.0, 409);

    // Every documented operation was called.
    let documented: BTreeSet<(String, String)> = o.doc["paths"]
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
    assert_eq!(o.called, documented);
}
