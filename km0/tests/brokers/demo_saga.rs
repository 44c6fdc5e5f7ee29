//! `km0 demo` through the order saga on the embedded default, PostgreSQL, PostgreSQL +
//! RabbitMQ and PostgreSQL + Kafka: declined cards, uncovered cities, customer cancels and
//! gateway faults (503s, charges whose answer is lost) mixed in, then commands and replies
//! published a second time. Every invariant is read from the services' rows; on top of the
//! report's verdict this checks the rows themselves for a few orders of each fate.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::Duration;

use entrega::saga::SagaStatus;
use km0::demo::{DemoOptions, DemoPlan, Fate};
use km0::services::pedidos::OrderState;
use km0::wiring::System;

const ORDERS: usize = 150;
const SEED: u64 = 17;

fn options() -> DemoOptions {
    DemoOptions {
        orders: ORDERS,
        concurrency: 8,
        fresh: false,
        keep: true,
        timeout: Duration::from_secs(120),
        seed: SEED,
        progress: false,
        redeliver: 21,
        saga: true,
        json: true,
    }
}

async fn the_saga_demo_holds_its_invariants(system: System) {
    let report = km0::demo::run(&system, &options()).await.unwrap();
    assert!(report.passed(), "{}", report.render());
    let saga = report.saga.as_ref().expect("a saga run reports its sagas");
    // The plan's mix happened: every fate planned and ended the way it must.
    for fate in ["pagado", "tarjeta_rechazada", "ciudad_no_cubierta"] {
        let n = saga.by_fate[fate];
        assert!(n.planned > 0, "{fate}: {n:?}");
    }
    assert_eq!(saga.by_fate["pagado"].paid, saga.by_fate["pagado"].planned);
    assert_eq!(
        saga.by_fate["ciudad_no_cubierta"].cancelled,
        saga.by_fate["ciudad_no_cubierta"].planned
    );
    assert!(saga.refunds > 0, "uncovered cities are refunded");
    // Three records of each of the 7 topics, and every refund and release command besides
    // (a refund may be among pagos.comandos' first three).
    assert!(
        saga.redelivered + 3 >= 21 + saga.refunds,
        "{} redelivered, {} refunds",
        saga.redelivered,
        saga.refunds
    );
    let json = report.to_json();
    assert_eq!(json["passed"], true);
    assert!(json["invariants"].as_array().unwrap().len() >= 10, "{json}");

    // The rows behind the verdict, for one order of each fate (the plan is reproducible;
    // the run id is the prefix of every order id in the databases).
    let orders = system.pedidos().await.unwrap();
    let prefix = orders
        .states("P-")
        .await
        .unwrap()
        .keys()
        .next()
        .map(|id| id[..id.len() - 6].to_owned())
        .unwrap();
    let run = prefix.trim_start_matches("P-").trim_end_matches('-');
    let plan = DemoPlan::generate_saga(ORDERS, run, SEED);
    let fates = &plan.saga.as_ref().unwrap().fates;
    let sagas = system.sagas(&orders).await.unwrap();
    let ledger = system.pasarela().await.unwrap();
    for wanted in [Fate::Paid, Fate::Declined, Fate::Uncovered] {
        let at = fates.iter().position(|f| *f == wanted).unwrap();
        let order = &plan.orders[at];
        let found = orders.find(&order.id).await.unwrap().unwrap();
        let (record, _) = sagas.show(&order.id).await.unwrap().unwrap();
        let net = ledger.net_for(&order.id).await.unwrap();
        match wanted {
            Fate::Paid => {
                assert_eq!(found.state, OrderState::Paid);
                assert_eq!(record.status, SagaStatus::Completed);
                assert_eq!(net, order.amount_cents());
            }
            _ => {
                assert_eq!(found.state, OrderState::Cancelled, "{wanted:?}");
                assert_eq!(record.status, SagaStatus::Compensated);
                assert_eq!(net, 0, "{wanted:?}");
            }
        }
    }
    for db in [orders.db(), ledger.db()] {
        db.close().await;
    }
    system.destroy().await.unwrap();
}

fn on_postgres(broker: String) -> System {
    let databases = common::test_system("postgres").databases().clone();
    System::new(databases, broker).with_lease_ttl(Duration::from_secs(2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_embedded_default() {
    the_saga_demo_holds_its_invariants(common::test_system("sqlite")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_alone() {
    the_saga_demo_holds_its_invariants(common::test_system("postgres")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_and_rabbitmq() {
    let vhost = common::amqp::Vhost::create();
    the_saga_demo_holds_its_invariants(on_postgres(format!("{}?shards=4", vhost.url()))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_and_kafka() {
    let kafka = common::kafka_ns::KafkaNamespace::new();
    let url = kafka.url_with("session_timeout_ms=6000");
    the_saga_demo_holds_its_invariants(on_postgres(url)).await;
}
