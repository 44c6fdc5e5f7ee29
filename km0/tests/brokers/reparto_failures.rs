//! The seed's exercise 3 with a real consumer: reparto assigning couriers to paid orders, and
//! each of its five failures handled as the seed classifies it. Assertions read deliveries,
//! processed-message keys, the retry topic and the dead-letter topic, on SQLite and PostgreSQL
//! with the log transport, and on SQLite with a Kafka-protocol broker (kafka).
//!
//! 1. the maps service answers 503: transient, retried, then applied;
//! 2. a city km0 does not serve: permanent, dead-lettered at once (`ciudad_no_cubierta`);
//! 3. a version-1 event without `direccion_entrega`: permanent (`esquema`);
//! 4. the database restarting: transient, retried through `<topic>.retry` (PostgreSQL);
//! 5. no free courier: persisted as pending and assigned by the periodic job, no retries.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use entrega_core::headers::{INTENTOS, MOTIVO, ULTIMO_ERROR};
use entrega_core::{Envelope, Headers, OutgoingMessage, Record};
use km0::services::reparto::{DeliveryState, DeliveryStore, CONSUMER};
use km0::wiring::config::{DataPlace, Databases, RetryArgs, RetryMode};
use km0::wiring::{Broker, Components, Running, System};
use serde_json::json;

use common::kafka_ns::KafkaNamespace;
use common::{pg_server, proxy::Proxy, test_system};

/// A deployment on fresh databases of `backend` (`sqlite`, `postgres`, or `kafka`: SQLite
/// databases with an Apache Kafka broker of the test's own, kept alive by the returned handle).
fn deployment(backend: &str, retry: RetryArgs) -> (System, Option<KafkaNamespace>) {
    if backend == "kafka" {
        let kafka = KafkaNamespace::new();
        let databases = test_system("sqlite").databases().clone();
        let url = kafka.url_with("session_timeout_ms=6000");
        let system = System::new(databases, url)
            .with_lease_ttl(Duration::from_secs(2))
            .with_retry(retry);
        return (system, Some(kafka));
    }
    (test_system(backend).with_retry(retry), None)
}

const TOPIC: &str = "pedidos.eventos";
const RETRY: &str = "pedidos.eventos.retry";
const DLQ: &str = "pedidos.eventos.dlq";

/// A maps service that answers 503 to its first `fail` calls, then `{"km": 4.5}`.
struct FakeMaps {
    addr: SocketAddr,
    calls: Arc<AtomicU32>,
    fail: Arc<AtomicU32>,
}

impl FakeMaps {
    async fn start() -> Self {
        let calls = Arc::new(AtomicU32::new(0));
        let fail = Arc::new(AtomicU32::new(0));
        let (c, f) = (calls.clone(), fail.clone());
        let app = axum::Router::new().route(
            "/ruta",
            axum::routing::get(move || {
                let (c, f) = (c.clone(), f.clone());
                async move {
                    c.fetch_add(1, Ordering::SeqCst);
                    let failing = f
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                    if failing {
                        (axum::http::StatusCode::SERVICE_UNAVAILABLE, "{}".to_owned())
                    } else {
                        (axum::http::StatusCode::OK, r#"{"km": 4.5}"#.to_owned())
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, calls, fail }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

fn retry(mode: RetryMode, max_attempts: u32) -> RetryArgs {
    RetryArgs {
        mode,
        max_attempts,
        retry_base_ms: 100,
        retry_max_ms: 400,
        retry_jitter: 0.0,
    }
}

async fn start(system: &System, maps: &FakeMaps) -> Running {
    let mut components = Components::none("t");
    components.add(&km0::services::reparto::COMPONENT);
    components.mapas_url = Some(maps.url());
    system
        .start(components, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

/// Publishes an order event as the producing services would.
async fn publish(broker: &Broker, order: &str, tipo: &str, version: u32, data: serde_json::Value) {
    let mut envelope = Envelope::new(tipo, "pagos", data);
    envelope.version = version;
    let message = OutgoingMessage {
        topic: TOPIC.into(),
        key: Some(order.into()),
        headers: Headers::new()
            .with("tipo", tipo)
            .with("id_evento", envelope.id.to_string()),
        payload: envelope.to_bytes(),
    };
    broker.publisher().publish(&[message]).await.unwrap();
}

async fn paid(broker: &Broker, order: &str, city: &str) {
    let data = json!({"pedido_id": order,
                      "direccion_entrega": {"ciudad": city, "calle": "Rambla Nova 1"}});
    publish(broker, order, "pedido.pagado", 2, data).await;
}

/// Every record of `topic` with key `order`.
async fn records(broker: &Broker, topic: &str, order: &str) -> Vec<Record> {
    let mut out = Vec::new();
    for (partition, end) in broker.end_offsets(topic).await.unwrap_or_default() {
        if end > 0 {
            out.extend(
                broker
                    .read(topic, partition, 0, end as usize)
                    .await
                    .unwrap(),
            );
        }
    }
    out.retain(|r| r.key.as_deref() == Some(order));
    out
}

async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn state(store: &DeliveryStore, order: &str) -> Option<DeliveryState> {
    store.delivery(order).await.unwrap().map(|d| d.state)
}

async fn processed(store: &DeliveryStore) -> i64 {
    let sql = "SELECT COUNT(*) FROM mensajes_procesados WHERE consumidor = $1";
    store
        .db()
        .scalar(entrega::db::query(sql).bind(CONSUMER))
        .await
        .unwrap()
        .expect("a count")
}

async fn a_503_is_retried_then_applied(backend: &str, mode: RetryMode) {
    let (system, _kafka) = deployment(backend, retry(mode, 5));
    let maps = FakeMaps::start().await;
    maps.fail.store(2, Ordering::SeqCst);
    let running = start(&system, &maps).await;
    let broker = system.broker().await.unwrap();
    let store = system.reparto().await.unwrap();
    paid(&broker, "P-503", "Madrid").await;
    eventually("P-503 assigned", || async {
        state(&store, "P-503").await == Some(DeliveryState::Assigned)
    })
    .await;
    running.stop().await.unwrap();

    assert_eq!(
        maps.calls.load(Ordering::SeqCst),
        3,
        "503, 503, then the route"
    );
    let delivery = store.delivery("P-503").await.unwrap().unwrap();
    assert_eq!(delivery.km, Some(4.5));
    assert_eq!(delivery.courier.as_deref(), Some("R-MAD-1"));
    assert!(records(&broker, DLQ, "P-503").await.is_empty());
    let retried = records(&broker, RETRY, "P-503").await;
    if mode == RetryMode::RetryTopic {
        let intentos: Vec<&str> = retried
            .iter()
            .map(|r| r.headers.get(INTENTOS).unwrap())
            .collect();
        assert_eq!(intentos, vec!["1", "2"], "{backend}");
        assert!(retried[0]
            .headers
            .get(ULTIMO_ERROR)
            .unwrap()
            .contains("503"));
    } else {
        assert!(retried.is_empty(), "{mode:?} does not use the retry topic");
    }
    assert_eq!(processed(&store).await, 1);
    store.db().close().await;
    system.destroy().await.unwrap();
}

async fn permanent_failures_are_dead_lettered_at_once(backend: &str) {
    let (system, _kafka) = deployment(backend, retry(RetryMode::RetryTopic, 5));
    let maps = FakeMaps::start().await;
    let running = start(&system, &maps).await;
    let broker = system.broker().await.unwrap();
    let store = system.reparto().await.unwrap();
    paid(&broker, "P-lugo", "Lugo").await;
    publish(
        &broker,
        "P-v1",
        "pedido.pagado",
        1,
        json!({"pedido_id": "P-v1"}),
    )
    .await;
    paid(&broker, "P-ok", "Valencia").await;
    eventually("P-ok assigned", || async {
        state(&store, "P-ok").await.is_some()
    })
    .await;
    eventually("two dead letters", || async {
        records(&broker, DLQ, "P-lugo").await.len() + records(&broker, DLQ, "P-v1").await.len() == 2
    })
    .await;
    running.stop().await.unwrap();

    let city = records(&broker, DLQ, "P-lugo").await;
    assert_eq!(
        city[0].headers.get(MOTIVO),
        Some(
            "permanent: ciudad_no_cubierta: Lugo (covered: Barcelona, Madrid, Tarragona, Valencia)"
        )
    );
    assert_eq!(
        city[0].headers.get(INTENTOS),
        Some("1"),
        "no retry for a permanent error"
    );
    let schema = records(&broker, DLQ, "P-v1").await;
    let reason = schema[0].headers.get(MOTIVO).unwrap();
    assert!(
        reason.starts_with("esquema: `pedido.pagado` version 1 cannot be read"),
        "{reason}"
    );
    assert_eq!(schema[0].headers.get(INTENTOS), Some("1"));
    for order in ["P-lugo", "P-v1"] {
        assert!(
            records(&broker, RETRY, order).await.is_empty(),
            "{order} was retried"
        );
        assert_eq!(state(&store, order).await, None, "{order} has a delivery");
    }
    assert_eq!(
        maps.calls.load(Ordering::SeqCst),
        1,
        "only P-ok asked for a route"
    );
    assert_eq!(processed(&store).await, 1);
    store.db().close().await;
    system.destroy().await.unwrap();
}

async fn no_free_courier_is_pending_not_retried(backend: &str) {
    let (system, _kafka) = deployment(backend, retry(RetryMode::RetryTopic, 3));
    let maps = FakeMaps::start().await;
    let running = start(&system, &maps).await;
    let broker = system.broker().await.unwrap();
    let store = system.reparto().await.unwrap();
    // Tarragona has one courier.
    paid(&broker, "P-tgn-1", "Tarragona").await;
    eventually("P-tgn-1 assigned", || async {
        state(&store, "P-tgn-1").await == Some(DeliveryState::Assigned)
    })
    .await;
    paid(&broker, "P-tgn-2", "Tarragona").await;
    eventually("P-tgn-2 pending", || async {
        state(&store, "P-tgn-2").await == Some(DeliveryState::Pending)
    })
    .await;
    assert!(records(&broker, RETRY, "P-tgn-2").await.is_empty());
    assert!(records(&broker, DLQ, "P-tgn-2").await.is_empty());
    // The first delivery is made: the periodic job gives its courier to the second.
    assert!(store
        .complete("P-tgn-1", entrega_core::now_ms())
        .await
        .unwrap());
    eventually("P-tgn-2 assigned", || async {
        state(&store, "P-tgn-2").await == Some(DeliveryState::Assigned)
    })
    .await;
    running.stop().await.unwrap();
    let second = store.delivery("P-tgn-2").await.unwrap().unwrap();
    assert_eq!(second.courier.as_deref(), Some("R-TGN-1"));
    assert!(
        records(&broker, RETRY, "P-tgn-2").await.is_empty(),
        "never bounced"
    );
    assert_eq!(processed(&store).await, 2);
    store.db().close().await;
    system.destroy().await.unwrap();
}

/// Case 4 on PostgreSQL: reparto's database behind a proxy that is cut for two seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_is_retried_through_the_retry_topic() {
    let server: SocketAddr = "127.0.0.1:5432".parse().unwrap();
    let proxy = Proxy::start(server);
    let id = uuid::Uuid::new_v4().simple().to_string();
    let databases = Databases {
        place: DataPlace::PostgresServer(format!("postgres://postgres@{}", proxy.addr())),
        prefix: Some(format!("entrega_t_{id}_")),
    };
    let broker_url = format!("{}/entrega_t_{id}_broker", pg_server());
    let system = System::new(databases, broker_url)
        .with_lease_ttl(Duration::from_secs(2))
        .with_retry(retry(RetryMode::RetryTopic, 12));
    let maps = FakeMaps::start().await;
    let running = start(&system, &maps).await;
    let broker = system.broker().await.unwrap();
    let store = system.reparto().await.unwrap();
    paid(&broker, "P-before", "Madrid").await;
    eventually("P-before assigned", || async {
        state(&store, "P-before").await.is_some()
    })
    .await;

    proxy.cut();
    paid(&broker, "P-down", "Barcelona").await;
    eventually("a retry of P-down", || async {
        !records(&broker, RETRY, "P-down").await.is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.restore();
    eventually("P-down assigned", || async {
        matches!(store.delivery("P-down").await, Ok(Some(d)) if d.state == DeliveryState::Assigned)
    })
    .await;
    running.stop().await.unwrap();

    let retried = records(&broker, RETRY, "P-down").await;
    assert!(!retried.is_empty());
    assert!(retried[0]
        .headers
        .get(ULTIMO_ERROR)
        .is_some_and(|e| !e.is_empty()));
    assert!(
        records(&broker, DLQ, "P-down").await.is_empty(),
        "not dead-lettered"
    );
    assert_eq!(processed(&store).await, 2, "each event applied once");
    store.db().close().await;
    system.destroy().await.unwrap();
}

macro_rules! on_every_backend {
    ($($scenario:ident $(($($arg:expr),*))?),+ $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario("sqlite" $($(, $arg)*)?).await;
                }
            )+
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario("postgres" $($(, $arg)*)?).await;
                }
            )+
        }
        mod kafka {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario("kafka" $($(, $arg)*)?).await;
                }
            )+
        }
    };
}

async fn a_503_through_the_retry_topic(backend: &str) {
    a_503_is_retried_then_applied(backend, RetryMode::RetryTopic).await;
}

async fn a_503_with_the_key_parked(backend: &str) {
    a_503_is_retried_then_applied(backend, RetryMode::Ordered).await;
}

on_every_backend!(
    a_503_through_the_retry_topic,
    a_503_with_the_key_parked,
    permanent_failures_are_dead_lettered_at_once,
    no_free_courier_is_pending_not_retried,
);
