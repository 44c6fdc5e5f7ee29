//! Per-key concurrency when things go wrong for one key: dead letters, panics, a dead-letter
//! topic that is down; and records without a key, which stay serial.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use entrega_core::{Headers, OutgoingMessage};
use entrega_testkit::{wait_until, Fault, FlakyPublisher};
use futures::future::FutureExt;
use support::event_message;
use support::handlers::Step;
use support::keys_steps::{find, id_of, keyed, publish_interleaved, router, Watch, TIPO};
use support::observed::Observed;
use support::worker_steps::{
    dead_letters, header, setup, wait_caught_up, Running, DLQ, PATIENCE, TOPIC,
};

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
