//! A rebalance with records in flight, on a real broker: the member that loses partitions
//! cannot commit them, the member that gains them reads the unprocessed records again, and no
//! committed offset ever passes a record nobody processed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use entrega_core::{partition_for, Headers, OutgoingMessage, Record, Subscription, TransportError};
use entrega_kafka::Kafka;

const PARTITIONS: u32 = 4;
const PER_PARTITION: i64 = 10;
/// Member 1 processes (and commits) the first records of each partition, and holds the rest.
const PROCESSED: i64 = 4;
const WAIT: Duration = Duration::from_secs(1);

fn key_on(partition: u32) -> String {
    (0u32..)
        .map(|i| format!("P-{i}"))
        .find(|k| partition_for(k, PARTITIONS) == partition)
        .unwrap()
}

/// Committed offsets never pass the first record not yet processed by anyone.
async fn assert_no_commit_past(
    kafka: &Kafka,
    group: &str,
    topic: &str,
    processed: &BTreeMap<u32, BTreeSet<i64>>,
) {
    for (p, next) in kafka.inspector().committed(group, topic).await.unwrap() {
        let done = processed.get(&p).cloned().unwrap_or_default();
        let first_gap = (0..).find(|o| !done.contains(o)).unwrap();
        assert!(
            next <= first_gap,
            "partition {p} committed at {next} but offset {first_gap} was never processed"
        );
    }
}

async fn poll_both(
    a: &mut Box<dyn Subscription>,
    b: &mut Box<dyn Subscription>,
) -> (Vec<Record>, Vec<Record>) {
    (
        a.poll(100, WAIT).await.unwrap(),
        b.poll(100, WAIT).await.unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_in_flight_records_go_to_the_new_owner() {
    let kafka = support::connect(support::test_config()).await.unwrap();
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let (topic, group) = (format!("relevo.{suffix}"), format!("inventario.{suffix}"));
    kafka
        .admin()
        .ensure_topic(&topic, PARTITIONS)
        .await
        .unwrap();
    let batch: Vec<OutgoingMessage> = (0..PARTITIONS)
        .flat_map(|p| {
            let key = key_on(p);
            let topic = topic.clone();
            (0..PER_PARTITION).map(move |i| OutgoingMessage {
                topic: topic.clone(),
                key: Some(key.clone()),
                headers: Headers::new(),
                payload: format!("{p}-{i}").into_bytes(),
            })
        })
        .collect();
    kafka.publisher().publish(&batch).await.unwrap();

    // Member 1 alone reads everything, processes the first records of each partition and
    // holds the others unprocessed.
    let mut m1 = kafka
        .subscriber()
        .subscribe(&group, &topic, "m1")
        .await
        .unwrap();
    let mut in_hand: Vec<Record> = Vec::new();
    for _ in 0..60 {
        in_hand.extend(m1.poll(100, WAIT).await.unwrap());
        if in_hand.len() as i64 == PER_PARTITION * i64::from(PARTITIONS) {
            break;
        }
    }
    assert_eq!(in_hand.len() as i64, PER_PARTITION * i64::from(PARTITIONS));
    let mut processed: BTreeMap<u32, BTreeSet<i64>> = BTreeMap::new();
    for r in in_hand.iter().filter(|r| r.offset < PROCESSED) {
        processed.entry(r.partition).or_default().insert(r.offset);
    }
    let first: Vec<(u32, i64)> = (0..PARTITIONS).map(|p| (p, PROCESSED)).collect();
    m1.commit(&first).await.unwrap();
    assert_no_commit_past(&kafka, &group, &topic, &processed).await;

    // Member 2 joins; both keep polling until the partitions are split between them.
    let mut m2 = kafka
        .subscriber()
        .subscribe(&group, &topic, "m2")
        .await
        .unwrap();
    let mut redelivered: Vec<Record> = Vec::new();
    let mut split = false;
    for _ in 0..90 {
        let (got1, got2) = poll_both(&mut m1, &mut m2).await;
        assert!(got1.is_empty(), "member 1 got records again: {got1:?}");
        redelivered.extend(got2);
        let (s1, s2): (BTreeSet<u32>, BTreeSet<u32>) = (
            m1.assignment().into_iter().collect(),
            m2.assignment().into_iter().collect(),
        );
        assert!(s1.is_disjoint(&s2), "both hold a partition: {s1:?} {s2:?}");
        if !s1.is_empty() && !s2.is_empty() && s1.len() + s2.len() == PARTITIONS as usize {
            split = true;
            break;
        }
    }
    assert!(split, "the partitions were never split");
    let moved = m2.assignment();
    let kept = m1.assignment();
    // The coordinator lists both members with partitions of the topic; no other group's.
    let inspector = kafka.inspector();
    let mut members = None;
    for _ in 0..20 {
        members = inspector.members(&group, &topic).await.unwrap();
        if members == Some(2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(members, Some(2));
    assert_eq!(
        inspector
            .members(&format!("{group}.none"), &topic)
            .await
            .unwrap(),
        Some(0)
    );
    assert_eq!(
        inspector
            .members(&group, &format!("{topic}.other"))
            .await
            .unwrap(),
        Some(0)
    );

    // Member 1 finishes its batch late: the moved partitions are refused, the kept ones commit.
    for p in &moved {
        let res = m1.commit(&[(*p, PER_PARTITION)]).await;
        assert!(
            matches!(res, Err(TransportError::NotAssigned { partition, .. }) if partition == *p),
            "commit of moved partition {p}: {res:?}"
        );
    }
    for p in &kept {
        for o in PROCESSED..PER_PARTITION {
            processed.entry(*p).or_default().insert(o);
        }
        m1.commit(&[(*p, PER_PARTITION)]).await.unwrap();
    }
    assert_no_commit_past(&kafka, &group, &topic, &processed).await;

    // Member 2 reads the records member 1 held unprocessed, from the last commit on.
    let want = moved.len() * (PER_PARTITION - PROCESSED) as usize;
    for _ in 0..30 {
        if redelivered.len() >= want {
            break;
        }
        let (got1, got2) = poll_both(&mut m1, &mut m2).await;
        assert!(got1.is_empty(), "member 1 got records again: {got1:?}");
        redelivered.extend(got2);
    }
    let mut by_partition: BTreeMap<u32, Vec<i64>> = BTreeMap::new();
    for r in &redelivered {
        by_partition.entry(r.partition).or_default().push(r.offset);
    }
    for p in &moved {
        assert_eq!(
            by_partition.get(p).cloned().unwrap_or_default(),
            (PROCESSED..PER_PARTITION).collect::<Vec<_>>(),
            "partition {p} redelivered"
        );
        for o in PROCESSED..PER_PARTITION {
            processed.entry(*p).or_default().insert(o);
        }
        m2.commit(&[(*p, PER_PARTITION)]).await.unwrap();
    }
    assert_no_commit_past(&kafka, &group, &topic, &processed).await;
    let committed = kafka.inspector().committed(&group, &topic).await.unwrap();
    let everything: Vec<(u32, i64)> = (0..PARTITIONS).map(|p| (p, PER_PARTITION)).collect();
    assert_eq!(committed, everything);
    m1.close().await.unwrap();
    m2.close().await.unwrap();
    let mut left = None;
    for _ in 0..40 {
        left = inspector.members(&group, &topic).await.unwrap();
        if left == Some(0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(left, Some(0), "members that left are not listed");
}
