//! `km0 --saga up`: the whole order saga in one process (pedidos orchestrating, inventario,
//! pagos with the payment gateway simulator on an address of its own, reparto, catalogo,
//! the relays), started as a newcomer would. One order ends paid and one, for a city
//! without couriers, refunded and cancelled; both read from the services' rows and the
//! gateway's ledger. A SIGTERM stops it cleanly.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::Duration;

use entrega::saga::SagaStatus;
use km0::services::pedidos::OrderState;
use serde_json::{json, Value};

use common::process::Deployment;
use common::state::{eventually, place};

fn order(id: &str, city: &str) -> Value {
    json!({"id": id, "cliente": "ana", "mercado": "girona", "tarjeta": "tok_visa",
           "lineas": [{"producto": "tomate-rosa", "cantidad": 3, "precio_centimos": 350}],
           "direccion_entrega": {"ciudad": city, "codigo_postal": "28013", "calle": "Carrer Major 3"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn km0_up_with_the_saga_takes_an_order_to_its_end() {
    let deployment = Deployment::new("sqlite", 1_000);
    let (mut up, ops) = deployment.start_up("up-1", &["--saga"]).await;
    let ready = up.wait_ready().await;
    for part in [
        "pagos",
        "reparto",
        "inventario",
        "catalogo",
        "pasarela_url=http://",
    ] {
        assert!(ready.contains(part), "{ready}");
    }
    // The operations endpoint of `km0 up` checks every database the process uses.
    let readyz = reqwest::get(format!("http://{ops}/readyz")).await.unwrap();
    assert_eq!(readyz.status().as_u16(), 200);
    let body = readyz.text().await.unwrap();
    for service in ["pedidos", "inventario", "catalogo", "reparto", "pagos"] {
        assert!(body.contains(&format!("database {service}: ok")), "{body}");
    }
    assert!(body.contains("broker"), "{body}");
    let addr = up.http_addr();
    place(addr, &order("U-1", "Madrid")).await;
    place(addr, &order("U-2", "Lleida")).await;

    let orders = deployment.system().pedidos().await.unwrap();
    let sagas = deployment.system().sagas(&orders).await.unwrap();
    for id in ["U-1", "U-2"] {
        eventually(Duration::from_secs(60), "the saga ends", || async {
            let (saga, _) = sagas.show(id).await.unwrap()?;
            saga.status.is_final().then_some(())
        })
        .await;
    }
    // The endpoint's saga gauges are the store's counts.
    let text = reqwest::get(format!("http://{ops}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let counts = sagas.counts().await.unwrap();
    assert_eq!(counts.iter().map(|(_, n)| n).sum::<i64>(), 2, "{counts:?}");
    for (status, n) in &counts {
        let line = format!("km0_sagas{{state=\"{}\"}} {n}", status.as_str());
        assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
    }
    assert!(
        text.lines().any(|l| l == "km0_sagas_needing_operator 0"),
        "{text}"
    );
    let (paid, _) = sagas.show("U-1").await.unwrap().unwrap();
    assert_eq!(paid.status, SagaStatus::Completed);
    assert_eq!(
        orders.find("U-1").await.unwrap().unwrap().state,
        OrderState::Paid
    );
    assert_eq!(
        orders.find("U-2").await.unwrap().unwrap().state,
        OrderState::Cancelled
    );
    let ledger = deployment.system().pasarela().await.unwrap();
    assert_eq!(ledger.net_for("U-1").await.unwrap(), 1050);
    assert_eq!(ledger.net_for("U-2").await.unwrap(), 0);
    assert_eq!(ledger.refunds_for("U-2").await.unwrap().len(), 1);
    up.terminate().await;
    for db in [orders.db(), ledger.db()] {
        db.close().await;
    }
    deployment.destroy().await;
}
