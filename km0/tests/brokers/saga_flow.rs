//! The whole order through the order saga on the embedded default (SQLite databases, the log
//! in SQLite), every service in one process and the gateway simulator in another `Running`:
//! a paid order is charged once, its stock taken once and a courier assigned; an order
//! without stock, one with a declined card and one for a city without couriers end
//! cancelled with their stock back and a net charge of zero. Assertions read every service's
//! rows, the saga tables and the gateway's ledger.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::{Duration, Instant};

use entrega::saga::SagaStatus;
use entrega::Backoff;
use km0::services::pagos::PaymentState;
use km0::services::pasarela::Faults;
use km0::services::pedidos::{OrderState, SagaTimings};
use km0::services::reparto::DeliveryState;
use km0::wiring::{Components, System};
use serde_json::{json, Value};

fn timings() -> SagaTimings {
    SagaTimings {
        step_deadline: Duration::from_secs(20),
        delivery_deadline: Duration::from_secs(20),
        resend: Backoff::new(Duration::from_secs(2), Duration::from_secs(4)),
        compensation_attempts: 10,
    }
}

fn order(id: &str, product: &str, quantity: i64, card: &str, city: &str) -> Value {
    json!({"id": id, "cliente": "ana", "mercado": "girona", "tarjeta": card,
           "lineas": [{"producto": product, "cantidad": quantity, "precio_centimos": 250}],
           "direccion_entrega": {"ciudad": city, "codigo_postal": "28013", "calle": "Rambla Nova 1"}})
}

async fn every_order_reaches_one_final_state(system: System) {
    let mut gateway = Components::none("pasarela-saga");
    gateway.add(&km0::services::pasarela::COMPONENT);
    gateway.faults = Faults {
        declined_cards: vec!["tok_robada".into()],
        ..Faults::default()
    };
    let gateway = system
        .start(gateway, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let gateway_url = format!("http://{}", gateway.http_addr().unwrap());
    let mut services = Components::all("saga");
    services.add(&km0::services::pagos::COMPONENT);
    services.add(&km0::services::reparto::COMPONENT);
    services.pasarela_url = Some(gateway_url.clone());
    let running = system
        .start(services, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = running.http_addr().unwrap();
    let http = reqwest::Client::new();
    let orders = [
        order("P-ok", "calabacin", 2, "tok_visa", "Madrid"),
        order("P-sin-stock", "queso-curado", 6, "tok_visa", "Madrid"),
        order("P-tarjeta", "tomate-rosa", 3, "tok_robada", "Madrid"),
        order("P-ciudad", "vino-crianza", 1, "tok_visa", "Lleida"),
    ];
    for body in &orders {
        let status = http
            .post(format!("http://{addr}/pedidos"))
            .json(body)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status.as_u16(), 201);
    }
    let no_address = json!({"id": "P-x", "cliente": "ana", "mercado": "girona",
        "lineas": [{"producto": "calabacin", "cantidad": 1, "precio_centimos": 1}]});
    let refused = http
        .post(format!("http://{addr}/pedidos"))
        .json(&no_address)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 400);

    let pedidos = system.pedidos().await.unwrap();
    let sagas = system.sagas(&pedidos).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let all = sagas.list(None, 10).await.unwrap();
        if all.len() == 4 && all.iter().all(|s| s.status.is_final()) {
            break;
        }
        let states: Vec<_> = all
            .iter()
            .map(|s| (s.id.clone(), s.status, s.step))
            .collect();
        assert!(Instant::now() < deadline, "sagas not final: {states:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A cancel after the order is paid is refused.
    let late = http
        .post(format!("http://{addr}/pedidos/P-ok/cancelacion"))
        .send()
        .await
        .unwrap();
    assert_eq!(late.status().as_u16(), 409);
    // Each order's GET says where it stands, and why a cancelled one was cancelled.
    let shown = |id: &'static str| {
        let http = http.clone();
        async move {
            let url = format!("http://{addr}/pedidos/{id}");
            let body: serde_json::Value = http.get(url).send().await.unwrap().json().await.unwrap();
            body
        }
    };
    let paid = shown("P-ok").await;
    assert_eq!(
        (paid["estado"].as_str(), paid.get("motivo")),
        (Some("pagado"), None)
    );
    let uncovered = shown("P-ciudad").await;
    assert_eq!(uncovered["estado"], "cancelado");
    assert_eq!(
        uncovered["motivo"],
        "ciudad_no_cubierta: Lleida (covered: Barcelona, Madrid, Tarragona, Valencia)"
    );
    running.stop().await.unwrap();

    let status = |id: &str| {
        let sagas = sagas.clone();
        let id = id.to_owned();
        async move { sagas.show(&id).await.unwrap().unwrap().0.status }
    };
    assert_eq!(status("P-ok").await, SagaStatus::Completed);
    for id in ["P-sin-stock", "P-tarjeta", "P-ciudad"] {
        assert_eq!(status(id).await, SagaStatus::Compensated, "{id}");
    }
    let order_state = |id: &str| {
        let pedidos = pedidos.clone();
        let id = id.to_owned();
        async move { pedidos.find(&id).await.unwrap().unwrap().state }
    };
    assert_eq!(order_state("P-ok").await, OrderState::Paid);
    assert_eq!(order_state("P-ciudad").await, OrderState::Cancelled);

    let stock = system.inventario().await.unwrap();
    assert_eq!(
        stock.units("calabacin").await.unwrap(),
        Some(78),
        "taken once"
    );
    assert_eq!(stock.units("queso-curado").await.unwrap(), Some(5));
    assert_eq!(
        stock.units("tomate-rosa").await.unwrap(),
        Some(120),
        "given back"
    );
    assert_eq!(
        stock.units("vino-crianza").await.unwrap(),
        Some(200),
        "given back"
    );

    let ledger = system.pasarela().await.unwrap();
    assert_eq!(ledger.net_for("P-ok").await.unwrap(), 500, "charged once");
    assert_eq!(ledger.charges_for("P-ok").await.unwrap().len(), 1);
    for id in ["P-sin-stock", "P-tarjeta", "P-ciudad"] {
        assert_eq!(ledger.net_for(id).await.unwrap(), 0, "{id}");
    }
    assert_eq!(ledger.refunds_for("P-ciudad").await.unwrap().len(), 1);

    let payments = system.pagos().await.unwrap();
    let payment = |id: &str| {
        let payments = payments.clone();
        let id = id.to_owned();
        async move { payments.payment(&id).await.unwrap().map(|p| p.state) }
    };
    assert_eq!(payment("P-ok").await, Some(PaymentState::Confirmed));
    assert_eq!(payment("P-ciudad").await, Some(PaymentState::Refunded));
    assert_eq!(payment("P-tarjeta").await, Some(PaymentState::Declined));
    assert_eq!(payment("P-sin-stock").await, None, "never charged");

    let deliveries = system.reparto().await.unwrap();
    let delivery = deliveries.delivery("P-ok").await.unwrap().unwrap();
    assert_eq!(delivery.state, DeliveryState::Assigned);
    assert!(delivery.courier.is_some());
    let refused = deliveries.delivery("P-ciudad").await.unwrap().unwrap();
    assert_eq!(refused.state, DeliveryState::Refused);

    if let km0::wiring::config::DataPlace::SqliteDir(dir) = &system.databases().place {
        operator_sees_the_sagas(&format!("sqlite://{}", dir.display()), system.broker_url());
    }

    gateway.stop().await.unwrap();
    for db in [
        pedidos.db(),
        stock.db(),
        ledger.db(),
        payments.db(),
        deliveries.db(),
    ] {
        db.close().await;
    }
    system.destroy().await.unwrap();
}

/// `km0 saga list|show|retry` on the finished run's databases, as an operator would.
fn operator_sees_the_sagas(database: &str, broker: &str) {
    let km0 = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_km0"))
            // Test deployments migrate as they open (production runs `km0 migrate` first).
            .env("KM0_MIGRATE", "true")
            .args(["--database", database, "--broker", broker, "saga"])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (ok, listed) = km0(&["list", "--estado", "compensada", "--json"]);
    assert!(ok, "{listed}");
    let listed: Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed["sagas"].as_array().unwrap().len(), 3, "{listed}");
    assert_eq!(listed["recuento"]["completed"], 1);
    let (ok, shown) = km0(&["show", "P-ciudad", "--json"]);
    assert!(ok, "{shown}");
    let shown: Value = serde_json::from_str(&shown).unwrap();
    let mut keys: Vec<&str> = shown["historial"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["que"] == "sent")
        .filter_map(|e| e["clave"].as_str())
        .collect();
    // A step's command is sent again, under the same key, when its answer is slow (a loaded
    // machine): the steps and their order are what the timeline must show.
    keys.dedup();
    assert_eq!(
        keys,
        [
            "reserva-P-ciudad",
            "cobro-P-ciudad",
            "reparto-P-ciudad",
            "reembolso-P-ciudad",
            "liberacion-P-ciudad"
        ]
    );
    assert_eq!(
        shown["motivo"],
        "ciudad_no_cubierta: Lleida (covered: Barcelona, Madrid, Tarragona, Valencia)"
    );
    let (ok, text) = km0(&["show", "P-ok"]);
    assert!(ok && text.contains("completed"), "{text}");
    let (ok, _) = km0(&["retry", "P-ok"]);
    assert!(!ok, "a completed saga waits for no operator");
    let (ok, _) = km0(&["show", "P-nada"]);
    assert!(!ok, "an unknown saga is an error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_reaches_one_final_state_on_the_embedded_default() {
    every_order_reaches_one_final_state(common::test_system("sqlite").with_saga(timings())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_reaches_one_final_state_on_postgres() {
    every_order_reaches_one_final_state(common::test_system("postgres").with_saga(timings())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_reaches_one_final_state_on_postgres_and_rabbitmq() {
    let vhost = common::amqp::Vhost::create();
    let databases = common::test_system("postgres").databases().clone();
    let system = System::new(databases, format!("{}?shards=6", vhost.url()))
        .with_lease_ttl(Duration::from_secs(2))
        .with_saga(timings());
    every_order_reaches_one_final_state(system).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_reaches_one_final_state_on_postgres_and_kafka() {
    let kafka = common::kafka_ns::KafkaNamespace::new();
    let databases = common::test_system("postgres").databases().clone();
    let system = System::new(databases, kafka.url_with("session_timeout_ms=6000"))
        .with_lease_ttl(Duration::from_secs(2))
        .with_saga(timings());
    every_order_reaches_one_final_state(system).await;
}
