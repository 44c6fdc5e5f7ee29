//! The orchestrator's replies a poll at a time (`Sagas` as a batch handler), on both
//! backends: every reply of a poll moves its saga once, in one transaction (on PostgreSQL the
//! rows share the transaction id that wrote them); repeats, foreign events and replies to
//! unknown sagas pass as they do one at a time; a reply that fails leaves the others applied
//! and the rest of the poll to be delivered again.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::Ordering;

use entrega::db::{query, Backend};
use entrega::saga::SagaStatus;
use entrega::{Handler, HandlerError, Headers, Message, TraceContext};
use entrega_core::Envelope;
use serde_json::json;

use super::saga::{done, event, Fixture};

fn delivered(envelope: &Envelope) -> Message {
    Message {
        envelope: envelope.clone(),
        topic: "respuestas".to_owned(),
        partition: 0,
        offset: 0,
        key: None,
        headers: Headers::new(),
        attempt: 1,
        trace: TraceContext::root(),
    }
}

fn poll(envelopes: &[&Envelope]) -> Vec<Message> {
    envelopes.iter().map(|e| delivered(e)).collect()
}

fn shape(results: &[Result<(), HandlerError>]) -> Vec<&'static str> {
    results
        .iter()
        .map(|r| match r {
            Ok(()) => "ok",
            Err(e) if e.is_transient() => "again",
            Err(_) => "refused",
        })
        .collect()
}

/// On PostgreSQL, how many transactions wrote the orchestrator's inbox keys.
async fn writers_of_keys(f: &Fixture) -> i64 {
    f.db()
        .scalar(query(
            "SELECT COUNT(DISTINCT xmin::text) FROM mensajes_procesados \
             WHERE consumidor = 'saga.orden'",
        ))
        .await
        .unwrap()
        .unwrap()
}

async fn a_poll_moves_each_saga_once_in_one_transaction(backend: Backend) {
    let f = Fixture::new(backend).await;
    for id in ["P1", "P2", "P3", "P4"] {
        f.start(id).await;
    }
    let first = done("reserva", "P1");
    let results = f
        .sagas
        .handle_batch(&poll(&[
            &first,
            &done("reserva", "P2"),
            &first,
            &event("pedido.creado", json!({})),
            &done("reserva", "P9"),
            &done("reserva", "P3"),
            &done("reserva", "P4"),
        ]))
        .await;
    assert_eq!(shape(&results), ["ok"; 7]);
    for id in ["P1", "P2", "P3", "P4"] {
        let saga = f.saga(id).await;
        assert_eq!((saga.status, saga.step), (SagaStatus::Running, 1), "{id}");
    }
    let charges = f
        .commands()
        .await
        .into_iter()
        .filter(|(kind, _)| kind == "cobro.pedir")
        .count();
    assert_eq!(charges, 4, "one charge command per saga");
    assert_eq!(
        f.count("SELECT COUNT(*) FROM mensajes_procesados WHERE consumidor = 'saga.orden'")
            .await,
        5,
        "each distinct reply's key once, the unknown saga's included"
    );
    assert_eq!(f.sagas.stats().snapshot().duplicates, 1);
    if backend == Backend::Postgres {
        assert_eq!(writers_of_keys(&f).await, 1);
    }
    f.finish().await;
}

async fn a_failing_reply_leaves_the_others_applied(backend: Backend) {
    let f = Fixture::new(backend).await;
    for id in ["P1", "P2", "P3"] {
        f.start(id).await;
    }
    f.sagas.handle(&done("reserva", "P2")).await.unwrap();
    f.sagas.handle(&done("cobro", "P2")).await.unwrap();
    let before = f.saga("P2").await;
    f.flow.fail_finish.store(true, Ordering::SeqCst);
    let shipped = done("envio", "P2");
    let reserved = done("reserva", "P3");
    let results = f
        .sagas
        .handle_batch(&poll(&[&done("reserva", "P1"), &shipped, &reserved]))
        .await;
    assert_eq!(
        shape(&results),
        ["ok", "again"],
        "applied one by one after the batch failed; stopped at the failure"
    );
    assert_eq!(f.saga("P1").await.step, 1);
    assert_eq!(
        f.saga("P2").await,
        before,
        "the failing reply changed nothing"
    );
    assert_eq!(f.saga("P3").await.step, 0, "not attempted");
    assert_eq!(f.count("SELECT COUNT(*) FROM finales").await, 0);
    assert_eq!(
        f.count("SELECT COUNT(*) FROM mensajes_procesados WHERE consumidor = 'saga.orden'")
            .await,
        3
    );

    f.flow.fail_finish.store(false, Ordering::SeqCst);
    let results = f.sagas.handle_batch(&poll(&[&shipped, &reserved])).await;
    assert_eq!(shape(&results), ["ok", "ok"]);
    assert_eq!(f.saga("P2").await.status, SagaStatus::Completed);
    assert_eq!(f.saga("P3").await.step, 1);
    assert_eq!(f.count("SELECT COUNT(*) FROM finales").await, 1);
    f.finish().await;
}

async fn an_unreadable_reply_is_refused_alone(backend: Backend) {
    let f = Fixture::new(backend).await;
    for id in ["P1", "P2"] {
        f.start(id).await;
    }
    let broken = event("cobro.hecho", json!({"clave": "cobro-P1"}));
    let results = f
        .sagas
        .handle_batch(&poll(&[
            &done("reserva", "P1"),
            &broken,
            &done("reserva", "P2"),
        ]))
        .await;
    assert_eq!(shape(&results), ["ok", "refused", "ok"]);
    assert_eq!(f.saga("P1").await.step, 1);
    assert_eq!(f.saga("P2").await.step, 1);
    if backend == Backend::Postgres {
        assert_eq!(writers_of_keys(&f).await, 1);
    }
    f.finish().await;
}

macro_rules! on_both {
    ($($name:ident),+ $(,)?) => {
        mod sqlite {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::Backend::Sqlite).await;
            })+
        }
        mod postgres {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::Backend::Postgres).await;
            })+
        }
    };
}

on_both!(
    a_poll_moves_each_saga_once_in_one_transaction,
    a_failing_reply_leaves_the_others_applied,
    an_unreadable_reply_is_refused_alone,
);
