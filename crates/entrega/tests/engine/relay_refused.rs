//! Rows the transport refuses for good: the refused row gets attempts, a next attempt and the
//! last error, is held after `max_attempts`, and only its aggregate waits behind it; the
//! other aggregates of its lane are published, in order. A released row goes out before its
//! aggregate's later rows. A broker outage counts no attempts. On the memory fake, SQLite and
//! PostgreSQL outboxes, on a `ManualClock`.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use entrega::{Relay, RelayConfig};
use entrega_core::{
    now_ms, BlockedRow, Clock, Envelope, ManualClock, NewEvent, OutgoingMessage, Publisher,
    TransportError,
};
use entrega_testkit::TxEnd;
use support::relay_steps::{config, env_with_topic, events, published, TOPIC};
use support::{all_records, Backend, Env};
use uuid::Uuid;

const BACKENDS: [Backend; 3] = [Backend::Memory, Backend::Sqlite, Backend::Postgres];

/// Refuses for good any batch holding one of the refused event ids; otherwise publishes.
struct RefuseIds {
    inner: Arc<dyn Publisher>,
    refused: Mutex<HashSet<String>>,
    /// When set, every publish fails as if the broker were down.
    down: Mutex<bool>,
}

impl RefuseIds {
    fn new(inner: Arc<dyn Publisher>, ids: &[Uuid]) -> Arc<Self> {
        Arc::new(Self {
            inner,
            refused: Mutex::new(ids.iter().map(Uuid::to_string).collect()),
            down: Mutex::new(false),
        })
    }

    fn accept_all(&self) {
        self.refused.lock().unwrap().clear();
    }

    fn set_down(&self, down: bool) {
        *self.down.lock().unwrap() = down;
    }
}

#[async_trait]
impl Publisher for RefuseIds {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<(), TransportError> {
        if *self.down.lock().unwrap() {
            return Err(TransportError::unavailable("broker down"));
        }
        let refused = self.refused.lock().unwrap().clone();
        if batch.iter().any(|m| {
            m.headers
                .get("id_evento")
                .is_some_and(|id| refused.contains(id))
        }) {
            return Err(TransportError::Rejected {
                reason: "message too large".into(),
            });
        }
        self.inner.publish(batch).await
    }
}

/// Events of `poison` (four), then of other aggregates until three share `poison`'s lane
/// (three events each); every event is committed. Returns the lane's other aggregates'
/// events and the events of the other lanes.
async fn seed(env: &Env, poison: &[NewEvent]) -> (Vec<NewEvent>, Vec<NewEvent>) {
    env.outbox.enqueue(poison, TxEnd::Commit).await.unwrap();
    let lane = env.outbox.row(poison[0].id).await.unwrap().unwrap().lane;
    let (mut same_lane, mut elsewhere) = (Vec::new(), Vec::new());
    let mut n = 0;
    while same_lane.len() < 9 {
        let batch = events(&format!("P-{n}"), 0..3);
        env.outbox.enqueue(&batch, TxEnd::Commit).await.unwrap();
        if env.outbox.row(batch[0].id).await.unwrap().unwrap().lane == lane {
            same_lane.extend(batch);
        } else if elsewhere.len() < 30 {
            elsewhere.extend(batch);
        }
        n += 1;
    }
    (same_lane, elsewhere)
}

/// Event ids of each key on the topic, in offset order, first appearance only.
async fn first_seen_by_key(env: &Env) -> HashMap<String, Vec<Uuid>> {
    let mut by_key: HashMap<String, Vec<Uuid>> = HashMap::new();
    for r in all_records(env.log.as_ref(), TOPIC).await {
        let id = Envelope::parse(&r.payload).unwrap().id;
        let ids = by_key.entry(r.key.clone().unwrap()).or_default();
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    by_key
}

/// Every aggregate of `events` appears on the topic exactly in its enqueue order.
async fn assert_in_order(env: &Env, events: &[NewEvent]) {
    let seen = first_seen_by_key(env).await;
    let mut want: HashMap<&str, Vec<Uuid>> = HashMap::new();
    for e in events {
        want.entry(&e.aggregate_id).or_default().push(e.id);
    }
    for (key, ids) in want {
        assert_eq!(seen.get(key), Some(&ids), "order of {key} on the topic");
    }
}

async fn blocked(env: &Env, clock: &ManualClock) -> Vec<BlockedRow> {
    let status = env
        .outbox
        .maintenance()
        .status(clock.now_ms())
        .await
        .unwrap();
    status.blocked
}

/// Passes until one publishes nothing (a pass stops after narrowing down a refusal).
async fn drain(relay: &Relay) {
    for _ in 0..20 {
        if relay.drain_once().await.unwrap() == 0 {
            return;
        }
    }
    panic!("the relay kept publishing");
}

/// An environment seeded by [`seed`] around `poison`, and a relay (holding at the third
/// attempt) whose publisher refuses the event `refused`.
struct Setup {
    clock: ManualClock,
    env: Env,
    same_lane: Vec<NewEvent>,
    elsewhere: Vec<NewEvent>,
    publisher: Arc<RefuseIds>,
    relay: Relay,
}

async fn setup(backend: Backend, poison: &[NewEvent], refused: Uuid) -> Setup {
    let clock = ManualClock::new(now_ms());
    let env = env_with_topic(backend, Arc::new(clock.clone())).await;
    let (same_lane, elsewhere) = seed(&env, poison).await;
    let publisher = RefuseIds::new(env.log.publisher(), &[refused]);
    let mut config: RelayConfig = config("r1");
    config.max_attempts = 3;
    let relay = Relay::new(
        env.ports(),
        publisher.clone(),
        Arc::new(clock.clone()),
        config,
    );
    Setup {
        clock,
        env,
        same_lane,
        elsewhere,
        publisher,
        relay,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_row_waits_with_its_aggregate_is_held_and_released_in_order() {
    for backend in BACKENDS {
        let poison = events("P-poison", 0..4);
        let Setup {
            clock,
            env,
            same_lane,
            elsewhere,
            publisher,
            relay,
        } = setup(backend, &poison, poison[1].id).await;

        // One pass: everything but the refused row and its aggregate's later rows goes out.
        drain(&relay).await;
        assert_eq!(
            published(env.outbox.as_ref(), &same_lane).await,
            same_lane.len(),
            "{backend:?}"
        );
        assert_eq!(
            published(env.outbox.as_ref(), &elsewhere).await,
            elsewhere.len(),
            "{backend:?}"
        );
        assert_eq!(
            published(env.outbox.as_ref(), &poison[..1]).await,
            1,
            "{backend:?}"
        );
        assert_eq!(
            published(env.outbox.as_ref(), &poison[1..]).await,
            0,
            "{backend:?}"
        );
        assert_in_order(
            &env,
            &[&poison[..1], &same_lane[..], &elsewhere[..]].concat(),
        )
        .await;
        let rows = blocked(&env, &clock).await;
        assert_eq!(rows.len(), 1, "{backend:?}: {rows:?}");
        let row = &rows[0];
        assert_eq!(row.id, poison[1].id);
        assert_eq!(row.aggregate_id, "P-poison");
        assert_eq!(row.attempts, 1);
        // The relay's backoff without jitter: 100 ms after the first refusal.
        assert_eq!(
            row.next_attempt_ms,
            Some(clock.now_ms() + 100),
            "{backend:?}"
        );
        assert!(row
            .last_error
            .as_deref()
            .unwrap()
            .contains("message too large"));
        assert!(!row.is_held());
        assert_eq!(relay.stats().refused(), 1);

        // Not due yet: nothing is tried.
        clock.advance(50);
        drain(&relay).await;
        assert_eq!(blocked(&env, &clock).await[0].attempts, 1, "{backend:?}");

        // Due twice more: refused again each time, then held at the third attempt.
        clock.advance(50);
        drain(&relay).await;
        let row = blocked(&env, &clock).await.remove(0);
        assert_eq!(row.attempts, 2, "{backend:?}");
        assert_eq!(
            row.next_attempt_ms,
            Some(clock.now_ms() + 200),
            "{backend:?}"
        );
        clock.advance(200);
        drain(&relay).await;
        let status = env
            .outbox
            .maintenance()
            .status(clock.now_ms())
            .await
            .unwrap();
        assert_eq!((status.held, status.retrying), (1, 0), "{backend:?}");
        let row = &status.blocked[0];
        assert_eq!(row.attempts, 3);
        assert_eq!(row.held_at_ms, Some(clock.now_ms()), "{backend:?}");
        assert_eq!(row.next_attempt_ms, None);
        assert_eq!((relay.stats().refused(), relay.stats().held()), (3, 1));

        // Held: a week later it is still not tried, while new events of the lane flow.
        clock.advance(7 * 24 * 3_600_000);
        let more_poison = events("P-poison", 4..5);
        let more_other = events(&same_lane[0].aggregate_id, 3..5);
        env.outbox
            .enqueue(&more_poison, TxEnd::Commit)
            .await
            .unwrap();
        env.outbox
            .enqueue(&more_other, TxEnd::Commit)
            .await
            .unwrap();
        drain(&relay).await;
        assert_eq!(
            published(env.outbox.as_ref(), &more_other).await,
            2,
            "{backend:?}"
        );
        assert_eq!(
            published(env.outbox.as_ref(), &more_poison).await,
            0,
            "{backend:?}"
        );
        assert_eq!(blocked(&env, &clock).await[0].attempts, 3, "{backend:?}");

        // The cause fixed and the row released: it goes out ahead of its aggregate's rest.
        publisher.accept_all();
        env.outbox
            .maintenance()
            .release(poison[1].id)
            .await
            .unwrap();
        drain(&relay).await;
        // (poison[0], published a week ago, has been purged meanwhile.)
        let all_poison = [&poison[..], &more_poison[..]].concat();
        assert_eq!(
            published(env.outbox.as_ref(), &all_poison[1..]).await,
            4,
            "{backend:?}"
        );
        assert_in_order(
            &env,
            &[&all_poison[..], &same_lane[..], &more_other[..]].concat(),
        )
        .await;
        assert!(blocked(&env, &clock).await.is_empty(), "{backend:?}");
        env.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_counts_no_attempts_and_a_lane_going_alone_narrows_a_refusal_too() {
    for backend in BACKENDS {
        let poison = events("P-poison", 0..3);
        let Setup {
            clock,
            env,
            same_lane,
            elsewhere,
            publisher,
            relay,
        } = setup(backend, &poison, poison[0].id).await;

        // The broker is down: the lanes back off, nothing is blamed on any row.
        publisher.set_down(true);
        for _ in 0..3 {
            drain(&relay).await;
            clock.advance(1_000);
            // (one pass each: the lanes fail and back off)
        }
        let status = env
            .outbox
            .maintenance()
            .status(clock.now_ms())
            .await
            .unwrap();
        assert_eq!((status.retrying, status.held), (0, 0), "{backend:?}");
        assert_eq!(relay.stats().refused(), 0);
        assert!(relay.stats().publish_errors() >= 3);

        // Back up: the backed-off lanes drain alone, and the refusal is narrowed there.
        publisher.set_down(false);
        clock.advance(60_000);
        drain(&relay).await;
        assert_eq!(
            published(env.outbox.as_ref(), &same_lane).await,
            same_lane.len(),
            "{backend:?}"
        );
        assert_eq!(
            published(env.outbox.as_ref(), &elsewhere).await,
            elsewhere.len(),
            "{backend:?}"
        );
        assert_eq!(
            published(env.outbox.as_ref(), &poison).await,
            0,
            "{backend:?}"
        );
        let rows = blocked(&env, &clock).await;
        assert_eq!(rows.len(), 1, "{backend:?}");
        assert_eq!((rows[0].id, rows[0].attempts), (poison[0].id, 1));
        assert_in_order(&env, &[&same_lane[..], &elsewhere[..]].concat()).await;
        env.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregate_nothing_routes_is_held_alone_and_never_sent_elsewhere() {
    for backend in BACKENDS {
        // `factura` shares the outbox but has no route: its rows are refused by the relay
        // itself, attempt after attempt, then held; the orders around them go out.
        let unrouted: Vec<NewEvent> = (0..2)
            .map(|n| {
                NewEvent::new(
                    "factura",
                    "P-poison",
                    "factura.emitida",
                    serde_json::json!({ "n": n }),
                )
            })
            .collect();
        let Setup {
            clock,
            env,
            same_lane,
            elsewhere,
            relay,
            ..
        } = setup(backend, &unrouted, Uuid::nil()).await;
        for _ in 0..3 {
            drain(&relay).await;
            clock.advance(1_000);
        }
        assert_eq!(
            published(env.outbox.as_ref(), &same_lane).await
                + published(env.outbox.as_ref(), &elsewhere).await,
            same_lane.len() + elsewhere.len(),
            "{backend:?}"
        );
        assert_eq!(
            published(env.outbox.as_ref(), &unrouted).await,
            0,
            "{backend:?}"
        );
        let status = env
            .outbox
            .maintenance()
            .status(clock.now_ms())
            .await
            .unwrap();
        assert_eq!((status.held, status.retrying), (1, 0), "{backend:?}");
        let row = &status.blocked[0];
        assert_eq!(row.id, unrouted[0].id);
        assert!(
            row.last_error
                .as_deref()
                .unwrap()
                .contains("no topic is routed for aggregate `factura`"),
            "{backend:?}: {row:?}"
        );
        // Nothing of `factura` reached the topic, under any name.
        let records = all_records(env.log.as_ref(), TOPIC).await;
        assert!(!records.is_empty());
        assert!(
            records
                .iter()
                .all(|r| Envelope::parse(&r.payload).unwrap().kind == "pedido.creado"),
            "{backend:?}"
        );
        env.finish().await;
    }
}
