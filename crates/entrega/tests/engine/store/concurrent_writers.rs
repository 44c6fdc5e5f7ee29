//! Several writers on one database file, as separate processes would share it.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::backend_db::SqliteDb as TestDb;
use entrega::broker::DbLog;
use entrega_core::{Headers, MigrationSet, OutgoingMessage, Publisher, StoreError, TopicAdmin};
use entrega_sqlite::classify;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};

const TOPIC: &str = "inventario.eventos";
const POOLS: usize = 2;
const TASKS: usize = 4;
const BATCHES: usize = 25;
const PER_BATCH: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appenders_on_two_pools_never_duplicate_or_skip_offsets() {
    let db = TestDb::new(&[MigrationSet::Log]).await;
    let first = DbLog::with_defaults(db.db.clone());
    first.ensure_topic(TOPIC, 2).await.unwrap();
    let logs = [first, DbLog::with_defaults(db.another_pool().await.into())];

    // A reader follows partition 0 while the writers run: every read must continue exactly
    // where the previous one ended, or a late commit slipped in behind it.
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let log = logs[0].clone();
        let done = Arc::clone(&done);
        tokio::spawn(async move {
            let mut next = 0;
            loop {
                let finished = done.load(Ordering::SeqCst);
                let records = log.read(TOPIC, 0, next, 1000).await.unwrap();
                for r in &records {
                    assert_eq!(
                        r.offset, next,
                        "a reader saw a gap or a smaller offset appear"
                    );
                    next += 1;
                }
                if finished && records.is_empty() {
                    return next;
                }
                tokio::task::yield_now().await;
            }
        })
    };

    let mut writers = Vec::new();
    for (p, log) in logs.iter().enumerate().take(POOLS) {
        for t in 0..TASKS {
            let log = log.clone();
            writers.push(tokio::spawn(async move {
                let key = format!("w{p}-{t}");
                for b in 0..BATCHES {
                    let batch: Vec<_> = (0..PER_BATCH)
                        .map(|i| {
                            let seq = b * PER_BATCH + i;
                            OutgoingMessage {
                                topic: TOPIC.into(),
                                // Half the writers use a key, half spread keyless messages.
                                key: (t % 2 == 0).then(|| key.clone()),
                                headers: Headers::new().with("writer", key.clone()),
                                payload: format!("{key}:{seq}").into_bytes(),
                            }
                        })
                        .collect();
                    log.publish(&batch).await.unwrap();
                }
            }));
        }
    }
    for w in writers {
        w.await.unwrap();
    }
    done.store(true, Ordering::SeqCst);

    let total = POOLS * TASKS * BATCHES * PER_BATCH;
    let ends = logs[1].end_offsets(TOPIC).await.unwrap();
    assert_eq!(ends.iter().map(|(_, n)| *n as usize).sum::<usize>(), total);
    assert_eq!(
        reader.await.unwrap(),
        ends[0].1,
        "the follower read partition 0 to its end"
    );

    let mut seen = HashSet::new();
    let mut last_seq: HashMap<String, usize> = HashMap::new();
    for (partition, end) in ends {
        let records = logs[0].read(TOPIC, partition, 0, total).await.unwrap();
        let offsets: Vec<i64> = records.iter().map(|r| r.offset).collect();
        assert_eq!(
            offsets,
            (0..end).collect::<Vec<_>>(),
            "partition {partition} is dense"
        );
        for r in records {
            let body = String::from_utf8(r.payload).unwrap();
            assert!(seen.insert(body.clone()), "{body} appended twice");
            if r.key.is_some() {
                let (key, seq) = body.split_once(':').unwrap();
                let seq: usize = seq.parse().unwrap();
                if let Some(prev) = last_seq.insert(key.to_owned(), seq) {
                    assert!(prev < seq, "{key}: {seq} after {prev}");
                }
            }
        }
    }
    assert_eq!(seen.len(), total, "every message is there exactly once");
}

#[tokio::test]
async fn a_writer_locked_out_past_its_busy_timeout_gets_a_transient_error() {
    let db = TestDb::new(&[MigrationSet::Outbox]).await;
    let mut holder = db.pool.acquire().await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut *holder)
        .await
        .unwrap();

    let path = db.url.trim_start_matches("sqlite://");
    let mut impatient = SqliteConnectOptions::new()
        .filename(path)
        .busy_timeout(Duration::from_millis(20))
        .connect()
        .await
        .unwrap();
    let err = sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut impatient)
        .await
        .unwrap_err();
    let err = classify(err);
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    assert!(err.is_transient());

    sqlx::query("ROLLBACK").execute(&mut *holder).await.unwrap();
    impatient.close().await.unwrap();
}

const CHILD_URL: &str = "ENTREGA_SQLITE_CHILD_URL";
const CHILD_ID: &str = "ENTREGA_SQLITE_CHILD_ID";
const PROCESSES: usize = 3;

/// The body of the child processes of `appenders_in_separate_processes_share_one_file`;
/// does nothing when run as an ordinary test.
#[tokio::test]
async fn child_appender() {
    let (Ok(url), Ok(id)) = (std::env::var(CHILD_URL), std::env::var(CHILD_ID)) else {
        return;
    };
    let log = DbLog::with_defaults(entrega_sqlite::connect(&url).await.unwrap().into());
    for b in 0..BATCHES {
        let batch: Vec<_> = (0..PER_BATCH)
            .map(|i| OutgoingMessage {
                topic: TOPIC.into(),
                key: Some(format!("proc-{id}")),
                headers: Headers::new(),
                payload: format!("proc-{id}:{}", b * PER_BATCH + i).into_bytes(),
            })
            .collect();
        log.publish(&batch).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appenders_in_separate_processes_share_one_file() {
    let db = TestDb::new(&[MigrationSet::Log]).await;
    let log = DbLog::with_defaults(db.db.clone());
    log.ensure_topic(TOPIC, 1).await.unwrap();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..PROCESSES)
        .map(|id| {
            tokio::process::Command::new(&exe)
                .args([
                    "--exact",
                    "store::concurrent_writers::child_appender",
                    "--test-threads=1",
                    "--quiet",
                ])
                .env(CHILD_URL, &db.url)
                .env(CHILD_ID, id.to_string())
                .kill_on_drop(true)
                .output()
        })
        .collect();
    for output in futures_join(children).await {
        let output = output.unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    let total = PROCESSES * BATCHES * PER_BATCH;
    let records = log.read(TOPIC, 0, 0, total + 1).await.unwrap();
    let offsets: Vec<i64> = records.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, (0..total as i64).collect::<Vec<_>>());
    let mut last: HashMap<String, usize> = HashMap::new();
    for r in records {
        let body = String::from_utf8(r.payload).unwrap();
        let (key, seq) = body.split_once(':').unwrap();
        let seq: usize = seq.parse().unwrap();
        let expected = last.get(key).map_or(0, |s| s + 1);
        assert_eq!(seq, expected, "{key} out of order or duplicated");
        last.insert(key.to_owned(), seq);
    }
    assert_eq!(last.len(), PROCESSES);
}

/// Awaits every future concurrently, keeping their order.
async fn futures_join<F>(futures: Vec<F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}
