//! Refunds at the payment gateway simulator over real HTTP: a charge given back once however
//! often the refund is sent and under however many keys, nothing to give back for a charge
//! never made or declined, a conflict while the charge still runs, and injected 503s that
//! change nothing. Assertions read the ledger.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::Duration;

use km0::services::pasarela::Faults;
use km0::wiring::{Components, Running, System};
use reqwest::StatusCode;
use serde_json::{json, Value};

struct Gateway {
    base: String,
    http: reqwest::Client,
    system: System,
    running: Running,
}

impl Gateway {
    async fn start(faults: Faults) -> Self {
        let system = common::test_system("sqlite");
        let mut components = Components::none("pasarela-refunds");
        components.add(&km0::services::pasarela::COMPONENT);
        components.faults = faults;
        let running = system
            .start(components, "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        Self {
            base: format!("http://{}", running.http_addr().unwrap()),
            http: reqwest::Client::new(),
            system,
            running,
        }
    }

    async fn post(&self, path: &str, key: Option<&str>, body: &Value) -> (StatusCode, Value, bool) {
        let mut request = self.http.post(format!("{}{path}", self.base)).json(body);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let replayed = response.headers().contains_key("idempotent-replayed");
        (status, response.json().await.unwrap(), replayed)
    }

    async fn charge(&self, order: &str, card: &str) -> StatusCode {
        let body = json!({"tarjeta": card, "importe_centimos": 1250, "referencia": order});
        self.post("/cargos", Some(&format!("cobro-{order}")), &body)
            .await
            .0
    }

    async fn refund(&self, key: &str, order: &str) -> (StatusCode, Value, bool) {
        let body = json!({"clave_cargo": format!("cobro-{order}"), "referencia": order});
        self.post("/reembolsos", Some(key), &body).await
    }

    async fn net(&self, order: &str) -> i64 {
        let ledger = self.system.pasarela().await.unwrap();
        let net = ledger.net_for(order).await.unwrap();
        ledger.db().close().await;
        net
    }

    async fn stop(self) {
        self.running.stop().await.unwrap();
        self.system.destroy().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_is_given_back_once_however_often_it_is_refunded() {
    let g = Gateway::start(Faults::default()).await;
    assert_eq!(g.charge("P-1", "tok_visa").await, StatusCode::CREATED);
    assert_eq!(g.net("P-1").await, 1250);
    let (status, first, replayed) = g.refund("reembolso-P-1", "P-1").await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{first}");
    assert_eq!(first["estado"], "reembolsado");
    let (status, again, replayed) = g.refund("reembolso-P-1", "P-1").await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true));
    assert_eq!(again, first);
    // Another key for the same charge: the refund made already, not a second one.
    let (status, other, _) = g.refund("reembolso-P-1-bis", "P-1").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(other["id"], first["id"]);
    assert_eq!(g.net("P-1").await, 0, "refunded once");
    let listed: Value = g
        .http
        .get(format!("{}/cargos?referencia=P-1", g.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        listed["reembolsos"].as_array().unwrap().len(),
        1,
        "{listed}"
    );
    g.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_charged_means_nothing_to_give_back() {
    let g = Gateway::start(Faults {
        declined_cards: vec!["tok_robada".into()],
        ..Faults::default()
    })
    .await;
    let (status, never, _) = g.refund("reembolso-P-2", "P-2").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(never["estado"], "sin_cargo");
    assert_eq!(
        g.charge("P-3", "tok_robada").await,
        StatusCode::PAYMENT_REQUIRED
    );
    let (status, declined, _) = g.refund("reembolso-P-3", "P-3").await;
    assert_eq!(
        (status, declined["estado"].clone()),
        (StatusCode::OK, json!("sin_cargo"))
    );
    assert_eq!(g.net("P-3").await, 0);
    let (status, _, _) = g
        .post(
            "/reembolsos",
            Some("reembolso-P-3"),
            &json!({"clave_cargo": "x", "referencia": "P-3"}),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "same key, another body"
    );
    let (status, _, _) = g.post("/reembolsos", None, &json!({})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _, _) = g
        .post("/reembolsos", Some("k"), &json!({"referencia": "P"}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    g.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_still_running_cannot_be_refunded_yet_and_503s_change_nothing() {
    let g = Gateway::start(Faults {
        latency_ms: 600,
        ..Faults::default()
    })
    .await;
    let charging = {
        let (http, base) = (g.http.clone(), g.base.clone());
        tokio::spawn(async move {
            http.post(format!("{base}/cargos"))
                .header("Idempotency-Key", "cobro-P-4")
                .json(
                    &json!({"tarjeta": "tok_visa", "importe_centimos": 1250, "referencia": "P-4"}),
                )
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let (status, _, _) = g.refund("reembolso-P-4", "P-4").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(charging.await.unwrap(), StatusCode::CREATED);
    let faults = Faults {
        fail_503: 1,
        ..Faults::default()
    };
    let put = g
        .http
        .put(format!("{}/fallos", g.base))
        .json(&faults)
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::OK);
    let (status, _, _) = g.refund("reembolso-P-4", "P-4").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(g.net("P-4").await, 1250, "a 503 gives nothing back");
    let (status, refunded, replayed) = g.refund("reembolso-P-4", "P-4").await;
    assert_eq!(
        (status, replayed),
        (StatusCode::CREATED, false),
        "{refunded}"
    );
    assert_eq!(g.net("P-4").await, 0);
    g.stop().await;
}
