//! Per-key concurrency on the in-memory log and on the SQLite log: keys overlap, one key never
//! does and keeps its order, the commit point waits for the lowest unfinished message, and a
//! crash with chains in flight loses nothing.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use entrega::{Backoff, Router, WorkerConfig};
use entrega_core::{Headers, OutgoingMessage, Record, SystemClock};
use entrega_testkit::{wait_until, Fault, FlakyPublisher, LogFixture};
use futures::future::{ready, BoxFuture, FutureExt};
use support::handlers::Step;
use support::observed::Observed;
use support::worker_steps::{
    caught_up, config, dead_letters, header, setup, wait_caught_up, Running, DLQ, GROUP, PATIENCE,
    TOPIC,
};
use support::{all_records, event_message, Backend, Env};
use tokio::task::JoinHandle;
use tokio::time::Instant;

const TIPO: &str = "pedido.creado";

fn keyed(n: usize) -> WorkerConfig {
    config().with_key_concurrency(n)
}

fn router(handler: Arc<Observed>) -> Router {
    Router::new().route(TIPO, handler)
}

/// Publishes `per_key` messages for each key, round by round (k0 n0, k1 n0, ..., k0 n1, ...),
/// so the keys interleave in every partition. Returns the records as stored.
async fn publish_interleaved(env: &Env, keys: &[&str], per_key: u32) -> Vec<Record> {
    publish_runs(env, keys, per_key, 1).await
}

/// Like [`publish_interleaved`], with `run` consecutive messages of a key in each round.
async fn publish_runs(env: &Env, keys: &[&str], per_key: u32, run: u32) -> Vec<Record> {
    let mut batch = Vec::new();
    for round in 0..per_key.div_ceil(run) {
        for key in keys {
            for n in (round * run..(round + 1) * run).filter(|n| *n < per_key) {
                batch.push(event_message(TOPIC, key, TIPO, n).1);
            }
        }
    }
    env.log.publisher().publish(&batch).await.unwrap();
    all_records(env.log.as_ref(), TOPIC).await
}

fn id_of(record: &Record) -> String {
    header(record, "id_evento").to_owned()
}

fn find<'a>(records: &'a [Record], key: &str, n: u64) -> &'a Record {
    records
        .iter()
        .find(|r| {
            let data: serde_json::Value = serde_json::from_slice(&r.payload).unwrap();
            r.key.as_deref() == Some(key) && data["datos"]["n"] == n
        })
        .unwrap()
}

/// Watches the committed offsets until stopped and reports every sample where `bad` holds.
/// `bad` gets the committed offset of a partition and is evaluated after reading it, so
/// anything applied before that commit is visible to it.
struct Watch {
    stop: Arc<AtomicBool>,
    task: JoinHandle<(usize, Vec<(u32, i64)>)>,
}

impl Watch {
    fn start(
        log: Arc<dyn LogFixture>,
        bad: impl Fn(u32, i64) -> BoxFuture<'static, bool> + Send + Sync + 'static,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let (mut samples, mut violations) = (0, Vec::new());
            while !flag.load(Ordering::SeqCst) {
                for (partition, next) in log.committed(GROUP, TOPIC).await.unwrap() {
                    samples += 1;
                    if bad(partition, next).await {
                        violations.push((partition, next));
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            (samples, violations)
        });
        Self { stop, task }
    }

    async fn finish(self) -> (usize, Vec<(u32, i64)>) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_overlap_while_one_key_runs_alone_and_in_order() {
    for env in setup(1).await {
        let keys = ["P-0", "P-1", "P-2", "P-3", "P-4", "P-5", "P-6", "P-7"];
        // Pairs of one key side by side (P-0 0, P-0 1, P-1 0, P-1 1, ...): they must not
        // run together even though they are next to each other.
        publish_runs(&env, &keys, 6, 2).await;
        let handler = Arc::new(Observed::ok(Duration::from_millis(5)));
        let running = Running::start_with(
            env.log.as_ref(),
            env.log.publisher(),
            router(handler.clone()),
            keyed(4),
        );
        wait_caught_up(&env).await;
        let stats = running.stats.clone();
        running.stop().await;
        let backend = env.backend;
        assert!(
            (2..=4).contains(&handler.max_running()),
            "{backend:?}: {} calls at once",
            handler.max_running()
        );
        assert!((2..=4).contains(&stats.max_in_flight()), "{backend:?}");
        assert_eq!(
            handler.key_overlaps(),
            0,
            "{backend:?}: one key ran twice at once"
        );
        for key in keys {
            assert_eq!(
                handler.applied_ns(key),
                vec![0, 1, 2, 3, 4, 5],
                "{backend:?} {key}"
            );
        }
        assert_eq!(stats.acked(), 48);
        let spans = handler.spans();
        let mut by_key: HashMap<Option<String>, Vec<_>> = HashMap::new();
        for span in &spans {
            by_key
                .entry(span.key.clone())
                .or_default()
                .push(span.clone());
        }
        for (key, mut runs) in by_key {
            runs.sort_by_key(|s| s.offset);
            for pair in runs.windows(2) {
                assert!(
                    pair[0].end <= pair[1].start,
                    "{backend:?}: {key:?} overlapped or reordered"
                );
            }
        }
        let crossed = spans.iter().any(|a| {
            spans
                .iter()
                .any(|b| a.key != b.key && a.start < b.end && b.start < a.end)
        });
        assert!(
            crossed,
            "{backend:?}: no two keys ever ran at the same time"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commit_point_waits_for_a_retried_key_while_others_apply_once() {
    for env in setup(1).await {
        // B0 C0 D0 A0 B1 C1 D1 A1 ...: the failing message sits at offset 3.
        let records = publish_interleaved(&env, &["B", "C", "D", "A"], 3).await;
        let failing = find(&records, "A", 0).clone();
        assert_eq!(failing.offset, 3);
        let failing_id = id_of(&failing);
        let handler = Arc::new(Observed::new(Duration::from_millis(1), {
            let failing_id = failing_id.clone();
            move |m| {
                if m.id() == failing_id && m.attempt < 3 {
                    Step::Transient
                } else {
                    Step::Ok
                }
            }
        }));
        let watched = handler.clone();
        let seen_at_failing = Arc::new(AtomicBool::new(false));
        let seen = seen_at_failing.clone();
        let id = failing_id.clone();
        let watch = Watch::start(env.log.clone(), move |_, next| {
            let applied = watched.inbox.contains("test", &id);
            if !applied && next == 3 {
                seen.store(true, Ordering::SeqCst);
            }
            ready(!applied && next > 3).boxed()
        });
        let mut cfg = keyed(4);
        cfg.backoff =
            Backoff::new(Duration::from_millis(100), Duration::from_millis(200)).with_jitter(0.0);
        let running = Running::start_with(
            env.log.as_ref(),
            env.log.publisher(),
            router(handler.clone()),
            cfg,
        );
        wait_caught_up(&env).await;
        let stats = running.stats.clone();
        running.stop().await;
        let (samples, violations) = watch.finish().await;
        let backend = env.backend;
        assert!(samples > 0);
        let violations = &violations[..violations.len().min(5)];
        assert!(
            violations.is_empty(),
            "{backend:?}: committed past the failing message: {violations:?}"
        );
        assert!(
            seen_at_failing.load(Ordering::SeqCst),
            "{backend:?}: the other keys' progress below the failing message was never committed"
        );
        assert_eq!(handler.calls_of(&failing_id), 3);
        for record in records.iter().filter(|r| id_of(r) != failing_id) {
            assert_eq!(
                handler.calls_of(&id_of(record)),
                1,
                "{backend:?}: offset {}",
                record.offset
            );
        }
        assert_eq!(handler.applied_ns("A"), vec![0, 1, 2], "{backend:?}");
        for key in ["B", "C", "D"] {
            assert_eq!(handler.applied_ns(key), vec![0, 1, 2], "{backend:?}");
        }
        assert_eq!(stats.retried(), 2);
        assert_eq!(
            stats.acked(),
            12,
            "{backend:?}: a redelivered message was counted twice"
        );
        assert!(
            stats.skipped() >= 6,
            "{backend:?}: {} skipped",
            stats.skipped()
        );
        assert!(dead_letters(&env).await.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_with_chains_in_flight_loses_nothing_and_keeps_key_order() {
    for env in setup(2).await {
        let keys = [
            "P-0", "P-1", "P-2", "P-3", "P-4", "P-5", "P-6", "P-7", "P-8", "P-9",
        ];
        let records = publish_interleaved(&env, &keys, 20).await;
        let handler = Arc::new(Observed::ok(Duration::from_millis(2)));
        let watched = handler.clone();
        let stored = records.clone();
        let watch = Watch::start(env.log.clone(), move |partition, next| {
            let unapplied = stored
                .iter()
                .filter(|r| r.partition == partition && r.offset < next)
                .any(|r| !watched.inbox.contains("test", &id_of(r)));
            ready(unapplied).boxed()
        });
        let mut cfg = keyed(4);
        cfg.member = format!("{GROUP}-stable");
        let first = Running::start_with(
            env.log.as_ref(),
            env.log.publisher(),
            router(handler.clone()),
            cfg.clone(),
        );
        let stats = first.stats.clone();
        let busy = wait_until(PATIENCE, || async {
            handler.applied().len() >= 60 && stats.in_flight.load(Ordering::SeqCst) >= 2
        })
        .await;
        assert!(busy, "{:?}: chains never ran two at once", env.backend);
        first.handle.abort();
        assert!(first.handle.await.unwrap_err().is_cancelled());
        let ends: i64 = env
            .log
            .end_offsets(TOPIC)
            .await
            .unwrap()
            .iter()
            .map(|(_, e)| e)
            .sum();
        let committed: i64 = env
            .log
            .committed(GROUP, TOPIC)
            .await
            .unwrap()
            .iter()
            .map(|(_, o)| o)
            .sum();
        assert!(
            committed < ends,
            "{:?}: the crash came too late",
            env.backend
        );

        let second = Running::start_with(
            env.log.as_ref(),
            env.log.publisher(),
            router(handler.clone()),
            cfg,
        );
        wait_caught_up(&env).await;
        second.stop().await;
        let (samples, violations) = watch.finish().await;
        let backend = env.backend;
        assert!(samples > 0);
        let violations = &violations[..violations.len().min(5)];
        assert!(
            violations.is_empty(),
            "{backend:?}: committed past an unapplied message: {violations:?}"
        );
        assert_eq!(handler.applied().len(), records.len(), "{backend:?}");
        for record in &records {
            assert!(handler.inbox.contains("test", &id_of(record)));
        }
        for key in keys {
            assert_eq!(
                handler.applied_ns(key),
                (0..20).collect::<Vec<u64>>(),
                "{backend:?} {key}"
            );
        }
        assert_eq!(handler.key_overlaps(), 0, "{backend:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_and_panics_hold_back_only_their_key() {
    for env in setup(1).await {
        let records = publish_interleaved(&env, &["A", "B", "C"], 3).await;
        let poison = id_of(find(&records, "A", 1));
        let buggy = id_of(find(&records, "B", 0));
        let handler = Arc::new(Observed::new(Duration::from_millis(1), {
            let (poison, buggy) = (poison.clone(), buggy.clone());
            move |m| match m.id() {
                id if id == poison => Step::Permanent,
                id if id == buggy && m.attempt == 1 => Step::Panic,
                _ => Step::Ok,
            }
        }));
        let running = Running::start_with(
            env.log.as_ref(),
            env.log.publisher(),
            router(handler.clone()),
            keyed(4),
        );
        wait_caught_up(&env).await;
        let stats = running.stats.clone();
        running.stop().await;
        let backend = env.backend;
        assert_eq!(handler.applied_ns("A"), vec![0, 2], "{backend:?}");
        assert_eq!(handler.applied_ns("B"), vec![0, 1, 2], "{backend:?}");
        assert_eq!(handler.applied_ns("C"), vec![0, 1, 2], "{backend:?}");
        assert_eq!(stats.acked(), 8);
        assert_eq!(stats.dead_lettered(), 1);
        assert!(stats.retried() >= 1);
        let dlq = dead_letters(&env).await;
        assert_eq!(dlq.len(), 1);
        assert_eq!(header(&dlq[0], "id_evento"), poison);
        assert_eq!(header(&dlq[0], "motivo"), "permanent: stock insuficiente");
        assert_eq!(
            handler.calls_of(&poison),
            1,
            "{backend:?}: dead-lettered twice"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offset_waits_for_a_dead_letter_of_one_key() {
    for env in setup(1).await {
        let records = publish_interleaved(&env, &["B", "A", "C"], 3).await;
        let poison = find(&records, "A", 0).clone();
        let poison_id = id_of(&poison);
        let flaky = Arc::new(FlakyPublisher::new(env.log.publisher()));
        flaky.set(Fault::Unavailable);
        let handler = Arc::new(Observed::new(Duration::from_millis(1), {
            let poison_id = poison_id.clone();
            move |m| {
                if m.id() == poison_id {
                    Step::Permanent
                } else {
                    Step::Ok
                }
            }
        }));
        let dlq_log = env.log.clone();
        let watch = Watch::start(env.log.clone(), move |_, next| {
            let (log, past) = (dlq_log.clone(), next > poison.offset);
            async move {
                // Read after the commit was read: a dead letter stored before it shows here.
                let dlq = log.end_offsets(DLQ).await.unwrap_or_default();
                past && !dlq.iter().any(|(_, end)| *end > 0)
            }
            .boxed()
        });
        let running = Running::start_with(
            env.log.as_ref(),
            flaky.clone(),
            router(handler.clone()),
            keyed(4),
        );
        let stats = running.stats.clone();
        assert!(wait_until(PATIENCE, || async { stats.retried() >= 2 }).await);
        assert_eq!(
            handler.applied_ns("B"),
            vec![0, 1, 2],
            "{:?}: other keys wait",
            env.backend
        );
        flaky.recover();
        wait_caught_up(&env).await;
        running.stop().await;
        let (_, violations) = watch.finish().await;
        let backend = env.backend;
        let violations = &violations[..violations.len().min(5)];
        assert!(
            violations.is_empty(),
            "{backend:?}: committed before the dead letter was stored"
        );
        assert_eq!(dead_letters(&env).await.len(), 1);
        assert_eq!(handler.applied_ns("A"), vec![1, 2], "{backend:?}");
        assert_eq!(stats.dead_lettered(), 1);
        assert_eq!(stats.acked(), 8);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_without_a_key_stay_serial_in_their_partition() {
    for env in setup(1).await {
        let batch: Vec<OutgoingMessage> = (0..12)
            .map(|n| {
                let (envelope, mut message) = event_message(TOPIC, "-", TIPO, n);
                message.key = None;
                message.headers = Headers::new()
                    .with("tipo", TIPO)
                    .with("id_evento", envelope.id.to_string());
                message
            })
            .collect();
        env.log.publisher().publish(&batch).await.unwrap();
        let handler = Arc::new(Observed::ok(Duration::from_millis(2)));
        let running = Running::start_with(
            env.log.as_ref(),
            env.log.publisher(),
            router(handler.clone()),
            keyed(4),
        );
        wait_caught_up(&env).await;
        running.stop().await;
        let backend = env.backend;
        assert_eq!(handler.max_running(), 1, "{backend:?}");
        let ns: Vec<u64> = handler.applied().iter().map(|a| a.n).collect();
        assert_eq!(ns, (0..12).collect::<Vec<u64>>(), "{backend:?}");
    }
}

/// A quick measure, not a benchmark: 2,000 messages over 50 keys on one partition, a handler
/// taking 2 ms per message, with one key at a time and with 16.
/// `cargo test -p entrega --release --test worker_keys -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "prints a measure; run on demand"]
async fn measure_key_concurrency() {
    let keys: Vec<String> = (0..50).map(|k| format!("P-{k}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    for (n, max_batch) in [(1, 100), (16, 100), (1, 500), (16, 500)] {
        let env = Env::new(Backend::Memory, Arc::new(SystemClock)).await;
        env.log.admin().ensure_topic(TOPIC, 1).await.unwrap();
        publish_interleaved(&env, &keys, 40).await;
        let handler = Arc::new(Observed::ok(Duration::from_millis(2)));
        let mut cfg = keyed(n);
        cfg.max_batch = max_batch;
        let started = Instant::now();
        let running = Running::start_with(
            env.log.as_ref(),
            env.log.publisher(),
            router(handler.clone()),
            cfg,
        );
        let log = env.log.as_ref();
        assert!(wait_until(Duration::from_secs(120), || caught_up(log)).await);
        let elapsed = started.elapsed();
        let stats = running.stats.clone();
        running.stop().await;
        assert_eq!(handler.applied().len(), 2000);
        println!(
            "key_concurrency={n:>2} max_batch={max_batch}: {:>6.0} ms, {:>6.0} msg/s, \
             max in flight {}",
            elapsed.as_secs_f64() * 1000.0,
            2000.0 / elapsed.as_secs_f64(),
            stats.max_in_flight()
        );
    }
}
