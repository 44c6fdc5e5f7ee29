//! The log transport on SQLite: publish, poll, commit, groups with fenced leases.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::backend_db::SqliteDb as TestDb;
use entrega::broker::{DbLog, LogConfig};
use entrega_core::{
    partition_for, Headers, ManualClock, MigrationSet, OutgoingMessage, Publisher, Record,
    Subscriber, Subscription, TopicAdmin, TransportError,
};

const T0: i64 = 1_800_000_000_000;
const TTL_MS: i64 = 10_000;
const HEARTBEAT_MS: i64 = 3_000;

fn message(topic: &str, key: Option<&str>, body: &str) -> OutgoingMessage {
    OutgoingMessage {
        topic: topic.into(),
        key: key.map(Into::into),
        headers: Headers::new()
            .with("tipo", "pedido.creado")
            .with("id_evento", body),
        payload: body.as_bytes().to_vec(),
    }
}

/// A log on a manual clock, so heartbeats and lease expiry happen when the test says.
async fn manual_log(partitions: u32) -> (TestDb, DbLog, ManualClock) {
    let db = TestDb::new(&[MigrationSet::Log]).await;
    let clock = ManualClock::new(T0);
    let config = LogConfig {
        lease_ttl: Duration::from_millis(TTL_MS as u64),
        heartbeat: Duration::from_millis(HEARTBEAT_MS as u64),
        poll_interval: Duration::from_millis(10),
        auto_create_partitions: None,
    };
    let log = DbLog::new(db.db.clone(), config, Arc::new(clock.clone()));
    assert_eq!(
        log.ensure_topic("pedidos.eventos", partitions)
            .await
            .unwrap(),
        partitions
    );
    (db, log, clock)
}

/// Polls until `want` records arrived or five seconds passed.
async fn poll_until(sub: &mut Box<dyn Subscription>, want: usize) -> Vec<Record> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    while got.len() < want && Instant::now() < deadline {
        got.extend(sub.poll(100, Duration::from_millis(100)).await.unwrap());
    }
    got
}

fn owned(subs: &[&dyn Subscription]) -> Vec<u32> {
    let mut all: Vec<u32> = subs.iter().flat_map(|s| s.assignment()).collect();
    all.sort_unstable();
    all
}

#[tokio::test]
async fn published_records_are_polled_in_key_order_and_committed() {
    let (_db, log, _clock) = manual_log(3).await;
    let keys = ["P-1", "P-2", "P-3", "P-4"];
    let batch: Vec<_> = (0..20)
        .map(|i| {
            message(
                "pedidos.eventos",
                Some(keys[i % 4]),
                &format!("{}#{i}", keys[i % 4]),
            )
        })
        .collect();
    log.publish(&batch[..10]).await.unwrap();
    log.publish(&batch[10..]).await.unwrap();

    let mut sub = log
        .subscribe("inventario", "pedidos.eventos", "m1")
        .await
        .unwrap();
    let records = poll_until(&mut sub, 20).await;
    assert_eq!(records.len(), 20);
    assert_eq!(sub.assignment(), vec![0, 1, 2]);
    for key in keys {
        let of_key: Vec<_> = records
            .iter()
            .filter(|r| r.key.as_deref() == Some(key))
            .collect();
        let bodies: Vec<String> = of_key
            .iter()
            .map(|r| String::from_utf8(r.payload.clone()).unwrap())
            .collect();
        let expected: Vec<String> = (0..20)
            .filter(|i| keys[i % 4] == key)
            .map(|i| format!("{key}#{i}"))
            .collect();
        assert_eq!(bodies, expected, "order of {key}");
        assert!(of_key.iter().all(|r| r.partition == partition_for(key, 3)));
        assert!(of_key.windows(2).all(|w| w[0].offset < w[1].offset));
    }
    assert_eq!(records[0].headers.get("tipo"), Some("pedido.creado"));
    assert_eq!(records[0].timestamp_ms, T0);

    let ends = log.end_offsets("pedidos.eventos").await.unwrap();
    assert_eq!(ends.iter().map(|(_, n)| n).sum::<i64>(), 20);
    sub.commit(&ends).await.unwrap();
    assert_eq!(
        log.committed("inventario", "pedidos.eventos")
            .await
            .unwrap(),
        ends
    );

    // A member joining after a clean close starts from the committed offsets.
    sub.close().await.unwrap();
    let mut next = log
        .subscribe("inventario", "pedidos.eventos", "m2")
        .await
        .unwrap();
    assert!(next
        .poll(100, Duration::from_millis(50))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(next.assignment(), vec![0, 1, 2]);
    log.publish(&[message("pedidos.eventos", Some("P-1"), "late")])
        .await
        .unwrap();
    let late = poll_until(&mut next, 1).await;
    assert_eq!(late.len(), 1);
    assert_eq!(late[0].payload, b"late");
}

#[tokio::test]
async fn unknown_topics_are_refused_unless_auto_created() {
    let db = TestDb::new(&[MigrationSet::Log]).await;
    let log = DbLog::with_defaults(db.db.clone());
    let err = log
        .publish(&[message("nada", None, "x")])
        .await
        .unwrap_err();
    assert!(
        matches!(err, TransportError::UnknownTopic { .. }),
        "{err:?}"
    );
    assert!(!err.is_transient());
    assert!(
        log.end_offsets("nada").await.unwrap().is_empty(),
        "nothing written"
    );
    let err = log.subscribe("g", "nada", "m").await.err().unwrap();
    assert!(
        matches!(err, TransportError::UnknownTopic { .. }),
        "{err:?}"
    );

    let auto = DbLog::new(
        db.db.clone(),
        LogConfig {
            auto_create_partitions: Some(2),
            ..LogConfig::default()
        },
        Arc::new(entrega_core::SystemClock),
    );
    auto.publish(&[message("nada", Some("k"), "x")])
        .await
        .unwrap();
    assert_eq!(log.end_offsets("nada").await.unwrap().len(), 2);
    assert_eq!(
        log.ensure_topic("nada", 8).await.unwrap(),
        2,
        "an existing topic keeps its count"
    );
    assert!(matches!(
        log.ensure_topic("vacio", 0).await.unwrap_err(),
        TransportError::Rejected { .. }
    ));
}

#[tokio::test]
async fn keyless_messages_spread_and_read_returns_them() {
    let (_db, log, _clock) = manual_log(4).await;
    // The keyless messages of one call stay together; the next call's go to the next
    // partition.
    for call in 0..4 {
        let batch: Vec<_> = (0..2)
            .map(|i| message("pedidos.eventos", None, &format!("{call}-{i}")))
            .collect();
        log.publish(&batch).await.unwrap();
    }
    let ends = log.end_offsets("pedidos.eventos").await.unwrap();
    assert_eq!(ends, vec![(0, 2), (1, 2), (2, 2), (3, 2)]);
    let records = log.read("pedidos.eventos", 2, 1, 10).await.unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].offset, 1);
    assert_eq!(records[0].key, None);
}

#[tokio::test]
async fn two_members_split_the_partitions() {
    let (_db, log, clock) = manual_log(4).await;
    let mut a = log.subscribe("g", "pedidos.eventos", "a").await.unwrap();
    let mut b = log.subscribe("g", "pedidos.eventos", "b").await.unwrap();
    a.poll(10, Duration::ZERO).await.unwrap();
    b.poll(10, Duration::ZERO).await.unwrap();
    assert_eq!(a.assignment().len(), 2);
    assert_eq!(b.assignment().len(), 2);
    assert_eq!(owned(&[a.as_ref(), b.as_ref()]), vec![0, 1, 2, 3]);

    // Heartbeats keep the split stable.
    clock.advance(HEARTBEAT_MS);
    a.poll(10, Duration::ZERO).await.unwrap();
    b.poll(10, Duration::ZERO).await.unwrap();
    assert_eq!(owned(&[a.as_ref(), b.as_ref()]), vec![0, 1, 2, 3]);

    // Records of each partition reach only its holder.
    let batch: Vec<_> = (0..40)
        .map(|i| message("pedidos.eventos", Some(&format!("k{i}")), "x"))
        .collect();
    log.publish(&batch).await.unwrap();
    let from_a = poll_until(&mut a, 1).await;
    assert!(from_a.iter().all(|r| a.assignment().contains(&r.partition)));
    let from_b = poll_until(&mut b, 1).await;
    assert!(from_b.iter().all(|r| b.assignment().contains(&r.partition)));
    assert_eq!(from_a.len() + from_b.len(), 40);
}

#[tokio::test]
async fn a_silent_member_loses_its_partitions_after_the_ttl_and_cannot_commit() {
    let (_db, log, clock) = manual_log(4).await;
    let mut a = log.subscribe("g", "pedidos.eventos", "a").await.unwrap();
    let mut b = log.subscribe("g", "pedidos.eventos", "b").await.unwrap();
    a.poll(10, Duration::ZERO).await.unwrap();
    b.poll(10, Duration::ZERO).await.unwrap();
    let of_a = a.assignment();
    assert_eq!(of_a.len(), 2);
    let batch: Vec<_> = (0..40)
        .map(|i| message("pedidos.eventos", Some(&format!("k{i}")), "x"))
        .collect();
    log.publish(&batch).await.unwrap();
    let read_by_a = poll_until(&mut a, 1).await;
    assert!(!read_by_a.is_empty());
    // a commits part of its progress, then goes silent.
    let p = of_a[0];
    a.commit(&[(p, 1)]).await.unwrap();

    // b heartbeats on; a's leases are not expired yet.
    clock.advance(TTL_MS - HEARTBEAT_MS);
    b.poll(10, Duration::ZERO).await.unwrap();
    assert_eq!(b.assignment().len(), 2, "a's leases have not expired yet");

    // One heartbeat later a has been silent for a whole TTL.
    clock.advance(HEARTBEAT_MS);
    let taken_over = b.poll(1000, Duration::ZERO).await.unwrap();
    assert_eq!(b.assignment(), vec![0, 1, 2, 3]);
    // b resumes a's partitions from a's committed offsets.
    let first_of_p = taken_over
        .iter()
        .filter(|r| r.partition == p)
        .map(|r| r.offset)
        .min();
    assert_eq!(first_of_p, Some(1));

    // a comes back with its stale token: the commit is refused and nothing is written.
    let err = a.commit(&[(p, 5)]).await.unwrap_err();
    assert!(
        matches!(err, TransportError::NotAssigned { partition, .. } if partition == p),
        "{err:?}"
    );
    let committed: HashMap<u32, i64> = log
        .committed("g", "pedidos.eventos")
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(committed.get(&p), Some(&1));
    assert!(!a.assignment().contains(&p));
}

#[tokio::test]
async fn a_commit_with_a_stale_token_changes_nothing_even_when_the_partition_came_back() {
    let (_db, log, clock) = manual_log(1).await;
    let mut a = log.subscribe("g", "pedidos.eventos", "a").await.unwrap();
    a.poll(10, Duration::ZERO).await.unwrap();
    assert_eq!(a.assignment(), vec![0]);

    // b takes the partition over after a's lease expired, commits, and leaves.
    clock.advance(TTL_MS);
    let mut b = log.subscribe("g", "pedidos.eventos", "b").await.unwrap();
    b.poll(10, Duration::ZERO).await.unwrap();
    assert_eq!(b.assignment(), vec![0]);
    b.commit(&[(0, 7)]).await.unwrap();
    b.close().await.unwrap();

    // A second instance running under a's member name takes the partition back: same owner
    // as the first instance, newer token.
    let mut a_again = log.subscribe("g", "pedidos.eventos", "a").await.unwrap();
    a_again.poll(10, Duration::ZERO).await.unwrap();
    assert_eq!(a_again.assignment(), vec![0]);

    // The first instance has not rebalanced and still believes it holds partition 0.
    assert_eq!(a.assignment(), vec![0]);
    let err = a.commit(&[(0, 3)]).await.unwrap_err();
    assert!(
        matches!(err, TransportError::NotAssigned { partition: 0, .. }),
        "{err:?}"
    );
    assert!(err.is_transient());
    assert_eq!(
        log.committed("g", "pedidos.eventos").await.unwrap(),
        vec![(0, 7)]
    );
    assert!(
        a.assignment().is_empty(),
        "a refused partition is no longer read"
    );

    a_again.commit(&[(0, 8)]).await.unwrap();
    assert_eq!(
        log.committed("g", "pedidos.eventos").await.unwrap(),
        vec![(0, 8)]
    );

    // Taken over by another member: refused as well.
    clock.advance(TTL_MS);
    let mut c = log.subscribe("g", "pedidos.eventos", "c").await.unwrap();
    c.poll(10, Duration::ZERO).await.unwrap();
    assert_eq!(c.assignment(), vec![0]);
    let err = a_again.commit(&[(0, 9)]).await.unwrap_err();
    assert!(matches!(err, TransportError::NotAssigned { .. }), "{err:?}");
    assert_eq!(
        log.committed("g", "pedidos.eventos").await.unwrap(),
        vec![(0, 8)]
    );

    // Committing a partition never held is refused too.
    assert!(matches!(
        c.commit(&[(5, 1)]).await.unwrap_err(),
        TransportError::NotAssigned { .. }
    ));
}

#[tokio::test]
async fn closing_hands_partitions_over_at_once() {
    let (_db, log, clock) = manual_log(4).await;
    let mut a = log.subscribe("g", "pedidos.eventos", "a").await.unwrap();
    let mut b = log.subscribe("g", "pedidos.eventos", "b").await.unwrap();
    a.poll(10, Duration::ZERO).await.unwrap();
    b.poll(10, Duration::ZERO).await.unwrap();
    a.close().await.unwrap();
    assert!(a.assignment().is_empty());
    assert!(
        a.poll(10, Duration::ZERO).await.is_err(),
        "a closed subscription does not poll"
    );
    // No TTL wait: the next heartbeat of b takes everything.
    clock.advance(HEARTBEAT_MS);
    b.poll(10, Duration::ZERO).await.unwrap();
    assert_eq!(b.assignment(), vec![0, 1, 2, 3]);
    let members: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM entrega_group_members WHERE group_id = 'g'")
            .fetch_one(log.db().sqlite().unwrap())
            .await
            .unwrap();
    assert_eq!(members, 1);
}

#[tokio::test]
async fn seek_redelivers_and_pause_holds_a_partition_back() {
    let (_db, log, _clock) = manual_log(2).await;
    let key0 = (0..100)
        .map(|i| format!("k{i}"))
        .find(|k| partition_for(k, 2) == 0)
        .unwrap();
    let key1 = (0..100)
        .map(|i| format!("k{i}"))
        .find(|k| partition_for(k, 2) == 1)
        .unwrap();
    log.publish(&[
        message("pedidos.eventos", Some(&key0), "a0"),
        message("pedidos.eventos", Some(&key0), "a1"),
    ])
    .await
    .unwrap();
    let mut sub = log.subscribe("g", "pedidos.eventos", "m").await.unwrap();
    assert_eq!(poll_until(&mut sub, 2).await.len(), 2);

    sub.seek(0, 1);
    let again = poll_until(&mut sub, 1).await;
    assert_eq!(again.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![1]);

    sub.pause_for(0, Duration::from_millis(300));
    let paused_at = Instant::now();
    log.publish(&[
        message("pedidos.eventos", Some(&key0), "a2"),
        message("pedidos.eventos", Some(&key1), "b0"),
    ])
    .await
    .unwrap();
    let first = poll_until(&mut sub, 1).await;
    assert_eq!(
        first.iter().map(|r| r.partition).collect::<BTreeSet<_>>(),
        BTreeSet::from([1])
    );
    let resumed = poll_until(&mut sub, 1).await;
    assert_eq!(resumed.len(), 1);
    assert_eq!(resumed[0].payload, b"a2");
    assert!(paused_at.elapsed() >= Duration::from_millis(290));
}

#[tokio::test]
async fn an_append_in_this_process_wakes_a_waiting_poll() {
    let db = TestDb::new(&[MigrationSet::Log]).await;
    // No polling fallback to speak of: only the in-process wake-up can end the wait early.
    let config = LogConfig {
        poll_interval: Duration::from_secs(60),
        ..LogConfig::default()
    };
    let log = DbLog::new(db.db.clone(), config, Arc::new(entrega_core::SystemClock));
    log.ensure_topic("t", 1).await.unwrap();
    let mut sub = log.subscribe("g", "t", "m").await.unwrap();
    assert!(sub.poll(10, Duration::ZERO).await.unwrap().is_empty());
    let waiter = tokio::spawn(async move { sub.poll(10, Duration::from_secs(60)).await });
    log.publish(&[message("t", None, "hola")]).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the poll was not woken by the append")
        .unwrap()
        .unwrap();
    assert_eq!(got.len(), 1);
}
