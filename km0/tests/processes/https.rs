//! km0's HTTP over TLS, with a certificate authority the test makes: `km0 --saga up` serves
//! pedidos, the gateway simulator and the operations endpoint over HTTPS only, and pagos
//! charges through the gateway over HTTPS trusting that CA (`--tls-ca`). An order goes to
//! its end; a client that does not trust the CA, or speaks plain HTTP, is refused.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::Duration;

use entrega::saga::SagaStatus;
use serde_json::json;

use common::process::Deployment;
use common::state::eventually;
use common::tls::TestPki;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_saga_runs_over_https_and_untrusting_clients_are_refused() {
    let deployment = Deployment::new("sqlite", 1_000);
    let dir = std::env::temp_dir().join(format!("km0-tls-{}", uuid::Uuid::new_v4().simple()));
    let pki = TestPki::new(&dir);
    let path = |p: &std::path::Path| p.display().to_string();
    let (cert, key, ca) = (path(&pki.cert), path(&pki.key), path(&pki.ca));
    let (mut up, ops) = deployment
        .start_up(
            "tls-1",
            &[
                "--saga",
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
                "--tls-ca",
                &ca,
            ],
        )
        .await;
    let ready = up.wait_ready().await;
    assert!(ready.contains("pasarela_url=https://"), "{ready}");
    let trusting = reqwest::Client::builder()
        .add_root_certificate(pki.ca_certificate())
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();

    // The operations endpoint answers over TLS to a client that trusts the CA.
    let readyz = trusting
        .get(format!("https://{ops}/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(readyz.status().as_u16(), 200);
    // Plain HTTP gets no answer, and a client trusting another CA refuses the server.
    assert!(reqwest::get(format!("http://{ops}/readyz")).await.is_err());
    let other = reqwest::Certificate::from_pem(&std::fs::read(&pki.other_ca).unwrap()).unwrap();
    let untrusting = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(other)
        .build()
        .unwrap();
    let refused = untrusting
        .get(format!("https://{ops}/readyz"))
        .send()
        .await
        .unwrap_err();
    assert!(refused.is_connect(), "{refused:?}");

    // An order over HTTPS, charged by pagos through the gateway over HTTPS.
    let order = json!({"id": "T-1", "cliente": "ana", "mercado": "girona", "tarjeta": "tok_visa",
        "lineas": [{"producto": "tomate-rosa", "cantidad": 3, "precio_centimos": 350}],
        "direccion_entrega": {"ciudad": "Madrid", "codigo_postal": "28013", "calle": "Carrer Major 3"}});
    let placed = trusting
        .post(format!("https://{}/pedidos", up.http_addr()))
        .json(&order)
        .send()
        .await
        .unwrap();
    assert_eq!(placed.status().as_u16(), 201);
    let orders = deployment.system().pedidos().await.unwrap();
    let sagas = deployment.system().sagas(&orders).await.unwrap();
    let status = eventually(Duration::from_secs(60), "the saga ends", || async {
        let (saga, _) = sagas.show("T-1").await.unwrap()?;
        saga.status.is_final().then_some(saga.status)
    })
    .await;
    assert_eq!(status, SagaStatus::Completed);
    let ledger = deployment.system().pasarela().await.unwrap();
    assert_eq!(ledger.net_for("T-1").await.unwrap(), 1050);
    up.terminate().await;
    for db in [orders.db(), ledger.db()] {
        db.close().await;
    }
    deployment.destroy().await;
    let _ = std::fs::remove_dir_all(&dir);
}
