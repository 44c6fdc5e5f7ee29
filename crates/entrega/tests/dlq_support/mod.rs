//! Shared fixture of the dead-letter tooling tests: an in-memory log with the orders topic
//! and its dead-letter topic, an in-memory state store, and dead letters as the worker
//! writes them.
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::sync::Arc;

use entrega::dlq::DeadLetters;
use entrega_core::headers::{
    CLASS, CODE, ID_EVENTO, INTENTOS, MOTIVO, ORIGIN_GROUP, ORIGIN_OFFSET, ORIGIN_PARTITION,
    ORIGIN_TOPIC, REPLAYS, TIPO,
};
use entrega_core::{
    DeadLetterId, Headers, ManualClock, OutgoingMessage, Publisher, Record, TopicAdmin,
};
use entrega_testkit::memory::{MemoryDlqStore, MemoryLog};
use entrega_testkit::LogSettings;

pub const TOPIC: &str = "pedidos.eventos";
pub const DLQ: &str = "pedidos.eventos.dlq";
pub const START_MS: i64 = 1_700_000_000_000;

pub struct Fixture {
    pub log: MemoryLog,
    pub store: MemoryDlqStore,
    pub clock: Arc<ManualClock>,
    pub tool: DeadLetters,
}

pub async fn fixture() -> Fixture {
    let clock = Arc::new(ManualClock::new(START_MS));
    let log = MemoryLog::with_settings(LogSettings::default(), clock.clone());
    log.ensure_topic(TOPIC, 2).await.unwrap();
    log.ensure_topic(DLQ, 1).await.unwrap();
    let store = MemoryDlqStore::new();
    let tool = DeadLetters::new(
        Arc::new(log.clone()),
        Arc::new(log.clone()),
        Arc::new(store.clone()),
        vec![DLQ.to_owned()],
    )
    .with_clock(clock.clone())
    .with_replay_key(replay_key());
    Fixture {
        log,
        store,
        clock,
        tool,
    }
}

/// The replay key the tool signs replays to one group with.
pub fn replay_key() -> entrega_core::ReplayKey {
    entrega_core::ReplayKey::new("dlq-tests-replay-key").unwrap()
}

/// A dead letter as the worker writes it, `replays` times replayed before.
pub fn dead(key: &str, tipo: &str, reason: &str, replays: u32) -> OutgoingMessage {
    let id = uuid::Uuid::new_v4().to_string();
    let mut headers = Headers::new()
        .with(TIPO, tipo)
        .with(ID_EVENTO, id.clone())
        .with("traceparent", "00-abc-def-01")
        .with(INTENTOS, "3")
        .with(MOTIVO, reason)
        .with(CLASS, "rechazado")
        .with(CODE, "sin_stock")
        .with(ORIGIN_TOPIC, TOPIC)
        .with(ORIGIN_PARTITION, "1")
        .with(ORIGIN_OFFSET, "42")
        .with(ORIGIN_GROUP, "inventario");
    if replays > 0 {
        headers.set(REPLAYS, replays.to_string());
    }
    let payload = serde_json::json!({"id_evento": id, "tipo": tipo, "version": 1,
        "fecha_ms": START_MS, "origen": "pedidos", "datos": {"id": key}});
    OutgoingMessage {
        topic: DLQ.to_owned(),
        key: Some(key.to_owned()),
        headers,
        payload: serde_json::to_vec(&payload).unwrap(),
    }
}

pub async fn put(fx: &Fixture, letters: Vec<OutgoingMessage>) {
    for letter in letters {
        fx.log.publish(&[letter]).await.unwrap();
        fx.clock.advance(1_000);
    }
}

pub fn origin_records(fx: &Fixture) -> Vec<Record> {
    fx.log.records(TOPIC)
}

pub fn id(offset: i64) -> DeadLetterId {
    DeadLetterId::new(DLQ, 0, offset)
}
