//! A relay killed with SIGKILL and started again under the same name takes its lanes back at
//! once, instead of waiting out its earlier life's leases (a minute here), with new fencing
//! tokens. The name is km0's default, `relay@<host name>`, the same on every start on one
//! machine: a user who restarts `km0 run relay` gets this without any setting.

use crate::common;

use std::time::Duration;

use common::process::{Deployment, Km0};
use common::state::{count, eventually, order, place, DbState};
use entrega::db::query;
use entrega_core::now_ms;

/// Lease period: long, so that waiting it out could not pass for resuming.
const LEASE_TTL_MS: u64 = 60_000;
/// Longest wait for a drain.
const SETTLE: Duration = Duration::from_secs(30);
const ORDERS: usize = 20;

/// `km0 run relay` without `--instance`, its log named `log`.
async fn relay(deployment: &Deployment, log: &str) -> Km0 {
    let args = ["run", "relay", "--http", "127.0.0.1:0"].map(str::to_owned);
    let mut process = deployment.spawn_args(log, "", &args);
    process.wait_ready().await;
    process
}

/// Every lane as (owner, token, lease end in epoch ms).
async fn lanes(state: &DbState) -> Vec<(Option<String>, i64, i64)> {
    state
        .pedidos
        .fetch_all(query(
            "SELECT owner, token, expires_at_ms FROM entrega_relay_lanes ORDER BY lane",
        ))
        .await
        .expect("relay lanes")
}

async fn drained(state: &DbState, what: &str) {
    eventually(SETTLE, what, || async {
        (state.pending().await == 0).then_some(())
    })
    .await;
}

async fn restarted_relay_resumes_before_its_earlier_leases_end(backend: &str) {
    let deployment = Deployment::new(backend, LEASE_TTL_MS);
    let state = deployment.state().await;
    let pedidos = deployment.start("pedidos", "pedidos-1").await;
    let first = relay(&deployment, "relay-first-life").await;
    place(
        pedidos.http_addr(),
        &order("P-RESTART-0", &[("tomate-rosa", 1)]),
    )
    .await;
    drained(&state, "the first order published").await;
    let before = lanes(&state).await;
    let name = before[0].0.clone().expect("lane 0 held");
    assert!(
        name.starts_with("relay@")
            && before
                .iter()
                .all(|(owner, ..)| owner.as_ref() == Some(&name)),
        "the lone relay holds every lane under its default name: {before:?}"
    );

    first.kill().await;
    for n in 1..=ORDERS {
        place(
            pedidos.http_addr(),
            &order(&format!("P-RESTART-{n}"), &[("tomate-rosa", 1)]),
        )
        .await;
    }
    assert_eq!(
        state.pending().await,
        ORDERS as i64,
        "placed while no relay ran"
    );
    let leases_end = before.iter().map(|(_, _, end)| *end).min().expect("lanes");
    let restarted_at = now_ms();
    let second = relay(&deployment, "relay-second-life").await;
    drained(&state, "the backlog published by the restarted relay").await;
    let drained_at = now_ms();
    println!(
        "restarted relay: ready and drained {ORDERS} events {} ms after its start; the earlier \
         life's leases had {} ms left",
        drained_at - restarted_at,
        leases_end - restarted_at
    );
    assert!(
        drained_at < leases_end,
        "the restarted relay waited for its own leases: drained at {drained_at}, they ended \
         at {leases_end}"
    );
    let after = lanes(&state).await;
    for (lane, ((owner, token, _), (_, was, _))) in after.iter().zip(&before).enumerate() {
        assert_eq!(
            owner.as_ref(),
            Some(&name),
            "lane {lane} under another name"
        );
        assert!(token > was, "lane {lane} taken back without a new token");
    }
    let published = count(
        &state.pedidos,
        "SELECT COUNT(*) FROM outbox WHERE publicado_en IS NOT NULL",
    )
    .await;
    assert_eq!(published, ORDERS as i64 + 1);
    let records = state.records(km0::services::pedidos::TOPIC).await;
    assert_eq!(records.len(), ORDERS + 1, "each event published once");

    second.terminate().await;
    pedidos.terminate().await;
    state.close().await;
    deployment.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_restarted_relay_resumes_before_its_earlier_leases_end() {
    restarted_relay_resumes_before_its_earlier_leases_end("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_relay_resumes_before_its_earlier_leases_end() {
    restarted_relay_resumes_before_its_earlier_leases_end("postgres").await;
}
