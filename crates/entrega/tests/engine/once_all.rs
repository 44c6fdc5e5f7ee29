//! A poll applied in one transaction (`Db::claim_batch`, `entrega::apply_all_or_each`), on SQLite
//! and PostgreSQL: each key applied once, keys seen before and keys repeated in the batch are
//! duplicates, a failing effect takes every effect and key of the batch back, and a batch
//! that fails is applied one message at a time, so only the culprit is refused or retried.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use entrega::db::{query, Backend, Db, Migration, Tx};
use entrega::{
    apply_all_or_each, ApplyAll, Handler, HandlerError, Headers, Message, MigrationSet, StoreError,
    TraceContext,
};
use entrega_core::Envelope;
use serde_json::json;

use support::on_both_databases;
use support::pg::FreshDb;
use support::TempDir;

const CONSUMER: &str = "reparto.envios";

const APP: &[Migration] = &[Migration::same(
    1,
    "envios",
    "CREATE TABLE IF NOT EXISTS envios (pedido TEXT PRIMARY KEY, ciudad TEXT NOT NULL)",
)];

async fn fresh(backend: Backend, dir: &TempDir) -> FreshDb {
    let fresh = FreshDb::new(backend, dir, "reparto.db").await;
    fresh.db.migrate(&[MigrationSet::Inbox]).await.unwrap();
    fresh.db.apply_migrations("app", APP).await.unwrap();
    fresh
}

async fn count(db: &Db, sql: &'static str) -> i64 {
    db.scalar(query(sql)).await.unwrap().unwrap()
}

/// `(key, order, city)`: the effect records the order's city; the city `falla` writes, then
/// fails.
type Item = (&'static str, &'static str, &'static str);

/// Ships `items` in one batch: whether each ran, or the error that took the batch back.
async fn ship(db: &Db, items: &[Item]) -> Result<Vec<bool>, StoreError> {
    let keys: Vec<&str> = items.iter().map(|(key, _, _)| *key).collect();
    let mut batch = db.claim_batch(CONSUMER, &keys).await?;
    let mut ran = Vec::new();
    for (key, order, city) in items {
        if !batch.is_new(key) {
            ran.push(false);
            continue;
        }
        batch
            .tx()
            .execute(
                query("INSERT INTO envios (pedido, ciudad) VALUES ($1, $2)")
                    .bind(*order)
                    .bind(*city),
            )
            .await?;
        if *city == "falla" {
            return Err(StoreError::unavailable("the maps service answered 503"));
        }
        ran.push(true);
    }
    batch.commit().await?;
    Ok(ran)
}

async fn each_key_once_and_repeats_are_duplicates(backend: Backend) {
    let dir = TempDir::new();
    let f = fresh(backend, &dir).await;
    let mut tx = f.db.begin().await.unwrap();
    assert!(tx.claim(CONSUMER, "k-seen").await.unwrap());
    tx.commit().await.unwrap();

    let done = ship(
        &f.db,
        &[
            ("k1", "P1", "Girona"),
            ("k-seen", "P9", "Lleida"),
            ("k2", "P2", "Reus"),
            ("k1", "P1-again", "Girona"),
        ],
    )
    .await
    .unwrap();
    assert_eq!(done, [true, false, true, false]);
    assert_eq!(count(&f.db, "SELECT COUNT(*) FROM envios").await, 2);
    assert_eq!(
        count(
            &f.db,
            "SELECT COUNT(*) FROM envios WHERE pedido IN ('P9', 'P1-again')"
        )
        .await,
        0,
        "a key seen before, or earlier in the batch, runs nothing"
    );
    assert_eq!(
        count(&f.db, "SELECT COUNT(*) FROM mensajes_procesados").await,
        3
    );
    f.finish().await;
}

async fn a_failing_effect_takes_the_whole_batch_back(backend: Backend) {
    let dir = TempDir::new();
    let f = fresh(backend, &dir).await;
    let err = ship(
        &f.db,
        &[
            ("k1", "P1", "Girona"),
            ("k2", "P2", "falla"),
            ("k3", "P3", "Reus"),
        ],
    )
    .await
    .unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert_eq!(count(&f.db, "SELECT COUNT(*) FROM envios").await, 0);
    assert_eq!(
        count(&f.db, "SELECT COUNT(*) FROM mensajes_procesados").await,
        0,
        "no key of the batch is left claimed"
    );
    f.finish().await;
}

/// Ships orders: in one transaction per run of the poll, else one by one. An order for the
/// city `nula` is refused for good; `falla` fails for now.
struct Shipper {
    db: Db,
    batches: AtomicUsize,
}

fn city(msg: &Message) -> &str {
    msg.envelope.data["ciudad"].as_str().unwrap_or_default()
}

fn refusal(msg: &Message) -> Option<HandlerError> {
    match city(msg) {
        "nula" => Some(HandlerError::permanent("no such city")),
        "falla" => Some(HandlerError::transient("the maps service answered 503")),
        _ => None,
    }
}

/// Records `msg`'s order, or refuses it.
async fn record(tx: &mut Tx, msg: &Message) -> Result<(), HandlerError> {
    if let Some(e) = refusal(msg) {
        return Err(e);
    }
    tx.execute(
        query("INSERT INTO envios (pedido, ciudad) VALUES ($1, $2)")
            .bind(msg.envelope.data["pedido"].as_str().unwrap_or_default())
            .bind(city(msg)),
    )
    .await?;
    Ok(())
}

#[async_trait]
impl Handler for Shipper {
    async fn handle(&self, msg: &Message) -> Result<(), HandlerError> {
        self.db
            .once(CONSUMER, &msg.id(), async |tx| record(tx, msg).await)
            .await?;
        Ok(())
    }

    async fn handle_batch(&self, msgs: &[Message]) -> Vec<Result<(), HandlerError>> {
        apply_all_or_each(self, msgs).await
    }
}

#[async_trait]
impl ApplyAll for Shipper {
    fn per_tx(&self) -> usize {
        3
    }

    async fn apply_all(&self, run: &[Message]) -> Result<(), HandlerError> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        let keys: Vec<String> = run.iter().map(Message::id).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut batch = self.db.claim_batch(CONSUMER, &keys).await?;
        for (msg, key) in run.iter().zip(&keys) {
            if batch.is_new(key) {
                record(batch.tx(), msg).await?;
            }
        }
        batch.commit().await?;
        Ok(())
    }
}

fn order(pedido: &str, ciudad: &str) -> Message {
    Message {
        envelope: Envelope::new(
            "pedido.creado",
            "pedidos",
            json!({"pedido": pedido, "ciudad": ciudad}),
        ),
        topic: "pedidos.eventos".to_owned(),
        partition: 0,
        offset: 0,
        key: Some(pedido.to_owned()),
        headers: Headers::new(),
        attempt: 1,
        trace: TraceContext::root(),
    }
}

async fn a_failed_batch_is_applied_one_by_one(backend: Backend) {
    let dir = TempDir::new();
    let f = fresh(backend, &dir).await;
    let shipper = Shipper {
        db: f.db.clone(),
        batches: AtomicUsize::new(0),
    };
    // Runs of three: the second holds a refusal, the third a failure for now.
    let poll = [
        order("P1", "Girona"),
        order("P2", "Reus"),
        order("P3", "Lleida"),
        order("P4", "Vic"),
        order("P5", "nula"),
        order("P6", "Olot"),
        order("P7", "Blanes"),
        order("P8", "falla"),
        order("P9", "Salt"),
        order("P10", "Roses"),
    ];
    let results = shipper.handle_batch(&poll).await;
    assert_eq!(shipper.batches.load(Ordering::SeqCst), 3);
    let shape: Vec<&str> = results
        .iter()
        .map(|r| match r {
            Ok(()) => "ok",
            Err(e) if e.is_transient() => "again",
            Err(_) => "refused",
        })
        .collect();
    assert_eq!(
        shape,
        ["ok", "ok", "ok", "ok", "refused", "ok", "ok", "again"],
        "the results end right after the transient failure"
    );
    let shipped: Vec<(String,)> =
        f.db.fetch_all(query("SELECT pedido FROM envios ORDER BY pedido"))
            .await
            .unwrap();
    let shipped: Vec<String> = shipped.into_iter().map(|(p,)| p).collect();
    assert_eq!(shipped, ["P1", "P2", "P3", "P4", "P6", "P7"]);
    assert_eq!(
        count(&f.db, "SELECT COUNT(*) FROM mensajes_procesados").await,
        6,
        "keys of the refused, the failed and the messages not attempted stay unclaimed"
    );

    // Delivered again from the failure on, the rest goes through as one run.
    let again = [order("P8", "Figueres"), poll[8].clone(), poll[9].clone()];
    let results = shipper.handle_batch(&again).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(shipper.batches.load(Ordering::SeqCst), 4);
    assert_eq!(count(&f.db, "SELECT COUNT(*) FROM envios").await, 9);
    f.finish().await;
}

on_both_databases!(
    each_key_once_and_repeats_are_duplicates,
    a_failing_effect_takes_the_whole_batch_back,
    a_failed_batch_is_applied_one_by_one,
);
