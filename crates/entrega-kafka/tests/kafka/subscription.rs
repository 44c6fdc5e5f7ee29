//! Member behaviour on a real broker beyond the shared suite: polls cancelled half-way lose
//! nothing, and a seek drops what was already fetched past it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use entrega_core::{Headers, OutgoingMessage, Record};
use entrega_kafka::Kafka;

fn unique(name: &str) -> String {
    format!("{name}.{}", uuid::Uuid::new_v4().simple())
}

async fn publish(kafka: &Kafka, topic: &str, from: usize, n: usize) {
    let batch: Vec<OutgoingMessage> = (from..from + n)
        .map(|i| OutgoingMessage {
            topic: topic.to_owned(),
            key: Some("P-1".into()),
            headers: Headers::new(),
            payload: i.to_string().into_bytes(),
        })
        .collect();
    kafka.publisher().publish(&batch).await.unwrap();
}

fn offsets(records: &[Record]) -> Vec<i64> {
    records.iter().map(|r| r.offset).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_polls_lose_no_records() {
    let kafka = support::connect(support::test_config()).await.unwrap();
    let topic = unique("cancelado");
    kafka.admin().ensure_topic(&topic, 1).await.unwrap();
    publish(&kafka, &topic, 0, 50).await;
    let mut sub = kafka
        .subscriber()
        .subscribe(&unique("grupo"), &topic, "m")
        .await
        .unwrap();
    let mut got: Vec<Record> = Vec::new();
    let mut cancelled = 0;
    for round in 0..400 {
        if got.len() >= 50 {
            break;
        }
        if round % 2 == 0 {
            // Dropped almost at once: whatever that poll fetched must stay for the next one.
            match tokio::time::timeout(
                Duration::from_millis(1),
                sub.poll(3, Duration::from_secs(1)),
            )
            .await
            {
                Ok(records) => got.extend(records.unwrap()),
                Err(_) => cancelled += 1,
            }
        } else {
            got.extend(sub.poll(3, Duration::from_millis(200)).await.unwrap());
        }
    }
    assert!(cancelled > 0, "no poll was cancelled");
    assert_eq!(offsets(&got), (0..50).collect::<Vec<i64>>());
    sub.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seek_drops_records_fetched_past_it() {
    let kafka = support::connect(support::test_config()).await.unwrap();
    let topic = unique("rebobinar");
    kafka.admin().ensure_topic(&topic, 1).await.unwrap();
    publish(&kafka, &topic, 0, 20).await;
    let mut sub = kafka
        .subscriber()
        .subscribe(&unique("grupo"), &topic, "m")
        .await
        .unwrap();
    // Take a few; the rest of the fetch is buffered locally.
    let mut first = Vec::new();
    for _ in 0..30 {
        first.extend(
            sub.poll(5 - first.len(), Duration::from_secs(1))
                .await
                .unwrap(),
        );
        if first.len() >= 5 {
            break;
        }
    }
    assert_eq!(offsets(&first), vec![0, 1, 2, 3, 4]);
    sub.seek(0, 2);
    let mut again = Vec::new();
    for _ in 0..30 {
        again.extend(sub.poll(100, Duration::from_secs(1)).await.unwrap());
        if again.len() >= 18 {
            break;
        }
    }
    assert_eq!(offsets(&again), (2..20).collect::<Vec<i64>>());
    sub.close().await.unwrap();
    let closed = sub.poll(10, Duration::from_millis(10)).await;
    assert!(closed.is_err(), "poll after close gave {closed:?}");
}
