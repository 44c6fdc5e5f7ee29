//! The stock consumer against real databases: every scenario is written once and run on
//! SQLite and on PostgreSQL. Assertions read the stock and `mensajes_procesados` rows.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use entrega::db::{query, Db};
use entrega_core::{Envelope, Processed};
use km0::services::inventario::{StockConsumer, StockStore, CONSUMER};
use serde_json::json;
use uuid::Uuid;

use common::TestDb;

async fn consumer(backend: &str) -> (StockConsumer, TestDb) {
    let test_db = TestDb::of(backend).await;
    let store = StockStore::new(test_db.db.clone());
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

async fn new_event_takes_stock_once_and_a_redelivery_is_a_duplicate(backend: &str) {
    let (c, t) = consumer(backend).await;
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

async fn out_of_stock_is_permanent_applies_nothing_and_records_no_key(backend: &str) {
    let (c, t) = consumer(backend).await;
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

async fn unknown_products_and_unreadable_payloads_are_permanent(backend: &str) {
    let (c, t) = consumer(backend).await;
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

async fn a_bad_message_in_a_batch_undoes_only_itself(backend: &str) {
    let (c, t) = consumer(backend).await;
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

async fn migrating_again_keeps_the_stock(backend: &str) {
    let (c, t) = consumer(backend).await;
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
    new_event_takes_stock_once_and_a_redelivery_is_a_duplicate,
    out_of_stock_is_permanent_applies_nothing_and_records_no_key,
    unknown_products_and_unreadable_payloads_are_permanent,
    a_bad_message_in_a_batch_undoes_only_itself,
    migrating_again_keeps_the_stock,
);

#[tokio::test]
async fn a_locked_database_fails_the_batch_transiently_and_applies_nothing() {
    let (c, t) = consumer("sqlite").await;
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
