//! The operations endpoint a km0 process serves with `--ops ADDR`: `/metrics` (Prometheus
//! text format), `/healthz` (the process answers) and `/readyz` (its databases and its broker
//! answer, with their schema migrated).
//!
//! Counters come from the components' own statistics (`RelayStats`, inventario's
//! `ConsumerStats`) and gauges from the database at each scrape (the outbox's backlog), so a
//! scrape always reports the state of the rows, not a cached copy.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use entrega::saga::{SagaStatus, Sagas};
use entrega::{CancellationToken, Db, RelayStats, WorkerStats};
use metrics::{counter, describe_counter, describe_gauge, gauge, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use utoipa::OpenApi as _;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{Broker, Task};
use crate::services::inventario::ConsumerStats;
use crate::services::pedidos::TOPIC;

/// How long `/readyz` waits for each dependency: a server that does not answer within it is
/// as good as down for the process's callers.
const READY_WITHIN: Duration = Duration::from_secs(2);

/// Bucket bounds of every duration histogram, in seconds: 1 ms to 10 s.
const SECONDS_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// What one process's endpoint reports on.
#[derive(Default, Clone)]
pub(crate) struct OpsSources {
    /// The databases the process's components use, by service name (readiness).
    pub(crate) databases: Vec<(&'static str, Db)>,
    /// The broker, when a component of the process uses one (readiness).
    pub(crate) broker: Option<Broker>,
    /// The databases with an outbox whose backlog is reported, by service name: each
    /// service's of this process (pedidos' when pedidos or its relay runs).
    pub(crate) outboxes: Vec<(&'static str, Db)>,
    /// The relay's counters, when the relay runs.
    pub(crate) relay: Option<Arc<RelayStats>>,
    /// inventario's counters, when the consumer runs.
    pub(crate) inventario: Option<Arc<ConsumerStats>>,
    /// The order sagas, when their orchestrator runs here.
    pub(crate) sagas: Option<Sagas>,
    /// The workers' counters, by consumer group.
    pub(crate) workers: Vec<(&'static str, Arc<WorkerStats>)>,
    /// Consumer groups of this process's components whose lag on the topic each consumes is
    /// reported (queue depths on RabbitMQ), with the records on its dead-letter topic.
    pub(crate) groups: Vec<String>,
}

/// The process's Prometheus recorder, installed on first use. Installed before the
/// components start, so nothing they record is lost to the facade's no-op default.
pub(crate) fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        // Histograms with buckets (aggregatable across instances), not summaries.
        // `set_buckets` fails only on an empty list, which this is not.
        let recorder = PrometheusBuilder::new()
            .set_buckets(&SECONDS_BUCKETS)
            .unwrap_or_else(|_| PrometheusBuilder::new())
            .build_recorder();
        let handle = recorder.handle();
        // Only fails if another recorder was installed first; the handle then renders what
        // this module records through its own gauges and counters only.
        let _ = metrics::set_global_recorder(recorder);
        describe();
        handle
    })
}

/// The process metrics (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
/// `process_open_fds`, `process_start_time_seconds`, ...), read on every scrape.
fn process() -> &'static metrics_process::Collector {
    static COLLECTOR: OnceLock<metrics_process::Collector> = OnceLock::new();
    COLLECTOR.get_or_init(metrics_process::Collector::default)
}

fn describe() {
    entrega::metrics::describe();
    super::http_metrics::describe();
    process().describe();
    describe_gauge!(
        "km0_build_info",
        "Always 1; labels say which km0 this is (version, git commit when built from one)."
    );
    describe_gauge!("km0_outbox_pending", "Outbox rows not yet published.");
    describe_gauge!(
        "km0_outbox_oldest_pending_age_seconds",
        Unit::Seconds,
        "Age of the oldest unpublished outbox row (0 when none)."
    );
    describe_gauge!(
        "km0_outbox_refused_retrying",
        "Outbox rows the broker refused that wait for their next attempt."
    );
    describe_gauge!(
        "km0_outbox_refused_held",
        "Outbox rows the broker refused that are held for an operator (`km0 outbox release`)."
    );
    describe_counter!(
        crate::telemetry::otel::SPANS_EXPORTED,
        "Spans the OpenTelemetry collector accepted (with --otlp-endpoint)."
    );
    describe_counter!(
        crate::telemetry::otel::SPANS_DROPPED,
        "Spans of exports the collector refused or never answered, after the SDK's retries."
    );
    describe_counter!(
        "km0_relay_published_events_total",
        "Events the relay published and marked."
    );
    describe_counter!(
        "km0_relay_publish_errors_total",
        "Publishes that failed (their rows stay pending)."
    );
    describe_counter!(
        "km0_relay_leases_lost_total",
        "Relay lanes dropped because their lease was lost."
    );
    describe_counter!(
        "km0_relay_refusals_total",
        "Refused attempts the relay recorded on outbox rows."
    );
    describe_gauge!(
        "km0_sagas",
        "Order sagas by state (running, compensating, completed, compensated, needs_operator)."
    );
    describe_gauge!(
        "km0_sagas_needing_operator",
        "Order sagas whose compensation failed past its limit: an operator must look."
    );
    describe_gauge!(
        "km0_dead_letters_held",
        "Dead letters the broker refused (too large, topic missing), held in the service's \
         database for an operator (`km0 dlq held`, `km0 dlq send-held`)."
    );
    describe_gauge!(
        "km0_consumer_lag",
        "Records of the partition not yet committed by the group (end offset - committed)."
    );
    describe_counter!(
        "km0_dead_letter_topic_records_total",
        "Records ever written to the dead-letter topic (pending or not: see `km0 dlq stats`)."
    );
    describe_gauge!(
        "km0_queue_ready_messages",
        "RabbitMQ: messages waiting in the group's queue (its lag)."
    );
    describe_gauge!(
        "km0_queue_unacked_messages",
        "RabbitMQ: messages delivered to the group and not yet acknowledged."
    );
    describe_counter!(
        "km0_consumer_messages_total",
        "Records a consumer group's worker finished, by outcome: acked (applied), \
         dead_lettered, retried (another attempt scheduled), deferred (to the retry topic), \
         parked (behind a failed record of their key), ignored (no handler for the type)."
    );
    describe_gauge!(
        "km0_consumer_handlers_in_flight",
        "Handler calls of the group's worker running now."
    );
    describe_counter!(
        "km0_inventario_applied_total",
        "Order events inventario applied to the stock."
    );
    describe_counter!(
        "km0_inventario_duplicates_total",
        "Order events inventario recognised as already applied."
    );
    describe_counter!(
        "km0_inventario_refused_total",
        "Order events inventario refused (out of stock, unknown product, unreadable)."
    );
}

/// Binds `addr` and serves the endpoint until `stop`, with `limits`; returns the bound
/// address and the task.
pub(crate) async fn serve(
    addr: SocketAddr,
    sources: OpsSources,
    console: Option<Router>,
    limits: super::http_server::HttpLimits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    stop: CancellationToken,
) -> anyhow::Result<(SocketAddr, Task)> {
    recorder();
    let (routes, mut api) = documented();
    let app = routes.with_state(Arc::new(sources));
    let app = match console {
        Some(console) => {
            api.merge(crate::console::documented().1);
            app.merge(console)
        }
        None => app,
    };
    let app = super::openapi_route::with_openapi(app, &api);
    let app = super::http_metrics::tracked(app, "ops");
    super::http_server::spawn(addr, app, limits, tls, stop).await
}

/// The operations endpoint's own routes, each through its documented handler.
fn documented() -> (Router<Arc<OpsSources>>, utoipa::openapi::OpenApi) {
    OpenApiRouter::with_openapi(OpsDoc::openapi())
        .routes(routes!(metrics_text))
        .routes(routes!(healthz))
        .routes(routes!(ready))
        .split_for_parts()
}

/// The OpenAPI 3.1 description of the operations endpoint (`--ops`) with the web console
/// it serves (committed as `docs/openapi-operations.json`, served at `/openapi.json`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    let mut api = documented().1;
    api.merge(crate::console::documented().1);
    api
}

#[derive(utoipa::OpenApi)]
#[openapi(info(
    title = "km0 operations",
    description = "The operations endpoint of a km0 process (`--ops ADDR`): liveness, \
                   readiness, Prometheus metrics, and with `--console` the web console: its \
                   pages (HTML) and its actions (JSON, an operator's token required).",
    license(name = "MIT OR Apache-2.0")
))]
struct OpsDoc;

/// The process is alive.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    responses((status = 200, description = "`ok`.", content_type = "text/plain", body = String))
)]
async fn healthz() -> &'static str {
    "ok\n"
}

/// Every metric in Prometheus' text exposition format 0.0.4.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses(
        (status = 200, description = "The metrics.", content_type = "text/plain", body = String),
        (status = 503, description = "A source could not be read; what failed.", content_type = "text/plain", body = String),
    )
)]
async fn metrics_text(State(sources): State<Arc<OpsSources>>) -> Response {
    process().collect();
    gauge!("km0_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    for (service, db) in &sources.outboxes {
        match db.outbox().maintenance.status(entrega_core::now_ms()).await {
            Ok(status) => {
                let service = *service;
                gauge!("km0_outbox_pending", "service" => service).set(status.pending as f64);
                gauge!("km0_outbox_oldest_pending_age_seconds", "service" => service)
                    .set(status.oldest_pending_age_ms.max(0) as f64 / 1000.0);
                gauge!("km0_outbox_refused_retrying", "service" => service)
                    .set(status.retrying as f64);
                gauge!("km0_outbox_refused_held", "service" => service).set(status.held as f64);
            }
            Err(e) => {
                // A scrape that cannot read the backlog fails whole, rather than report the
                // last values as if they were current.
                return unavailable(format!("reading the {service} outbox failed: {e}\n"));
            }
        }
    }
    if let Some(sagas) = &sources.sagas {
        match sagas.counts().await {
            Ok(counts) => {
                for status in SagaStatus::ALL {
                    let n = counts
                        .iter()
                        .find(|(s, _)| s == status)
                        .map_or(0, |(_, n)| *n);
                    gauge!("km0_sagas", "state" => status.as_str()).set(n as f64);
                    if *status == SagaStatus::NeedsOperator {
                        gauge!("km0_sagas_needing_operator").set(n as f64);
                    }
                }
            }
            Err(e) => {
                return unavailable(format!("reading the sagas failed: {e}\n"));
            }
        }
    }
    for (service, db) in &sources.databases {
        if !crate::ops::dlq::holds_letters(service) {
            continue;
        }
        match db.held_letters().count().await {
            Ok(n) => gauge!("km0_dead_letters_held", "service" => *service).set(n as f64),
            Err(e) => {
                return unavailable(format!(
                    "reading {service}'s held dead letters failed: {e}\n"
                ));
            }
        }
    }
    if let (Some(broker), false) = (&sources.broker, sources.groups.is_empty()) {
        if let Err(e) = record_lag(broker, &sources.groups).await {
            return unavailable(format!("reading consumer lag failed: {e:#}\n"));
        }
    }
    if let Some(relay) = &sources.relay {
        counter!("km0_relay_published_events_total").absolute(relay.published());
        counter!("km0_relay_publish_errors_total").absolute(relay.publish_errors());
        counter!("km0_relay_leases_lost_total").absolute(relay.leases_lost());
        counter!("km0_relay_refusals_total").absolute(relay.refused());
    }
    for (group, stats) in &sources.workers {
        let outcomes = [
            ("acked", stats.acked()),
            ("dead_lettered", stats.dead_lettered()),
            ("retried", stats.retried()),
            ("deferred", stats.deferred()),
            ("parked", stats.parked()),
            ("ignored", stats.ignored()),
        ];
        for (outcome, n) in outcomes {
            counter!("km0_consumer_messages_total", "group" => *group, "outcome" => outcome)
                .absolute(n);
        }
        gauge!("km0_consumer_handlers_in_flight", "group" => *group)
            .set(stats.in_flight.load(std::sync::atomic::Ordering::Relaxed) as f64);
    }
    if let Some(inventario) = &sources.inventario {
        let now = inventario.snapshot();
        counter!("km0_inventario_applied_total").absolute(now.processed);
        counter!("km0_inventario_duplicates_total").absolute(now.duplicates);
        counter!("km0_inventario_refused_total").absolute(now.refused);
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        recorder().render(),
    )
        .into_response()
}

/// A 503 whose body says what failed.
fn unavailable(why: String) -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, why).into_response()
}

/// Sets the lag gauges of `groups`, each on the topic it consumes, from the broker.
async fn record_lag(broker: &Broker, groups: &[String]) -> anyhow::Result<()> {
    let pairs = crate::ops::lag::on_their_topics(groups);
    if let Some(amqp) = broker.as_amqp() {
        let report = crate::ops::queue_lag::queue_lag_report(amqp, &pairs).await?;
        for group in &report.groups {
            for queue in &group.queues {
                let labels = [
                    ("group", group.group.clone()),
                    ("queue", queue.queue.clone()),
                ];
                gauge!("km0_queue_ready_messages", &labels).set(queue.ready as f64);
                if let Some(unacked) = queue.unacked {
                    gauge!("km0_queue_unacked_messages", &labels).set(unacked as f64);
                }
            }
            let dlq = &group.dead_letters;
            gauge!("km0_queue_ready_messages", "group" => group.group.clone(), "queue" => dlq.queue.clone())
                .set(dlq.ready as f64);
        }
        return Ok(());
    }
    let inspector = broker.inspector();
    let report = crate::ops::lag::lag_report(inspector.as_ref(), &pairs).await?;
    for group in &report.groups {
        for p in &group.partitions {
            gauge!(
                "km0_consumer_lag",
                "group" => group.group.clone(),
                "topic" => group.topic.clone(),
                "partition" => p.partition.to_string()
            )
            .set(p.lag as f64);
        }
    }
    for dlq in &report.dead_letters {
        counter!("km0_dead_letter_topic_records_total", "topic" => dlq.topic.clone())
            .absolute(u64::try_from(dlq.end).unwrap_or(0));
    }
    Ok(())
}

/// 200 with one line per dependency when every database and the broker answer, 503 naming
/// the first that does not.
/// Whether the process can work: every database answers at the schema this build migrates
/// to, and the broker answers.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "One line per dependency checked.", content_type = "text/plain", body = String),
        (status = 503, description = "The first dependency that is not ready, and why.", content_type = "text/plain", body = String),
    )
)]
async fn ready(State(sources): State<Arc<OpsSources>>) -> Response {
    let mut lines = String::new();
    for (name, db) in &sources.databases {
        let answered = within(async { db.ping().await.map_err(anyhow::Error::from) }).await;
        if let Err(e) = answered {
            return unavailable(format!("database {name}: {e:#}\n"));
        }
        // Answering is not enough: the schema must be the one this build migrates to.
        let schema = within(async {
            let behind = db.schema_behind().await?;
            if behind.is_empty() {
                Ok(())
            } else {
                Err(anyhow::anyhow!("schema not current: {}", behind.join(", ")))
            }
        })
        .await;
        if let Err(e) = schema {
            return unavailable(format!("database {name}: {e:#}\n"));
        }
        lines.push_str(&format!("database {name}: ok\n"));
    }
    if let Some(broker) = &sources.broker {
        if let Err(e) = within(broker_answers(broker)).await {
            return unavailable(format!("broker: {e:#}\n"));
        }
        lines.push_str(&format!("broker {}: ok\n", broker.kind()));
    }
    (StatusCode::OK, lines).into_response()
}

/// `check`'s outcome, or an error once it took longer than [`READY_WITHIN`].
async fn within(
    check: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    tokio::time::timeout(READY_WITHIN, check)
        .await
        .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer within {READY_WITHIN:?}")))
}

/// Asks the broker something that needs it to answer: the end offsets of the orders' topic
/// (on RabbitMQ, which has no offsets, a passive declare of the queue of that name).
async fn broker_answers(broker: &Broker) -> anyhow::Result<()> {
    match broker.as_amqp() {
        Some(amqp) => amqp
            .queue_depths(&[TOPIC.to_owned()])
            .await
            .map(drop)
            .map_err(anyhow::Error::from),
        None => broker
            .end_offsets(TOPIC)
            .await
            .map(drop)
            .map_err(anyhow::Error::from),
    }
}
