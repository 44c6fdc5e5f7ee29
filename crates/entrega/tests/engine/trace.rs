//! One trace from the enqueue to the consumer's own events, on each backend (the outbox on
//! SQLite or PostgreSQL, the log on SQLite): an event enqueued inside `trace::scope` stores
//! the context in the outbox row, the relay publishes it as the `traceparent` header, the
//! worker hands the handler a child span of it, and the events the handler enqueues carry
//! that span. Asserted on the outbox rows and on the records in the log.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use entrega::db::{query, Backend, Db};
use entrega::{
    trace, Broker, CancellationToken, Handler, HandlerError, Message, MigrationSet, NewEvent,
    Record, Relay, RelayConfig, Router, SystemClock, TopicRouting, TraceContext, Worker,
    WorkerConfig, TRACEPARENT,
};
use serde_json::json;

use support::pg::FreshDb;
use support::TempDir;

const ORDERS: &str = "pedidos.eventos";
const SEEN: &str = "vistos.eventos";
const CONSUMER: &str = "traza.prueba";

/// Records the trace each delivery got, and enqueues one `pedido.visto` per order.
struct Follow {
    db: Db,
    seen: Mutex<HashMap<String, TraceContext>>,
}

#[async_trait]
impl Handler for Follow {
    async fn handle(&self, msg: &Message) -> Result<(), HandlerError> {
        let order = msg.envelope.data["pedido_id"].as_str().unwrap().to_owned();
        let mut tx = self.db.begin().await.map_err(HandlerError::transient)?;
        if tx
            .claim(CONSUMER, &msg.id())
            .await
            .map_err(HandlerError::transient)?
        {
            let seen = NewEvent::new("visto", &order, "pedido.visto", json!({"pedido_id": order}));
            tx.enqueue(&seen).await.map_err(HandlerError::transient)?;
        }
        tx.commit().await.map_err(HandlerError::transient)?;
        self.seen.lock().unwrap().insert(order, msg.trace);
        Ok(())
    }
}

/// The `traceparent` stored with each outbox row of `kind`, by `agregado_id`.
async fn stored(db: &Db, kind: &str) -> HashMap<String, Option<String>> {
    let rows: Vec<(String, Option<String>)> = db
        .fetch_all(
            query("SELECT agregado_id, CAST(headers AS TEXT) FROM outbox WHERE tipo = $1")
                .bind(kind),
        )
        .await
        .unwrap();
    rows.into_iter()
        .map(|(id, headers)| {
            let value = headers.and_then(|h| {
                let v: serde_json::Value = serde_json::from_str(&h).unwrap();
                v[TRACEPARENT].as_str().map(str::to_owned)
            });
            (id, value)
        })
        .collect()
}

/// Every record of `topic`, by key.
async fn records(broker: &Broker, topic: &str) -> HashMap<String, Record> {
    let mut all = HashMap::new();
    for (partition, end) in broker.end_offsets(topic).await.unwrap() {
        for r in broker
            .read(topic, partition, 0, end as usize)
            .await
            .unwrap()
        {
            all.insert(r.key.clone().unwrap(), r);
        }
    }
    all
}

async fn one_trace_from_enqueue_to_the_consumers_events(backend: Backend) {
    let dir = TempDir::new();
    let fresh = FreshDb::new(backend, &dir, "app.db").await;
    let db = fresh.db.clone();
    db.migrate(&[MigrationSet::Outbox, MigrationSet::Inbox])
        .await
        .unwrap();
    let broker = Broker::connect(&dir.url("broker.db"), Duration::from_secs(10))
        .await
        .unwrap();
    broker.admin().ensure_topic(ORDERS, 3).await.unwrap();
    broker.admin().ensure_topic(SEEN, 1).await.unwrap();

    // P-1 inside a request's trace; P-2 outside any; P-3 with a context of its own, which
    // wins over the scope's.
    let request =
        TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
    let own = TraceContext::root();
    let created = |id: &str| NewEvent::new("pedido", id, "pedido.creado", json!({"pedido_id": id}));
    let mut tx = db.begin().await.unwrap();
    tx.enqueue(&created("P-2")).await.unwrap();
    tx.commit().await.unwrap();
    trace::scope(request, async {
        let mut tx = db.begin().await.unwrap();
        tx.enqueue_all(&[
            created("P-1"),
            created("P-3").with_header(TRACEPARENT, own.header()),
        ])
        .await
        .unwrap();
        tx.commit().await.unwrap();
    })
    .await;

    let routing = TopicRouting::new()
        .route("pedido", ORDERS)
        .route("visto", SEEN);
    let relay = Relay::new(
        db.outbox(),
        broker.publisher(),
        Arc::new(SystemClock),
        RelayConfig::new("traza", routing),
    );
    let handler = Arc::new(Follow {
        db: db.clone(),
        seen: Mutex::new(HashMap::new()),
    });
    let worker = Worker::new(
        broker.subscriber(),
        broker.publisher(),
        Router::new().route("pedido.creado", handler.clone()),
        WorkerConfig::new("traza", ORDERS),
    );
    let stop = CancellationToken::new();
    let tasks = [
        tokio::spawn({
            let stop = stop.clone();
            async move { relay.run(stop).await.map_err(|e| e.to_string()) }
        }),
        tokio::spawn({
            let stop = stop.clone();
            async move { worker.run(stop).await.map_err(|e| e.to_string()) }
        }),
    ];
    let deadline = Instant::now() + Duration::from_secs(60);
    while broker.topic_total(SEEN).await.unwrap() < 3 {
        assert!(
            Instant::now() < deadline,
            "three orders handled and their events published"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    for task in tasks {
        task.await.unwrap().unwrap();
    }

    // The outbox rows and the published records carry what was enqueued.
    let rows = stored(&db, "pedido.creado").await;
    assert_eq!(rows["P-1"].as_deref(), Some(request.header().as_str()));
    assert_eq!(rows["P-2"], None, "enqueued outside any trace");
    assert_eq!(rows["P-3"].as_deref(), Some(own.header().as_str()));
    let orders = records(&broker, ORDERS).await;
    for (id, row) in &rows {
        assert_eq!(orders[id].headers.get(TRACEPARENT), row.as_deref(), "{id}");
    }

    // Each delivery continued the trace it came with, in a span of its own.
    let seen = handler.seen.lock().unwrap().clone();
    for (id, parent) in [("P-1", request), ("P-3", own)] {
        assert_eq!(seen[id].trace_id(), parent.trace_id(), "{id}");
        assert_ne!(seen[id].span_id(), parent.span_id(), "{id}");
    }
    for other in [request, own] {
        assert_ne!(
            seen["P-2"].trace_id(),
            other.trace_id(),
            "P-2 starts a trace"
        );
    }

    // The handler's events carry its delivery's span, in the outbox and in the log.
    let followed = stored(&db, "pedido.visto").await;
    let published = records(&broker, SEEN).await;
    for id in ["P-1", "P-2", "P-3"] {
        let expected = seen[id].header();
        assert_eq!(followed[id].as_deref(), Some(expected.as_str()), "{id}");
        assert_eq!(
            published[id].headers.get(TRACEPARENT),
            Some(expected.as_str()),
            "{id}"
        );
    }
    fresh.finish().await;
}

#[tokio::test]
async fn sqlite_one_trace_from_enqueue_to_the_consumers_events() {
    one_trace_from_enqueue_to_the_consumers_events(Backend::Sqlite).await;
}

#[tokio::test]
async fn postgres_one_trace_from_enqueue_to_the_consumers_events() {
    one_trace_from_enqueue_to_the_consumers_events(Backend::Postgres).await;
}
