//! The order saga's orchestrator killed after every step, with real processes: `km0 run
//! pasarela`, `inventario`, `pagos`, `reparto`, `relay`, and `km0 run pedidos --saga` with the
//! failpoint `saga.after_commit=exit`, which kills it (status 137) each time an answer has
//! moved a saga and committed, before the answer is acknowledged. Each restart gets the
//! unacknowledged answer again (recognised by its inbox key) and dies after the next step, so
//! one order is killed between every pair of its steps, and another during each of its
//! compensations. Asserted on every service's rows and the gateway's ledger: both sagas end
//! the one way they should, each step and compensation applied once. On the embedded
//! default, PostgreSQL, PostgreSQL + RabbitMQ and PostgreSQL + Kafka.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::{Duration, Instant};

use entrega::failpoint::SAGA_AFTER_COMMIT;
use entrega::saga::{EventKind, Phase, SagaStatus};
use km0::services::reparto::DeliveryState;
use serde_json::{json, Value};

use common::process::Deployment;
use common::state::place;

/// Relay lane lease (and group lease) of the processes.
const LEASE_TTL_MS: u64 = 1_000;
/// Deadline of the reservation and the charge, far above what a step may take here.
const STEP_DEADLINE_S: u64 = 600;
/// Longest wait for a saga step after a restart.
const STEP_WITHIN: Duration = Duration::from_secs(30);

fn order(id: &str, city: &str) -> Value {
    json!({"id": id, "cliente": "ana", "mercado": "girona", "tarjeta": "tok_visa",
           "lineas": [{"producto": "queso-fresco", "cantidad": 2, "precio_centimos": 600}],
           "direccion_entrega": {"ciudad": city, "codigo_postal": "28013", "calle": "Carrer Major 3"}})
}

async fn killed_after_every_step(deployment: Deployment) {
    let gateway = deployment.start("pasarela", "pasarela-1").await;
    let gateway_url = format!("http://{}", gateway.http_addr());
    let with_gateway = ["--pasarela-url".to_owned(), gateway_url];
    // inventario starts once both orders are placed: until it answers a reservation no saga
    // can move, so no life of pedidos dies before both orders exist.
    let mut _inventario = None;
    let _services = [
        deployment.spawn_with("pagos", "pagos-1", "", &with_gateway),
        deployment.spawn_with("reparto", "reparto-1", "", &[]),
        deployment.spawn_with("relay", "relay-1", "", &[]),
    ];
    // Each life of a killed consumer waits for its group to form again (on Kafka, for the
    // dead member's session to time out), and a step may span several lives: a deadline
    // here would test the machine's speed, not the kills.
    let saga = [
        "--saga".to_owned(),
        "--saga-step-deadline-s".to_owned(),
        STEP_DEADLINE_S.to_string(),
    ];
    let failpoint = format!("{SAGA_AFTER_COMMIT}=exit");
    let pedidos_store = deployment.system().pedidos().await.unwrap();
    let sagas = deployment
        .system()
        .clone()
        .with_saga(Default::default())
        .sagas(&pedidos_store)
        .await
        .unwrap();

    let mut kills = 0;
    let mut replied = [0usize; 2];
    let mut placed = false;
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let mut pedidos = deployment.spawn_with("pedidos", "pedidos-1", &failpoint, &saga);
        if !placed {
            // Nothing can kill it before inventario runs; later lives may die before they
            // print their ready line, so only the first one waits for it.
            pedidos.wait_ready().await;
            let addr = pedidos.http_addr();
            place(addr, &order("S-OK", "Madrid")).await;
            place(addr, &order("S-LLEIDA", "Lleida")).await;
            _inventario = Some(deployment.spawn_with("inventario", "inventario-1", "", &[]));
            placed = true;
        }
        let life = Instant::now();
        let died = loop {
            if pedidos.exit_status().is_some() {
                break true;
            }
            let all = sagas.list(None, 10).await.unwrap();
            if all.len() == 2 && all.iter().all(|s| s.status.is_final()) {
                break false;
            }
            assert!(
                life.elapsed() < STEP_WITHIN,
                "no saga moved in {STEP_WITHIN:?}: {all:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if !died {
            // The last answer kills it too, right after its commit: give it the moment.
            let grace = Instant::now();
            while pedidos.exit_status().is_none() && grace.elapsed() < Duration::from_secs(3) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            match pedidos.exit_status() {
                Some(status) if status.code() == Some(137) => kills += 1,
                Some(status) => panic!("pedidos ended with {status}"),
                None => pedidos.kill().await,
            }
            one_step_each(&sagas, &mut replied).await;
            break;
        }
        pedidos.died_at_failpoint().await;
        kills += 1;
        // The three answer topics have a worker each, so a life may apply one answer of
        // each saga before it dies; never two of one saga, never none.
        assert!(
            one_step_each(&sagas, &mut replied).await > 0,
            "died without applying an answer"
        );
        assert!(
            Instant::now() < deadline,
            "sagas not final after {kills} kills"
        );
    }
    // 3 steps of S-OK; reserve, charge, refusal, refund and release of S-LLEIDA, each
    // answer followed by a kill before its saga's next one.
    assert_eq!(replied, [3, 5]);
    assert!(kills >= 5, "killed {kills} times");

    let (ok, ok_history) = sagas.show("S-OK").await.unwrap().unwrap();
    assert_eq!(ok.status, SagaStatus::Completed);
    let (lleida, lleida_history) = sagas.show("S-LLEIDA").await.unwrap().unwrap();
    assert_eq!(lleida.status, SagaStatus::Compensated);
    assert_eq!(
        lleida.reason.as_deref(),
        Some("ciudad_no_cubierta: Lleida (covered: Barcelona, Madrid, Tarragona, Valencia)")
    );
    // Every answer applied once, whatever was delivered again.
    for (history, expected) in [
        (
            &ok_history,
            vec![
                ("reserva", Phase::Action),
                ("cobro", Phase::Action),
                ("reparto", Phase::Action),
            ],
        ),
        (
            &lleida_history,
            vec![
                ("reserva", Phase::Action),
                ("cobro", Phase::Action),
                ("cobro", Phase::Compensation),
                ("reserva", Phase::Compensation),
            ],
        ),
    ] {
        let applied: Vec<(&str, Phase)> = history
            .iter()
            .filter(|e| e.what == EventKind::Replied)
            .map(|e| (e.step.as_str(), e.phase))
            .collect();
        assert_eq!(applied, expected);
    }

    let ledger = deployment.system().pasarela().await.unwrap();
    assert_eq!(ledger.charges_for("S-OK").await.unwrap().len(), 1);
    assert_eq!(ledger.net_for("S-OK").await.unwrap(), 1200, "charged once");
    assert_eq!(ledger.net_for("S-LLEIDA").await.unwrap(), 0, "refunded");
    assert_eq!(ledger.refunds_for("S-LLEIDA").await.unwrap().len(), 1);
    let stock = deployment.system().inventario().await.unwrap();
    assert_eq!(
        stock.units("queso-fresco").await.unwrap(),
        Some(28),
        "taken once, given back once"
    );
    let deliveries = deployment.system().reparto().await.unwrap();
    let delivery = deliveries.delivery("S-OK").await.unwrap().unwrap();
    assert_eq!(delivery.state, DeliveryState::Assigned);
    let order_state = pedidos_store.find("S-LLEIDA").await.unwrap().unwrap().state;
    assert_eq!(order_state, km0::services::pedidos::OrderState::Cancelled);
    for db in [pedidos_store.db(), ledger.db(), stock.db(), deliveries.db()] {
        db.close().await;
    }
    deployment.destroy().await;
}

/// Counts the answers each saga has applied (replies and failures) since the last call into `replied` (S-OK,
/// S-LLEIDA), asserting at most one per saga, and returns how many there were.
async fn one_step_each(sagas: &entrega::saga::Sagas, replied: &mut [usize; 2]) -> usize {
    let mut moved = 0;
    for (count, id) in replied.iter_mut().zip(["S-OK", "S-LLEIDA"]) {
        let history = sagas
            .show(id)
            .await
            .unwrap()
            .map(|(_, h)| h)
            .unwrap_or_default();
        let now = history
            .iter()
            .filter(|e| matches!(e.what, EventKind::Replied | EventKind::Failed))
            .count();
        assert!(
            now <= *count + 1,
            "{id} applied {} answers in one life",
            now - *count
        );
        moved += now - *count;
        *count = now;
    }
    moved
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_orchestrator_killed_after_every_step_on_sqlite() {
    killed_after_every_step(Deployment::new("sqlite", LEASE_TTL_MS)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_orchestrator_killed_after_every_step_on_postgres() {
    killed_after_every_step(Deployment::new("postgres", LEASE_TTL_MS)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_orchestrator_killed_after_every_step_on_postgres_and_rabbitmq() {
    let vhost = common::amqp::Vhost::create();
    let url = format!("{}?shards=4", vhost.url());
    killed_after_every_step(Deployment::with_broker("postgres", &url, LEASE_TTL_MS)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_orchestrator_killed_after_every_step_on_postgres_and_kafka() {
    let kafka = common::kafka_ns::KafkaNamespace::new();
    // A killed member's partitions wait for its session to time out before a new life
    // gets them: keep that short.
    let url = kafka.url_with("session_timeout_ms=6000");
    killed_after_every_step(Deployment::with_broker("postgres", &url, LEASE_TTL_MS)).await;
}
