//! One order, one trace, across five processes: `km0 run pasarela`, `inventario`, `pagos`,
//! `reparto`, `relay` and `pedidos --saga`, each exporting its spans through the OpenTelemetry
//! SDK to a collector of the test's own (OTLP/HTTP: protobuf, the default, and JSON from the
//! gateway). An order placed with a `traceparent` runs its whole saga (reserve, charge through
//! the gateway, deliver); asserted afterwards:
//!
//! - every outbox row any service wrote for the order, in every service's database, carries
//!   the order's trace and names a span the collector received, and so does every record of
//!   it in the log;
//! - spans of that trace reached the collector from pedidos, inventario, pagos, reparto and
//!   the gateway, and they form one tree: each span's parent is the caller's span or another
//!   span of the trace; the `traceparent` pedidos answered is its own `POST /pedidos` span;
//! - a second order placed without a `traceparent` got a trace of its own (answered in the
//!   response's `traceparent`), shared by none of the first order's rows;
//! - a third order placed in an unsampled trace (`-00`) stays unsampled in every row, and no
//!   span of its trace is exported.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::collections::{BTreeSet, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use axum::response::IntoResponse as _;
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use entrega::db::query;
use entrega::saga::SagaStatus;
use entrega::{TraceContext, TRACEPARENT};
use km0::services::{inventario, pagos, pedidos, reparto};
use km0::wiring::Database;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value;
use prost::Message as _;
use serde_json::{json, Value};

use common::process::Deployment;
use common::state::eventually;

/// One exported span: (service.name, traceId, spanId, parentSpanId, name).
type Span = (String, String, String, String, String);

/// An OTLP/HTTP collector that keeps every span it is sent, in protobuf or JSON.
async fn collector() -> (SocketAddr, Arc<Mutex<Vec<Span>>>) {
    let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
    let kept = Arc::clone(&spans);
    let app = Router::new().route(
        "/v1/traces",
        post(move |headers: HeaderMap, body: Bytes| {
            let kept = Arc::clone(&kept);
            async move {
                let protobuf = headers
                    .get("content-type")
                    .is_some_and(|v| v.as_bytes() == b"application/x-protobuf");
                let received = if protobuf {
                    decoded(&body)
                } else {
                    from_json(&serde_json::from_slice(&body).unwrap())
                };
                kept.lock().unwrap().extend(received);
                if protobuf {
                    let answer = ExportTraceServiceResponse::default().encode_to_vec();
                    ([("content-type", "application/x-protobuf")], answer).into_response()
                } else {
                    Json(json!({})).into_response()
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, spans)
}

/// The spans of an OTLP protobuf export request.
fn decoded(body: &[u8]) -> Vec<Span> {
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let request = ExportTraceServiceRequest::decode(body).unwrap();
    let mut spans = Vec::new();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|a| a.key == "service.name")
            .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
                any_value::Value::StringValue(name) => Some(name.clone()),
                _ => None,
            })
            .unwrap_or_default();
        for s in resource
            .scope_spans
            .into_iter()
            .flat_map(|scope| scope.spans)
        {
            spans.push((
                service.clone(),
                hex(&s.trace_id),
                hex(&s.span_id),
                hex(&s.parent_span_id),
                s.name,
            ));
        }
    }
    spans
}

/// The spans of an OTLP JSON export request.
fn from_json(body: &Value) -> Vec<Span> {
    let mut spans = Vec::new();
    for resource in body["resourceSpans"].as_array().into_iter().flatten() {
        let service = resource["resource"]["attributes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["key"] == "service.name")
            .and_then(|a| a["value"]["stringValue"].as_str())
            .unwrap_or_default()
            .to_owned();
        for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
            for s in scope["spans"].as_array().into_iter().flatten() {
                let text = |k: &str| s[k].as_str().unwrap_or_default().to_lowercase();
                spans.push((
                    service.clone(),
                    text("traceId"),
                    text("spanId"),
                    text("parentSpanId"),
                    s["name"].as_str().unwrap_or_default().to_owned(),
                ));
            }
        }
    }
    spans
}

/// An order of `id` delivered in `ciudad` (two couriers in Madrid, one in Barcelona).
fn order(id: &str, ciudad: &str) -> Value {
    json!({"id": id, "cliente": "ana", "mercado": "girona", "tarjeta": "tok_visa",
           "lineas": [{"producto": "queso-fresco", "cantidad": 1, "precio_centimos": 600}],
           "direccion_entrega": {"ciudad": ciudad, "codigo_postal": "28013", "calle": "Carrer Major 3"}})
}

/// Places `body`, optionally with a `traceparent`; returns the trace the answer names.
async fn place(addr: SocketAddr, body: &Value, traceparent: Option<&str>) -> TraceContext {
    let mut request = reqwest::Client::new()
        .post(format!("http://{addr}/pedidos"))
        .timeout(Duration::from_secs(20))
        .json(body);
    if let Some(value) = traceparent {
        request = request.header(TRACEPARENT, value);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 201);
    let answered = response.headers()[TRACEPARENT].to_str().unwrap();
    TraceContext::parse(answered).unwrap()
}

/// The trace context of every outbox row mentioning `order`, in each service's database.
async fn row_traces(
    deployment: &Deployment,
    order: &str,
) -> Vec<(&'static Database, Option<TraceContext>)> {
    let mut all = Vec::new();
    for service in [
        &pedidos::DATABASE,
        &inventario::DATABASE,
        &pagos::DATABASE,
        &reparto::DATABASE,
    ] {
        let db = deployment
            .system()
            .databases()
            .connect(service)
            .await
            .unwrap();
        let rows: Vec<(String, Option<String>)> = db
            .fetch_all(
                query(
                    "SELECT CAST(id AS TEXT), CAST(headers AS TEXT) FROM outbox \
                     WHERE CAST(carga AS TEXT) LIKE $1",
                )
                .bind(format!("%{order}%")),
            )
            .await
            .unwrap();
        assert!(
            !rows.is_empty(),
            "{service:?} wrote no outbox row for {order}"
        );
        for (_, headers) in rows {
            let trace = headers.and_then(|h| {
                let v: Value = serde_json::from_str(&h).unwrap();
                v[TRACEPARENT]
                    .as_str()
                    .map(|t| TraceContext::parse(t).unwrap())
            });
            all.push((service, trace));
        }
        db.close().await;
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_order_is_one_trace_across_the_services() {
    let (collector_addr, spans) = collector().await;
    let deployment = Deployment::new("sqlite", 1_000);
    let otlp = [
        "--otlp-endpoint".to_owned(),
        format!("http://{collector_addr}"),
    ];
    // The gateway speaks OTLP's JSON encoding, the others its default, protobuf.
    let mut gateway_args = otlp.to_vec();
    gateway_args.extend(["--otlp-protocol".to_owned(), "http/json".to_owned()]);
    let mut gateway = deployment.spawn_with("pasarela", "pasarela-1", "", &gateway_args);
    gateway.wait_ready().await;
    let mut pagos_args = otlp.to_vec();
    pagos_args.extend([
        "--pasarela-url".to_owned(),
        format!("http://{}", gateway.http_addr()),
    ]);
    let _services = [
        deployment.spawn_with("inventario", "inventario-1", "", &otlp),
        deployment.spawn_with("pagos", "pagos-1", "", &pagos_args),
        deployment.spawn_with("reparto", "reparto-1", "", &otlp),
        deployment.spawn_with("relay", "relay-1", "", &otlp),
    ];
    let mut pedidos_args = otlp.to_vec();
    pedidos_args.push("--saga".to_owned());
    let mut pedidos = deployment.spawn_with("pedidos", "pedidos-1", "", &pedidos_args);
    pedidos.wait_ready().await;

    let caller = TraceContext::root();
    let traced = place(
        pedidos.http_addr(),
        &order("T-1", "Madrid"),
        Some(&caller.header()),
    )
    .await;
    assert_eq!(
        traced.trace_id(),
        caller.trace_id(),
        "the request's trace is continued"
    );
    let untraced = place(pedidos.http_addr(), &order("T-2", "Madrid"), None).await;
    assert_ne!(untraced.trace_id(), caller.trace_id());
    let unsampled_caller =
        TraceContext::parse(&TraceContext::root().header().replace("-01", "-00")).unwrap();
    let unsampled = place(
        pedidos.http_addr(),
        &order("T-3", "Barcelona"),
        Some(&unsampled_caller.header()),
    )
    .await;
    assert_eq!(unsampled.trace_id(), unsampled_caller.trace_id());
    assert!(!unsampled.sampled(), "pedidos keeps the caller's decision");

    let store = deployment.system().pedidos().await.unwrap();
    let sagas = deployment
        .system()
        .clone()
        .with_saga(Default::default())
        .sagas(&store)
        .await
        .unwrap();
    eventually(
        Duration::from_secs(90),
        "the three sagas completed",
        || async {
            let mut completed = 0;
            for id in ["T-1", "T-2", "T-3"] {
                if let Some((saga, _)) = sagas.show(id).await.unwrap() {
                    completed += usize::from(saga.status == SagaStatus::Completed);
                }
            }
            (completed == 3).then_some(())
        },
    )
    .await;

    // Every row written for each order, in every service, carries that order's trace, and
    // whether it is sampled.
    let mut t1_rows = Vec::new();
    for (id, trace) in [("T-1", &traced), ("T-2", &untraced), ("T-3", &unsampled)] {
        for (service, row_trace) in row_traces(&deployment, id).await {
            let row_trace = row_trace.unwrap_or_else(|| panic!("{service:?}: {id} untraced"));
            assert_eq!(
                (row_trace.trace_id(), row_trace.sampled()),
                (trace.trace_id(), trace.sampled()),
                "an outbox row of {service:?} for {id}"
            );
            if id == "T-1" {
                t1_rows.push((service, row_trace));
            }
        }
    }
    // And every record of the first order in the log.
    let broker = deployment.system().broker_log().await.unwrap();
    let mut logged = 0;
    for topic in km0::wiring::topics() {
        for (partition, end) in broker.end_offsets(topic).await.unwrap() {
            for r in broker
                .read(topic, partition, 0, end as usize)
                .await
                .unwrap()
            {
                if String::from_utf8_lossy(&r.payload).contains("\"T-1\"") {
                    let header = r
                        .headers
                        .get(TRACEPARENT)
                        .expect("traceparent on the record");
                    let trace = TraceContext::parse(header).unwrap().trace_id();
                    assert_eq!(trace, caller.trace_id(), "record of {topic}");
                    logged += 1;
                }
            }
        }
    }
    assert!(logged >= 6, "only {logged} records of the order in the log");

    // The spans of the first order's trace: from every service, one tree.
    let wanted: BTreeSet<&str> = [
        "km0 pedidos",
        "km0 inventario",
        "km0 pagos",
        "km0 reparto",
        "km0 pasarela",
    ]
    .into();
    // Spans reach the collector every half second from each process: wait for the tree to
    // be whole (every service, every parent known), then look at it.
    let caller_span = caller.span_id();
    let deadline = Instant::now() + Duration::from_secs(20);
    let of_trace = loop {
        let of_trace: Vec<Span> = spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.1 == caller.trace_id())
            .cloned()
            .collect();
        let services: BTreeSet<&str> = of_trace.iter().map(|s| s.0.as_str()).collect();
        let ids: HashSet<&str> = of_trace.iter().map(|s| s.2.as_str()).collect();
        let dangling: Vec<&Span> = of_trace
            .iter()
            .filter(|s| s.3 != caller_span && !ids.contains(s.3.as_str()))
            .collect();
        // A span that wrote an outbox row may end, and be exported, after its children.
        let unexported: Vec<String> = t1_rows
            .iter()
            .map(|(_, row)| row.span_id())
            .filter(|span| !ids.contains(span.as_str()))
            .collect();
        if wanted.is_subset(&services) && dangling.is_empty() && unexported.is_empty() {
            break of_trace;
        }
        if Instant::now() >= deadline && dangling.is_empty() && wanted.is_subset(&services) {
            // Judged below: a row naming a span that never came.
            break of_trace;
        }
        assert!(
            Instant::now() < deadline,
            "the trace is not one tree from every service: services {services:?}, \
             spans whose parent is no span of the trace {dangling:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "trace {}: {} spans, {logged} records in the log",
        caller.trace_id(),
        of_trace.len()
    );
    for (service, _, span, parent, name) in &of_trace {
        eprintln!("  {service:16} {name:40} {span} <- {parent}");
    }
    let roots: Vec<&Span> = of_trace.iter().filter(|s| s.3 == caller_span).collect();
    assert_eq!(roots.len(), 1, "one span continues the caller's: {roots:?}");
    assert_eq!(
        (
            roots[0].0.as_str(),
            roots[0].2.as_str(),
            roots[0].4.as_str()
        ),
        ("km0 pedidos", traced.span_id().as_str(), "POST /pedidos"),
        "the answered traceparent is pedidos' request span"
    );
    // Each row names the span that wrote it: one the collector received.
    let exported: HashSet<&str> = of_trace.iter().map(|s| s.2.as_str()).collect();
    for (service, row) in &t1_rows {
        assert!(
            exported.contains(row.span_id().as_str()),
            "an outbox row of {service:?} names span {}, which was never exported",
            row.span_id()
        );
    }
    // The unsampled order's spans stay with its processes: its saga completed before the
    // first order's tree was whole, and every process sends what ended within half a second;
    // two such rounds more, and a span of it would have arrived.
    tokio::time::sleep(2 * km0::telemetry::otel::FLUSH_EVERY + Duration::from_millis(500)).await;
    assert!(
        !spans
            .lock()
            .unwrap()
            .iter()
            .any(|s| s.1 == unsampled.trace_id()),
        "a span of the unsampled trace was exported"
    );
    assert!(
        !spans
            .lock()
            .unwrap()
            .iter()
            .any(|s| s.1 == untraced.trace_id() && s.3 == caller_span),
        "the second order's spans hang from the first's"
    );
    deployment.destroy().await;
}
