//! Consumer groups on the log transport: partitions split between members, takeover after
//! the lease, fenced commits, commit-order offsets and LISTEN wake-ups.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::backend_db::{eventually, PgDb as TestDb, TestResult};
use entrega::broker::{DbLog, LogConfig};
use entrega_core::{
    Headers, ManualClock, MigrationSet, OutgoingMessage, Publisher, Subscriber, TopicAdmin,
    TransportError,
};
use sqlx::Connection;

fn message(topic: &str, key: &str, body: &str) -> OutgoingMessage {
    OutgoingMessage {
        topic: topic.to_owned(),
        key: Some(key.to_owned()),
        headers: Headers::new(),
        payload: body.as_bytes().to_vec(),
    }
}

fn manual_log(db: &TestDb, clock: &ManualClock) -> DbLog {
    DbLog::new(db.db.clone(), LogConfig::default(), Arc::new(clock.clone()))
}

/// Keys that land on each of `partitions` partitions, one per partition.
fn key_per_partition(partitions: u32) -> Vec<String> {
    let mut keys = vec![String::new(); partitions as usize];
    let mut i = 0;
    while keys.iter().any(String::is_empty) {
        let key = format!("K-{i}");
        let p = entrega_core::partition_for(&key, partitions) as usize;
        if keys[p].is_empty() {
            keys[p] = key;
        }
        i += 1;
    }
    keys
}

#[tokio::test]
async fn two_members_split_the_partitions() -> TestResult {
    let db = TestDb::with(&[MigrationSet::Log]).await?;
    let clock = ManualClock::new(1_000_000);
    let log = manual_log(&db, &clock);
    log.ensure_topic("t", 4).await?;
    let mut a = log.subscribe("g", "t", "a").await?;
    a.poll(10, Duration::ZERO).await?;
    assert_eq!(a.assignment(), vec![0, 1, 2, 3]);
    let mut b = log.subscribe("g", "t", "b").await?;
    b.poll(10, Duration::ZERO).await?;
    assert!(b.assignment().is_empty(), "a's leases are still valid");

    // One heartbeat later a gives back its surplus and b takes it.
    clock.advance(LogConfig::default().heartbeat.as_millis() as i64);
    a.poll(10, Duration::ZERO).await?;
    b.poll(10, Duration::ZERO).await?;
    let (held_a, held_b): (BTreeSet<u32>, BTreeSet<u32>) = (
        a.assignment().into_iter().collect(),
        b.assignment().into_iter().collect(),
    );
    assert_eq!((held_a.len(), held_b.len()), (2, 2));
    assert!(held_a.is_disjoint(&held_b));

    // Each member reads exactly its own partitions.
    let keys = key_per_partition(4);
    let batch: Vec<OutgoingMessage> = keys.iter().map(|k| message("t", k, k)).collect();
    log.publish(&batch).await?;
    let from_a = a.poll(10, Duration::ZERO).await?;
    let from_b = b.poll(10, Duration::ZERO).await?;
    assert!(from_a.iter().all(|r| held_a.contains(&r.partition)));
    assert!(from_b.iter().all(|r| held_b.contains(&r.partition)));
    assert_eq!(from_a.len() + from_b.len(), 4);

    // A member that leaves hands its partitions over at the others' next heartbeat,
    // without waiting for its leases to expire.
    a.close().await?;
    clock.advance(LogConfig::default().heartbeat.as_millis() as i64);
    b.poll(10, Duration::ZERO).await?;
    assert_eq!(b.assignment(), vec![0, 1, 2, 3]);
    db.drop().await
}

#[tokio::test]
async fn a_silent_member_is_taken_over_after_the_lease_and_fenced_out() -> TestResult {
    let db = TestDb::with(&[MigrationSet::Log]).await?;
    let clock = ManualClock::new(1_000_000);
    let log = manual_log(&db, &clock);
    log.ensure_topic("t", 2).await?;
    let keys = key_per_partition(2);
    let batch: Vec<OutgoingMessage> = (0..6)
        .map(|i| message("t", &keys[i % 2], &format!("{i}")))
        .collect();
    log.publish(&batch).await?;

    let mut old = log.subscribe("g", "t", "old").await?;
    let got = old.poll(100, Duration::ZERO).await?;
    assert_eq!(got.len(), 6);
    old.commit(&[(0, 2), (1, 1)]).await?;
    let mut new = log.subscribe("g", "t", "new").await?;
    assert!(new.poll(100, Duration::ZERO).await?.is_empty());
    assert!(new.assignment().is_empty());

    // "old" stops heartbeating; once its lease has passed "new" takes everything over and
    // resumes from the committed offsets.
    clock.advance(LogConfig::default().lease_ttl.as_millis() as i64 + 1);
    let resumed = new.poll(100, Duration::ZERO).await?;
    assert_eq!(new.assignment(), vec![0, 1]);
    let firsts: Vec<(u32, i64)> = [0u32, 1]
        .iter()
        .filter_map(|p| {
            resumed
                .iter()
                .find(|r| r.partition == *p)
                .map(|r| (*p, r.offset))
        })
        .collect();
    assert_eq!(firsts, vec![(0, 2), (1, 1)]);
    assert_eq!(resumed.len(), 3);

    // The stale member's commit is refused and changes nothing.
    let stale = old.commit(&[(0, 3), (1, 3)]).await;
    assert!(
        matches!(stale, Err(TransportError::NotAssigned { .. })),
        "{stale:?}"
    );
    assert_eq!(log.committed("g", "t").await?, vec![(0, 2), (1, 1)]);
    new.commit(&[(0, 3), (1, 3)]).await?;
    assert_eq!(log.committed("g", "t").await?, vec![(0, 3), (1, 3)]);
    db.drop().await
}

#[tokio::test]
async fn an_append_that_commits_late_is_never_skipped() -> TestResult {
    let db = TestDb::with(&[MigrationSet::Log]).await?;
    let log = DbLog::with_defaults(db.db.clone());
    log.ensure_topic("t", 1).await?;
    // Appends of key 'slow' stop inside their transaction (after taking their offset) until
    // the test lets them go.
    sqlx::raw_sql(
        "CREATE FUNCTION hold_slow() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.msg_key = 'slow' THEN PERFORM pg_advisory_xact_lock_shared(4242); END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER hold_slow BEFORE INSERT ON entrega_log
             FOR EACH ROW EXECUTE FUNCTION hold_slow();",
    )
    .execute(&db.pool)
    .await?;
    let mut gate = sqlx::PgConnection::connect(&db.url).await?;
    sqlx::query("SELECT pg_advisory_lock(4242)")
        .execute(&mut gate)
        .await?;
    let mut reader = log.subscribe("g", "t", "reader").await?;
    assert!(reader.poll(10, Duration::ZERO).await?.is_empty());

    let slow_log = log.clone();
    let slow = tokio::spawn(async move { slow_log.publish(&[message("t", "slow", "slow")]).await });
    let waiting = |locktype: &'static str| {
        let pool = db.pool.clone();
        move || {
            let pool = pool.clone();
            async move {
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
                     WHERE d.datname = current_database() AND NOT l.granted AND l.locktype = $1",
                )
                .bind(locktype)
                .fetch_one(&pool)
                .await?;
                Ok(n > 0)
            }
        }
    };
    assert!(eventually(Duration::from_secs(10), waiting("advisory")).await?);

    let fast_log = log.clone();
    let fast = tokio::spawn(async move { fast_log.publish(&[message("t", "fast", "fast")]).await });
    // The fast append either waits for the partition row or (if offsets were not allocated
    // under that lock) finishes; both are observable.
    let fast_settled = eventually(Duration::from_secs(10), || {
        let pool = db.pool.clone();
        let done = fast.is_finished();
        async move {
            let blocked: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .fetch_one(&pool)
            .await?;
            Ok(done || blocked >= 2)
        }
    })
    .await?;
    assert!(fast_settled);

    // While the slow append is open, no reader may see anything after its offset.
    assert!(
        log.read("t", 0, 0, 10).await?.is_empty(),
        "a later offset became visible first"
    );
    assert!(reader
        .poll(10, Duration::from_millis(200))
        .await?
        .is_empty());

    sqlx::query("SELECT pg_advisory_unlock(4242)")
        .execute(&mut gate)
        .await?;
    slow.await??;
    fast.await??;
    let seen = {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut seen = Vec::new();
        while seen.len() < 2 && tokio::time::Instant::now() < deadline {
            seen.extend(reader.poll(10, Duration::from_millis(200)).await?);
        }
        seen
    };
    let got: Vec<(i64, Option<String>)> = seen.iter().map(|r| (r.offset, r.key.clone())).collect();
    assert_eq!(
        got,
        vec![(0, Some("slow".into())), (1, Some("fast".into()))]
    );
    db.drop().await
}

#[tokio::test]
async fn a_publish_wakes_an_idle_subscription_promptly() -> TestResult {
    let db = TestDb::with(&[MigrationSet::Log]).await?;
    // Long fallback intervals: only the notification can end the wait early.
    let config = LogConfig {
        lease_ttl: Duration::from_secs(120),
        heartbeat: Duration::from_secs(40),
        poll_interval: Duration::from_secs(40),
        auto_create_partitions: None,
    };
    let log = DbLog::new(db.db.clone(), config, Arc::new(entrega_core::SystemClock));
    log.ensure_topic("t", 2).await?;
    let mut sub = log.subscribe("g", "t", "m").await?;
    assert!(sub.poll(10, Duration::from_millis(300)).await?.is_empty());
    assert_eq!(sub.assignment(), vec![0, 1]);

    let task = tokio::spawn(async move {
        let started = Instant::now();
        let records = sub.poll(10, Duration::from_secs(30)).await;
        (records, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!task.is_finished(), "the poll returned without a publish");
    log.publish(&[message("t", "k", "hola")]).await?;
    let (records, waited) = tokio::time::timeout(Duration::from_secs(20), task).await??;
    let records = records?;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].payload, b"hola");
    assert!(waited < Duration::from_secs(5), "woke after {waited:?}");
    db.drop().await
}

#[tokio::test]
async fn members_counts_those_heard_from_within_a_lease() -> TestResult {
    use entrega_core::LogInspector;
    let db = TestDb::with(&[MigrationSet::Log]).await?;
    let clock = ManualClock::new(1_000_000);
    let log = manual_log(&db, &clock);
    log.ensure_topic("t", 2).await?;
    assert_eq!(LogInspector::members(&log, "g", "t").await?, Some(0));
    let mut a = log.subscribe("g", "t", "a").await?;
    a.poll(10, Duration::ZERO).await?;
    let mut b = log.subscribe("g", "t", "b").await?;
    b.poll(10, Duration::ZERO).await?;
    assert_eq!(LogInspector::members(&log, "g", "t").await?, Some(2));
    assert_eq!(LogInspector::members(&log, "other", "t").await?, Some(0));
    // One leaves; the other goes silent past its lease.
    a.close().await?;
    assert_eq!(LogInspector::members(&log, "g", "t").await?, Some(1));
    clock.advance(LogConfig::default().lease_ttl.as_millis() as i64 + 1);
    assert_eq!(LogInspector::members(&log, "g", "t").await?, Some(0));
    b.poll(10, Duration::ZERO).await?;
    assert_eq!(LogInspector::members(&log, "g", "t").await?, Some(1));
    Ok(())
}
