//! The stock consumer against real databases: every scenario is written once and run on
//! SQLite and on PostgreSQL, each with the set-based and the per-event batch apply.
//! Assertions read the stock, `mensajes_procesados`, `reservas` and outbox rows.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use entrega::db::{query, Db};
use entrega_core::{Envelope, Processed};
use km0::services::inventario::{BatchMode, StockConsumer, StockStore, CONSUMER};
use serde_json::json;
use uuid::Uuid;

use common::TestDb;

async fn consumer(backend: &str, mode: BatchMode) -> (StockConsumer, TestDb) {
    let test_db = TestDb::of(backend).await;
    let store = StockStore::new(test_db.db.clone()).with_batch_mode(mode);
    store.migrate().await.unwrap();
    (StockConsumer::new(store), test_db)
}

fn order_created(order_id: &str, lines: &[(&str, i64)]) -> Envelope {
    let lines: Vec<_> = lines
        .iter()
        .map(|(p, q)| json!({"producto": p, "cantidad": q, "precio_centimos": 100}))
        .collect();
    Envelope::new(
        "pedido.creado",
        "pedidos",
        json!({"id": order_id, "cliente": "ana", "mercado": "girona", "lineas": lines}),
    )
}

async fn units(c: &StockConsumer, product: &str) -> i64 {
    c.store()
        .units(product)
        .await
        .unwrap()
        .expect("product exists")
}

async fn key_stored(db: &Db, id: Uuid) -> bool {
    let sql = "SELECT COUNT(*) FROM mensajes_procesados WHERE id_mensaje = $1 AND consumidor = $2";
    let n: Option<i64> = db
        .scalar(query(sql).bind(id.to_string()).bind(CONSUMER))
        .await
        .unwrap();
    n == Some(1)
}

async fn new_event_takes_stock_once_and_a_redelivery_is_a_duplicate(
    backend: &str,
    mode: BatchMode,
) {
    let (c, t) = consumer(backend, mode).await;
    let event = order_created("P-1", &[("queso-curado", 2), ("tomate-rosa", 10)]);

    assert_eq!(c.apply(&event).await.unwrap(), Processed::Applied(()));
    assert_eq!(units(&c, "queso-curado").await, 3);
    assert_eq!(units(&c, "tomate-rosa").await, 110);
    assert!(key_stored(&t.db, event.id).await);

    assert_eq!(c.apply(&event).await.unwrap(), Processed::Duplicate);
    assert_eq!(
        units(&c, "queso-curado").await,
        3,
        "a duplicate changes nothing"
    );
    assert_eq!(units(&c, "tomate-rosa").await, 110);
    assert_eq!(c.store().processed(CONSUMER).await.unwrap(), 1);
    let stats = c.stats().snapshot();
    assert_eq!((stats.processed, stats.duplicates), (1, 1));
    t.remove().await;
}

async fn out_of_stock_is_permanent_applies_nothing_and_records_no_key(
    backend: &str,
    mode: BatchMode,
) {
    let (c, t) = consumer(backend, mode).await;
    // The first line fits; the second does not: the first must be undone too.
    let event = order_created("P-2", &[("tomate-rosa", 1), ("queso-curado", 6)]);
    let err = c.apply(&event).await.unwrap_err();
    assert!(!err.is_transient(), "{err}");
    assert!(
        err.to_string().contains("sin stock de queso-curado"),
        "{err}"
    );
    assert_eq!(units(&c, "tomate-rosa").await, 120);
    assert_eq!(units(&c, "queso-curado").await, 5);
    assert!(!key_stored(&t.db, event.id).await);
    assert_eq!(c.stats().snapshot().refused, 1);
    t.remove().await;
}

async fn unknown_products_and_unreadable_payloads_are_permanent(backend: &str, mode: BatchMode) {
    let (c, t) = consumer(backend, mode).await;
    let unknown = order_created("P-3", &[("calabacin", 1), ("trufa", 1)]);
    let err = c.apply(&unknown).await.unwrap_err();
    assert!(!err.is_transient());
    assert!(err.to_string().contains("trufa"), "{err}");
    assert_eq!(units(&c, "calabacin").await, 80);
    assert!(!key_stored(&t.db, unknown.id).await);

    let unreadable = Envelope::new("pedido.creado", "pedidos", json!({"id": "P-4"}));
    let err = c.apply(&unreadable).await.unwrap_err();
    assert!(!err.is_transient());
    assert!(!key_stored(&t.db, unreadable.id).await);
    t.remove().await;
}

async fn a_bad_message_in_a_batch_undoes_only_itself(backend: &str, mode: BatchMode) {
    let (c, t) = consumer(backend, mode).await;
    let first = order_created("P-10", &[("calabacin", 5)]);
    let bad = order_created("P-11", &[("calabacin", 3), ("queso-curado", 50)]);
    let last = order_created("P-12", &[("calabacin", 7), ("queso-curado", 1)]);
    let results = c
        .apply_batch(&[first.clone(), bad.clone(), last.clone(), first.clone()])
        .await;
    assert_eq!(results.len(), 4);
    assert_eq!(results[0].as_ref().unwrap(), &Processed::Applied(()));
    let err = results[1].as_ref().unwrap_err();
    assert!(!err.is_transient() && err.to_string().contains("sin stock de queso-curado"));
    assert_eq!(results[2].as_ref().unwrap(), &Processed::Applied(()));
    assert_eq!(
        results[3].as_ref().unwrap(),
        &Processed::Duplicate,
        "a redelivery inside the same batch is still a duplicate"
    );

    assert_eq!(
        units(&c, "calabacin").await,
        80 - 5 - 7,
        "the bad order's 3 are not taken"
    );
    assert_eq!(units(&c, "queso-curado").await, 4);
    assert!(key_stored(&t.db, first.id).await);
    assert!(!key_stored(&t.db, bad.id).await);
    assert!(key_stored(&t.db, last.id).await);
    assert_eq!(c.store().processed(CONSUMER).await.unwrap(), 2);
    t.remove().await;
}

fn outcome(r: &Result<Processed<()>, entrega_core::HandlerError>) -> String {
    match r {
        Ok(Processed::Applied(())) => "applied".into(),
        Ok(Processed::Duplicate) => "duplicate".into(),
        Err(e) if e.is_transient() => format!("transient: {e}"),
        Err(e) => e.to_string(),
    }
}

async fn count(db: &Db, sql: &'static str, arg: &str) -> i64 {
    db.scalar(query(sql).bind(arg.to_owned()))
        .await
        .unwrap()
        .unwrap_or(0)
}

async fn out_of_stock_mid_batch_refuses_that_event_and_the_rest_apply_in_order(
    backend: &str,
    mode: BatchMode,
) {
    let (c, t) = consumer(backend, mode).await;
    // queso-curado starts at 5.
    let batch = [
        order_created("P-30", &[("queso-curado", 3)]),
        order_created("P-31", &[("tomate-rosa", 1), ("queso-curado", 3)]),
        order_created("P-32", &[("queso-curado", 2)]),
        order_created("P-33", &[("queso-curado", 1)]),
        Envelope::new("pedido.creado", "pedidos", json!({"id": "P-34"})),
        order_created("P-35", &[("tomate-rosa", 1)]),
    ];
    let results = c.apply_batch(&batch).await;
    let got: Vec<String> = results.iter().map(outcome).collect();
    assert_eq!(got[0], "applied");
    assert!(got[1].contains("sin stock de queso-curado"), "{got:?}");
    assert_eq!(got[2], "applied");
    assert!(got[3].contains("sin stock de queso-curado"), "{got:?}");
    assert!(
        got[4].starts_with("esquema: `pedido.creado` version 1"),
        "{got:?}"
    );
    assert_eq!(got[5], "applied");
    assert_eq!(got.len(), 6);
    assert_eq!(units(&c, "queso-curado").await, 0);
    assert_eq!(
        units(&c, "tomate-rosa").await,
        119,
        "P-31's tomato was not taken"
    );
    let kept: Vec<bool> =
        futures::future::join_all(batch.iter().map(|e| key_stored(&t.db, e.id))).await;
    assert_eq!(kept, [true, false, true, false, false, true]);
    let reservations = count(
        &t.db,
        "SELECT COUNT(*) FROM reservas WHERE estado = $1",
        "reservada",
    )
    .await;
    assert_eq!(reservations, 3);
    assert_eq!(c.stats().snapshot().refused, 3);
    t.remove().await;
}

async fn duplicates_across_batches_change_nothing(backend: &str, mode: BatchMode) {
    let (c, t) = consumer(backend, mode).await;
    let a = order_created("P-40", &[("calabacin", 4)]);
    let b = order_created("P-41", &[("calabacin", 6), ("vino-crianza", 1)]);
    let d = order_created("P-42", &[("vino-crianza", 2)]);
    let first: Vec<String> = c
        .apply_batch(&[a.clone(), b.clone()])
        .await
        .iter()
        .map(outcome)
        .collect();
    assert_eq!(first, ["applied", "applied"]);
    let second: Vec<String> = c
        .apply_batch(&[b.clone(), d.clone(), a.clone(), d.clone()])
        .await
        .iter()
        .map(outcome)
        .collect();
    assert_eq!(second, ["duplicate", "applied", "duplicate", "duplicate"]);
    assert_eq!(units(&c, "calabacin").await, 70);
    assert_eq!(units(&c, "vino-crianza").await, 197);
    assert_eq!(c.store().processed(CONSUMER).await.unwrap(), 3);
    let events = count(
        &t.db,
        "SELECT COUNT(*) FROM outbox WHERE tipo = $1",
        "stock.actualizado",
    )
    .await;
    assert_eq!(
        events, 4,
        "one stock event per product of each applied order"
    );
    t.remove().await;
}

async fn two_events_of_one_order_take_its_stock_once(backend: &str, mode: BatchMode) {
    let (c, t) = consumer(backend, mode).await;
    // Two events (two ids) for one order: the reservation `reserva-P-50` is made once.
    let one = order_created("P-50", &[("queso-fresco", 10)]);
    let again = order_created("P-50", &[("queso-fresco", 10)]);
    let got: Vec<String> = c
        .apply_batch(&[one.clone(), again.clone()])
        .await
        .iter()
        .map(outcome)
        .collect();
    assert_eq!(got, ["applied", "applied"]);
    assert_eq!(units(&c, "queso-fresco").await, 20);
    assert!(key_stored(&t.db, one.id).await && key_stored(&t.db, again.id).await);
    let rows = count(
        &t.db,
        "SELECT COUNT(*) FROM reservas WHERE pedido_id = $1",
        "P-50",
    )
    .await;
    assert_eq!(rows, 1);
    t.remove().await;
}

async fn every_change_has_its_stock_event_and_reservation(backend: &str, mode: BatchMode) {
    let (c, t) = consumer(backend, mode).await;
    let batch = [
        order_created(
            "P-60",
            &[("tomate-rosa", 2), ("calabacin", 1), ("tomate-rosa", 1)],
        ),
        order_created("P-61", &[("tomate-rosa", 5)]),
    ];
    let got: Vec<String> = c.apply_batch(&batch).await.iter().map(outcome).collect();
    assert_eq!(got, ["applied", "applied"]);
    // The outbox's order of insertion: `seq` on PostgreSQL, the rowid on SQLite.
    let sql = match backend {
        "postgres" => {
            "SELECT CAST(carga AS TEXT) FROM outbox WHERE tipo = 'stock.actualizado' ORDER BY seq"
        }
        _ => {
            "SELECT CAST(carga AS TEXT) FROM outbox WHERE tipo = 'stock.actualizado' ORDER BY rowid"
        }
    };
    let rows: Vec<(String,)> = t.db.fetch_all(query(sql)).await.unwrap();
    let changes: Vec<(String, i64, i64, String)> = rows
        .iter()
        .map(|(carga,)| {
            let v: serde_json::Value = serde_json::from_str(carga).unwrap();
            assert_eq!(v["motivo"], "pedido");
            (
                v["producto"].as_str().unwrap().to_owned(),
                v["antes"].as_i64().unwrap(),
                v["despues"].as_i64().unwrap(),
                v["pedido_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        changes,
        [
            ("tomate-rosa".into(), 120, 117, "P-60".into()),
            ("calabacin".into(), 80, 79, "P-60".into()),
            ("tomate-rosa".into(), 117, 112, "P-61".into()),
        ]
    );
    let (lines,): (String,) =
        t.db.fetch_optional(query(
            "SELECT lineas FROM reservas WHERE id_reserva = 'reserva-P-61'",
        ))
        .await
        .unwrap()
        .unwrap();
    let lines: serde_json::Value = serde_json::from_str(&lines).unwrap();
    assert_eq!(lines, json!([{"producto": "tomate-rosa", "cantidad": 5}]));
    t.remove().await;
}

async fn migrating_again_keeps_the_stock(backend: &str, mode: BatchMode) {
    let (c, t) = consumer(backend, mode).await;
    c.store().set_units("queso-curado", 1).await.unwrap();
    c.store().migrate().await.unwrap();
    assert_eq!(
        units(&c, "queso-curado").await,
        1,
        "seed rows are inserted once"
    );
    assert_eq!(c.store().all().await.unwrap().len(), 5);
    t.remove().await;
}

macro_rules! on_both_backends {
    ($($scenario:ident),* $(,)?) => {
        on_both_backends!(@mode set_based, SetBased, $($scenario),*);
        on_both_backends!(@mode per_event, PerEvent, $($scenario),*);
    };
    (@mode $module:ident, $mode:ident, $($scenario:ident),*) => {
        mod $module {
            mod sqlite {
                $(#[tokio::test]
                async fn $scenario() {
                    super::super::$scenario("sqlite", super::super::BatchMode::$mode).await;
                })*
            }
            mod postgres {
                $(#[tokio::test]
                async fn $scenario() {
                    super::super::$scenario("postgres", super::super::BatchMode::$mode).await;
                })*
            }
        }
    };
}

on_both_backends!(
    new_event_takes_stock_once_and_a_redelivery_is_a_duplicate,
    out_of_stock_is_permanent_applies_nothing_and_records_no_key,
    unknown_products_and_unreadable_payloads_are_permanent,
    a_bad_message_in_a_batch_undoes_only_itself,
    out_of_stock_mid_batch_refuses_that_event_and_the_rest_apply_in_order,
    duplicates_across_batches_change_nothing,
    two_events_of_one_order_take_its_stock_once,
    every_change_has_its_stock_event_and_reservation,
    migrating_again_keeps_the_stock,
);

#[tokio::test]
async fn a_locked_database_fails_the_batch_transiently_and_applies_nothing() {
    let (c, t) = consumer("sqlite", BatchMode::SetBased).await;
    let events = [
        order_created("P-20", &[("calabacin", 1)]),
        order_created("P-21", &[("calabacin", 1)]),
    ];
    // Another process holds the write lock longer than busy_timeout (5 s).
    let other = entrega_sqlite::connect(&t.url).await.unwrap();
    let lock = entrega_sqlite::begin_immediate(&other).await.unwrap();
    let results = c.apply_batch(&events).await;
    drop(lock);
    other.close().await;
    assert_eq!(results.len(), 1, "only the first counts as attempted");
    assert!(results[0].as_ref().unwrap_err().is_transient());
    assert_eq!(units(&c, "calabacin").await, 80);
    assert_eq!(c.store().processed(CONSUMER).await.unwrap(), 0);

    let retried = c.apply_batch(&events).await;
    assert!(retried
        .iter()
        .all(|r| r.as_ref().unwrap() == &Processed::Applied(())));
    assert_eq!(units(&c, "calabacin").await, 78);
    t.remove().await;
}
