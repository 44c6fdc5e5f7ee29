//! pagos killed with SIGKILL-like exit (failpoint `pagos.before_commit=exit`, status 137)
//! after the gateway charged an order and before its result committed, with real processes:
//! `km0 run pasarela`, `km0 run pedidos`, `km0 run relay` and `km0 run pagos`.
//!
//! Asserted on the gateway's ledger and pagos' database: at the crash the order was charged
//! once and its payment is still `iniciado` with no event; after the restart the redelivered
//! `pedido.creado` calls the gateway again with the same Idempotency-Key and gets the stored
//! charge, so the ledger still holds one charge, and the payment is `confirmado` with that
//! charge's id and exactly one `pago.confirmado`. Orders placed after it are charged once each.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::Duration;

use entrega::db::query;
use km0::services::pagos::{PaymentState, BEFORE_COMMIT};
use serde_json::{json, Value};

use common::ledger::charges;
use common::process::Deployment;
use common::state::{eventually, place};

/// Relay lane lease (and group lease) of the processes.
const LEASE_TTL_MS: u64 = 1_000;
/// Orders placed after the restart.
const AFTER: usize = 5;

fn order(id: &str) -> Value {
    json!({"id": id, "cliente": "marc", "mercado": "girona", "tarjeta": "tok_visa",
           "lineas": [{"producto": "tomate-rosa", "cantidad": 3, "precio_centimos": 220}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pagos_killed_between_the_charge_and_its_commit_charges_once() {
    let deployment = Deployment::new("postgres", LEASE_TTL_MS);
    let gateway = deployment.start("pasarela", "pasarela-1").await;
    let gateway_url = format!("http://{}", gateway.http_addr());
    let pedidos = deployment.start("pedidos", "pedidos-1").await;
    let _relay = deployment.start("relay", "relay-1").await;
    let with_gateway = ["--pasarela-url".to_owned(), gateway_url.clone()];
    let mut pagos = deployment.spawn_with(
        "pagos",
        "pagos-1",
        &format!("{BEFORE_COMMIT}=exit"),
        &with_gateway,
    );
    pagos.wait_ready().await;
    let store = deployment.system().pagos().await.unwrap();

    place(pedidos.http_addr(), &order("K-1")).await;
    pagos.died_at_failpoint().await;

    // Charged once, and nothing of it committed in pagos.
    assert_eq!(charges(&gateway_url, "K-1").await.len(), 1);
    let payment = store.payment("K-1").await.unwrap().unwrap();
    assert_eq!(payment.state, PaymentState::Started);
    let count = |sql: &'static str| {
        let db = store.db().clone();
        async move { db.scalar::<i64>(query(sql)).await.unwrap().unwrap_or(0) }
    };
    assert_eq!(count("SELECT COUNT(*) FROM outbox").await, 0);

    let _pagos = {
        let mut p = deployment.spawn_with("pagos", "pagos-2", "", &with_gateway);
        p.wait_ready().await;
        p
    };
    for n in 0..AFTER {
        place(pedidos.http_addr(), &order(&format!("K-after-{n}"))).await;
    }
    eventually(
        Duration::from_secs(60),
        "every payment confirmed and relayed",
        || async {
            let confirmed = count("SELECT COUNT(*) FROM pagos WHERE estado = 'confirmado'").await;
            let pending = count("SELECT COUNT(*) FROM outbox WHERE publicado_en IS NULL").await;
            (confirmed == 1 + AFTER as i64 && pending == 0).then_some(())
        },
    )
    .await;

    let ledger = charges(&gateway_url, "K-1").await;
    assert_eq!(ledger.len(), 1, "K-1 charged twice: {ledger:?}");
    let payment = store.payment("K-1").await.unwrap().unwrap();
    assert_eq!(payment.state, PaymentState::Confirmed);
    assert_eq!(payment.gateway_ref.as_deref(), ledger[0]["id"].as_str());
    assert_eq!(
        count("SELECT COUNT(*) FROM outbox WHERE tipo = 'pago.confirmado'").await,
        1 + AFTER as i64
    );
    for n in 0..AFTER {
        assert_eq!(
            charges(&gateway_url, &format!("K-after-{n}")).await.len(),
            1
        );
    }
    store.db().close().await;
    deployment.destroy().await;
}
