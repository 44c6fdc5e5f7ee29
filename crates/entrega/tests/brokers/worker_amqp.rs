//! The worker on RabbitMQ (`ENTREGA_TEST_AMQP`): every event applied once, each key's events
//! in order across three shard queues, a transient failure retried in place (a seek and a
//! pause served from the held deliveries), and everything acked at the end.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use entrega::{Backoff, Broker, CancellationToken, Router, Worker, WorkerConfig};
use entrega_core::OutgoingMessage;
use support::event_message;
use support::handlers::{Scripted, Step};

fn url() -> String {
    let base = std::env::var("ENTREGA_TEST_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".into());
    format!("{base}?shards=3")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_once_in_key_order_with_a_retry_in_place() {
    let broker = Broker::connect(&url(), Duration::from_secs(10))
        .await
        .unwrap();
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (group, topic) = (format!("g.{id}"), format!("t.{id}"));
    broker.admin().ensure_topic(&topic, 3).await.unwrap();
    // The group's queues exist before anything is published (publishing is mandatory).
    let mut probe = broker
        .subscriber()
        .subscribe(&group, &topic, "probe")
        .await
        .unwrap();
    probe.close().await.unwrap();

    let failed = Arc::new(AtomicBool::new(false));
    let handler = Arc::new(Scripted::new({
        let failed = failed.clone();
        move |m| {
            let first_try_of_p3_n1 = m.key.as_deref() == Some("P-3")
                && m.envelope.data["n"] == 1
                && !failed.swap(true, Ordering::SeqCst);
            if first_try_of_p3_n1 {
                Step::Transient
            } else {
                Step::Ok
            }
        }
    }));
    let mut config = WorkerConfig::new(&group, &topic);
    config.backoff = Backoff::new(Duration::from_millis(50), Duration::from_millis(200));
    config.poll_wait = Duration::from_millis(100);
    let worker = Worker::new(
        broker.subscriber(),
        broker.publisher(),
        Router::new().route("pedido.creado", handler.clone()),
        config,
    );
    let stats = worker.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move { worker.run(stop).await }
    });

    let keys: Vec<String> = (0..8).map(|k| format!("P-{k}")).collect();
    let mut batch: Vec<OutgoingMessage> = Vec::new();
    for n in 0..5 {
        for k in &keys {
            batch.push(event_message(&topic, k, "pedido.creado", n).1);
        }
    }
    broker.publisher().publish(&batch).await.unwrap();

    let deadline = Instant::now() + Duration::from_secs(30);
    while stats.acked() < 40 {
        assert!(Instant::now() < deadline, "acked {} of 40", stats.acked());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    task.await.unwrap().unwrap();

    for key in &keys {
        assert_eq!(handler.applied_ns(key), vec![0, 1, 2, 3, 4], "{key}");
    }
    assert!(failed.load(Ordering::SeqCst));
    assert_eq!(stats.retried(), 1);

    // Everything was acked: a new member of the group gets nothing.
    let mut after = broker
        .subscriber()
        .subscribe(&group, &topic, "after")
        .await
        .unwrap();
    let left = after.poll(100, Duration::from_millis(500)).await.unwrap();
    assert!(
        left.is_empty(),
        "{} deliveries were never acked",
        left.len()
    );
    after.close().await.unwrap();
    broker
        .as_amqp()
        .unwrap()
        .delete_group(&group, &topic)
        .await
        .unwrap();
}
