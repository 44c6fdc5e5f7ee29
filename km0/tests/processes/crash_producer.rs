//! Crash test (d) of the producer with real `km0 run pedidos` processes, on SQLite and on
//! PostgreSQL: the create-order transaction fails right before `COMMIT`
//! (`pedidos.before_commit`). With `error` the client gets a JSON 5xx; with `exit` the process
//! dies mid-request. Either way there is no order, no line and no outbox row: the state and its
//! event are written together or not at all. A healthy process then accepts the same order id,
//! which shows nothing of the failed attempts was left behind.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use common::process::Deployment;
use common::state::{count, order, place, post_order, DbState};
use km0::services::pedidos::BEFORE_COMMIT;

const LINES: &[(&str, i64)] = &[("queso-curado", 1), ("calabacin", 2)];
const ORDER_ID: &str = "P-PRODUCER-1";

/// (orders, lines, outbox rows) in the pedidos database.
async fn rows(state: &DbState) -> (i64, i64, i64) {
    (
        count(&state.pedidos, "SELECT COUNT(*) FROM pedidos").await,
        count(&state.pedidos, "SELECT COUNT(*) FROM lineas_pedido").await,
        count(&state.pedidos, "SELECT COUNT(*) FROM outbox").await,
    )
}

async fn a_failed_commit_leaves_no_order_no_lines_and_no_event(backend: &str) {
    let deployment = Deployment::new(backend, 1_000);
    let state = deployment.state().await;
    let body = order(ORDER_ID, LINES);

    // `error`: the step fails inside the transaction, which is rolled back.
    let mut failing = deployment.spawn(
        "pedidos",
        "pedidos-error",
        &format!("{BEFORE_COMMIT}=error"),
    );
    failing.wait_ready().await;
    let (status, answer) = post_order(failing.http_addr(), &body)
        .await
        .expect("an answer");
    assert!(
        (500..600).contains(&status),
        "status {status} for a failed commit"
    );
    assert!(
        answer["error"].as_str().is_some_and(|e| !e.is_empty()),
        "the 5xx answer is an error JSON: {answer}"
    );
    assert_eq!(
        rows(&state).await,
        (0, 0, 0),
        "a rolled-back order left rows"
    );
    failing.terminate().await;

    // `exit`: the process dies with the transaction open; the database discards it.
    let mut dying = deployment.spawn("pedidos", "pedidos-exit", &format!("{BEFORE_COMMIT}=exit"));
    dying.wait_ready().await;
    let answer = post_order(dying.http_addr(), &body).await;
    assert!(
        answer.is_err(),
        "the process should have died mid-request, yet answered {answer:?}"
    );
    dying.died_at_failpoint().await;
    assert_eq!(
        rows(&state).await,
        (0, 0, 0),
        "an order of a dead process left rows"
    );

    // The same order id is still free, and a committed order is visible to these counts.
    let healthy = deployment.start("pedidos", "pedidos-ok").await;
    place(healthy.http_addr(), &body).await;
    assert_eq!(
        rows(&state).await,
        (1, 2, 1),
        "order, lines and event committed together"
    );
    healthy.terminate().await;
    state.close().await;
    deployment.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_failed_commit_leaves_no_order_no_lines_and_no_event() {
    a_failed_commit_leaves_no_order_no_lines_and_no_event("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_failed_commit_leaves_no_order_no_lines_and_no_event() {
    a_failed_commit_leaves_no_order_no_lines_and_no_event("postgres").await;
}
