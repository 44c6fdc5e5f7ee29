//! The worker on RabbitMQ's own side queues (`ENTREGA_TEST_AMQP`): a transient failure waits
//! in a TTL wait queue and comes back into the group's queue with `intentos`, attempts are
//! counted from that header, and what cannot be applied lands in the group's dead-letter
//! queue (the seed's `<base>.dlq` behind the shared dead-letter exchange) with its `motivo`,
//! while everything else flows.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use entrega::{Backoff, Broker, CancellationToken, RetryStrategy, Router, Worker, WorkerConfig};
use entrega_core::OutgoingMessage;
use lapin::options::{BasicGetOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};
use support::handlers::{Scripted, Step};
use support::{event_message, raw_message};

fn base_url() -> String {
    std::env::var("ENTREGA_TEST_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".into())
}

/// The dead letters in `queue`, taken off it: (`motivo`, `intentos`, payload).
async fn drain(queue: &str) -> Vec<(String, String, Vec<u8>)> {
    let conn = Connection::connect(&base_url(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    let mut out = Vec::new();
    while let Some(m) = channel
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        let headers = m.delivery.properties.headers().clone().unwrap_or_default();
        let text = |name: &str| match headers.inner().get(name) {
            Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
            other => format!("{other:?}"),
        };
        out.push((text("motivo"), text("intentos"), m.delivery.data.clone()));
    }
    let _ = conn.close(200, "done".into()).await;
    out
}

/// Messages in `queue` right now (ready ones), by a passive declare; `None` when there is no
/// such queue (a wait level never used).
async fn depth(queue: &str) -> Option<u32> {
    let conn = Connection::connect(&base_url(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    let q = channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .ok();
    let _ = conn.close(200, "done".into()).await;
    q.map(|q| q.message_count())
}

/// Per key, each delivery of its first event: (attempt, when, `intentos`).
type Seen = BTreeMap<String, Vec<(u32, Instant, Option<String>)>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_wait_in_ttl_queues_and_dead_letters_land_in_the_groups_dlq_with_a_reason() {
    let url = format!(
        "{}?shards=3&dead_letter_exchange=entrega.test.dlx",
        base_url()
    );
    let broker = Broker::connect(&url, Duration::from_secs(10))
        .await
        .unwrap();
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (group, topic) = (format!("g.{id}"), format!("t.{id}"));
    broker.admin().ensure_topic(&topic, 3).await.unwrap();
    let mut probe = broker
        .subscriber()
        .subscribe(&group, &topic, "probe")
        .await
        .unwrap();
    probe.close().await.unwrap();
    let queues = broker.as_amqp().unwrap().group_queues(&group, &topic);

    // P-1 n=0 fails twice then succeeds; P-2 n=0 always fails; the rest succeed.
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let handler = Arc::new(Scripted::new({
        let seen = seen.clone();
        move |m| {
            let key = m.key.clone().unwrap_or_default();
            let n = m.envelope.data["n"].as_u64().unwrap_or(99);
            if n == 0 {
                let intentos = m.headers.get("intentos").map(str::to_owned);
                seen.lock().unwrap().entry(key.clone()).or_default().push((
                    m.attempt,
                    Instant::now(),
                    intentos,
                ));
            }
            match (key.as_str(), n) {
                ("P-1", 0) if m.attempt < 3 => Step::Transient,
                ("P-2", 0) => Step::Transient,
                _ => Step::Ok,
            }
        }
    }));
    let mut config = WorkerConfig::new(&group, &topic).with_retry(RetryStrategy::DelayQueues);
    config.backoff = Backoff::new(Duration::from_millis(150), Duration::from_millis(400));
    config.poll_wait = Duration::from_millis(100);
    let worker = Worker::new(
        broker.subscriber(),
        broker.publisher(),
        Router::new().route("pedido.creado", handler.clone()),
        config,
    )
    .with_side_queues(broker.side_queues().unwrap());
    let stats = worker.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move { worker.run(stop).await }
    });

    let mut batch: Vec<OutgoingMessage> = Vec::new();
    for n in 0..4 {
        for k in 0..6 {
            batch.push(event_message(&topic, &format!("P-{k}"), "pedido.creado", n).1);
        }
    }
    batch.push(raw_message(&topic, "P-9", b"{not json"));
    broker.publisher().publish(&batch).await.unwrap();

    // 23 applied (all but P-2 n=0), P-2 n=0 and the malformed one dead-lettered.
    let deadline = Instant::now() + Duration::from_secs(60);
    while stats.acked() < 23 || stats.dead_lettered() < 2 {
        assert!(
            Instant::now() < deadline,
            "acked {} of 23, dead-lettered {} of 2",
            stats.acked(),
            stats.dead_lettered()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    task.await.unwrap().unwrap();

    // P-1's first event came back twice from the wait queues, each time with the attempts
    // made so far in `intentos`, and never sooner than its backoff.
    let seen = seen.lock().unwrap().clone();
    let p1 = &seen["P-1"];
    let attempts: Vec<u32> = p1.iter().map(|(a, _, _)| *a).collect();
    assert_eq!(attempts, vec![1, 2, 3]);
    let intentos: Vec<Option<String>> = p1.iter().map(|(_, _, i)| i.clone()).collect();
    assert_eq!(intentos, vec![None, Some("1".into()), Some("2".into())]);
    for pair in p1.windows(2) {
        let gap = pair[1].1 - pair[0].1;
        assert!(gap >= Duration::from_millis(150), "came back after {gap:?}");
    }
    assert_eq!(
        handler.applied_ns("P-1"),
        vec![1, 2, 3, 0],
        "P-1 n=0 lost its place"
    );
    for k in [0, 3, 4, 5] {
        assert_eq!(handler.applied_ns(&format!("P-{k}")), vec![0, 1, 2, 3]);
    }
    assert_eq!(handler.applied_ns("P-2"), vec![1, 2, 3]);
    assert_eq!(stats.retried(), 4);

    // Both dead letters are in `<base>.dlq`, with why and after how many attempts.
    let mut dead = drain(&queues.dead_letter_queue()).await;
    dead.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert_eq!(dead[0].1, "1");
    assert!(dead[0].0.contains("malformed json"), "{}", dead[0].0);
    assert_eq!(dead[0].2, b"{not json");
    assert_eq!(dead[1].1, "3");
    assert!(
        dead[1].0.contains("transient exhausted after 3"),
        "{}",
        dead[1].0
    );

    // Nothing is left waiting or unacked.
    let mut used = 0;
    for level in 0..entrega_amqp::WAIT_LEVELS {
        if let Some(n) = depth(&queues.wait_queue(level)).await {
            assert_eq!(n, 0, "wait level {level}");
            used += 1;
        }
    }
    assert!(used > 0, "no wait queue was ever declared");
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
