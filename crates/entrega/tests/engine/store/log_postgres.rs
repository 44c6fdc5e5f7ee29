//! The log transport: publish/poll/commit, per-key order, topics, seek and pause.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::backend_db::{PgDb as TestDb, TestResult};
use entrega::broker::{DbLog, LogConfig};
use entrega_core::{
    Headers, ManualClock, MigrationSet, OutgoingMessage, Publisher, Record, Subscriber,
    Subscription, TopicAdmin, TransportError,
};

fn message(topic: &str, key: Option<&str>, body: &str) -> OutgoingMessage {
    OutgoingMessage {
        topic: topic.to_owned(),
        key: key.map(str::to_owned),
        headers: Headers::new().with("tipo", "prueba").with("cuerpo", body),
        payload: body.as_bytes().to_vec(),
    }
}

fn body(r: &Record) -> String {
    String::from_utf8_lossy(&r.payload).into_owned()
}

/// Polls until `want` records arrived or 10 s passed.
async fn poll_n(
    sub: &mut dyn Subscription,
    want: usize,
) -> Result<Vec<Record>, super::backend_db::Error> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    while got.len() < want && tokio::time::Instant::now() < deadline {
        got.extend(
            sub.poll(want - got.len(), Duration::from_millis(200))
                .await?,
        );
    }
    Ok(got)
}

#[tokio::test]
async fn published_records_are_polled_in_key_order_and_committed() -> TestResult {
    let db = TestDb::with(&[MigrationSet::Log]).await?;
    let log = DbLog::with_defaults(db.db.clone());
    assert_eq!(log.ensure_topic("pedidos.eventos", 3).await?, 3);
    assert_eq!(
        log.ensure_topic("pedidos.eventos", 8).await?,
        3,
        "count is fixed"
    );

    let batch: Vec<OutgoingMessage> = (0..20)
        .map(|i| {
            message(
                "pedidos.eventos",
                Some(&format!("P-{}", i % 5)),
                &format!("{i}"),
            )
        })
        .collect();
    log.publish(&batch[..12]).await?;
    log.publish(&batch[12..]).await?;
    let ends: i64 = log
        .end_offsets("pedidos.eventos")
        .await?
        .iter()
        .map(|e| e.1)
        .sum();
    assert_eq!(ends, 20);

    let mut sub = log.subscribe("analitica", "pedidos.eventos", "m1").await?;
    let records = poll_n(sub.as_mut(), 20).await?;
    assert_eq!(records.len(), 20);
    assert_eq!(sub.assignment(), vec![0, 1, 2]);
    let mut per_key: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let mut last_offset: BTreeMap<u32, i64> = BTreeMap::new();
    for r in &records {
        let key = r.key.clone().ok_or("key lost")?;
        assert_eq!(r.partition, entrega_core::partition_for(&key, 3));
        assert_eq!(r.headers.get("cuerpo"), Some(body(r).as_str()));
        per_key.entry(key).or_default().push(body(r).parse()?);
        let previous = last_offset.insert(r.partition, r.offset);
        assert!(
            previous.is_none_or(|p| p + 1 == r.offset),
            "offsets in order, no gap"
        );
    }
    for (key, seen) in &per_key {
        let mut sorted = seen.clone();
        sorted.sort_unstable();
        assert_eq!(seen, &sorted, "order of {key} kept");
        assert_eq!(seen.len(), 4);
    }

    // Commit all but the last record of the partition of P-0, then a new member resumes there.
    let p0 = entrega_core::partition_for("P-0", 3);
    let mut commits: Vec<(u32, i64)> = last_offset.iter().map(|(p, o)| (*p, o + 1)).collect();
    for c in &mut commits {
        if c.0 == p0 {
            c.1 -= 1;
        }
    }
    sub.commit(&commits).await?;
    assert_eq!(
        log.committed("analitica", "pedidos.eventos").await?,
        commits
    );
    sub.close().await?;
    assert!(
        sub.poll(1, Duration::ZERO).await.is_err(),
        "a closed subscription polls no more"
    );

    let mut next = log.subscribe("analitica", "pedidos.eventos", "m2").await?;
    let again = poll_n(next.as_mut(), 1).await?;
    assert_eq!(again.len(), 1);
    let last_of_p0 = records
        .iter()
        .filter(|r| r.partition == p0)
        .max_by_key(|r| r.offset)
        .ok_or("partition of P-0 empty")?;
    assert_eq!(
        again[0], *last_of_p0,
        "only the uncommitted record comes again"
    );
    assert!(next.poll(10, Duration::from_millis(100)).await?.is_empty());
    // Another group reads everything from the start.
    let mut other = log.subscribe("catalogo", "pedidos.eventos", "c1").await?;
    assert_eq!(poll_n(other.as_mut(), 20).await?.len(), 20);
    db.drop().await
}

#[tokio::test]
async fn unknown_topics_are_refused_unless_auto_created() -> TestResult {
    let db = TestDb::with(&[MigrationSet::Log]).await?;
    let log = DbLog::with_defaults(db.db.clone());
    let refused = log.publish(&[message("nadie", None, "x")]).await;
    assert!(
        matches!(refused, Err(TransportError::UnknownTopic { .. })),
        "{refused:?}"
    );
    let refused = log.subscribe("g", "nadie", "m").await;
    assert!(matches!(refused, Err(TransportError::UnknownTopic { .. })));
    assert!(log.end_offsets("nadie").await?.is_empty());
    assert!(matches!(
        log.ensure_topic("cero", 0).await,
        Err(TransportError::Rejected { .. })
    ));

    let config = LogConfig {
        auto_create_partitions: Some(2),
        ..LogConfig::default()
    };
    let auto = DbLog::new(db.db.clone(), config, Arc::new(entrega_core::SystemClock));
    let batch: Vec<OutgoingMessage> = (0..4)
        .map(|i| message("nuevo", None, &format!("{i}")))
        .collect();
    auto.publish(&batch).await?;
    let ends = auto.end_offsets("nuevo").await?;
    assert_eq!(ends.len(), 2);
    assert_eq!(ends.iter().map(|e| e.1).sum::<i64>(), 4);
    // A keyless batch lands in one partition, in order.
    let full = ends
        .iter()
        .find(|e| e.1 == 4)
        .ok_or("keyless batch was split")?;
    let read = auto.read("nuevo", full.0, 0, 10).await?;
    let bodies: Vec<String> = read.iter().map(body).collect();
    assert_eq!(bodies, ["0", "1", "2", "3"]);
    db.drop().await
}

#[tokio::test]
async fn seek_redelivers_and_pause_holds_a_partition_back() -> TestResult {
    let db = TestDb::with(&[MigrationSet::Log]).await?;
    let clock = ManualClock::new(1_000_000);
    let log = DbLog::new(db.db.clone(), LogConfig::default(), Arc::new(clock.clone()));
    log.ensure_topic("t", 1).await?;
    log.publish(&[message("t", Some("k"), "a"), message("t", Some("k"), "b")])
        .await?;
    let mut sub = log.subscribe("g", "t", "m").await?;
    let first = sub.poll(10, Duration::ZERO).await?;
    assert_eq!(first.iter().map(body).collect::<Vec<_>>(), ["a", "b"]);

    sub.seek(0, 1);
    let again = sub.poll(10, Duration::ZERO).await?;
    assert_eq!(again.iter().map(body).collect::<Vec<_>>(), ["b"]);

    sub.seek(0, 0);
    sub.pause_for(0, Duration::from_secs(5));
    assert!(sub.poll(10, Duration::from_millis(100)).await?.is_empty());
    clock.advance(5_000);
    let resumed = sub.poll(10, Duration::ZERO).await?;
    assert_eq!(resumed.iter().map(body).collect::<Vec<_>>(), ["a", "b"]);

    // Commits are refused for partitions never held.
    let refused = sub.commit(&[(7, 1)]).await;
    assert!(matches!(
        refused,
        Err(TransportError::NotAssigned { partition: 7, .. })
    ));
    db.drop().await
}
