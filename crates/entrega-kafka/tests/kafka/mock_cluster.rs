//! Fast, in-process failure tests on librdkafka's mock cluster: a broker that goes away,
//! produce requests that fail and are retried, and commits the coordinator refuses.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use entrega_core::{Headers, OutgoingMessage, Subscription, TransportError};
use entrega_kafka::{Kafka, KafkaConfig};
use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

const TOPIC: &str = "pedidos.eventos";

fn cluster() -> MockCluster<'static, rdkafka::producer::DefaultProducerContext> {
    let mock = MockCluster::new(1).expect("mock cluster");
    mock.create_topic(TOPIC, 2, 1).expect("topic");
    mock
}

fn kafka(mock: &MockCluster<'static, rdkafka::producer::DefaultProducerContext>) -> Kafka {
    let config = KafkaConfig::new(mock.bootstrap_servers())
        .with_delivery_timeout(Duration::from_secs(3))
        .with_request_timeout(Duration::from_secs(3));
    Kafka::connect(config).expect("clients")
}

fn messages(n: usize, tag: &str) -> Vec<OutgoingMessage> {
    (0..n)
        .map(|i| OutgoingMessage {
            topic: TOPIC.into(),
            key: Some("P-1".into()),
            headers: Headers::new().with("tipo", "pedido.creado"),
            payload: format!("{tag}-{i}").into_bytes(),
        })
        .collect()
}

/// Payloads stored in the partition of key `P-1`, in offset order.
async fn stored(kafka: &Kafka) -> Vec<String> {
    let partition = entrega_core::partition_for("P-1", 2);
    kafka
        .inspector()
        .read(TOPIC, partition, 0, 1_000)
        .await
        .unwrap()
        .iter()
        .map(|r| String::from_utf8_lossy(&r.payload).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_down_is_transient_and_never_a_false_ok() {
    let mock = cluster();
    let kafka = kafka(&mock);
    kafka
        .publisher()
        .publish(&messages(2, "antes"))
        .await
        .unwrap();

    mock.broker_down(1).unwrap();
    let res = kafka.publisher().publish(&messages(3, "caido")).await;
    let err = res.expect_err("a publish while the only broker is down was confirmed");
    assert!(
        matches!(err, TransportError::Unavailable { .. }) && err.is_transient(),
        "{err:?}"
    );

    mock.broker_up(1).unwrap();
    // The producer reconnects with backoff: the caller retries, as the relay does.
    let mut attempts = 0;
    while let Err(e) = kafka.publisher().publish(&messages(2, "despues")).await {
        assert!(e.is_transient(), "{e:?}");
        attempts += 1;
        assert!(
            attempts < 10,
            "still failing after the broker came back: {e:?}"
        );
    }
    let got = stored(&kafka).await;
    assert_eq!(&got[..2], ["antes-0", "antes-1"]);
    assert_eq!(&got[got.len() - 2..], ["despues-0", "despues-1"]);
    // Unconfirmed messages may or may not be stored, never out of order with confirmed ones.
    assert!(got.len() >= 4, "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_errors_that_can_pass_are_retried() {
    let mock = cluster();
    let kafka = kafka(&mock);
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
        ],
    );
    let batch = messages(10, "m");
    kafka.publisher().publish(&batch).await.unwrap();
    let want: Vec<String> = (0..10).map(|i| format!("m-{i}")).collect();
    // Idempotence: every message exactly once, in order, despite the retries.
    assert_eq!(stored(&kafka).await, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_local_queue_waits_instead_of_failing() {
    let mock = cluster();
    let config = KafkaConfig::new(mock.bootstrap_servers())
        .with_override("queue.buffering.max.messages", "5");
    let kafka = Kafka::connect(config).unwrap();
    let batch = messages(200, "q");
    kafka.publisher().publish(&batch).await.unwrap();
    let want: Vec<String> = (0..200).map(|i| format!("q-{i}")).collect();
    assert_eq!(stored(&kafka).await, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_to_a_missing_topic_is_unknown_topic() {
    let mock = cluster();
    let kafka = kafka(&mock);
    let mut batch = messages(1, "x");
    batch[0].topic = "no.existe".into();
    let res = kafka.publisher().publish(&batch).await;
    assert!(
        matches!(&res, Err(TransportError::UnknownTopic { topic }) if topic == "no.existe"),
        "{res:?}"
    );
    assert!(kafka
        .inspector()
        .end_offsets("no.existe")
        .await
        .unwrap()
        .is_empty());
}

/// Polls until the member holds both partitions and has read `want` records.
async fn join_and_read(sub: &mut Box<dyn Subscription>, want: usize) -> usize {
    let mut got = 0;
    for _ in 0..60 {
        got += sub
            .poll(100, Duration::from_millis(500))
            .await
            .unwrap()
            .len();
        if got >= want && sub.assignment().len() == 2 {
            break;
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_errors_from_the_coordinator_are_returned() {
    let mock = cluster();
    let kafka = kafka(&mock);
    kafka.publisher().publish(&messages(3, "c")).await.unwrap();
    let partition = entrega_core::partition_for("P-1", 2);
    let mut sub = kafka
        .subscriber()
        .subscribe("inventario", TOPIC, "m1")
        .await
        .unwrap();
    assert_eq!(join_and_read(&mut sub, 3).await, 3);

    mock.request_errors(
        RDKafkaApiKey::OffsetCommit,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED],
    );
    let res = sub.commit(&[(partition, 3)]).await;
    let err = res.expect_err("a refused commit was reported as done");
    assert!(!err.is_transient(), "{err:?}");

    mock.request_errors(
        RDKafkaApiKey::OffsetCommit,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS],
    );
    let res = sub.commit(&[(partition, 3)]).await;
    let err = res.expect_err("a commit during a rebalance was reported as done");
    assert!(err.is_transient(), "{err:?}");
    assert!(
        kafka
            .inspector()
            .committed("inventario", TOPIC)
            .await
            .unwrap()
            .is_empty(),
        "a refused commit was stored"
    );

    sub.commit(&[(partition, 3)]).await.unwrap();
    assert_eq!(
        kafka
            .inspector()
            .committed("inventario", TOPIC)
            .await
            .unwrap(),
        vec![(partition, 3)]
    );
    sub.close().await.unwrap();
}
