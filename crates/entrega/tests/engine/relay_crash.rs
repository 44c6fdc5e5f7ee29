//! Crash tests of the relay: (f) marking before confirmation loses events and the relay does
//! not; (e) three relays keep per-aggregate order and publish a late commit; a relay fenced
//! out of its lane marks nothing.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega::{CancellationToken, Relay};
use entrega_core::{
    now_ms, Clock, LaneLeases, ManualClock, NewEvent, OutgoingMessage, Publisher, SystemClock,
    TransportError,
};
use entrega_testkit::{wait_until, Fault, FlakyPublisher, TxEnd};
use support::relay_steps::{
    assert_first_deliveries_in_order, config, env_with_topic, events, published, published_ids,
    TOPIC, TTL,
};
use support::{all_records, Env, BACKENDS};
use uuid::Uuid;

/// The foil: marks rows published, then publishes. Wrong, and here to show why.
async fn mark_then_publish(env: &Env, publisher: &dyn Publisher, now: i64) {
    let leases = env
        .outbox
        .leases()
        .balance(&entrega_core::Holder::with_incarnation("foil", 1), now, TTL)
        .await
        .unwrap();
    for lease in leases {
        let rows = env.outbox.reader().pending(lease.lane, 100).await.unwrap();
        if rows.is_empty() {
            continue;
        }
        let ids: Vec<_> = rows.iter().map(|r| r.id).collect();
        env.outbox
            .reader()
            .mark_published(&lease, &ids, now)
            .await
            .unwrap();
        let batch: Vec<_> = rows
            .iter()
            .map(|r| OutgoingMessage {
                topic: TOPIC.into(),
                key: Some(r.aggregate_id.clone()),
                headers: Default::default(),
                payload: r.envelope("pedidos").to_bytes(),
            })
            .collect();
        let _ = publisher.publish(&batch).await;
    }
}

/// Crash test (f): under the same failing transport, marking before confirmation loses
/// events; confirming first loses none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marking_before_confirmation_loses_events_and_the_relay_does_not() {
    for backend in BACKENDS {
        let all = [events("P-1", 0..3), events("P-2", 0..3)].concat();

        let clock = ManualClock::new(now_ms());
        let foil_env = env_with_topic(backend, Arc::new(clock.clone())).await;
        foil_env.outbox.enqueue(&all, TxEnd::Commit).await.unwrap();
        let flaky = FlakyPublisher::new(foil_env.log.publisher());
        flaky.set(Fault::Unavailable);
        mark_then_publish(&foil_env, &flaky, clock.now_ms()).await;
        flaky.recover();
        clock.advance(31_000);
        mark_then_publish(&foil_env, &flaky, clock.now_ms()).await;
        let lost = all.len() - published_ids(&foil_env).await.len();
        assert_eq!(
            lost,
            all.len(),
            "{backend:?}: the foil should have lost every event"
        );

        let env = env_with_topic(backend, Arc::new(clock.clone())).await;
        env.outbox.enqueue(&all, TxEnd::Commit).await.unwrap();
        let flaky = Arc::new(FlakyPublisher::new(env.log.publisher()));
        flaky.set(Fault::Unavailable);
        let relay = Relay::new(
            env.ports(),
            flaky.clone(),
            Arc::new(clock.clone()),
            config("r1"),
        );
        relay.drain_once().await.unwrap();
        flaky.recover();
        clock.advance(31_000);
        relay.drain_once().await.unwrap();
        let ids = published_ids(&env).await;
        assert!(
            all.iter().all(|e| ids.contains_key(&e.id)),
            "{backend:?}: the relay lost events"
        );
    }
}

/// Moves the lane to another owner while the first relay is publishing.
struct StealDuringPublish {
    inner: Arc<dyn Publisher>,
    leases: Arc<dyn LaneLeases>,
    clock: ManualClock,
    armed: AtomicBool,
}

#[async_trait]
impl Publisher for StealDuringPublish {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<(), TransportError> {
        if self.armed.swap(false, Ordering::SeqCst) {
            self.clock.advance(TTL.as_millis() as i64 + 1_000);
            self.leases
                .balance(
                    &entrega_core::Holder::with_incarnation("r2", 1),
                    self.clock.now_ms(),
                    TTL,
                )
                .await
                .unwrap();
        }
        self.inner.publish(batch).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_lost_its_lane_marks_nothing_and_the_new_owner_publishes() {
    for backend in BACKENDS {
        let clock = ManualClock::new(now_ms());
        let env = env_with_topic(backend, Arc::new(clock.clone())).await;
        let all = events("P-1", 0..2);
        env.outbox.enqueue(&all, TxEnd::Commit).await.unwrap();
        let stealer = Arc::new(StealDuringPublish {
            inner: env.log.publisher(),
            leases: env.outbox.leases(),
            clock: clock.clone(),
            armed: AtomicBool::new(true),
        });
        let r1 = Relay::new(env.ports(), stealer, Arc::new(clock.clone()), config("r1"));
        assert_eq!(r1.drain_once().await.unwrap(), 0, "{backend:?}");
        assert!(r1.stats().leases_lost.load(Ordering::SeqCst) >= 1);
        assert_eq!(
            published(env.outbox.as_ref(), &all).await,
            0,
            "a fenced relay marked rows"
        );
        let r2 = Relay::new(
            env.ports(),
            env.log.publisher(),
            Arc::new(clock.clone()),
            config("r2"),
        );
        assert_eq!(r2.drain_once().await.unwrap(), 2);
        assert_eq!(published(env.outbox.as_ref(), &all).await, 2);
    }
}

/// A relay restarted under its name (the process killed, its leases still running) takes its
/// lanes back at once instead of waiting them out, and its earlier life, were it still
/// running, is fenced: what it publishes afterwards it cannot mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_restarted_under_its_name_resumes_at_once_and_fences_its_earlier_life() {
    for backend in BACKENDS {
        let clock = ManualClock::new(now_ms());
        let env = env_with_topic(backend, Arc::new(clock.clone())).await;
        let before = events("P-1", 0..2);
        env.outbox.enqueue(&before, TxEnd::Commit).await.unwrap();
        let first = Relay::new(
            env.ports(),
            env.log.publisher(),
            Arc::new(clock.clone()),
            config("r"),
        );
        assert_eq!(first.drain_once().await.unwrap(), 2, "{backend:?}");
        assert_eq!(first.lanes().await.len(), 64, "{backend:?}");

        // The restart: a tenth into the first life's leases.
        clock.advance(TTL.as_millis() as i64 / 10);
        let after = events("P-1", 2..4);
        env.outbox.enqueue(&after, TxEnd::Commit).await.unwrap();
        let second = Relay::new(
            env.ports(),
            env.log.publisher(),
            Arc::new(clock.clone()),
            config("r"),
        );
        assert_eq!(
            second.drain_once().await.unwrap(),
            2,
            "{backend:?}: the restarted relay waited for its own leases"
        );
        assert_eq!(second.lanes().await.len(), 64, "{backend:?}");

        // The earlier life still believes it holds every lane (not due to balance yet).
        let late = events("P-1", 4..6);
        env.outbox.enqueue(&late, TxEnd::Commit).await.unwrap();
        assert_eq!(
            first.drain_once().await.unwrap(),
            0,
            "{backend:?}: the earlier life marked rows"
        );
        assert!(first.stats().leases_lost.load(Ordering::SeqCst) >= 1);
        assert_eq!(
            published(env.outbox.as_ref(), &late).await,
            0,
            "{backend:?}"
        );
        assert_eq!(second.drain_once().await.unwrap(), 2, "{backend:?}");
        let all = [before, after, late].concat();
        assert_eq!(published(env.outbox.as_ref(), &all).await, 6, "{backend:?}");
        // Once it balances, the earlier life holds nothing.
        clock.advance(TTL.as_millis() as i64 / 2);
        first.drain_once().await.unwrap();
        assert!(first.lanes().await.is_empty(), "{backend:?}");
        assert_eq!(second.lanes().await.len(), 64, "{backend:?}");
    }
}

/// Crash test (e): three relays on one outbox, joining while events flow, plus a row whose
/// transaction commits late: everything is published and each aggregate keeps its order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_relays_keep_per_aggregate_order_and_publish_a_late_commit() {
    for backend in BACKENDS {
        let env = env_with_topic(backend, Arc::new(SystemClock)).await;
        let (aggregates, rounds) = (30, 8);
        let late = events("LATE-1", 0..1);
        let mut held = Some(env.outbox.enqueue_held(&late).await.unwrap());
        let token = CancellationToken::new();
        let mut relays = Vec::new();
        let mut tasks = Vec::new();
        let start = |name: &str| {
            let mut cfg = config(name);
            cfg.lease_ttl = Duration::from_millis(900);
            cfg.batch_size = 10;
            let relay = Arc::new(Relay::new(
                env.ports(),
                env.log.publisher(),
                Arc::new(SystemClock),
                cfg,
            ));
            let (r, t) = (relay.clone(), token.clone());
            (relay, tokio::spawn(async move { r.run(t).await }))
        };
        let mut produced = late.clone();
        for round in 0..rounds {
            let batch: Vec<NewEvent> = (0..aggregates)
                .flat_map(|a| events(&format!("A-{a}"), round..round + 1))
                .collect();
            env.outbox.enqueue(&batch, TxEnd::Commit).await.unwrap();
            produced.extend(batch);
            if round < 3 {
                // Relays join one per round, while events keep coming.
                let (relay, task) = start(&format!("r{round}"));
                relays.push(relay);
                tasks.push(task);
                let joined = relays.clone();
                let shared = wait_until(Duration::from_secs(20), || {
                    let joined = joined.clone();
                    async move {
                        let mut total = 0;
                        for relay in &joined {
                            let lanes = relay.lanes().await.len();
                            if lanes == 0 {
                                return false;
                            }
                            total += lanes;
                        }
                        total == 64
                    }
                })
                .await;
                assert!(
                    shared,
                    "{backend:?}: {} relays did not share the lanes",
                    joined.len()
                );
            }
            if round == rounds / 2 {
                let before = published_ids(&env).await.len();
                assert!(
                    before > 0,
                    "later rows were published before the late commit"
                );
                held.take().unwrap().commit().await.unwrap();
            }
        }
        let expected: HashSet<Uuid> = produced.iter().map(|e| e.id).collect();
        assert!(
            wait_until(Duration::from_secs(30), || async {
                let ids = published_ids(&env).await;
                expected.iter().all(|id| ids.contains_key(id))
            })
            .await,
            "{backend:?}: not everything was published"
        );
        token.cancel();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        for (i, relay) in relays.iter().enumerate() {
            assert!(
                relay.stats().published() > 0,
                "{backend:?}: relay {i} never published"
            );
        }
        let records = all_records(env.log.as_ref(), TOPIC).await;
        assert_first_deliveries_in_order(&records, &format!("{backend:?}"));
    }
}
