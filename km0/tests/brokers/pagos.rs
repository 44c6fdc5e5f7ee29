//! pagos end to end, in-process, on the embedded default (the log in SQLite) and on RabbitMQ:
//! each created order charged once at the gateway simulator whatever the gateway does (503s,
//! an answer too late after charging, declines), its `pagos` row and its `pago.confirmado` /
//! `pago.rechazado` written together, and card authorisations answered on
//! `pagos.autorizaciones`, a repeat with the stored answer.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::Duration;

use entrega::db::query;
use entrega::rpc::RpcClient;
use km0::services::pagos::{PaymentState, AUTHORISATIONS};
use km0::services::pasarela::Faults;
use km0::services::pedidos::PARTITIONS;
use km0::wiring::{Components, System};
use serde_json::{json, Value};

use common::amqp::Vhost;
use common::ledger::charges;
use common::state::{eventually, place};

/// Orders placed, one of them with a card the gateway declines.
const ORDERS: usize = 8;

fn order(id: &str, card: &str) -> Value {
    json!({"id": id, "cliente": "ana", "mercado": "girona", "tarjeta": card,
           "lineas": [{"producto": "calabacin", "cantidad": 2, "precio_centimos": 150}]})
}

/// pagos' outbox rows per event type, all published.
async fn events(system: &System) -> (i64, i64, i64) {
    let store = system.pagos().await.unwrap();
    let count = |sql: &'static str| {
        let db = store.db().clone();
        async move { db.scalar::<i64>(query(sql)).await.unwrap().unwrap_or(0) }
    };
    let confirmed = count("SELECT COUNT(*) FROM outbox WHERE tipo = 'pago.confirmado'").await;
    let declined = count("SELECT COUNT(*) FROM outbox WHERE tipo = 'pago.rechazado'").await;
    let pending = count("SELECT COUNT(*) FROM outbox WHERE publicado_en IS NULL").await;
    store.db().close().await;
    (confirmed, declined, pending)
}

async fn every_order_charged_once_whatever_the_gateway_does(broker_url: Option<String>) {
    let mut system = common::test_system("sqlite");
    if let Some(url) = broker_url {
        system = System::new(system.databases().clone(), url);
    }
    let system =
        system
            .with_lease_ttl(Duration::from_secs(2))
            .with_retry(km0::wiring::config::RetryArgs {
                retry_base_ms: 200,
                retry_max_ms: 1_000,
                max_attempts: 10,
                ..Default::default()
            });
    let mut gateway = Components::none("pasarela");
    gateway.add(&km0::services::pasarela::COMPONENT);
    gateway.faults = Faults {
        fail_503: 3,
        hang_after_charge: 1,
        hang_ms: 7_000,
        declined_cards: vec!["tok_robada".into()],
        ..Faults::default()
    };
    let gateway = system
        .start(gateway, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let gateway_url = format!("http://{}", gateway.http_addr().unwrap());
    let mut services = Components::none("pagos-test");
    services.add(&km0::services::pedidos::API);
    services.add(&km0::services::pedidos::RELAY);
    services.add(&km0::services::pagos::COMPONENT);
    services.pasarela_url = Some(gateway_url.clone());
    let running = system
        .start(services, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = running.http_addr().unwrap();
    for n in 0..ORDERS {
        let card = if n == 3 { "tok_robada" } else { "tok_visa" };
        place(addr, &order(&format!("C-{n}"), card)).await;
    }

    let store = system.pagos().await.unwrap();
    eventually(
        Duration::from_secs(90),
        "every order's payment settled",
        || async {
            let mut settled = 0;
            for n in 0..ORDERS {
                let payment = store.payment(&format!("C-{n}")).await.unwrap();
                if payment.is_some_and(|p| p.state != PaymentState::Started) {
                    settled += 1;
                }
            }
            let (_, _, pending) = events(&system).await;
            (settled == ORDERS && pending == 0).then_some(())
        },
    )
    .await;

    // Card authorisations, answered once per order.
    let client = RpcClient::start(running_rpc(&system).await).await.unwrap();
    let request = json!({"pedido_id": "C-0", "importe_centimos": 300}).to_string();
    let first = client
        .call(
            AUTHORISATIONS,
            request.clone().into_bytes(),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    let again = client
        .call(AUTHORISATIONS, request.into_bytes(), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(
        first, again,
        "a repeated authorisation must get the stored answer"
    );
    let first: Value = serde_json::from_slice(&first).unwrap();
    assert_eq!(first["autorizado"], true);
    assert!(first["id_autorizacion"]
        .as_str()
        .unwrap()
        .starts_with("AUT-"));
    let big = json!({"pedido_id": "C-9", "importe_centimos": 9_000_000}).to_string();
    let refused = client
        .call(AUTHORISATIONS, big.into_bytes(), Duration::from_secs(5))
        .await
        .unwrap();
    let refused: Value = serde_json::from_slice(&refused).unwrap();
    assert_eq!(refused["autorizado"], false);
    assert_eq!(refused["motivo"], "importe_excede_limite");

    running.stop().await.unwrap();

    // The faults really happened: every 503 and the late answer were used up.
    let left: Value = reqwest::get(format!("{gateway_url}/fallos"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (
            left["fallar_503"].as_u64(),
            left["colgar_tras_cobro"].as_u64()
        ),
        (Some(0), Some(0))
    );

    // The ledger: one approved charge per order, none for the declined card's order.
    for n in 0..ORDERS {
        let id = format!("C-{n}");
        let made = charges(&gateway_url, &id).await;
        assert_eq!(made.len(), 1, "{id} charged {} times: {made:?}", made.len());
        let payment = store.payment(&id).await.unwrap().unwrap();
        if n == 3 {
            assert_eq!(made[0]["resultado"], "rechazado");
            assert_eq!(payment.state, PaymentState::Declined);
            assert_eq!(payment.reason.as_deref(), Some("tarjeta_rechazada"));
        } else {
            assert_eq!(made[0]["resultado"], "aprobado");
            assert_eq!(payment.state, PaymentState::Confirmed);
            assert_eq!(payment.gateway_ref.as_deref(), made[0]["id"].as_str());
            assert_eq!(payment.amount_cents, 300);
        }
    }
    let (confirmed, declined, pending) = events(&system).await;
    assert_eq!((confirmed, declined, pending), (ORDERS as i64 - 1, 1, 0));
    assert_eq!(store.processed().await.unwrap(), ORDERS as u64);
    gateway.stop().await.unwrap();
    store.db().close().await;
    system.destroy().await.unwrap();
}

/// The deployment's request/reply transport.
async fn running_rpc(system: &System) -> std::sync::Arc<dyn entrega_core::RpcTransport> {
    system.broker().await.unwrap().rpc(PARTITIONS)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_charged_once_on_the_embedded_default() {
    every_order_charged_once_whatever_the_gateway_does(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_charged_once_on_rabbitmq() {
    let vhost = Vhost::create();
    every_order_charged_once_whatever_the_gateway_does(Some(format!("{}?shards=3", vhost.url())))
        .await;
}
