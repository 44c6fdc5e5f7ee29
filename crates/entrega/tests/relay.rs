//! The relay on the in-memory fakes and on SQLite: publish then mark, failing transports,
//! lost confirmations, fencing, purge, clean shutdown, and the crash tests (e) and (f).
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega::{Backoff, CancellationToken, Relay, RelayConfig};
use entrega_core::{
    now_ms, Clock, Envelope, LaneLeases, ManualClock, NewEvent, OutgoingMessage, Publisher,
    SystemClock, TransportError,
};
use entrega_testkit::{wait_until, Fault, FlakyPublisher, OutboxFixture, TxEnd};
use serde_json::json;
use support::{all_records, Env, BACKENDS};
use uuid::Uuid;

const TOPIC: &str = "pedidos.eventos";
const TTL: Duration = Duration::from_secs(10);

fn config(instance: &str) -> RelayConfig {
    let mut config = RelayConfig::new("pedidos");
    config.instance_id = instance.to_owned();
    config.batch_size = 2;
    config.lease_ttl = TTL;
    config.poll_interval = Duration::from_millis(20);
    config.backoff =
        Backoff::new(Duration::from_millis(100), Duration::from_secs(30)).with_jitter(0.0);
    config
}

fn events(aggregate_id: &str, ns: std::ops::Range<u32>) -> Vec<NewEvent> {
    ns.map(|n| NewEvent::new("pedido", aggregate_id, "pedido.creado", json!({ "n": n })))
        .collect()
}

async fn env_with_topic(backend: support::Backend, clock: Arc<dyn Clock>) -> Env {
    let env = Env::new(backend, clock).await;
    env.log.admin().ensure_topic(TOPIC, 3).await.unwrap();
    env
}

async fn published(outbox: &dyn OutboxFixture, events: &[NewEvent]) -> usize {
    let mut n = 0;
    for e in events {
        if outbox
            .row(e.id)
            .await
            .unwrap()
            .expect("row exists")
            .published
        {
            n += 1;
        }
    }
    n
}

/// Ids of the records of `TOPIC`, with how often each occurs.
async fn published_ids(env: &Env) -> HashMap<Uuid, usize> {
    let mut ids = HashMap::new();
    for r in all_records(env.log.as_ref(), TOPIC).await {
        *ids.entry(Envelope::parse(&r.payload).unwrap().id)
            .or_default() += 1;
    }
    ids
}

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

/// The foil: marks rows published, then publishes. Wrong, and here to show why.
async fn mark_then_publish(env: &Env, publisher: &dyn Publisher, now: i64) {
    let leases = env.outbox.leases().balance("foil", now, TTL).await.unwrap();
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
                .balance("r2", self.clock.now_ms(), TTL)
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
            .balance("r2", now_ms(), TTL)
            .await
            .unwrap();
        assert_eq!(taken.len(), 64, "lanes were not released on shutdown");
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
        let mut seen = HashSet::new();
        let mut order: HashMap<String, Vec<u64>> = HashMap::new();
        for r in &records {
            let envelope = Envelope::parse(&r.payload).unwrap();
            // Consumers skip repeats by id; the order that matters is of first deliveries.
            if seen.insert(envelope.id) {
                order
                    .entry(r.key.clone().unwrap())
                    .or_default()
                    .push(envelope.data["n"].as_u64().unwrap());
            }
        }
        for (key, ns) in &order {
            let mut sorted = ns.clone();
            sorted.sort_unstable();
            assert_eq!(ns, &sorted, "{backend:?}: order of {key} broken");
        }
    }
}
