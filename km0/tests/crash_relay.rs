//! Crash test (c) of the outbox relay with real `km0 run relay` processes, on SQLite and on
//! PostgreSQL: the relay dies after the broker confirmed a publish and before it marked the
//! outbox row (`relay.after_publish=exit`). The event is in the log and its row still pending;
//! the next relay publishes it again (a second record with the same `id_evento` header) and
//! the stock consumer applies it once.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::process::Deployment;
use common::state::{eventually, order, place, taken};
use entrega::failpoint::RELAY_AFTER_PUBLISH;
use entrega_core::headers::ID_EVENTO;
use km0::services::pedidos::TOPIC;

/// Lease period of the processes: the dead relay's lanes are taken over after this.
const LEASE_TTL_MS: u64 = 1_000;
/// Longest wait for the system to reach an expected state.
const SETTLE: Duration = Duration::from_secs(30);

const LINES: &[(&str, i64)] = &[("tomate-rosa", 4), ("vino-crianza", 1)];

async fn killed_between_publish_and_mark_publishes_again_and_applies_once(backend: &str) {
    let deployment = Deployment::new(backend, LEASE_TTL_MS);
    let state = deployment.state().await;
    let before = state.stock().await;
    let pedidos = deployment.start("pedidos", "pedidos-1").await;
    let id = place(pedidos.http_addr(), &order("P-RELAY-1", LINES)).await;
    assert_eq!(state.pending().await, 1, "the event waits in the outbox");

    let mut relay = deployment.spawn("relay", "relay-1", &format!("{RELAY_AFTER_PUBLISH}=exit"));
    relay.died_at_failpoint().await;
    let records = state.records(TOPIC).await;
    let ids: Vec<_> = records.iter().map(|r| r.headers.get(ID_EVENTO)).collect();
    assert_eq!(
        ids,
        vec![Some(id.as_str())],
        "the confirmed publish is in the log"
    );
    assert_eq!(
        state.pending().await,
        1,
        "the row was marked published though the relay died before marking it"
    );

    // A new instance takes the dead one's lanes once their lease expires.
    let relay = deployment.start("relay", "relay-2").await;
    eventually(SETTLE, "the outbox drained by the second relay", || async {
        (state.pending().await == 0).then_some(())
    })
    .await;
    let records = state.records(TOPIC).await;
    let ids: Vec<_> = records.iter().map(|r| r.headers.get(ID_EVENTO)).collect();
    assert_eq!(
        ids,
        vec![Some(id.as_str()), Some(id.as_str())],
        "published again with the same id_evento"
    );
    assert_eq!(
        records[0].partition, records[1].partition,
        "both copies in the order's partition"
    );

    let consumer = deployment.start("inventario", "inventario-1").await;
    eventually(SETTLE, "both copies consumed", || async {
        state.consumed_all(2).await.then_some(())
    })
    .await;
    assert_eq!(
        state.stock().await,
        taken(&before, &[LINES]),
        "the event was applied more or less than once"
    );
    assert_eq!(state.keys().await, vec![id], "one key for both copies");

    consumer.terminate().await;
    relay.terminate().await;
    pedidos.terminate().await;
    state.close().await;
    deployment.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_relay_killed_between_publish_and_mark_publishes_again_and_applies_once() {
    killed_between_publish_and_mark_publishes_again_and_applies_once("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_relay_killed_between_publish_and_mark_publishes_again_and_applies_once() {
    killed_between_publish_and_mark_publishes_again_and_applies_once("postgres").await;
}
