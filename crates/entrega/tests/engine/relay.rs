//! The relay on the in-memory fakes and on SQLite: publish then mark, failing transports,
//! lost confirmations, purge, wake-up and clean shutdown.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega::{CancellationToken, Relay};
use entrega_core::{
    now_ms, Envelope, ManualClock, OutgoingMessage, Publisher, SystemClock, TransportError,
};
use entrega_testkit::{wait_until, Fault, FlakyPublisher, OutboxFixture, TxEnd};
use serde_json::json;
use support::relay_steps::{config, env_with_topic, events, published, published_ids, TOPIC, TTL};
use support::{all_records, BACKENDS};
use uuid::Uuid;

/// Checks, at every publish, that none of the rows being published is marked yet.
struct ConfirmBeforeMark {
    outbox: Arc<dyn OutboxFixture>,
    inner: Arc<dyn Publisher>,
    checked: AtomicUsize,
    violations: AtomicUsize,
}

#[async_trait]
impl Publisher for ConfirmBeforeMark {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<(), TransportError> {
        for m in batch {
            let id = Uuid::parse_str(m.headers.get("id_evento").unwrap()).unwrap();
            if self.outbox.row(id).await.unwrap().unwrap().published {
                self.violations.fetch_add(1, Ordering::SeqCst);
            }
            self.checked.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.publish(batch).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_then_marks() {
    for backend in BACKENDS {
        let clock = ManualClock::new(now_ms());
        let env = env_with_topic(backend, Arc::new(clock.clone())).await;
        let mut all = events("P-1", 0..3);
        all.extend(events("P-2", 0..2));
        env.outbox.enqueue(&all, TxEnd::Commit).await.unwrap();
        let observer = Arc::new(ConfirmBeforeMark {
            outbox: env.outbox.clone(),
            inner: env.log.publisher(),
            checked: AtomicUsize::new(0),
            violations: AtomicUsize::new(0),
        });
        let relay = Relay::new(
            env.ports(),
            observer.clone(),
            Arc::new(clock.clone()),
            config("r1"),
        );
        assert_eq!(relay.drain_once().await.unwrap(), 5, "{backend:?}");
        assert_eq!(observer.checked.load(Ordering::SeqCst), 5);
        assert_eq!(
            observer.violations.load(Ordering::SeqCst),
            0,
            "rows were marked before publishing"
        );
        assert_eq!(published(env.outbox.as_ref(), &all).await, 5);
        assert_eq!(relay.stats().published(), 5);
        assert!(relay.stats().batches() >= 3, "batch size 2");

        let records = all_records(env.log.as_ref(), TOPIC).await;
        assert_eq!(records.len(), 5);
        for e in &all {
            let r = records
                .iter()
                .find(|r| r.headers.get("id_evento") == Some(&e.id.to_string()[..]))
                .expect("published");
            assert_eq!(r.key.as_deref(), Some(&e.aggregate_id[..]));
            assert_eq!(r.headers.get("tipo"), Some("pedido.creado"));
            let envelope = Envelope::parse(&r.payload).unwrap();
            assert_eq!(
                (envelope.id, envelope.source.as_str(), &envelope.data),
                (e.id, "pedidos", &e.payload)
            );
        }
        let p1: Vec<_> = records
            .iter()
            .filter(|r| r.key.as_deref() == Some("P-1"))
            .map(|r| Envelope::parse(&r.payload).unwrap().data["n"].clone())
            .collect();
        assert_eq!(
            p1,
            vec![json!(0), json!(1), json!(2)],
            "per-aggregate order"
        );
        assert_eq!(
            relay.drain_once().await.unwrap(),
            0,
            "nothing is published twice"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_transport_marks_nothing_and_everything_goes_out_after_recovery() {
    for backend in BACKENDS {
        let clock = ManualClock::new(now_ms());
        let env = env_with_topic(backend, Arc::new(clock.clone())).await;
        let all = [events("P-1", 0..3), events("P-2", 0..2)].concat();
        env.outbox.enqueue(&all, TxEnd::Commit).await.unwrap();
        let flaky = Arc::new(FlakyPublisher::new(env.log.publisher()));
        flaky.set(Fault::Unavailable);
        let relay = Relay::new(
            env.ports(),
            flaky.clone(),
            Arc::new(clock.clone()),
            config("r1"),
        );
        assert_eq!(relay.drain_once().await.unwrap(), 0);
        assert!(relay.stats().publish_errors() >= 1);
        assert_eq!(
            published(env.outbox.as_ref(), &all).await,
            0,
            "{backend:?}: rows marked without confirmation"
        );
        let calls = flaky.calls();
        assert_eq!(relay.drain_once().await.unwrap(), 0);
        assert_eq!(flaky.calls(), calls, "failed lanes must back off");
        flaky.recover();
        clock.advance(31_000);
        assert_eq!(relay.drain_once().await.unwrap(), 5);
        assert_eq!(published(env.outbox.as_ref(), &all).await, 5);
        let ids = published_ids(&env).await;
        assert_eq!(ids.len(), 5);
        assert!(ids.values().all(|n| *n == 1));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_confirmation_publishes_again_with_the_same_ids() {
    for backend in BACKENDS {
        let clock = ManualClock::new(now_ms());
        let env = env_with_topic(backend, Arc::new(clock.clone())).await;
        let all = [events("P-1", 0..3), events("P-2", 0..2)].concat();
        env.outbox.enqueue(&all, TxEnd::Commit).await.unwrap();
        let flaky = Arc::new(FlakyPublisher::new(env.log.publisher()));
        flaky.set(Fault::LoseConfirmation);
        let mut cfg = config("r1");
        cfg.batch_size = 100;
        let relay = Relay::new(env.ports(), flaky.clone(), Arc::new(clock.clone()), cfg);
        assert_eq!(relay.drain_once().await.unwrap(), 0);
        assert_eq!(published(env.outbox.as_ref(), &all).await, 0, "{backend:?}");
        assert_eq!(
            published_ids(&env).await.len(),
            5,
            "stored by the transport"
        );
        flaky.recover();
        clock.advance(31_000);
        assert_eq!(relay.drain_once().await.unwrap(), 5);
        let ids = published_ids(&env).await;
        assert!(
            all.iter().all(|e| ids.get(&e.id) == Some(&2)),
            "each event twice, same id_evento: {ids:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_rows_are_purged_after_the_retention() {
    for backend in BACKENDS {
        let clock = ManualClock::new(now_ms());
        let env = env_with_topic(backend, Arc::new(clock.clone())).await;
        env.outbox
            .enqueue(&events("P-1", 0..3), TxEnd::Commit)
            .await
            .unwrap();
        let mut cfg = config("r1");
        cfg.retention = Duration::from_secs(3600);
        cfg.purge_interval = Duration::from_secs(60);
        let relay = Relay::new(
            env.ports(),
            env.log.publisher(),
            Arc::new(clock.clone()),
            cfg,
        );
        assert_eq!(relay.drain_once().await.unwrap(), 3);
        assert_eq!(
            env.outbox.row_count().await.unwrap(),
            3,
            "{backend:?}: purged too early"
        );
        clock.advance(2 * 3600 * 1000);
        relay.drain_once().await.unwrap();
        assert_eq!(
            env.outbox.row_count().await.unwrap(),
            0,
            "{backend:?}: not purged"
        );
        assert_eq!(relay.stats().purged.load(Ordering::SeqCst), 3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_publishes_on_wakeup_and_releases_lanes_on_shutdown() {
    for backend in BACKENDS {
        let env = env_with_topic(backend, Arc::new(SystemClock)).await;
        let mut cfg = config("r1");
        cfg.poll_interval = Duration::from_secs(30);
        let relay = Arc::new(Relay::new(
            env.ports(),
            env.log.publisher(),
            Arc::new(SystemClock),
            cfg,
        ));
        let token = CancellationToken::new();
        let task = tokio::spawn({
            let (relay, token) = (relay.clone(), token.clone());
            async move { relay.run(token).await }
        });
        assert!(
            wait_until(Duration::from_secs(10), || async {
                relay.lanes().await.len() == 64
            })
            .await
        );
        let all = events("P-1", 0..3);
        env.outbox.enqueue(&all, TxEnd::Commit).await.unwrap();
        // The poll interval is 30 s: only a wake-up gets these out within the deadline.
        let outbox = env.outbox.as_ref();
        assert!(
            wait_until(Duration::from_secs(10), || async {
                published(outbox, &all).await == 3
            })
            .await,
            "{backend:?}: not published after a wake-up"
        );
        token.cancel();
        task.await.unwrap().unwrap();
        let taken = env
            .outbox
            .leases()
            .balance(
                &entrega_core::Holder::with_incarnation("r2", 1),
                now_ms(),
                TTL,
            )
            .await
            .unwrap();
        assert_eq!(taken.len(), 64, "lanes were not released on shutdown");
    }
}
