//! The ids a hop is exported with are the ids its events carry. A worker runs under km0's
//! OpenTelemetry layer (an in-memory exporter in place of OTLP); an order enqueued in a sampled
//! trace and one in an unsampled trace go through the outbox, the relay and the log to a
//! handler that enqueues an event of its own. Asserted on the exported spans and on the
//! records in the log:
//!
//! - the sampled order's `consume` span is exported with the caller's trace, the caller's span
//!   as its parent, and the very span id the handler's event carries in `traceparent`;
//! - the unsampled order's span is not exported, and its event says so (`-00`), so the next
//!   hop does not record it either;
//! - [`km0::telemetry::otel::span_ids`] leaves a span the layer does not export to entrega,
//!   and answers for a span started before its parent was set with the ids it was exported
//!   with.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use entrega::{
    trace, Broker, CancellationToken, Handler, HandlerError, Message, MigrationSet, NewEvent,
    Relay, RelayConfig, Router, SystemClock, TopicRouting, TraceContext, Worker, WorkerConfig,
    TRACEPARENT,
};
use km0::telemetry::otel;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::json;
use tracing_subscriber::layer::SubscriberExt as _;

use crate::common::TestDb;

const ORDERS: &str = "otel.pedidos";
const SHIPPED: &str = "otel.envios";

/// Sends one `envio.preparado` per order it is handed, in the delivery's trace, and keeps
/// the context each delivery was given.
struct Ship {
    db: entrega::db::Db,
    given: Mutex<HashMap<String, TraceContext>>,
}

#[async_trait]
impl Handler for Ship {
    async fn handle(&self, msg: &Message) -> Result<(), HandlerError> {
        let order = msg.key.clone().unwrap_or_default();
        let mut tx = self.db.begin().await.map_err(HandlerError::transient)?;
        tx.enqueue(&NewEvent::new(
            "envio",
            &order,
            "envio.preparado",
            json!({ "pedido_id": order }),
        ))
        .await
        .map_err(HandlerError::transient)?;
        tx.commit().await.map_err(HandlerError::transient)?;
        self.given.lock().unwrap().insert(order, msg.trace);
        Ok(())
    }
}

/// The hex ids of an exported span and of its parent.
fn ids(span: &SpanData) -> (String, String, String) {
    (
        span.span_context.trace_id().to_string(),
        span.span_context.span_id().to_string(),
        span.parent_span_id.to_string(),
    )
}

#[tokio::test]
async fn a_hops_events_carry_the_ids_it_is_exported_with() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry().with(otel::layer_for(&provider));
    let _installed = tracing::subscriber::set_default(subscriber);

    let test_db = TestDb::sqlite().await;
    let db = test_db.db.clone();
    db.migrate(&[MigrationSet::Outbox]).await.unwrap();
    let broker = Broker::connect(
        &test_db.url.replace("test.db", "log.db"),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    broker.admin().ensure_topic(ORDERS, 2).await.unwrap();
    broker.admin().ensure_topic(SHIPPED, 1).await.unwrap();

    let sampled =
        TraceContext::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").unwrap();
    let unsampled =
        TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
    for (order, caller) in [("E-1", sampled), ("E-2", unsampled)] {
        trace::scope(caller, async {
            let mut tx = db.begin().await.unwrap();
            tx.enqueue(&NewEvent::new(
                "pedido",
                order,
                "pedido.creado",
                json!({ "pedido_id": order }),
            ))
            .await
            .unwrap();
            tx.commit().await.unwrap();
        })
        .await;
    }

    let relay = Relay::new(
        db.outbox(),
        broker.publisher(),
        Arc::new(SystemClock),
        RelayConfig::new(
            "otel",
            TopicRouting::new()
                .route("pedido", ORDERS)
                .route("envio", SHIPPED),
        ),
    );
    let handler = Arc::new(Ship {
        db: db.clone(),
        given: Mutex::default(),
    });
    let worker = Worker::new(
        broker.subscriber(),
        broker.publisher(),
        Router::new().route("pedido.creado", handler.clone()),
        WorkerConfig::new("otel", ORDERS),
    );
    let stop = CancellationToken::new();
    let relaying = tokio::spawn({
        let stop = stop.clone();
        async move { relay.run(stop).await.map_err(|e| e.to_string()) }
    });
    let working = tokio::spawn({
        let stop = stop.clone();
        async move { worker.run(stop).await.map_err(|e| e.to_string()) }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while broker.topic_total(SHIPPED).await.unwrap() < 2 {
        assert!(Instant::now() < deadline, "both orders handled and shipped");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    relaying.await.unwrap().unwrap();
    working.await.unwrap().unwrap();

    let shipped: HashMap<String, String> = broker
        .read(SHIPPED, 0, 0, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| {
            let header = r.headers.get(TRACEPARENT).unwrap().to_owned();
            (r.key.unwrap(), header)
        })
        .collect();
    let given = handler.given.lock().unwrap().clone();
    let consumed: Vec<SpanData> = exporter
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .filter(|s| s.name == "consume pedido.creado")
        .collect();

    // The sampled order: exported once, under the caller's span, with the ids its event carries.
    assert_eq!(consumed.len(), 1, "only the sampled delivery is exported");
    let (trace_id, span_id, parent) = ids(&consumed[0]);
    assert_eq!(trace_id, sampled.trace_id());
    assert_eq!(parent, sampled.span_id());
    assert_eq!(given["E-1"].span_id(), span_id);
    assert_eq!(shipped["E-1"], format!("00-{trace_id}-{span_id}-01"));

    // The unsampled order: a span of its own in its trace, unsampled downstream too.
    let e2 = TraceContext::parse(&shipped["E-2"]).unwrap();
    assert_eq!(e2.trace_id(), unsampled.trace_id());
    assert_ne!(e2.span_id(), unsampled.span_id());
    assert!(!e2.sampled(), "the unsampled trace stays unsampled: {e2}");
    assert_eq!(e2, given["E-2"]);

    drop(_installed);
    let _ = provider.shutdown();
    test_db.remove().await;
}

#[test]
fn spans_the_layer_does_not_export_or_started_early_keep_consistent_ids() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry().with(otel::layer_for(&provider));
    tracing::subscriber::with_default(subscriber, || {
        let caller = TraceContext::root();

        // No `otel.kind`: not exported, so the hook leaves it to entrega.
        let plain = tracing::info_span!("plain");
        assert_eq!(otel::span_ids(&plain, Some(caller)), None);
        let ctx = trace::open(&plain, Some(caller));
        assert_eq!(ctx.trace_id(), caller.trace_id());

        // A root hop: a new trace, sampled by the default sampler.
        let root = tracing::info_span!("hop", otel.kind = "server");
        let root_ids = otel::span_ids(&root, None).unwrap();
        assert_ne!(root_ids.trace_id(), caller.trace_id());
        assert!(root_ids.sampled());
        drop(root);

        // Started before its parent was set: the ids it was exported with, whatever they are.
        let early = tracing::info_span!("early", otel.kind = "consumer");
        let _ = opentelemetry::trace::TraceContextExt::span(
            &tracing_opentelemetry::OpenTelemetrySpanExt::context(&early),
        )
        .span_context()
        .span_id();
        let early_ids = otel::span_ids(&early, Some(caller)).unwrap();
        drop(early);

        let spans = exporter.get_finished_spans().unwrap();
        let exported = |name: &str| {
            spans
                .iter()
                .find(|s| s.name == name)
                .map(ids)
                .unwrap_or_else(|| panic!("{name} exported"))
        };
        assert_eq!(
            exported("hop"),
            (
                root_ids.trace_id(),
                root_ids.span_id(),
                "0000000000000000".to_owned()
            )
        );
        let (trace_id, span_id, _) = exported("early");
        assert_eq!(
            (trace_id, span_id),
            (early_ids.trace_id(), early_ids.span_id())
        );
        assert!(spans.iter().all(|s| s.name != "plain"));
    });
    let _ = provider.shutdown();
}
