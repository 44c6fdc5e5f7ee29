//! Crash tests of the outbox relay with real `km0 run relay` processes, on SQLite and on
//! PostgreSQL.
//!
//! (c) The relay dies after the broker confirmed a publish and before it marked the outbox
//! row (`relay.after_publish=exit`). The event is in the log and its row still pending; the
//! next relay publishes it again (a second record with the same `id_evento` header) and the
//! stock consumer applies it once.
//!
//! (e) Three relays share the outbox's lanes. Every event is published and, for each
//! aggregate, its events reach the log in enqueue order, through
//!
//! - a transaction that commits late (PostgreSQL): the test holds an outbox row of aggregate
//!   `LATE-A` uncommitted while events of many aggregates, some in `LATE-A`'s own lane, are
//!   committed and published past it; then commits it and enqueues `LATE-A`'s next event;
//! - a relay killed with SIGKILL in the middle of a stream of events, whose lanes the
//!   survivors take over once its leases expire.
//!
//! The late commit cannot happen on SQLite: it has one writer at a time, so while the test
//! holds a write transaction open no other event can commit (nor any row be marked). There
//! the test runs the stream and the kill only.
//!
//! The order checked is that of first deliveries: a relay killed between publish and mark
//! publishes some events twice, and consumers skip the repeats by `id_evento`.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::process::{Deployment, Km0};
use common::state::{count, enqueue, eventually, order, place, taken, DbState};
use entrega::failpoint::RELAY_AFTER_PUBLISH;
use entrega_core::headers::ID_EVENTO;
use entrega_core::{now_ms, Envelope, NewEvent};
use km0::services::pedidos::{AGGREGATE, ORDER_PAID, TOPIC};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

/// Lease period of the processes: a dead relay's lanes are taken over after this.
const LEASE_TTL_MS: u64 = 1_000;
/// Longest wait for the system to reach an expected state.
const SETTLE: Duration = Duration::from_secs(30);

const LINES: &[(&str, i64)] = &[("tomate-rosa", 4), ("vino-crianza", 1)];

async fn killed_between_publish_and_mark_publishes_again_and_applies_once(backend: &str) {
    let deployment = Deployment::new(backend, LEASE_TTL_MS);
    let state = deployment.state().await;
    let before = state.stock().await;
    let pedidos = deployment.start("pedidos", "pedidos-1").await;
    let id = place(pedidos.http_addr(), &order("P-RELAY-1", LINES)).await;
    assert_eq!(state.pending().await, 1, "the event waits in the outbox");

    let mut relay = deployment.spawn("relay", "relay-1", &format!("{RELAY_AFTER_PUBLISH}=exit"));
    relay.died_at_failpoint().await;
    let records = state.records(TOPIC).await;
    let ids: Vec<_> = records.iter().map(|r| r.headers.get(ID_EVENTO)).collect();
    assert_eq!(
        ids,
        vec![Some(id.as_str())],
        "the confirmed publish is in the log"
    );
    assert_eq!(
        state.pending().await,
        1,
        "the row was marked published though the relay died before marking it"
    );

    // A new instance takes the dead one's lanes once their lease expires.
    let relay = deployment.start("relay", "relay-2").await;
    eventually(SETTLE, "the outbox drained by the second relay", || async {
        (state.pending().await == 0).then_some(())
    })
    .await;
    let records = state.records(TOPIC).await;
    let ids: Vec<_> = records.iter().map(|r| r.headers.get(ID_EVENTO)).collect();
    assert_eq!(
        ids,
        vec![Some(id.as_str()), Some(id.as_str())],
        "published again with the same id_evento"
    );
    assert_eq!(
        records[0].partition, records[1].partition,
        "both copies in the order's partition"
    );

    let consumer = deployment.start("inventario", "inventario-1").await;
    eventually(SETTLE, "both copies consumed", || async {
        state.consumed_all(2).await.then_some(())
    })
    .await;
    assert_eq!(
        state.stock().await,
        taken(&before, &[LINES]),
        "the event was applied more or less than once"
    );
    assert_eq!(state.keys().await, vec![id], "one key for both copies");

    consumer.terminate().await;
    relay.terminate().await;
    pedidos.terminate().await;
    state.close().await;
    deployment.destroy().await;
}

const RELAYS: [&str; 3] = ["relay-a", "relay-b", "relay-c"];
/// The relay killed mid-stream.
const VICTIM: &str = "relay-b";

fn event(aggregate_id: &str, n: u64) -> NewEvent {
    // `pedido.pagado`: routed to the orders topic like every `pedido` event.
    NewEvent::new(
        AGGREGATE,
        aggregate_id,
        ORDER_PAID,
        json!({ "agregado": aggregate_id, "n": n }),
    )
}

/// Waits until every lane is leased, unexpired, to one of `owners`, each holding some.
async fn lanes_shared_by(state: &DbState, owners: &[&str]) -> HashMap<String, Vec<i64>> {
    eventually(SETTLE, &format!("lanes shared by {owners:?}"), || async {
        let now = now_ms();
        let mut held: HashMap<String, Vec<i64>> = HashMap::new();
        for (lane, owner, expires_at_ms) in state.lanes().await {
            match owner {
                Some(owner) if owners.contains(&owner.as_str()) && expires_at_ms > now => {
                    held.entry(owner).or_default().push(lane);
                }
                _ => return None,
            }
        }
        (held.len() == owners.len()).then_some(held)
    })
    .await
}

/// Waits until every committed event is marked published.
async fn drained(state: &DbState, what: &str) {
    eventually(SETTLE, what, || async {
        (state.pending().await == 0).then_some(())
    })
    .await;
}

/// Every event of `produced` is in the log, and each aggregate's first deliveries come in
/// the order its events were enqueued.
async fn assert_all_published_in_order(state: &DbState, produced: &[NewEvent], when: &str) {
    let mut seen = HashSet::new();
    let mut delivered: HashMap<String, Vec<Uuid>> = HashMap::new();
    for record in state.records(TOPIC).await {
        let envelope = Envelope::parse(&record.payload).unwrap();
        if seen.insert(envelope.id) {
            delivered
                .entry(record.key.clone().expect("keyed by aggregate"))
                .or_default()
                .push(envelope.id);
        }
    }
    let mut expected: HashMap<String, Vec<Uuid>> = HashMap::new();
    for e in produced {
        expected
            .entry(e.aggregate_id.clone())
            .or_default()
            .push(e.id);
    }
    for (aggregate, ids) in &expected {
        assert_eq!(
            delivered.get(aggregate),
            Some(ids),
            "{when}: events of {aggregate} missing or out of enqueue order"
        );
    }
    assert_eq!(delivered.len(), expected.len(), "{when}: unexpected events");
}

/// PostgreSQL: a row of `LATE-A` stays uncommitted while later rows of other aggregates,
/// some in its own lane, are committed and published; committed late, it is still published,
/// and before `LATE-A`'s next event.
async fn late_commit(pool: &PgPool, state: &DbState, produced: &mut Vec<NewEvent>) {
    let first = event("LATE-A", 0);
    let mut held = entrega::Db::from(pool.clone()).begin().await.unwrap();
    held.enqueue(&first).await.unwrap();
    let (lane, seq): (i64, i64) =
        sqlx::query_as("SELECT CAST(lane AS BIGINT), seq FROM outbox WHERE id = $1")
            .bind(first.id)
            .fetch_one(held.postgres().unwrap())
            .await
            .unwrap();
    // Aggregates hashed into LATE-A's lane: their rows commit after LATE-A's row and before
    // its commit, the case a high-water mark over `seq` would skip.
    let mut neighbours = Vec::new();
    for i in 0.. {
        let candidate = format!("SAME-{i}");
        let candidate_lane: i64 = sqlx::query_scalar("SELECT CAST((hashtext($1) & 63) AS BIGINT)")
            .bind(&candidate)
            .fetch_one(pool)
            .await
            .unwrap();
        if candidate_lane == lane {
            neighbours.push(candidate);
        }
        if neighbours.len() == 3 {
            break;
        }
    }
    let aggregates: Vec<String> = (0..20)
        .map(|i| format!("B-{i}"))
        .chain(neighbours)
        .collect();
    for round in 0..4 {
        let batch: Vec<NewEvent> = aggregates.iter().map(|a| event(a, round)).collect();
        enqueue(&state.pedidos, &batch).await;
        produced.extend(batch);
    }
    drained(state, "events committed after LATE-A's row published").await;
    let overtaking = count(
        &state.pedidos,
        &format!(
            "SELECT COUNT(*) FROM outbox WHERE lane = {lane} AND seq > {seq} \
             AND publicado_en IS NOT NULL"
        ),
    )
    .await;
    assert!(
        overtaking >= 4,
        "rows after LATE-A's in its lane should be published before it commits ({overtaking})"
    );
    assert!(
        state
            .records(TOPIC)
            .await
            .iter()
            .all(|r| r.key.as_deref() != Some("LATE-A")),
        "an uncommitted row was published"
    );

    held.commit().await.unwrap();
    produced.push(first);
    let next = event("LATE-A", 1);
    enqueue(&state.pedidos, std::slice::from_ref(&next)).await;
    produced.push(next);
    drained(state, "the late row and the one after it published").await;
    assert_all_published_in_order(state, produced, "after the late commit").await;
}

async fn three_relays_keep_order_through_a_late_commit_and_a_kill(backend: &str) {
    let deployment = Deployment::new(backend, LEASE_TTL_MS);
    let state = deployment.state().await;
    let mut relays: Vec<Km0> = Vec::new();
    for name in RELAYS {
        relays.push(deployment.start("relay", name).await);
    }
    lanes_shared_by(&state, &RELAYS).await;

    let mut produced = Vec::new();
    if let Some(pool) = state.pedidos.postgres() {
        late_commit(pool, &state, &mut produced).await;
    }

    // A stream of events; one relay is killed a third of the way in, mid-publish.
    let (aggregates, rounds) = (25, 30);
    let mut victim_lanes = Vec::new();
    for round in 0..rounds {
        let batch: Vec<NewEvent> = (0..aggregates)
            .map(|a| event(&format!("S-{a}"), round))
            .collect();
        enqueue(&state.pedidos, &batch).await;
        produced.extend(batch);
        if round == rounds / 3 {
            let held = lanes_shared_by(&state, &RELAYS).await;
            victim_lanes = held[VICTIM].clone();
            let index = relays.iter().position(|r| r.name == VICTIM).unwrap();
            relays.remove(index).kill().await;
        }
        // Paces the stream so the kill lands while events keep coming.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let survivors: Vec<&str> = RELAYS.into_iter().filter(|r| *r != VICTIM).collect();
    let held = lanes_shared_by(&state, &survivors).await;
    drained(&state, "every event published after the takeover").await;
    assert!(
        victim_lanes
            .iter()
            .all(|lane| held.values().any(|lanes| lanes.contains(lane))),
        "the killed relay's lanes {victim_lanes:?} were not taken over: {held:?}"
    );
    assert_all_published_in_order(&state, &produced, "after the kill").await;

    for relay in relays {
        relay.terminate().await;
    }
    state.close().await;
    deployment.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_three_relays_keep_order_through_a_kill() {
    three_relays_keep_order_through_a_late_commit_and_a_kill("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_three_relays_keep_order_through_a_late_commit_and_a_kill() {
    three_relays_keep_order_through_a_late_commit_and_a_kill("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_relay_killed_between_publish_and_mark_publishes_again_and_applies_once() {
    killed_between_publish_and_mark_publishes_again_and_applies_once("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_relay_killed_between_publish_and_mark_publishes_again_and_applies_once() {
    killed_between_publish_and_mark_publishes_again_and_applies_once("postgres").await;
}
