//! Publisher and admin behaviour on a real broker that the shared suite does not cover.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use entrega_core::{Headers, OutgoingMessage, TransportError};

fn unique(name: &str) -> String {
    format!("{name}.{}", uuid::Uuid::new_v4().simple())
}

fn message(topic: &str, payload: Vec<u8>) -> OutgoingMessage {
    OutgoingMessage {
        topic: topic.to_owned(),
        key: Some("P-1".into()),
        headers: Headers::new().with("tipo", "pedido.creado"),
        payload,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_message_is_rejected_for_good() {
    let kafka = support::connect(support::test_config()).await.unwrap();
    let topic = unique("grande");
    kafka.admin().ensure_topic(&topic, 1).await.unwrap();
    let res = kafka
        .publisher()
        .publish(&[message(&topic, vec![b'x'; 2 * 1024 * 1024])])
        .await;
    let err = res.expect_err("a 2 MiB message was accepted");
    assert!(
        matches!(err, TransportError::Rejected { .. }) && !err.is_transient(),
        "{err:?}"
    );
    assert_eq!(
        kafka.inspector().end_offsets(&topic).await.unwrap(),
        vec![(0, 0)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_never_creates_a_topic() {
    let kafka = support::connect(support::test_config()).await.unwrap();
    let topic = unique("inexistente");
    for _ in 0..2 {
        let res = kafka
            .publisher()
            .publish(&[message(&topic, b"x".to_vec())])
            .await;
        assert!(
            matches!(&res, Err(TransportError::UnknownTopic { topic: t }) if *t == topic),
            "{res:?}"
        );
    }
    assert!(kafka
        .inspector()
        .end_offsets(&topic)
        .await
        .unwrap()
        .is_empty());
    let sub = kafka.subscriber().subscribe("g", &topic, "m").await;
    assert!(
        matches!(&sub, Err(TransportError::UnknownTopic { .. })),
        "subscribing to a missing topic"
    );
    // Once created through the admin, the same publisher can use it.
    assert_eq!(kafka.admin().ensure_topic(&topic, 2).await.unwrap(), 2);
    kafka
        .publisher()
        .publish(&[message(&topic, b"x".to_vec())])
        .await
        .unwrap();
    let ends = kafka.inspector().end_offsets(&topic).await.unwrap();
    assert_eq!(ends.iter().map(|(_, e)| e).sum::<i64>(), 1, "{ends:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_are_typed_errors() {
    let kafka = support::connect(support::test_config()).await.unwrap();
    let zero = kafka.admin().ensure_topic(&unique("cero"), 0).await;
    assert!(
        matches!(zero, Err(TransportError::Rejected { .. })),
        "{zero:?}"
    );
    let empty = kafka.subscriber().subscribe("", "t", "m").await;
    assert!(matches!(empty, Err(TransportError::Rejected { .. })));
    let bad = entrega_kafka::Kafka::connect(
        support::test_config().with_override("no.such.property", "1"),
    );
    assert!(matches!(bad, Err(TransportError::Rejected { .. })));
}

/// The replicas of each partition of `topic`, and the broker's `default.replication.factor`.
fn replication_of(topic: &str) -> (Vec<usize>, i32) {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use std::time::Duration;
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", support::bootstrap())
        .create()
        .unwrap();
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let replicas = metadata.topics()[0]
        .partitions()
        .iter()
        .map(|p| p.replicas().len())
        .collect();
    let broker = metadata.brokers()[0].id();
    (replicas, broker)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_get_the_brokers_default_replication_unless_the_url_says() {
    use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
    use rdkafka::client::DefaultClientContext;
    let kafka = support::connect(support::test_config()).await.unwrap();
    assert_eq!(kafka.config().replication_factor, None);
    let topic = unique("replicas");
    kafka.admin().ensure_topic(&topic, 2).await.unwrap();
    let (replicas, broker) = replication_of(&topic);
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", support::bootstrap())
        .create()
        .unwrap();
    let configs = admin
        .describe_configs([&ResourceSpecifier::Broker(broker)], &AdminOptions::new())
        .await
        .unwrap();
    let default: usize = configs[0]
        .as_ref()
        .unwrap()
        .get("default.replication.factor")
        .and_then(|e| e.value.as_deref())
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        replicas,
        vec![default; 2],
        "the broker's default, not a fixed 1"
    );

    // Asked for more copies than this one-broker cluster has: refused, so the number asked
    // for is the one sent.
    let three = support::test_config().with_replication_factor(3);
    let kafka = support::connect(three).await.unwrap();
    let refused = kafka.admin().ensure_topic(&unique("tres"), 1).await;
    assert!(refused.is_err(), "{refused:?}");
}

/// Clients under a namespace publish, consume, commit and inspect under plain names while the
/// cluster holds them under the prefix; removing the namespace deletes its topics and groups,
/// and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_keeps_names_apart_and_is_removed_whole() {
    use std::time::Duration;
    let prefix = format!("ns-{}.", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let namespace = entrega_core::Namespace::new(&prefix).unwrap();
    let inside = support::connect(support::test_config().with_namespace(namespace))
        .await
        .unwrap();
    let outside = support::connect(support::test_config()).await.unwrap();
    let topic = unique("pedidos.eventos");
    inside.admin().ensure_topic(&topic, 2).await.unwrap();
    inside
        .publisher()
        .publish(&[message(&topic, b"{}".to_vec())])
        .await
        .unwrap();

    // Outside, the record is on the prefixed topic only.
    let wire = format!("{prefix}{topic}");
    let total = |ends: Vec<(u32, i64)>| ends.iter().map(|(_, e)| *e).sum::<i64>();
    assert_eq!(
        total(support::ends(outside.inspector().as_ref(), &wire).await),
        1
    );
    assert!(support::ends(outside.inspector().as_ref(), &topic)
        .await
        .is_empty());
    // Inside, it reads, commits and inspects under the plain names.
    let mut member = inside
        .subscriber()
        .subscribe("inventario", &topic, "m-1")
        .await
        .unwrap();
    let mut records = Vec::new();
    for _ in 0..60 {
        records.extend(member.poll(10, Duration::from_millis(500)).await.unwrap());
        if !records.is_empty() {
            break;
        }
    }
    assert_eq!(records.len(), 1, "the record was consumed inside");
    assert_eq!(records[0].topic, topic);
    member
        .commit(&[(records[0].partition, records[0].offset + 1)])
        .await
        .unwrap();
    member.close().await.unwrap();
    let committed = inside
        .inspector()
        .committed("inventario", &topic)
        .await
        .unwrap();
    assert_eq!(committed.iter().map(|(_, n)| *n).sum::<i64>(), 1);
    let outside_committed = outside
        .inspector()
        .committed(&format!("{prefix}inventario"), &wire)
        .await
        .unwrap();
    assert_eq!(
        outside_committed, committed,
        "the group is prefixed on the cluster"
    );
    let read = inside
        .inspector()
        .read(&topic, records[0].partition, 0, 10)
        .await
        .unwrap();
    assert_eq!(read[0].topic, topic);

    let removed = inside.remove_namespace().await.unwrap();
    assert_eq!(removed.topics, vec![wire.clone()]);
    assert_eq!(removed.groups, vec![format!("{prefix}inventario")]);
    assert!(support::ends(outside.inspector().as_ref(), &wire)
        .await
        .is_empty());
    // Without a namespace there is nothing to scope a removal to.
    assert!(outside.remove_namespace().await.is_err());
}
