//! PostgreSQL faults mid-run, with `km0 run pedidos`, `relay` and `inventario` as separate
//! processes and orders posted over HTTP in a stream (the log transport in PostgreSQL too):
//!
//! - the server restarted twice, once killed without a checkpoint (crash recovery) and once
//!   shut down cleanly, on a server of the test's own;
//! - `pg_terminate_backend` of every session of the relay and of the consumer, again and
//!   again, on the shared server.
//!
//! Each time: every stored order applied exactly once and no other, stock the start less the
//! stored orders, the outbox drained, nothing dead-lettered; and the fault really happened
//! (the server's start time moved with work in hand; sessions were terminated).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::time::Duration;

use entrega::db::query;
use entrega_testkit::wait_until;

use common::own_pg::OwnPostgres;
use common::process::{Deployment, Km0};
use common::state::DbState;
use common::stream::{assert_applied_once, Posting};

const LEASE_TTL_MS: u64 = 1_000;
const SETTLE: Duration = Duration::from_secs(60);
const PREFIX: &str = "P-PGF";

/// When the server last started, epoch ms.
async fn started_at(state: &DbState) -> i64 {
    state
        .pedidos
        .scalar::<i64>(query(
            "SELECT CAST(EXTRACT(EPOCH FROM pg_postmaster_start_time()) * 1000 AS BIGINT)",
        ))
        .await
        .unwrap()
        .unwrap()
}

/// Whether the relay or the consumer has work in hand.
async fn busy(state: &DbState) -> bool {
    wait_until(Duration::from_secs(1), || async {
        state.pending().await > 0 || !state.consumer_caught_up().await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_mid_run_loses_nothing_and_applies_once() {
    let pg = OwnPostgres::start();
    let deployment = Deployment::on_postgres(&pg.url(), LEASE_TTL_MS);
    let (mut state, start) = deployment.stocked_state().await;
    let pedidos = deployment.start("pedidos", "pedidos-1").await;
    let relay = deployment.start("relay", "relay-1").await;
    let consumer = deployment.start("inventario", "inventario-1").await;
    let posting = Posting::start(pedidos.http_addr(), PREFIX, 0x7067_7265, 500, 60);

    let mut restarts_with_work = 0;
    for (after, mode) in [(120, "immediate"), (300, "fast")] {
        posting
            .answered_at_least(after, Duration::from_secs(90))
            .await;
        restarts_with_work += usize::from(busy(&state).await);
        let before = started_at(&state).await;
        state.close().await;
        pg.restart(mode);
        state = deployment.state().await;
        assert!(
            started_at(&state).await > before,
            "the server did not restart"
        );
    }
    let orders = posting.orders.clone();
    let accepted = posting.accepted().await;
    assert!(restarts_with_work > 0, "no restart found work in hand");
    let answered_201 = accepted.iter().flatten().count();
    assert!(answered_201 >= 300, "only {answered_201} orders accepted");
    assert_applied_once(
        &state, PREFIX, &orders, &accepted, &start, SETTLE, "restarts",
    )
    .await;
    eprintln!("{answered_201} of 500 orders accepted through 2 restarts ({restarts_with_work} with work in hand)");
    for process in [consumer, relay, pedidos] {
        process.terminate().await;
    }
    state.close().await;
    deployment.destroy().await;
}

/// Terminates every session of the relay and the consumer on the deployment's databases
/// (named `<prefix>...`); returns how many.
async fn terminate_sessions(admin: &entrega::Db, prefix: &str) -> i64 {
    admin
        .scalar::<i64>(
            query(
                "SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE application_name IN ('km0-relay', 'km0-inventario') \
                 AND datname LIKE $1) AS ended",
            )
            .bind(format!("{prefix}%")),
        )
        .await
        .unwrap()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_of_the_relay_and_the_consumer_terminated_mid_run() {
    let deployment = Deployment::new("postgres", LEASE_TTL_MS);
    let (state, start) = deployment.stocked_state().await;
    let admin = entrega::Db::connect(&format!("{}/postgres", common::pg_server()))
        .await
        .unwrap();
    let pedidos = deployment.start("pedidos", "pedidos-1").await;
    // Named sessions, so only theirs are terminated (the test's own and pedidos' are not).
    let prefix = deployment.system().databases().prefix.clone().unwrap();
    let relay: Km0 = deployment
        .start_with_env("relay", "relay-1", &[("PGAPPNAME", "km0-relay")])
        .await;
    // Sessions are cut every 250 ms: one batch can have its transaction cut on three
    // attempts in a row, and with the default three attempts it would be dead-lettered, as
    // configured. What is tested is that nothing is lost or applied twice, so the consumer
    // keeps retrying instead.
    let consumer: Km0 = deployment
        .start_with_env(
            "inventario",
            "inventario-1",
            &[
                ("PGAPPNAME", "km0-inventario"),
                ("KM0_MAX_ATTEMPTS", "1000"),
            ],
        )
        .await;
    let posting = Posting::start(pedidos.http_addr(), PREFIX, 0x7465_726d, 500, 40);

    let mut terminated = 0;
    let mut with_work = 0;
    while posting.answered() < 400 {
        with_work += usize::from(state.pending().await > 0 || !state.consumer_caught_up().await);
        terminated += terminate_sessions(&admin, &prefix).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let orders = posting.orders.clone();
    let accepted = posting.accepted().await;
    assert!(terminated > 0, "no session was terminated");
    assert!(with_work > 0, "no termination found work in hand");
    let label = format!("terminations ({prefix})");
    assert_applied_once(&state, PREFIX, &orders, &accepted, &start, SETTLE, &label).await;
    eprintln!("{terminated} sessions terminated, {with_work} times with work in hand");
    for process in [consumer, relay, pedidos] {
        process.terminate().await;
    }
    admin.close().await;
    state.close().await;
    deployment.destroy().await;
}
