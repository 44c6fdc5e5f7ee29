//! The operations endpoint (`--ops ADDR`) of real `km0 run` processes: `/healthz`, `/readyz`
//! naming the databases and the broker it checked, and `/metrics` whose outbox backlog and
//! relay counters move with the rows, on SQLite and on PostgreSQL.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::pg_server;
use common::process::{Deployment, Km0};
use common::proxy::Proxy;
use common::state::{eventually, order, place};
use entrega::db::query;
use entrega::rpc::RpcClient;
use km0::services::pagos::AUTHORISATIONS;
use km0::services::pedidos::{PARTITIONS, TOPIC};
use km0::wiring::config::{DataPlace, Databases};
use km0::wiring::{Components, System};
use serde_json::json;

/// Longest wait for the system to reach an expected state.
const SETTLE: Duration = Duration::from_secs(30);
const ORDERS: usize = 3;

/// The `ops=` address of a ready process.
fn ops_addr(line: &str) -> SocketAddr {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("ops="))
        .expect("ops= in the ready line")
        .parse()
        .expect("an address")
}

async fn start_with_ops(deployment: &Deployment, component: &str) -> (Km0, SocketAddr) {
    start_failing(deployment, component, &format!("{component}-1"), "").await
}

/// `component` as `instance` with `failpoints`, its endpoint on a free port.
async fn start_failing(
    deployment: &Deployment,
    component: &str,
    instance: &str,
    failpoints: &str,
) -> (Km0, SocketAddr) {
    let extra = ["--ops".to_owned(), "127.0.0.1:0".to_owned()];
    let mut process = deployment.spawn_with(component, instance, failpoints, &extra);
    let line = process.wait_ready().await;
    (process, ops_addr(&line))
}

/// The sum of the group's `km0_consumer_lag` samples, once any is reported.
async fn group_lag(addr: SocketAddr, group: &str) -> Option<f64> {
    let text = metrics(addr).await;
    let group = format!("group=\"{group}\"");
    let lags: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("km0_consumer_lag{") && l.contains(&group))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse().ok())
        .collect();
    (!lags.is_empty()).then(|| lags.iter().sum())
}

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let response = reqwest::Client::new()
        .get(format!("http://{addr}{path}"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("the endpoint answers");
    let status = response.status().as_u16();
    (status, response.text().await.expect("a body"))
}

/// The value of the sample `name` (no labels) in a Prometheus text exposition.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (metric, value) = l.split_once(' ')?;
        (metric == name).then(|| value.trim().parse().ok())?
    })
}

/// The label of pedidos' outbox on the `km0_outbox_*` gauges.
const PEDIDOS_OUTBOX: &str = "service=\"pedidos\"";

/// The value of the sample `name` whose labels include every one of `labels`.
fn labelled(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|label| l.contains(label)))
        .find_map(|l| l.rsplit_once(' ')?.1.parse().ok())
}

/// Waits (bounded) until the endpoint at `addr` reports `want` for the sample `name`.
async fn until_sample(addr: SocketAddr, name: &str, want: f64) {
    eventually(SETTLE, &format!("{name} reaching {want}"), || async {
        (sample(&metrics(addr).await, name) == Some(want)).then_some(())
    })
    .await;
}

async fn metrics(addr: SocketAddr) -> String {
    let (status, text) = get(addr, "/metrics").await;
    assert_eq!(status, 200, "/metrics: {text}");
    text
}

async fn the_backlog_and_the_relay_counters_follow_the_rows(backend: &str) {
    let deployment = Deployment::new(backend, 1_000);
    let state = deployment.state().await;
    let (pedidos, pedidos_ops) = start_with_ops(&deployment, "pedidos").await;

    assert_eq!(get(pedidos_ops, "/healthz").await, (200, "ok\n".to_owned()));
    let (status, ready) = get(pedidos_ops, "/readyz").await;
    assert_eq!(status, 200, "/readyz: {ready}");
    assert!(ready.contains("database pedidos: ok"), "/readyz: {ready}");

    for n in 0..ORDERS {
        place(
            pedidos.http_addr(),
            &order(&format!("P-OPS-{n}"), &[("tomate-rosa", 1)]),
        )
        .await;
    }
    let pending = state.pending().await;
    assert_eq!(pending, ORDERS as i64, "no relay runs yet");
    let text = metrics(pedidos_ops).await;
    assert_eq!(
        labelled(&text, "km0_outbox_pending", &[PEDIDOS_OUTBOX]),
        Some(pending as f64)
    );
    let age = labelled(
        &text,
        "km0_outbox_oldest_pending_age_seconds",
        &[PEDIDOS_OUTBOX],
    )
    .expect("the age");
    assert!(age >= 0.0, "oldest pending age {age}");
    // The HTTP API's requests, by route template and status; the process; the build.
    let created = labelled(
        &text,
        "km0_http_requests_total",
        &[
            "service=\"pedidos\"",
            "route=\"/pedidos\"",
            "status=\"201\"",
            "method=\"POST\"",
        ],
    );
    assert_eq!(created, Some(ORDERS as f64), "{text}");
    assert!(
        labelled(
            &text,
            "km0_http_request_duration_seconds_count",
            &["route=\"/pedidos\""]
        )
        .is_some_and(|n| n >= ORDERS as f64),
        "{text}"
    );
    assert!(sample(&text, "process_resident_memory_bytes").is_some_and(|b| b > 0.0));
    assert!(
        labelled(&text, "km0_build_info", &["version=\""]) == Some(1.0),
        "{text}"
    );
    // Every metric says what it is.
    let helped: std::collections::BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# HELP "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| helped.contains(f)))
            .unwrap_or(name);
        assert!(helped.contains(family), "no # HELP for {name}");
    }
    assert!(
        text.contains("# HELP km0_outbox_pending"),
        "described metrics: {text}"
    );
    // pedidos runs no relay: it reports no relay counters.
    assert_eq!(sample(&text, "km0_relay_published_events_total"), None);

    let (relay, relay_ops) = start_with_ops(&deployment, "relay").await;
    let (status, ready) = get(relay_ops, "/readyz").await;
    assert_eq!(status, 200, "/readyz: {ready}");
    assert!(
        ready.contains("broker"),
        "the relay checks its broker: {ready}"
    );
    until_sample(relay_ops, "km0_relay_published_events_total", ORDERS as f64).await;
    assert_eq!(state.pending().await, 0, "every row marked published");
    let text = metrics(pedidos_ops).await;
    assert_eq!(
        labelled(&text, "km0_outbox_pending", &[PEDIDOS_OUTBOX]),
        Some(0.0)
    );
    assert_eq!(
        labelled(
            &text,
            "km0_outbox_oldest_pending_age_seconds",
            &[PEDIDOS_OUTBOX]
        ),
        Some(0.0)
    );

    // A first consumer applies every order but never commits an offset: the lag it reports
    // is every record. The second one gets them all again, absorbs them as duplicates and
    // commits: the lag falls to zero.
    let failpoint = format!("{}=error", entrega::failpoint::WORKER_BEFORE_COMMIT);
    let (stuck, stuck_ops) =
        start_failing(&deployment, "inventario", "inventario-stuck", &failpoint).await;
    until_sample(stuck_ops, "km0_inventario_applied_total", ORDERS as f64).await;
    eventually(SETTLE, "the uncommitted records counted as lag", || async {
        let published = state.broker.topic_total(TOPIC).await.unwrap() as f64;
        (group_lag(stuck_ops, "inventario").await == Some(published)).then_some(())
    })
    .await;
    stuck.terminate().await;

    let (inventario, inventario_ops) = start_with_ops(&deployment, "inventario").await;
    until_sample(
        inventario_ops,
        "km0_inventario_duplicates_total",
        ORDERS as f64,
    )
    .await;
    let text = metrics(inventario_ops).await;
    assert_eq!(
        sample(&text, "km0_inventario_applied_total"),
        Some(0.0),
        "nothing applied twice"
    );
    assert_eq!(
        state.keys().await.len(),
        ORDERS,
        "one key per order applied"
    );
    let text = metrics(inventario_ops).await;
    let of_group = |outcome: &str| {
        let outcome = format!("outcome=\"{outcome}\"");
        labelled(
            &text,
            "km0_consumer_messages_total",
            &["group=\"inventario\"", &outcome],
        )
    };
    assert_eq!(of_group("acked"), Some(ORDERS as f64), "acks: {text}");
    assert_eq!(of_group("dead_lettered"), Some(0.0));
    // One handler call per batch: at least one, at most one per order.
    let calls = labelled(
        &text,
        "entrega_handler_duration_seconds_count",
        &["group=\"inventario\""],
    )
    .expect("the handler histogram");
    assert!(
        (1.0..=ORDERS as f64).contains(&calls),
        "handler calls {calls}"
    );
    let relay_text = metrics(relay_ops).await;
    let publishes = sample(&relay_text, "entrega_relay_publish_duration_seconds_count")
        .expect("the publish histogram");
    assert!(
        (1.0..=ORDERS as f64).contains(&publishes),
        "publishes {publishes}"
    );
    assert!(
        relay_text.contains("entrega_relay_publish_duration_seconds_bucket{le=\"0.001\"}"),
        "a histogram with buckets: {relay_text}"
    );
    eventually(SETTLE, "the group's lag back to zero", || async {
        (group_lag(inventario_ops, "inventario").await == Some(0.0)).then_some(())
    })
    .await;
    let committed: i64 = state.committed().await.values().sum();
    assert_eq!(
        committed, ORDERS as i64,
        "the offsets the zero lag stands for"
    );

    inventario.terminate().await;
    relay.terminate().await;
    pedidos.terminate().await;
    state.close().await;
    deployment.destroy().await;
}

#[tokio::test]
async fn the_backlog_and_the_relay_counters_follow_the_rows_on_sqlite() {
    the_backlog_and_the_relay_counters_follow_the_rows("sqlite").await;
}

#[tokio::test]
async fn the_backlog_and_the_relay_counters_follow_the_rows_on_postgres() {
    the_backlog_and_the_relay_counters_follow_the_rows("postgres").await;
}

/// Starts `components` in this process with the endpoint on a free port.
async fn start_in_process(
    system: &System,
    mut components: Components,
) -> (km0::wiring::Running, SocketAddr) {
    components.ops = Some("127.0.0.1:0".parse().unwrap());
    let running = system
        .start(components, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let ops = running.ops_addr().expect("the endpoint is served");
    (running, ops)
}

/// `/readyz` turns 503 while the database cannot be reached (its connections go through a
/// proxy the test cuts) and 200 again once it can; `/healthz` stays 200 throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_database_on_postgres() {
    let proxy = Proxy::start("127.0.0.1:5432".parse().unwrap());
    let id = uuid::Uuid::new_v4().simple().to_string();
    let databases = Databases {
        place: DataPlace::PostgresServer(format!("postgres://postgres@{}", proxy.addr())),
        prefix: Some(format!("entrega_t_{id}_")),
    };
    let system = System::new(databases, format!("{}/entrega_t_{id}_broker", pg_server()));
    let mut components = Components::none("pedidos-ready");
    components.add(&km0::services::pedidos::API);
    let (running, ops) = start_in_process(&system, components).await;
    assert_eq!(get(ops, "/readyz").await.0, 200);

    proxy.cut();
    let (status, body) = get(ops, "/readyz").await;
    assert_eq!(status, 503, "/readyz with the database cut: {body}");
    assert!(body.contains("database pedidos"), "/readyz: {body}");
    // The first checks fail on the pooled connections the cut closed; once those are spent,
    // a check opens a new one, which the proxy refuses.
    eventually(SETTLE, "a connection refused by the cut", || async {
        let (status, body) = get(ops, "/readyz").await;
        assert_eq!(status, 503, "/readyz while cut: {body}");
        (proxy.refused() > 0).then_some(())
    })
    .await;
    assert_eq!(get(ops, "/healthz").await.0, 200, "alive though not ready");
    assert_eq!(get(ops, "/metrics").await.0, 503, "no stale backlog");

    proxy.restore();
    eventually(SETTLE, "/readyz answering 200 again", || async {
        (get(ops, "/readyz").await.0 == 200).then_some(())
    })
    .await;

    running.stop().await.unwrap();
    system.destroy().await.unwrap();
}

/// `/readyz` turns 503 when a database answers but its schema is behind this build (as a
/// database restored from an older backup would be), naming the set, and 200 once it is
/// current again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_needs_the_schema_this_build_migrates_to() {
    let system = common::test_system("sqlite");
    let mut components = Components::none("pedidos-schema");
    components.add(&km0::services::pedidos::API);
    let (running, ops) = start_in_process(&system, components).await;
    assert_eq!(get(ops, "/readyz").await.0, 200);

    let db = system.pedidos().await.unwrap().db().clone();
    let latest: i64 = db
        .scalar(query(
            "SELECT CAST(MAX(version) AS BIGINT) FROM entrega_migrations WHERE set_name = 'outbox'",
        ))
        .await
        .unwrap()
        .unwrap();
    let (description, applied): (String, i64) = db
        .fetch_all(
            query(
                "SELECT description, applied_at_ms FROM entrega_migrations \
                 WHERE set_name = 'outbox' AND version = $1",
            )
            .bind(latest),
        )
        .await
        .unwrap()
        .remove(0);
    db.execute(
        query("DELETE FROM entrega_migrations WHERE set_name = 'outbox' AND version = $1")
            .bind(latest),
    )
    .await
    .unwrap();
    let (status, body) = get(ops, "/readyz").await;
    assert_eq!(status, 503, "/readyz with the schema behind: {body}");
    let expected = format!("outbox at {} of {latest}", latest - 1);
    assert!(body.contains(&expected), "/readyz names the set: {body}");

    db.execute(
        query(
            "INSERT INTO entrega_migrations (set_name, version, description, applied_at_ms) \
             VALUES ('outbox', $1, $2, $3)",
        )
        .bind(latest)
        .bind(description)
        .bind(applied),
    )
    .await
    .unwrap();
    assert_eq!(get(ops, "/readyz").await.0, 200, "current again");
    running.stop().await.unwrap();
    system.destroy().await.unwrap();
}

/// Request/reply through pagos' card authorisations: the client's calls and the server's
/// answers are counted on the endpoint of the process that runs both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_calls_and_answers_are_counted() {
    let system = common::test_system("sqlite");
    let mut components = Components::none("pagos-ops");
    components.add(&km0::services::pagos::COMPONENT);
    let (running, ops) = start_in_process(&system, components).await;
    let transport = system.broker().await.unwrap().rpc(PARTITIONS);
    let client = RpcClient::start(transport).await.unwrap();
    for n in 0..2 {
        let request = json!({"pedido_id": format!("R-{n}"), "importe_centimos": 300});
        let answer = client
            .call(
                AUTHORISATIONS,
                request.to_string().into_bytes(),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(answer["autorizado"], true, "{answer}");
    }
    let answered = |text: &str, name: &str| {
        labelled(text, name, &["outcome=\"answered\""]).unwrap_or_default()
    };
    eventually(SETTLE, "both calls counted on each side", || async {
        let text = metrics(ops).await;
        (answered(&text, "entrega_rpc_client_calls_total") == 2.0
            && answered(&text, "entrega_rpc_server_requests_total") == 2.0)
            .then_some(())
    })
    .await;
    running.stop().await.unwrap();
    system.destroy().await.unwrap();
}
