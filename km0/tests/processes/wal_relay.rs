//! The WAL relay (`--relay-source wal`) as a real `km0 run relay` process, with orders posted
//! over HTTP in a stream to `km0 run pedidos` and applied by `km0 run inventario`:
//!
//! - killed with SIGKILL again and again mid-stream, and killed at its failpoints between the
//!   broker's confirmation and the mark, and between the mark and the confirmed position;
//! - two relays on one slot, the streaming one killed: the other takes over;
//! - PostgreSQL restarted under it (killed without a checkpoint, then shut down cleanly), on
//!   a server of the test's own.
//!
//! Each time: every stored order applied exactly once and no other, stock the start less the
//! stored orders, the outbox drained (every row marked), nothing dead-lettered; and the fault
//! happened with work in hand.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::Duration;

use entrega::db::query;
use entrega::failpoint::{RELAY_AFTER_PUBLISH, WAL_AFTER_MARK};

use common::own_pg::OwnPostgres;
use common::process::{Deployment, Km0};
use common::state::{eventually, DbState};
use common::stream::{assert_applied_once, Posting};

const LEASE_TTL_MS: u64 = 1_000;
const SETTLE: Duration = Duration::from_secs(60);
const WAL: (&str, &str) = ("KM0_RELAY_SOURCE", "wal");

async fn wal_relay(deployment: &Deployment, instance: &str) -> Km0 {
    deployment.start_with_env("relay", instance, &[WAL]).await
}

/// Whether the slot of pedidos' outbox is being streamed from now.
async fn slot_active(state: &DbState) -> bool {
    state
        .pedidos
        .scalar::<bool>(query(
            "SELECT COALESCE(bool_or(active), false) FROM pg_replication_slots \
             WHERE database = current_database()",
        ))
        .await
        .unwrap()
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_again_and_again_mid_stream_loses_nothing_and_applies_once() {
    const PREFIX: &str = "P-WALK";
    let deployment = Deployment::new("postgres", LEASE_TTL_MS);
    let (state, start) = deployment.stocked_state().await;
    let pedidos = deployment.start("pedidos", "pedidos-1").await;
    let consumer = deployment.start("inventario", "inventario-1").await;
    let mut relay = wal_relay(&deployment, "relay-0").await;
    let posting = Posting::start(pedidos.http_addr(), PREFIX, 0x7761_6c6b, 400, 30);

    let mut kills = 0;
    let mut with_work = 0;
    while posting.answered() < 320 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        with_work += usize::from(state.pending().await > 0);
        relay.kill().await;
        kills += 1;
        relay = wal_relay(&deployment, &format!("relay-{kills}")).await;
    }
    // Between the broker's confirmation and the mark, then between the mark and the
    // position confirmed to PostgreSQL: each time the next relay publishes the rows again.
    for (n, failpoint) in [RELAY_AFTER_PUBLISH, WAL_AFTER_MARK]
        .into_iter()
        .enumerate()
    {
        relay.kill().await;
        let mut dying = deployment.spawn_args_env(
            &format!("relay-fp{n}"),
            &format!("{failpoint}=exit"),
            &common::process::run_args("relay", &format!("relay-fp{n}")),
            &[WAL],
        );
        dying.died_at_failpoint().await;
        relay = wal_relay(&deployment, &format!("relay-after-{n}")).await;
    }
    let orders = posting.orders.clone();
    let accepted = posting.accepted().await;
    assert!(kills >= 3, "only {kills} kills");
    assert!(with_work > 0, "no kill found work in hand");
    assert_applied_once(
        &state,
        PREFIX,
        &orders,
        &accepted,
        &start,
        SETTLE,
        "WAL relay kills",
    )
    .await;
    eprintln!("WAL relay killed {kills} times ({with_work} with rows pending) and twice at its failpoints");
    for process in [relay, consumer, pedidos] {
        process.terminate().await;
    }
    state.close().await;
    deployment.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_relay_takes_over_the_slot_when_the_first_is_killed() {
    const PREFIX: &str = "P-WAL2";
    let deployment = Deployment::new("postgres", LEASE_TTL_MS);
    let (state, start) = deployment.stocked_state().await;
    let pedidos = deployment.start("pedidos", "pedidos-1").await;
    let consumer = deployment.start("inventario", "inventario-1").await;
    let first = wal_relay(&deployment, "relay-a").await;
    eventually(SETTLE, "the first relay streaming", || async {
        slot_active(&state).await.then_some(())
    })
    .await;
    let second = wal_relay(&deployment, "relay-b").await;
    let posting = Posting::start(pedidos.http_addr(), PREFIX, 0x7761_6c32, 200, 30);
    posting.answered_at_least(60, SETTLE).await;
    first.kill().await;
    let orders = posting.orders.clone();
    let accepted = posting.accepted().await;
    assert_applied_once(
        &state,
        PREFIX,
        &orders,
        &accepted,
        &start,
        SETTLE,
        "WAL relay takeover",
    )
    .await;
    assert!(slot_active(&state).await, "the second relay streams");
    // What an operator sees: the slot entrega created, streaming to the second relay's session.
    let out = deployment.cli(&["outbox", "status", "--json"]).await;
    assert!(out.status.success(), "{out:?}");
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let slots = status["services"]["pedidos"]["wal_slots"]
        .as_array()
        .unwrap();
    assert_eq!(slots.len(), 1, "{status}");
    assert_eq!(slots[0]["condition"], "streaming", "{status}");
    assert_eq!(slots[0]["caught_up"], true, "{status}");
    let streaming_pid: Option<i64> = state
        .pedidos
        .scalar(query(
            "SELECT active_pid::bigint FROM pg_replication_slots WHERE database = current_database()",
        ))
        .await
        .unwrap();
    assert_eq!(slots[0]["active_pid"].as_i64(), streaming_pid, "{status}");
    for process in [second, consumer, pedidos] {
        process.terminate().await;
    }
    state.close().await;
    deployment.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_under_the_wal_relay_loses_nothing_and_applies_once() {
    const PREFIX: &str = "P-WALR";
    let pg = OwnPostgres::start();
    let deployment = Deployment::on_postgres(&pg.url(), LEASE_TTL_MS);
    let (mut state, start) = deployment.stocked_state().await;
    let pedidos = deployment.start("pedidos", "pedidos-1").await;
    let relay = wal_relay(&deployment, "relay-1").await;
    let consumer = deployment.start("inventario", "inventario-1").await;
    let posting = Posting::start(pedidos.http_addr(), PREFIX, 0x7761_6c72, 400, 60);
    for (after, mode) in [(100, "immediate"), (250, "fast")] {
        posting
            .answered_at_least(after, Duration::from_secs(90))
            .await;
        state.close().await;
        pg.restart(mode);
        state = deployment.state().await;
    }
    let orders = posting.orders.clone();
    let accepted = posting.accepted().await;
    let answered_201 = accepted.iter().flatten().count();
    assert!(answered_201 >= 200, "only {answered_201} orders accepted");
    assert_applied_once(
        &state,
        PREFIX,
        &orders,
        &accepted,
        &start,
        SETTLE,
        "WAL relay, restarts",
    )
    .await;
    for process in [consumer, relay, pedidos] {
        process.terminate().await;
    }
    state.close().await;
    deployment.destroy().await;
}
