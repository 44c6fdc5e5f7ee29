//! `GET /ciudades`: pedidos lists the cities with couriers by asking reparto over
//! request/reply (`reparto.cobertura`), on the SQLite log, as `km0 up` runs them. The answer is
//! reparto's couriers' cities, kept for a while; without reparto the API answers 503 naming
//! it, within the question's deadline.

use std::time::Instant;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use entrega::db::query;
use http_body_util::BodyExt as _;
use km0::services::pedidos::{app, Coverage, PedidosState, ASK_WITHIN};
use serde_json::Value;
use tower::ServiceExt as _;

use crate::common::coverage::CoverageServer;
use crate::common::test_system;

async fn get_cities(app: &axum::Router) -> (StatusCode, Value) {
    let response = app
        .clone()
        .oneshot(Request::get("/ciudades").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pedidos_lists_the_cities_reparto_covers() {
    let system = test_system("sqlite");
    let reparto = system.reparto().await.unwrap();
    let orders = system.pedidos().await.unwrap();
    let serving = CoverageServer::start(&system).await;
    let pedidos =
        app(PedidosState::new(orders.clone()).with_coverage(Coverage::new(system.clone())));
    let (status, body) = get_cities(&pedidos).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let listed: Vec<String> = serde_json::from_value(body["ciudades"].clone()).unwrap();
    assert_eq!(
        listed,
        reparto.cities().await.unwrap(),
        "reparto's couriers' cities"
    );
    assert_eq!(listed, ["Barcelona", "Madrid", "Tarragona", "Valencia"]);

    // A courier hired in Lleida: reparto answers with it; pedidos keeps its answer a while.
    reparto
        .db()
        .execute(query(
            "INSERT INTO repartidores (id, ciudad) VALUES ('R-LLE-1', 'Lleida')",
        ))
        .await
        .unwrap();
    let (_, kept) = get_cities(&pedidos).await;
    assert_eq!(
        kept["ciudades"].as_array().unwrap().len(),
        4,
        "kept: {kept}"
    );
    let asked_again =
        app(PedidosState::new(orders.clone()).with_coverage(Coverage::new(system.clone())));
    let (status, fresh) = get_cities(&asked_again).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        fresh["ciudades"]
            .as_array()
            .unwrap()
            .contains(&"Lleida".into()),
        "{fresh}"
    );

    // reparto stopped: a pedidos that has not asked yet answers 503, naming reparto.
    serving.stop().await;
    let alone = app(PedidosState::new(orders).with_coverage(Coverage::new(system.clone())));
    let started = Instant::now();
    let (status, body) = get_cities(&alone).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("reparto"),
        "{body}"
    );
    assert!(started.elapsed() >= ASK_WITHIN, "it waited for reparto");
    system.destroy().await.unwrap();
}
