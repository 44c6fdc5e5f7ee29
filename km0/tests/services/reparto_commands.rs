//! reparto's assignments for the order saga, on SQLite and PostgreSQL: a courier assigned once
//! and the same answer on a repeat, a city without couriers refused with its reason, a
//! pending delivery answered when a courier frees up, and a delivery cancelled first refused.
//! Assertions read `entregas`, the couriers and reparto's outbox.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::sync::Arc;

use entrega::db::query_each;
use entrega::{Handler, Message};
use entrega_core::{now_ms, Envelope, Headers};
use km0::services::reparto::{
    AssignCommand, CommandConsumer, DeliveryState, DeliveryStore, LocalMaps, ASSIGN,
};
use serde_json::Value;

use common::TestDb;

struct Fixture {
    store: DeliveryStore,
    consumer: CommandConsumer,
    db: TestDb,
}

impl Fixture {
    async fn new(backend: &str) -> Self {
        let db = TestDb::of(backend).await;
        let store = DeliveryStore::new(db.db.clone());
        store.migrate().await.unwrap();
        let consumer = CommandConsumer::new(store.clone(), Arc::new(LocalMaps));
        Self {
            store,
            consumer,
            db,
        }
    }

    async fn assign(&self, order: &str, city: &str) {
        self.consumer
            .handle(&assignment(order, city))
            .await
            .unwrap();
    }

    async fn state(&self, order: &str) -> Option<DeliveryState> {
        self.store.delivery(order).await.unwrap().map(|d| d.state)
    }

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
}

fn assignment(order: &str, city: &str) -> Message {
    let command = AssignCommand {
        order_id: order.into(),
        key: format!("reparto-{order}"),
        city: city.into(),
        street: "Rambla Nova 1".into(),
    };
    Message {
        envelope: Envelope::new(ASSIGN, "pedidos", command.event().unwrap().payload),
        topic: "reparto.comandos".into(),
        partition: 0,
        offset: 0,
        key: None,
        headers: Headers::default(),
        attempt: 1,
        trace: entrega_core::TraceContext::root(),
    }
}

async fn a_poll_is_assigned_in_order_in_one_transaction(backend: &str) {
    let f = Fixture::new(backend).await;
    let first = assignment("P-a", "Madrid");
    let poll = [
        first.clone(),
        assignment("P-b", "Madrid"),
        assignment("P-c", "Madrid"),
        first,
        assignment("P-d", "Lleida"),
        assignment("P-e", "Tarragona"),
    ];
    let results = f.consumer.handle_batch(&poll).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(results.len(), poll.len());
    // Madrid has two couriers: the third order waits for one.
    for (order, state) in [
        ("P-a", DeliveryState::Assigned),
        ("P-b", DeliveryState::Assigned),
        ("P-c", DeliveryState::Pending),
        ("P-d", DeliveryState::Refused),
        ("P-e", DeliveryState::Assigned),
    ] {
        assert_eq!(f.state(order).await, Some(state), "{order}");
    }
    assert_eq!(
        f.answers("reparto.asignado", "P-a").await.len(),
        1,
        "the repeated message is a duplicate"
    );
    assert_eq!(f.answers("reparto.rechazado", "P-d").await.len(), 1);
    if backend == "postgres" {
        let writers: Option<i64> =
            f.db.db
                .scalar(entrega::db::query(
                    "SELECT COUNT(DISTINCT xmin::text) FROM outbox",
                ))
                .await
                .unwrap();
        assert_eq!(writers, Some(1), "the answers committed together");
    }
    f.db.remove().await;
}

async fn a_courier_is_assigned_once_and_answered_again(backend: &str) {
    let f = Fixture::new(backend).await;
    f.assign("P-1", "Madrid").await;
    f.assign("P-1", "Madrid").await;
    assert_eq!(f.state("P-1").await, Some(DeliveryState::Assigned));
    let answers = f.answers("reparto.asignado", "P-1").await;
    assert_eq!(answers.len(), 2);
    assert_eq!(answers[0]["repartidor_id"], answers[1]["repartidor_id"]);
    assert_eq!(answers[0]["clave"], "reparto-P-1");
    // Madrid has two couriers: the repeat did not take the second.
    f.assign("P-2", "Madrid").await;
    assert_eq!(f.state("P-2").await, Some(DeliveryState::Assigned));
    f.db.remove().await;
}

async fn a_city_without_couriers_is_refused_with_its_reason(backend: &str) {
    let f = Fixture::new(backend).await;
    f.assign("P-3", "Lleida").await;
    f.assign("P-3", "Lleida").await;
    assert_eq!(f.state("P-3").await, Some(DeliveryState::Refused));
    let refused = f.answers("reparto.rechazado", "P-3").await;
    assert_eq!(refused.len(), 2);
    assert!(refused.iter().all(|r| r["motivo"]
        == "ciudad_no_cubierta: Lleida (covered: Barcelona, Madrid, Tarragona, Valencia)"
        && r["clave"] == "reparto-P-3"));
    f.db.remove().await;
}

async fn a_pending_delivery_is_answered_when_a_courier_frees_up(backend: &str) {
    let f = Fixture::new(backend).await;
    f.assign("P-4", "Tarragona").await;
    f.assign("P-5", "Tarragona").await;
    assert_eq!(f.state("P-5").await, Some(DeliveryState::Pending));
    assert!(f.answers("reparto.asignado", "P-5").await.is_empty());
    assert_eq!(f.store.assign_pending(now_ms()).await.unwrap(), 0);
    assert!(f.store.complete("P-4", now_ms()).await.unwrap());
    assert_eq!(f.store.assign_pending(now_ms()).await.unwrap(), 1);
    assert_eq!(f.state("P-5").await, Some(DeliveryState::Assigned));
    let answers = f.answers("reparto.asignado", "P-5").await;
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0]["clave"], "reparto-P-5");
    f.db.remove().await;
}

/// A city is matched without regard to case, and a courier who has been out for the
/// delivery time has made the delivery and takes the next one.
async fn couriers_finish_after_the_delivery_time_and_take_the_next(backend: &str) {
    let f = Fixture::new(backend).await;
    f.assign("P-7", "tarragona").await;
    f.assign("P-8", "TARRAGONA").await;
    assert_eq!(f.state("P-7").await, Some(DeliveryState::Assigned));
    assert_eq!(f.state("P-8").await, Some(DeliveryState::Pending));
    // Not out long enough yet: nothing is made.
    let long_ago = now_ms() - 60_000;
    assert_eq!(
        f.store
            .complete_assigned_before(long_ago, now_ms())
            .await
            .unwrap(),
        0
    );
    assert_eq!(f.state("P-7").await, Some(DeliveryState::Assigned));
    // Out for the delivery time: made, and the courier takes the pending one.
    let now = now_ms() + 1;
    assert_eq!(f.store.complete_assigned_before(now, now).await.unwrap(), 1);
    assert_eq!(f.state("P-7").await, Some(DeliveryState::Delivered));
    assert_eq!(f.store.assign_pending(now).await.unwrap(), 1);
    assert_eq!(f.state("P-8").await, Some(DeliveryState::Assigned));
    assert_eq!(f.answers("reparto.asignado", "P-8").await.len(), 1);
    f.db.remove().await;
}

async fn a_delivery_cancelled_first_is_refused(backend: &str) {
    let f = Fixture::new(backend).await;
    let cancelled = f
        .store
        .apply_cancelled("reparto.asignacion", "m-1", "P-6", now_ms())
        .await
        .unwrap();
    assert_eq!(cancelled, entrega_core::Processed::Applied(()));
    f.assign("P-6", "Madrid").await;
    assert_eq!(f.state("P-6").await, Some(DeliveryState::Cancelled));
    let refused = f.answers("reparto.rechazado", "P-6").await;
    assert_eq!(refused[0]["motivo"], "entrega_cancelada");
    f.db.remove().await;
}

macro_rules! on_both_backends {
    ($($scenario:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test]
            async fn $scenario() {
                super::$scenario("sqlite").await;
            })*
        }
        mod postgres {
            $(#[tokio::test]
            async fn $scenario() {
                super::$scenario("postgres").await;
            })*
        }
    };
}

on_both_backends!(
    a_poll_is_assigned_in_order_in_one_transaction,
    a_courier_is_assigned_once_and_answered_again,
    a_city_without_couriers_is_refused_with_its_reason,
    a_pending_delivery_is_answered_when_a_courier_frees_up,
    a_delivery_cancelled_first_is_refused,
    couriers_finish_after_the_delivery_time_and_take_the_next,
);
