//! pagos' commands for the order saga against the gateway simulator, with pagos' database on
//! SQLite and on PostgreSQL: a charge made once and answered again on a repeat, a refund that
//! gives the money back once however often it is delivered, a refund before its charge that
//! makes the charge refused, and a refund while the charge still runs that waits for it.
//! Assertions read the `pagos` rows, pagos' outbox and the gateway's ledger.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::Duration;

use entrega::db::query_each;
use entrega::{Handler, Message};
use entrega_core::{Envelope, Headers};
use km0::services::pagos::{
    CommandConsumer, Gateway, PaymentState, PaymentStore, CHARGE, GATEWAY_QUICK_TRIES, REFUND,
};
use km0::services::pasarela::Faults;
use km0::wiring::{Components, Running, System};
use serde_json::{json, Value};

use common::TestDb;

struct Fixture {
    consumer: CommandConsumer,
    store: PaymentStore,
    db: TestDb,
    gateway: System,
    running: Running,
    url: String,
}

impl Fixture {
    async fn new(backend: &str, faults: Faults) -> Self {
        let gateway = common::test_system("sqlite");
        let mut components = Components::none("pasarela-comandos");
        components.add(&km0::services::pasarela::COMPONENT);
        components.faults = faults;
        let running = gateway
            .start(components, "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let url = format!("http://{}", running.http_addr().unwrap());
        let db = TestDb::of(backend).await;
        let store = PaymentStore::new(db.db.clone());
        store.migrate().await.unwrap();
        let client = Gateway::new(&url, Duration::from_secs(5)).unwrap();
        Self {
            consumer: CommandConsumer::new(store.clone(), client),
            store,
            db,
            gateway,
            running,
            url,
        }
    }

    async fn handle(&self, kind: &str, data: Value) -> Result<(), entrega_core::HandlerError> {
        self.consumer.handle(&message(kind, data)).await
    }

    async fn charge(&self, order: &str, card: &str) -> Result<(), entrega_core::HandlerError> {
        self.handle(CHARGE, charge_data(order, card)).await
    }

    async fn refund(&self, order: &str) -> Result<(), entrega_core::HandlerError> {
        self.handle(REFUND, refund_data(order)).await
    }

    async fn state(&self, order: &str) -> Option<PaymentState> {
        self.store.payment(order).await.unwrap().map(|p| p.state)
    }

    /// pagos' answers of `kind` for `order`, oldest first.
    async fn answers(&self, kind: &str, order: &str) -> Vec<Value> {
        let q = query_each(
            "SELECT carga FROM outbox WHERE tipo = $1 AND agregado_id = $2 ORDER BY rowid",
            "SELECT carga::text FROM outbox WHERE tipo = $1 AND agregado_id = $2 ORDER BY seq",
        )
        .bind(kind)
        .bind(order);
        let rows: Vec<(String,)> = self.db.db.fetch_all(q).await.unwrap();
        rows.into_iter()
            .map(|(c,)| serde_json::from_str(&c).unwrap())
            .collect()
    }

    async fn net(&self, order: &str) -> i64 {
        let ledger = self.gateway.pasarela().await.unwrap();
        let net = ledger.net_for(order).await.unwrap();
        ledger.db().close().await;
        net
    }

    async fn finish(self) {
        self.running.stop().await.unwrap();
        self.gateway.destroy().await.unwrap();
        self.db.remove().await;
    }
}

fn message(kind: &str, data: Value) -> Message {
    Message {
        envelope: Envelope::new(kind, "pedidos", data),
        topic: "pagos.comandos".into(),
        partition: 0,
        offset: 0,
        key: None,
        headers: Headers::default(),
        attempt: 1,
        trace: entrega_core::TraceContext::root(),
    }
}

fn charge_data(order: &str, card: &str) -> Value {
    json!({"pedido_id": order, "clave": format!("cobro-{order}"),
           "importe_centimos": 1250, "tarjeta": card})
}

fn refund_data(order: &str) -> Value {
    json!({"pedido_id": order, "clave": format!("reembolso-{order}")})
}

async fn a_poll_of_charges_is_charged_together_once_each(backend: &str) {
    let f = Fixture::new(backend, Faults::default()).await;
    let orders = ["P-b1", "P-b2", "P-b3", "P-b4", "P-b5"];
    let poll: Vec<Message> = orders
        .iter()
        .map(|o| message(CHARGE, charge_data(o, "tok_visa")))
        .collect();
    let results = f.consumer.handle_batch(&poll).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(results.len(), poll.len());
    for order in orders {
        assert_eq!(f.state(order).await, Some(PaymentState::Confirmed));
        assert_eq!(f.net(order).await, 1250, "{order} charged once");
        assert_eq!(f.answers("pago.confirmado", order).await.len(), 1);
    }
    // Delivered again: every key is known, nothing is charged or answered again.
    let results = f.consumer.handle_batch(&poll).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    for order in orders {
        assert_eq!(f.net(order).await, 1250);
        assert_eq!(f.answers("pago.confirmado", order).await.len(), 1);
    }
    if backend == "postgres" {
        let writers: Option<i64> =
            f.db.db
                .scalar(entrega::db::query(
                    "SELECT COUNT(DISTINCT xmin::text) FROM outbox WHERE tipo = 'pago.confirmado'",
                ))
                .await
                .unwrap();
        assert_eq!(writers, Some(1), "the answers committed together");
    }
    f.finish().await;
}

async fn a_poll_mixing_refunds_and_repeats_is_applied_in_order(backend: &str) {
    let f = Fixture::new(backend, Faults::default()).await;
    let again = message(CHARGE, charge_data("P-m2", "tok_visa"));
    let poll = [
        message(CHARGE, charge_data("P-m1", "tok_visa")),
        again.clone(),
        message(REFUND, refund_data("P-m1")),
        message(CHARGE, charge_data("P-m3", "tok_visa")),
        again,
        message(CHARGE, json!({"pedido_id": "P-m4"})),
        message(CHARGE, charge_data("P-m5", "tok_visa")),
    ];
    let results = f.consumer.handle_batch(&poll).await;
    let refused: Vec<bool> = results.iter().map(Result::is_err).collect();
    assert_eq!(
        refused,
        [false, false, false, false, false, true, false],
        "{results:?}"
    );
    assert!(!results[5].as_ref().unwrap_err().is_transient());
    assert_eq!(f.state("P-m1").await, Some(PaymentState::Refunded));
    assert_eq!(f.net("P-m1").await, 0);
    for order in ["P-m2", "P-m3", "P-m5"] {
        assert_eq!(f.state(order).await, Some(PaymentState::Confirmed));
        assert_eq!(f.net(order).await, 1250, "{order} charged once");
        assert_eq!(f.answers("pago.confirmado", order).await.len(), 1);
    }
    assert_eq!(f.state("P-m4").await, None);
    f.finish().await;
}

async fn a_charge_is_made_once_and_answered_again(backend: &str) {
    let f = Fixture::new(backend, Faults::default()).await;
    f.charge("P-1", "tok_visa").await.unwrap();
    f.charge("P-1", "tok_visa").await.unwrap();
    assert_eq!(f.state("P-1").await, Some(PaymentState::Confirmed));
    assert_eq!(f.net("P-1").await, 1250);
    let answers = f.answers("pago.confirmado", "P-1").await;
    assert_eq!(answers.len(), 2, "each command answered");
    assert!(answers.iter().all(|a| a["clave"] == json!("cobro-P-1")));
    assert_eq!(answers[0]["ref_pasarela"], answers[1]["ref_pasarela"]);
    let bad = json!({"pedido_id": "P-1", "clave": "otra", "importe_centimos": 1, "tarjeta": "t"});
    assert!(!f.handle(CHARGE, bad).await.unwrap_err().is_transient());
    f.finish().await;
}

async fn a_refund_gives_the_money_back_once(backend: &str) {
    let f = Fixture::new(backend, Faults::default()).await;
    f.charge("P-2", "tok_visa").await.unwrap();
    f.refund("P-2").await.unwrap();
    f.refund("P-2").await.unwrap();
    assert_eq!(f.state("P-2").await, Some(PaymentState::Refunded));
    assert_eq!(f.net("P-2").await, 0, "the balance did not change twice");
    let answers = f.answers("pago.reembolsado", "P-2").await;
    assert_eq!(answers.len(), 2);
    assert!(answers
        .iter()
        .all(|a| a["clave"] == json!("reembolso-P-2") && a["importe_centimos"] == json!(1250)));
    // A charge asked for again after the refund is refused, not made again.
    f.charge("P-2", "tok_visa").await.unwrap();
    assert_eq!(f.net("P-2").await, 0);
    let refused = f.answers("pago.rechazado", "P-2").await;
    assert_eq!(refused[0]["motivo"], json!("pedido anulado"));
    f.finish().await;
}

async fn a_refund_before_its_charge_refuses_the_charge(backend: &str) {
    let f = Fixture::new(backend, Faults::default()).await;
    f.refund("P-3").await.unwrap();
    assert_eq!(f.state("P-3").await, Some(PaymentState::Cancelled));
    f.charge("P-3", "tok_visa").await.unwrap();
    assert_eq!(f.state("P-3").await, Some(PaymentState::Cancelled));
    assert_eq!(f.net("P-3").await, 0);
    let charges = common::ledger::charges(&f.url, "P-3").await;
    assert!(
        charges.is_empty(),
        "the gateway was never asked: {charges:?}"
    );
    assert_eq!(
        f.answers("pago.reembolsado", "P-3").await[0]["importe_centimos"],
        json!(0)
    );
    assert_eq!(f.answers("pago.rechazado", "P-3").await.len(), 1);
    f.finish().await;
}

async fn a_refund_of_a_declined_charge_gives_nothing_back(backend: &str) {
    let faults = Faults {
        declined_cards: vec!["tok_robada".into()],
        ..Faults::default()
    };
    let f = Fixture::new(backend, faults).await;
    f.charge("P-4", "tok_robada").await.unwrap();
    assert_eq!(f.state("P-4").await, Some(PaymentState::Declined));
    f.refund("P-4").await.unwrap();
    assert_eq!(f.state("P-4").await, Some(PaymentState::Declined));
    assert_eq!(
        f.answers("pago.reembolsado", "P-4").await[0]["importe_centimos"],
        json!(0)
    );
    assert_eq!(f.net("P-4").await, 0);
    f.finish().await;
}

async fn a_refund_while_the_charge_runs_waits_for_it(backend: &str) {
    // Longer than pagos' own quick tries of the refund (100 + 200 + 400 ms).
    let faults = Faults {
        latency_ms: 2_000,
        ..Faults::default()
    };
    let f = std::sync::Arc::new(Fixture::new(backend, faults).await);
    let charging = {
        let f = f.clone();
        tokio::spawn(async move { f.charge("P-5", "tok_visa").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let early = f.refund("P-5").await.unwrap_err();
    assert!(early.is_transient(), "{early}");
    charging.await.unwrap().unwrap();
    assert_eq!(f.net("P-5").await, 1250);
    f.refund("P-5").await.unwrap();
    assert_eq!(f.net("P-5").await, 0);
    assert_eq!(f.state("P-5").await, Some(PaymentState::Refunded));
    let f = std::sync::Arc::into_inner(f).unwrap();
    f.finish().await;
}

async fn a_gateway_503_on_a_refund_is_retried(backend: &str) {
    // pagos asks again at once a few times itself: enough 503s to outlast those.
    let faults = Faults {
        fail_503: GATEWAY_QUICK_TRIES,
        ..Faults::default()
    };
    let f = Fixture::new(backend, faults).await;
    // The 503s go to the charge, which is then retried.
    assert!(f
        .charge("P-6", "tok_visa")
        .await
        .unwrap_err()
        .is_transient());
    f.charge("P-6", "tok_visa").await.unwrap();
    let put = reqwest::Client::new()
        .put(format!("{}/fallos", f.url))
        .json(&Faults {
            fail_503: GATEWAY_QUICK_TRIES,
            ..Faults::default()
        })
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success());
    assert!(f.refund("P-6").await.unwrap_err().is_transient());
    assert_eq!(f.state("P-6").await, Some(PaymentState::Confirmed));
    assert_eq!(f.net("P-6").await, 1250);
    f.refund("P-6").await.unwrap();
    assert_eq!(f.net("P-6").await, 0);
    f.finish().await;
}

macro_rules! on_both_backends {
    ($($scenario:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                super::$scenario("sqlite").await;
            })*
        }
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                super::$scenario("postgres").await;
            })*
        }
    };
}

on_both_backends!(
    a_poll_of_charges_is_charged_together_once_each,
    a_poll_mixing_refunds_and_repeats_is_applied_in_order,
    a_charge_is_made_once_and_answered_again,
    a_refund_gives_the_money_back_once,
    a_refund_before_its_charge_refuses_the_charge,
    a_refund_of_a_declined_charge_gives_nothing_back,
    a_refund_while_the_charge_runs_waits_for_it,
    a_gateway_503_on_a_refund_is_retried,
);
