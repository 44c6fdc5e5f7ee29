//! Crash tests of the stock consumer with real `km0 run inventario` processes, on SQLite and
//! on PostgreSQL. A failpoint set to `exit` kills the process (status 137, no cleanup) at the
//! worst moment; the test asserts on the rows that survived, then restarts the consumer and
//! asserts the order's stock was taken exactly once.
//!
//! - (a) after the stock transaction committed, before the offset commit
//!   (`worker.after_handler`): the effect is there, the offset is not; the event comes again
//!   and the idempotency key absorbs it.
//! - (b) inside the stock transaction, after the `UPDATE`s, before `COMMIT`
//!   (`inventario.before_commit`): nothing is there; the event comes again and is applied.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::Duration;

use common::process::Deployment;
use common::state::{eventually, order, place, taken, DbState};
use entrega::failpoint::WORKER_AFTER_HANDLER;
use km0::services::inventario::BEFORE_COMMIT;
use km0::services::pedidos::TOPIC;

/// Lease period of the processes: a killed consumer's partitions move on after this.
const LEASE_TTL_MS: u64 = 1_000;
/// Longest wait for the system to reach an expected state.
const SETTLE: Duration = Duration::from_secs(30);

/// One order of two lines, so a half-applied order would show.
const LINES: &[(&str, i64)] = &[("calabacin", 3), ("queso-fresco", 2)];

/// Places one order through `km0 run pedidos` and publishes it with `km0 run relay`; returns
/// its `id_evento` once it is in the log and the outbox is drained.
async fn one_order_in_the_log(deployment: &Deployment, state: &DbState) -> String {
    let pedidos = deployment.start("pedidos", "pedidos-1").await;
    let relay = deployment.start("relay", "relay-1").await;
    let id = place(pedidos.http_addr(), &order("P-CRASH-1", LINES)).await;
    eventually(SETTLE, "the order's event in the log", || async {
        (state.pending().await == 0 && state.records(TOPIC).await.len() == 1).then_some(())
    })
    .await;
    relay.terminate().await;
    pedidos.terminate().await;
    id
}

/// The partition holding the only record, and that no offset past it is committed.
async fn assert_offset_not_committed(state: &DbState, when: &str) {
    let records = state.records(TOPIC).await;
    assert_eq!(records.len(), 1, "{when}: one record in the log");
    let partition = records[0].partition;
    let committed = state.committed().await.get(&partition).copied();
    assert!(
        committed.unwrap_or(0) <= records[0].offset,
        "{when}: offset committed past the event ({committed:?}) though the consumer died \
         before committing it"
    );
}

/// Restarts the consumer without failpoints and waits until it committed the record.
async fn restart_until_consumed(deployment: &Deployment, state: &DbState) {
    let consumer = deployment.start("inventario", "inventario-2").await;
    eventually(SETTLE, "the restarted consumer to commit", || async {
        state.consumed_all(1).await.then_some(())
    })
    .await;
    consumer.terminate().await;
}

/// (a) Killed between the stock transaction's commit and the offset commit.
async fn killed_after_commit_before_offset_commit_applies_once(backend: &str) {
    let deployment = Deployment::new(backend, LEASE_TTL_MS);
    let state = deployment.state().await;
    let before = state.stock().await;
    let id = one_order_in_the_log(&deployment, &state).await;

    let mut consumer = deployment.spawn(
        "inventario",
        "inventario-1",
        &format!("{WORKER_AFTER_HANDLER}=exit"),
    );
    consumer.died_at_failpoint().await;
    let once = taken(&before, &[LINES]);
    assert_eq!(
        state.stock().await,
        once,
        "the committed effect survives the crash"
    );
    assert_eq!(
        state.keys().await,
        vec![id.clone()],
        "the key committed with it"
    );
    assert_offset_not_committed(&state, "after the crash").await;

    restart_until_consumed(&deployment, &state).await;
    assert_eq!(
        state.stock().await,
        once,
        "the redelivered event must be absorbed, not applied again"
    );
    assert_eq!(state.keys().await, vec![id], "one key for the event");
    state.close().await;
    deployment.destroy().await;
}

/// (b) Killed inside the stock transaction, after the stock `UPDATE`s, before `COMMIT`.
async fn killed_mid_transaction_applies_nothing_then_once(backend: &str) {
    let deployment = Deployment::new(backend, LEASE_TTL_MS);
    let state = deployment.state().await;
    let before = state.stock().await;
    let id = one_order_in_the_log(&deployment, &state).await;

    let mut consumer = deployment.spawn(
        "inventario",
        "inventario-1",
        &format!("{BEFORE_COMMIT}=exit"),
    );
    consumer.died_at_failpoint().await;
    assert_eq!(
        state.stock().await,
        before,
        "an uncommitted transaction took stock"
    );
    assert!(
        state.keys().await.is_empty(),
        "an uncommitted transaction recorded its key"
    );
    assert_offset_not_committed(&state, "after the crash").await;

    restart_until_consumed(&deployment, &state).await;
    assert_eq!(
        state.stock().await,
        taken(&before, &[LINES]),
        "applied exactly once after the restart"
    );
    assert_eq!(state.keys().await, vec![id], "one key for the event");
    state.close().await;
    deployment.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_killed_after_commit_before_offset_commit_applies_once() {
    killed_after_commit_before_offset_commit_applies_once("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_killed_after_commit_before_offset_commit_applies_once() {
    killed_after_commit_before_offset_commit_applies_once("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_killed_mid_transaction_applies_nothing_then_once() {
    killed_mid_transaction_applies_nothing_then_once("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_killed_mid_transaction_applies_nothing_then_once() {
    killed_mid_transaction_applies_nothing_then_once("postgres").await;
}
