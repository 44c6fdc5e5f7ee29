//! Per-key concurrency on the in-memory log and on the SQLite log: keys overlap, one key never
//! does and keeps its order, the commit point waits for the lowest unfinished message, and a
//! crash with chains in flight loses nothing.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use entrega::Backoff;
use entrega_testkit::wait_until;
use futures::future::{ready, FutureExt};
use support::handlers::Step;
use support::keys_steps::{find, id_of, keyed, publish_interleaved, publish_runs, router, Watch};
use support::observed::Observed;
use support::worker_steps::{dead_letters, setup, wait_caught_up, Running, GROUP, PATIENCE, TOPIC};

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
