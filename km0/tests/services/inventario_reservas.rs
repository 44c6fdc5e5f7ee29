//! inventario's reservations for the order saga, on SQLite and PostgreSQL: idempotent by
//! `id_reserva`, answers and `stock.actualizado` in the same transaction as the stock, a
//! release that gives stock back once, a release before its reservation that blocks it, and
//! the seed's direct `pedido.creado` path converging on the same reservation, and an
//! operator's restock. Assertions read the stock, `reservas` and the outbox.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use entrega::db::query_each;
use entrega::{Handler, Message};
use entrega_core::{Envelope, Headers, NewEvent, Processed};
use km0::services::inventario::{
    reservation_id, CommandConsumer, ReleaseCommand, Released, ReservationState, ReserveCommand,
    Reserved, StockConsumer, StockLine, StockStore,
};
use serde_json::{json, Value};
use uuid::Uuid;

use common::TestDb;

async fn store(backend: &str) -> (StockStore, TestDb) {
    let test_db = TestDb::of(backend).await;
    let store = StockStore::new(test_db.db.clone());
    store.migrate().await.unwrap();
    (store, test_db)
}

fn reserve(order: &str, lines: &[(&str, i32)]) -> ReserveCommand {
    ReserveCommand {
        order_id: order.into(),
        reservation_id: reservation_id(order),
        lines: lines
            .iter()
            .map(|(p, q)| StockLine {
                product: (*p).into(),
                quantity: *q,
            })
            .collect(),
    }
}

fn release(order: &str) -> ReleaseCommand {
    ReleaseCommand {
        order_id: order.into(),
        reservation_id: reservation_id(order),
        key: format!("liberacion-{order}"),
    }
}

fn id() -> String {
    Uuid::new_v4().to_string()
}

async fn units(s: &StockStore, product: &str) -> i64 {
    s.units(product).await.unwrap().expect("product")
}

/// The outbox's events of `kind`, oldest first, as `datos`.
async fn outbox(t: &TestDb, kind: &str) -> Vec<Value> {
    let q = query_each(
        "SELECT carga FROM outbox WHERE tipo = $1 ORDER BY rowid",
        "SELECT carga::text FROM outbox WHERE tipo = $1 ORDER BY seq",
    )
    .bind(kind);
    let rows: Vec<(String,)> = t.db.fetch_all(q).await.unwrap();
    rows.into_iter()
        .map(|(c,)| serde_json::from_str(&c).unwrap())
        .collect()
}

async fn state(s: &StockStore, order: &str) -> Option<ReservationState> {
    s.reservation(&reservation_id(order))
        .await
        .unwrap()
        .map(|r| r.state)
}

async fn a_reservation_takes_stock_once_and_a_repeat_gets_the_same_answer(backend: &str) {
    let (s, t) = store(backend).await;
    let command = reserve(
        "P-1",
        &[("queso-curado", 2), ("tomate-rosa", 3), ("queso-curado", 1)],
    );
    let first = id();
    assert_eq!(
        s.reserve(&first, &command).await.unwrap(),
        Processed::Applied(Reserved::Taken)
    );
    assert_eq!(
        s.reserve(&first, &command).await.unwrap(),
        Processed::Duplicate
    );
    // The saga sent it again: a new event, the same reservation.
    let again = s.reserve(&id(), &command).await.unwrap();
    assert!(
        matches!(again, Processed::Applied(Reserved::Existing(_))),
        "{again:?}"
    );
    assert_eq!(units(&s, "queso-curado").await, 2);
    assert_eq!(units(&s, "tomate-rosa").await, 117);
    assert_eq!(state(&s, "P-1").await, Some(ReservationState::Held));
    let answers = outbox(&t, "reserva.confirmada").await;
    assert_eq!(answers.len(), 2, "each command answered");
    assert!(answers.iter().all(|a| a["clave"] == json!("reserva-P-1")));
    let updates = outbox(&t, "stock.actualizado").await;
    assert_eq!(updates.len(), 2, "one per product, taken once");
    let cheese = updates
        .iter()
        .find(|u| u["producto"] == json!("queso-curado"))
        .unwrap();
    assert_eq!(
        (
            cheese["antes"].clone(),
            cheese["despues"].clone(),
            cheese["motivo"].clone()
        ),
        (json!(5), json!(2), json!("reserva"))
    );
    assert_eq!(cheese["pedido_id"], json!("P-1"));
    t.remove().await;
}

/// A saga's command as delivered.
fn delivered(event: NewEvent) -> Message {
    Message {
        envelope: Envelope {
            id: event.id,
            kind: event.kind,
            version: event.version,
            timestamp_ms: entrega_core::now_ms(),
            source: "pedidos".into(),
            data: event.payload,
        },
        topic: "inventario.comandos".into(),
        partition: 0,
        offset: 0,
        key: None,
        headers: Headers::default(),
        attempt: 1,
        trace: entrega_core::TraceContext::root(),
    }
}

async fn a_poll_of_commands_is_applied_in_order_in_one_transaction(backend: &str) {
    let (s, t) = store(backend).await;
    let consumer = CommandConsumer::new(s.clone());
    let first = delivered(reserve("P-10", &[("queso-curado", 3)]).event().unwrap());
    let poll = [
        first.clone(),
        // Two units left: refused.
        delivered(reserve("P-11", &[("queso-curado", 3)]).event().unwrap()),
        delivered(release("P-10").event().unwrap()),
        // Five again: it fits.
        delivered(reserve("P-12", &[("queso-curado", 4)]).event().unwrap()),
        first,
    ];
    let results = consumer.handle_batch(&poll).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(results.len(), poll.len());
    assert_eq!(units(&s, "queso-curado").await, 1);
    assert_eq!(state(&s, "P-10").await, Some(ReservationState::Released));
    assert_eq!(state(&s, "P-11").await, Some(ReservationState::Refused));
    assert_eq!(state(&s, "P-12").await, Some(ReservationState::Held));
    let confirmed = outbox(&t, "reserva.confirmada").await;
    let keys: Vec<&Value> = confirmed.iter().map(|a| &a["clave"]).collect();
    assert_eq!(keys, [&json!("reserva-P-10"), &json!("reserva-P-12")]);
    assert_eq!(outbox(&t, "reserva.rechazada").await.len(), 1);
    assert_eq!(outbox(&t, "reserva.liberada").await.len(), 1);
    if backend == "postgres" {
        let writers: Option<i64> =
            t.db.scalar(entrega::db::query(
                "SELECT COUNT(DISTINCT xmin::text) FROM outbox WHERE tipo LIKE 'reserva.%'",
            ))
            .await
            .unwrap();
        assert_eq!(writers, Some(1), "the answers committed together");
    }

    // An unreadable command is refused alone; the others are applied.
    let mut unreadable = delivered(reserve("P-13", &[("tomate-rosa", 1)]).event().unwrap());
    unreadable.envelope.data = json!({"pedido_id": "P-13"});
    let poll = [
        delivered(reserve("P-14", &[("tomate-rosa", 1)]).event().unwrap()),
        unreadable,
        delivered(reserve("P-15", &[("tomate-rosa", 2)]).event().unwrap()),
    ];
    let results = consumer.handle_batch(&poll).await;
    let refused: Vec<bool> = results.iter().map(Result::is_err).collect();
    assert_eq!(refused, [false, true, false], "{results:?}");
    assert!(!results[1].as_ref().unwrap_err().is_transient());
    assert_eq!(units(&s, "tomate-rosa").await, 117);
    assert_eq!(state(&s, "P-13").await, None);
    t.remove().await;
}

async fn a_refusal_is_recorded_and_repeated_without_touching_stock(backend: &str) {
    let (s, t) = store(backend).await;
    let command = reserve("P-2", &[("tomate-rosa", 5), ("queso-curado", 6)]);
    let refused = s.reserve(&id(), &command).await.unwrap();
    assert!(
        matches!(refused, Processed::Applied(Reserved::Refused(ref r)) if r.contains("queso-curado"))
    );
    let again = s.reserve(&id(), &command).await.unwrap();
    assert!(matches!(again, Processed::Applied(Reserved::Existing(_))));
    assert_eq!(
        units(&s, "tomate-rosa").await,
        120,
        "the first line was undone"
    );
    assert_eq!(state(&s, "P-2").await, Some(ReservationState::Refused));
    let answers = outbox(&t, "reserva.rechazada").await;
    assert_eq!(answers.len(), 2);
    assert!(answers
        .iter()
        .all(|a| a["motivo"].as_str().unwrap().contains("sin stock")));
    assert!(outbox(&t, "stock.actualizado").await.is_empty());
    t.remove().await;
}

async fn a_release_gives_stock_back_once(backend: &str) {
    let (s, t) = store(backend).await;
    s.reserve(&id(), &reserve("P-3", &[("calabacin", 10)]))
        .await
        .unwrap();
    assert_eq!(units(&s, "calabacin").await, 70);
    let first = s.release(&id(), &release("P-3")).await.unwrap();
    assert_eq!(first, Processed::Applied(Released::GivenBack));
    // The compensation delivered twice: the stock must not change.
    let second = s.release(&id(), &release("P-3")).await.unwrap();
    assert_eq!(second, Processed::Applied(Released::Nothing));
    assert_eq!(units(&s, "calabacin").await, 80);
    assert_eq!(state(&s, "P-3").await, Some(ReservationState::Released));
    let released = outbox(&t, "reserva.liberada").await;
    assert_eq!(released.len(), 2);
    assert!(released
        .iter()
        .all(|a| a["clave"] == json!("liberacion-P-3")));
    let updates = outbox(&t, "stock.actualizado").await;
    assert_eq!(updates.len(), 2);
    assert_eq!(
        (
            updates[1]["antes"].clone(),
            updates[1]["despues"].clone(),
            updates[1]["motivo"].clone()
        ),
        (json!(70), json!(80), json!("liberacion"))
    );
    t.remove().await;
}

async fn a_release_before_its_reservation_blocks_it(backend: &str) {
    let (s, t) = store(backend).await;
    let released = s.release(&id(), &release("P-4")).await.unwrap();
    assert_eq!(released, Processed::Applied(Released::Nothing));
    let late = s
        .reserve(&id(), &reserve("P-4", &[("calabacin", 1)]))
        .await
        .unwrap();
    assert!(matches!(late, Processed::Applied(Reserved::Existing(_))));
    assert_eq!(units(&s, "calabacin").await, 80);
    let refused = outbox(&t, "reserva.rechazada").await;
    assert_eq!(refused.len(), 1);
    assert!(refused[0]["motivo"].as_str().unwrap().contains("liberada"));
    t.remove().await;
}

fn order_created(order: &str, lines: &[(&str, i64)], reserva: Option<&str>) -> Envelope {
    let lines: Vec<_> = lines
        .iter()
        .map(|(p, q)| json!({"producto": p, "cantidad": q, "precio_centimos": 100}))
        .collect();
    let mut data = json!({"id": order, "cliente": "ana", "mercado": "girona", "lineas": lines});
    if let Some(r) = reserva {
        data["reserva"] = json!(r);
    }
    Envelope::new("pedido.creado", "pedidos", data)
}

async fn the_direct_path_and_the_saga_take_an_orders_stock_once(backend: &str) {
    let (s, t) = store(backend).await;
    let c = StockConsumer::new(s.clone());
    // The seed's path first, then the saga's command for the same order.
    c.apply(&order_created("P-5", &[("vino-crianza", 4)], None))
        .await
        .unwrap();
    let r = s
        .reserve(&id(), &reserve("P-5", &[("vino-crianza", 4)]))
        .await
        .unwrap();
    assert!(matches!(r, Processed::Applied(Reserved::Existing(_))));
    // The batch path (one statement per event on PostgreSQL) for another order, then its command.
    let batch = [order_created("P-6", &[("vino-crianza", 6)], None)];
    assert!(c.apply_batch(&batch).await[0].is_ok());
    s.reserve(&id(), &reserve("P-6", &[("vino-crianza", 6)]))
        .await
        .unwrap();
    // An order the saga reserves: the event takes nothing, the command does.
    let managed = [order_created(
        "P-7",
        &[("vino-crianza", 1)],
        Some("reserva-P-7"),
    )];
    assert!(c.apply_batch(&managed).await[0].is_ok());
    c.apply(&order_created(
        "P-7",
        &[("vino-crianza", 1)],
        Some("reserva-P-7"),
    ))
    .await
    .unwrap();
    assert_eq!(units(&s, "vino-crianza").await, 190);
    s.reserve(&id(), &reserve("P-7", &[("vino-crianza", 1)]))
        .await
        .unwrap();
    assert_eq!(units(&s, "vino-crianza").await, 189);
    let updates = outbox(&t, "stock.actualizado").await;
    let motives: Vec<&str> = updates
        .iter()
        .map(|u| u["motivo"].as_str().unwrap())
        .collect();
    assert_eq!(motives, ["pedido", "pedido", "reserva"]);
    assert_eq!(updates[1]["antes"], json!(196));
    assert_eq!(updates[1]["despues"], json!(190));
    for order in ["P-5", "P-6", "P-7"] {
        assert_eq!(
            state(&s, order).await,
            Some(ReservationState::Held),
            "{order}"
        );
    }
    t.remove().await;
}

/// An operator's restock: the units and its `stock.actualizado` in one transaction (a new
/// product too), and a sum past what the column holds refused with nothing written.
async fn a_restock_adds_units_and_says_so_once(backend: &str) {
    let (s, t) = store(backend).await;
    let before = units(&s, "queso-curado").await;
    assert_eq!(
        s.restock("queso-curado", 40).await.unwrap(),
        (before, before + 40)
    );
    assert_eq!(units(&s, "queso-curado").await, before + 40);
    assert_eq!(s.restock("miel-de-romero", 20).await.unwrap(), (0, 20));
    assert_eq!(units(&s, "miel-de-romero").await, 20);
    let events = outbox(&t, "stock.actualizado").await;
    assert_eq!(
        events,
        vec![
            json!({"producto": "queso-curado", "antes": before, "despues": before + 40,
                   "motivo": "reposicion"}),
            json!({"producto": "miel-de-romero", "antes": 0, "despues": 20,
                   "motivo": "reposicion"}),
        ]
    );
    // Past 2,147,483,647: refused, the stock and the outbox as they were.
    s.set_units("miel-de-romero", i32::MAX - 5).await.unwrap();
    let refused = s.restock("miel-de-romero", 6).await.unwrap_err();
    assert!(refused.to_string().contains("2,147,483,647"), "{refused}");
    assert_eq!(units(&s, "miel-de-romero").await, i64::from(i32::MAX - 5));
    assert_eq!(outbox(&t, "stock.actualizado").await.len(), 2);
    assert_eq!(
        s.restock("miel-de-romero", 5).await.unwrap().1,
        i64::from(i32::MAX)
    );
    t.remove().await;
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
    a_poll_of_commands_is_applied_in_order_in_one_transaction,
    a_reservation_takes_stock_once_and_a_repeat_gets_the_same_answer,
    a_refusal_is_recorded_and_repeated_without_touching_stock,
    a_release_gives_stock_back_once,
    a_release_before_its_reservation_blocks_it,
    the_direct_path_and_the_saga_take_an_orders_stock_once,
    a_restock_adds_units_and_says_so_once,
);
