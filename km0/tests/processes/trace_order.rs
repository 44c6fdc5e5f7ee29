//! One order, one trace, across five processes: `km0 run pasarela`, `inventario`, `pagos`,
//! `reparto`, `relay` and `pedidos --saga`, each exporting its spans to an OpenTelemetry
//! collector of the test's own (OTLP/HTTP JSON). An order placed with a `traceparent` runs its
//! whole saga (reserve, charge through the gateway, deliver); asserted afterwards:
//!
//! - every outbox row any service wrote for the order, in every service's database, carries
//!   the order's trace, and so does every record of it in the log;
//! - spans of that trace reached the collector from pedidos, inventario, pagos, reparto and
//!   the gateway, and they form one tree: each span's parent is the caller's span or another
//!   span of the trace;
//! - a second order placed without a `traceparent` got a trace of its own (answered in the
//!   response's `traceparent`), shared by none of the first order's rows.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::collections::{BTreeSet, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::post;
use axum::{Json, Router};
use entrega::db::query;
use entrega::saga::SagaStatus;
use entrega::{TraceContext, TRACEPARENT};
use km0::services::{inventario, pagos, pedidos, reparto};
use km0::wiring::Database;
use serde_json::{json, Value};

use common::process::Deployment;
use common::state::eventually;

/// One exported span: (service.name, traceId, spanId, parentSpanId, name).
type Span = (String, String, String, String, String);

/// An OTLP/HTTP collector that keeps every span it is sent.
async fn collector() -> (SocketAddr, Arc<Mutex<Vec<Span>>>) {
    let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
    let kept = Arc::clone(&spans);
    let app = Router::new().route(
        "/v1/traces",
        post(move |Json(body): Json<Value>| {
            let kept = Arc::clone(&kept);
            async move {
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
                            let text = |k: &str| s[k].as_str().unwrap_or_default().to_owned();
                            kept.lock().unwrap().push((
                                service.clone(),
                                text("traceId"),
                                text("spanId"),
                                text("parentSpanId"),
                                text("name"),
                            ));
                        }
                    }
                }
                Json(json!({}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, spans)
}

fn order(id: &str) -> Value {
    json!({"id": id, "cliente": "ana", "mercado": "girona", "tarjeta": "tok_visa",
           "lineas": [{"producto": "queso-fresco", "cantidad": 1, "precio_centimos": 600}],
           "direccion_entrega": {"ciudad": "Madrid", "codigo_postal": "28013", "calle": "Carrer Major 3"}})
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

/// The trace id of every outbox row mentioning `order`, in each service's database.
async fn row_traces(
    deployment: &Deployment,
    order: &str,
) -> Vec<(&'static Database, Option<String>)> {
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
                    .map(|t| TraceContext::parse(t).unwrap().trace_id())
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
    let mut gateway = deployment.spawn_with("pasarela", "pasarela-1", "", &otlp);
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
    let traced = place(pedidos.http_addr(), &order("T-1"), Some(&caller.header())).await;
    assert_eq!(
        traced.trace_id(),
        caller.trace_id(),
        "the request's trace is continued"
    );
    let untraced = place(pedidos.http_addr(), &order("T-2"), None).await;
    assert_ne!(untraced.trace_id(), caller.trace_id());

    let store = deployment.system().pedidos().await.unwrap();
    let sagas = deployment
        .system()
        .clone()
        .with_saga(Default::default())
        .sagas(&store)
        .await
        .unwrap();
    eventually(Duration::from_secs(90), "both sagas completed", || async {
        let (a, b) = (
            sagas.show("T-1").await.unwrap(),
            sagas.show("T-2").await.unwrap(),
        );
        matches!((a, b), (Some((a, _)), Some((b, _)))
            if a.status == SagaStatus::Completed && b.status == SagaStatus::Completed)
        .then_some(())
    })
    .await;

    // Every row written for each order, in every service, carries that order's trace.
    for (id, trace) in [("T-1", &traced), ("T-2", &untraced)] {
        for (service, row_trace) in row_traces(&deployment, id).await {
            assert_eq!(
                row_trace.as_deref(),
                Some(trace.trace_id().as_str()),
                "an outbox row of {service:?} for {id}"
            );
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
        if wanted.is_subset(&services) && dangling.is_empty() {
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
    assert_eq!(roots[0].0, "km0 pedidos");
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
