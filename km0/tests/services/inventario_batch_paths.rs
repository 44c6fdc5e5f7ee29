//! The set-based batch apply against the per-event one, on random batches: same outcome for
//! every event, and the same rows after (stock, keys, reservations, `stock.actualizado` in
//! order), on SQLite and on PostgreSQL.
//!
//! The batches mix what the semantics tests single out: orders that do not fit the stock
//! left by the events before them, unknown products, unreadable payloads, a key repeated in
//! the batch or delivered in an earlier one, two events of one order, orders whose stock a
//! saga's command takes, and orders reserved before the batch.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use entrega::db::{query, Db};
use entrega_core::{Envelope, HandlerError, Processed};
use km0::services::inventario::{BatchMode, StockConsumer, StockStore};
use proptest::prelude::*;
use serde_json::{json, Value};
use uuid::Uuid;

use common::TestDb;

/// Products the orders pick from; the last one is not in the stock table.
const PRODUCTS: [&str; 4] = ["queso-curado", "queso-fresco", "tomate-rosa", "trufa"];

#[derive(Debug, Clone)]
enum Event {
    /// A new `pedido.creado` of order `order` with lines (product index, units).
    Order { order: u8, lines: Vec<(usize, i64)> },
    /// An order whose stock a saga's reservation takes (`datos.reserva`).
    ByCommand { order: u8 },
    /// An earlier event delivered again (index into the events so far, modulo).
    Again(usize),
    /// A `pedido.creado` without lines.
    Unreadable,
}

#[derive(Debug, Clone)]
struct Case {
    /// Starting units of the three known products.
    stock: [i64; 3],
    /// Orders with a reservation before the batches, and whether it holds stock.
    reserved: Vec<(u8, bool)>,
    batches: Vec<Vec<Event>>,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        6 => (0u8..8, prop::collection::vec((0usize..4, 1i64..4), 1..4))
            .prop_map(|(order, lines)| Event::Order { order, lines }),
        1 => (0u8..8).prop_map(|order| Event::ByCommand { order }),
        2 => any::<usize>().prop_map(Event::Again),
        1 => Just(Event::Unreadable),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (
        [0i64..8, 0i64..8, 0i64..8],
        prop::collection::vec((0u8..8, any::<bool>()), 0..3),
        prop::collection::vec(prop::collection::vec(event(), 1..12), 1..4),
    )
        .prop_map(|(stock, reserved, batches)| Case {
            stock,
            reserved,
            batches,
        })
}

/// The envelopes of each batch; ids are numbered so both paths see the same keys.
fn envelopes(case: &Case) -> Vec<Vec<Envelope>> {
    let mut all: Vec<Envelope> = Vec::new();
    let mut out = Vec::new();
    for batch in &case.batches {
        let mut envelopes = Vec::new();
        for event in batch {
            let fresh = |data: Value, n: usize| {
                let mut e = Envelope::new("pedido.creado", "pedidos", data);
                e.id = Uuid::from_u128(n as u128 + 1);
                e
            };
            let envelope = match event {
                Event::Again(i) if !all.is_empty() => all[i % all.len()].clone(),
                Event::Again(_) | Event::Unreadable => {
                    fresh(json!({"id": "P-roto", "cliente": "ana"}), all.len())
                }
                Event::Order { order, lines } => {
                    let lines: Vec<Value> = lines
                        .iter()
                        .map(|(p, q)| json!({"producto": PRODUCTS[*p], "cantidad": q}))
                        .collect();
                    fresh(
                        json!({"id": format!("P-{order}"), "lineas": lines}),
                        all.len(),
                    )
                }
                Event::ByCommand { order } => fresh(
                    json!({"id": format!("P-{order}"), "reserva": format!("reserva-P-{order}"),
                           "lineas": [{"producto": "queso-fresco", "cantidad": 1}]}),
                    all.len(),
                ),
            };
            all.push(envelope.clone());
            envelopes.push(envelope);
        }
        out.push(envelopes);
    }
    out
}

/// Everything a path leaves behind, in a comparable form.
#[derive(Debug, PartialEq)]
struct Outcome {
    results: Vec<Vec<String>>,
    stock: Vec<(String, i64)>,
    keys: Vec<String>,
    reservations: Vec<(String, String, String, Value)>,
    stock_events: Vec<Value>,
}

fn result(r: &Result<Processed<()>, HandlerError>) -> String {
    match r {
        Ok(Processed::Applied(())) => "applied".into(),
        Ok(Processed::Duplicate) => "duplicate".into(),
        // The error says whether it is transient or permanent.
        Err(e) => e.to_string(),
    }
}

/// A reservation's lines, one per product in first-seen order (how either path stores them).
fn normalised(lines: &str) -> Value {
    let lines: Vec<Value> = serde_json::from_str(lines).unwrap();
    let mut out: Vec<(String, i64)> = Vec::new();
    for line in lines {
        let product = line["producto"].as_str().unwrap().to_owned();
        let units = line["cantidad"].as_i64().unwrap();
        match out.iter_mut().find(|(p, _)| *p == product) {
            Some((_, n)) => *n += units,
            None => out.push((product, units)),
        }
    }
    json!(out)
}

async fn reset(db: &Db, case: &Case) {
    for sql in [
        "DELETE FROM mensajes_procesados",
        "DELETE FROM reservas",
        "DELETE FROM outbox",
    ] {
        db.execute(query(sql)).await.unwrap();
    }
    for (product, units) in PRODUCTS.iter().zip(case.stock) {
        db.execute(
            query("UPDATE stock SET unidades = $1 WHERE producto = $2")
                .bind(i32::try_from(units).unwrap())
                .bind(product.to_string()),
        )
        .await
        .unwrap();
    }
    for (order, holds) in &case.reserved {
        let (state, lines) = if *holds {
            ("reservada", r#"[{"producto":"queso-curado","cantidad":1}]"#)
        } else {
            ("rechazada", "[]")
        };
        db.execute(
            query(
                "INSERT INTO reservas (id_reserva, pedido_id, estado, lineas, motivo, actualizado_ms) \
                 VALUES ($1, $2, $3, $4, NULL, 0) ON CONFLICT DO NOTHING",
            )
            .bind(format!("reserva-P-{order}"))
            .bind(format!("P-{order}"))
            .bind(state.to_owned())
            .bind(lines.to_owned()),
        )
        .await
        .unwrap();
    }
}

async fn run(consumer: &StockConsumer, db: &Db, backend: &str, case: &Case) -> Outcome {
    reset(db, case).await;
    let mut results = Vec::new();
    for batch in envelopes(case) {
        results.push(
            consumer
                .apply_batch(&batch)
                .await
                .iter()
                .map(result)
                .collect(),
        );
    }
    let stock = consumer.store().all().await.unwrap();
    let keys: Vec<(String,)> = db
        .fetch_all(query(
            "SELECT id_mensaje FROM mensajes_procesados ORDER BY id_mensaje",
        ))
        .await
        .unwrap();
    let rows: Vec<(String, String, String, String)> = db
        .fetch_all(query(
            "SELECT id_reserva, pedido_id, estado, lineas FROM reservas ORDER BY id_reserva",
        ))
        .await
        .unwrap();
    // The outbox's order of insertion: `seq` on PostgreSQL, the rowid on SQLite.
    let sql = match backend {
        "postgres" => {
            "SELECT CAST(carga AS TEXT) FROM outbox WHERE tipo = 'stock.actualizado' ORDER BY seq"
        }
        _ => {
            "SELECT CAST(carga AS TEXT) FROM outbox WHERE tipo = 'stock.actualizado' ORDER BY rowid"
        }
    };
    let events: Vec<(String,)> = db.fetch_all(query(sql)).await.unwrap();
    Outcome {
        results,
        stock,
        keys: keys.into_iter().map(|(k,)| k).collect(),
        reservations: rows
            .into_iter()
            .map(|(id, order, state, lines)| (id, order, state, normalised(&lines)))
            .collect(),
        stock_events: events
            .into_iter()
            .map(|(e,)| serde_json::from_str(&e).unwrap())
            .collect(),
    }
}

async fn store(backend: &str, mode: BatchMode) -> (StockConsumer, TestDb) {
    let t = TestDb::of(backend).await;
    let store = StockStore::new(t.db.clone()).with_batch_mode(mode);
    store.migrate().await.unwrap();
    (StockConsumer::new(store), t)
}

fn both_paths_agree(backend: &'static str, cases: u32) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (set, set_db) = rt.block_on(store(backend, BatchMode::SetBased));
    let (each, each_db) = rt.block_on(store(backend, BatchMode::PerEvent));
    let config = ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(case in case())| {
        let (by_set, by_each) = rt.block_on(async {
            (
                run(&set, &set_db.db, backend, &case).await,
                run(&each, &each_db.db, backend, &case).await,
            )
        });
        prop_assert_eq!(by_set, by_each);
    });
    rt.block_on(async {
        set_db.remove().await;
        each_db.remove().await;
    });
}

#[test]
fn the_two_paths_agree_on_sqlite() {
    both_paths_agree("sqlite", 96);
}

#[test]
fn the_two_paths_agree_on_postgres() {
    both_paths_agree("postgres", 48);
}
