//! The payment gateway simulator over real HTTP: Idempotency-Key semantics, the faults a run
//! injects, and the ledger that proves how many times an order was charged.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::Duration;

use km0::services::pasarela::Faults;
use km0::wiring::{Components, System};
use reqwest::StatusCode;
use serde_json::{json, Value};

struct Gateway {
    base: String,
    http: reqwest::Client,
    system: System,
    running: km0::wiring::Running,
}

async fn gateway(faults: Faults) -> Gateway {
    let system = common::test_system("sqlite");
    let mut components = Components::none("pasarela-test");
    components.add(&km0::services::pasarela::COMPONENT);
    components.faults = faults;
    let running = system
        .start(components, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    Gateway {
        base: format!("http://{}", running.http_addr().unwrap()),
        http: reqwest::Client::new(),
        system,
        running,
    }
}

impl Gateway {
    async fn charge(&self, key: Option<&str>, body: &Value) -> (StatusCode, Value, bool) {
        let mut request = self.http.post(format!("{}/cargos", self.base)).json(body);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let replayed = response.headers().contains_key("idempotent-replayed");
        (status, response.json().await.unwrap(), replayed)
    }

    async fn charges(&self, reference: &str) -> Vec<Value> {
        let response = self
            .http
            .get(format!("{}/cargos", self.base))
            .query(&[("referencia", reference)])
            .send()
            .await
            .unwrap();
        let body: Value = response.json().await.unwrap();
        body["cargos"].as_array().unwrap().clone()
    }

    async fn set_faults(&self, faults: &Faults) {
        let response = self
            .http
            .put(format!("{}/fallos", self.base))
            .json(faults)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }

    async fn stop(self) {
        self.running.stop().await.unwrap();
        self.system.destroy().await.unwrap();
    }
}

fn body(reference: &str, cents: i64) -> Value {
    json!({"tarjeta": "tok_visa", "importe_centimos": cents, "referencia": reference})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_charges_once_and_answers_again_with_what_it_answered() {
    let g = gateway(Faults::default()).await;
    let (status, missing, _) = g.charge(None, &body("P-1", 1250)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{missing}");
    let (status, first, replayed) = g.charge(Some("cobro-P-1"), &body("P-1", 1250)).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{first}");
    assert_eq!(first["estado"], "aprobado");
    let (status, again, replayed) = g.charge(Some("cobro-P-1"), &body("P-1", 1250)).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true));
    assert_eq!(again, first, "a repeat must get the stored answer");
    let (status, _, _) = g.charge(Some("cobro-P-1"), &body("P-1", 9999)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _, _) = g
        .charge(
            Some("cobro-P-x"),
            &json!({"tarjeta": "t", "importe_centimos": -3, "referencia": "P"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let charges = g.charges("P-1").await;
    assert_eq!(charges.len(), 1, "{charges:?}");
    assert_eq!(charges[0]["id"], first["id"]);
    g.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_still_running_is_a_conflict_and_declines_are_stored_answers_too() {
    let g = gateway(Faults {
        latency_ms: 600,
        declined_cards: vec!["tok_robada".into()],
        ..Faults::default()
    })
    .await;
    let first = {
        let (http, base) = (g.http.clone(), g.base.clone());
        tokio::spawn(async move {
            http.post(format!("{base}/cargos"))
                .header("Idempotency-Key", "cobro-P-2")
                .json(&body("P-2", 500))
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let (status, _, _) = g.charge(Some("cobro-P-2"), &body("P-2", 500)).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(first.await.unwrap(), StatusCode::CREATED);
    let (status, _, replayed) = g.charge(Some("cobro-P-2"), &body("P-2", 500)).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true));

    let stolen = json!({"tarjeta": "tok_robada", "importe_centimos": 700, "referencia": "P-3"});
    let (status, declined, _) = g.charge(Some("cobro-P-3"), &stolen).await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(declined["motivo"], "tarjeta_rechazada");
    let (status, again, replayed) = g.charge(Some("cobro-P-3"), &stolen).await;
    assert_eq!((status, replayed), (StatusCode::PAYMENT_REQUIRED, true));
    assert_eq!(again, declined);
    let charges = g.charges("P-3").await;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0]["resultado"], "rechazado");
    g.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_charges_nothing_and_a_late_answer_is_still_one_charge() {
    let g = gateway(Faults {
        fail_503: 1,
        ..Faults::default()
    })
    .await;
    let (status, _, _) = g.charge(Some("cobro-P-4"), &body("P-4", 800)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        g.charges("P-4").await.is_empty(),
        "a 503 must charge nothing"
    );
    let (status, _, replayed) = g.charge(Some("cobro-P-4"), &body("P-4", 800)).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false));

    // Charged, then the answer comes after the client gave up; the retry gets the charge.
    g.set_faults(&Faults {
        hang_after_charge: 1,
        hang_ms: 1_500,
        ..Faults::default()
    })
    .await;
    let timed_out = g
        .http
        .post(format!("{}/cargos", g.base))
        .header("Idempotency-Key", "cobro-P-5")
        .json(&body("P-5", 900))
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(timed_out.is_err_and(|e| e.is_timeout()));
    let (status, retried, replayed) = g.charge(Some("cobro-P-5"), &body("P-5", 900)).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true));
    let charges = g.charges("P-5").await;
    assert_eq!(charges.len(), 1, "charged twice: {charges:?}");
    assert_eq!(charges[0]["id"], retried["id"]);
    g.stop().await;
}
