//! The WAL relay on PostgreSQL: rows committed before the slot and after it, commit order
//! across interleaved transactions, the broker away, a dropped slot (the relay stops; the
//! polling relay finishes), and a second relay that waits for the first.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use entrega::db::{Backend, Db};
use entrega::{CancellationToken, Relay, SystemClock, WalConfig, WalError, WalRelay};
use entrega_core::{Envelope, MigrationSet, NewEvent, Publisher, Record, TopicAdmin};
use entrega_testkit::memory::MemoryLog;
use entrega_testkit::{wait_until, Fault, FlakyPublisher};
use serde_json::json;
use uuid::Uuid;

use crate::support::pg::FreshDb;
use crate::support::relay_steps::{config, TOPIC};
use crate::support::TempDir;

struct Setup {
    fresh: FreshDb,
    log: Arc<MemoryLog>,
    _dir: TempDir,
}

async fn setup() -> Setup {
    let dir = TempDir::new();
    let fresh = FreshDb::new(Backend::Postgres, &dir, "unused").await;
    fresh.db.migrate(&[MigrationSet::Outbox]).await.unwrap();
    Setup {
        fresh,
        log: memory_log().await,
        _dir: dir,
    }
}

async fn memory_log() -> Arc<MemoryLog> {
    let log = Arc::new(MemoryLog::new());
    log.ensure_topic(TOPIC, 3).await.unwrap();
    log
}

fn wal_config() -> WalConfig {
    let mut wal = WalConfig::default();
    wal.heartbeat_interval = Duration::from_millis(200);
    wal.status_interval = Duration::from_millis(100);
    wal.check_interval = Duration::from_millis(200);
    wal
}

fn relay(s: &Setup, publisher: Arc<dyn Publisher>, wal: WalConfig) -> Arc<WalRelay> {
    let mut config = config("wal");
    config.batch_size = 50;
    Arc::new(WalRelay::new(s.fresh.url(), &s.fresh.db, publisher, config, wal).unwrap())
}

fn start(
    relay: &Arc<WalRelay>,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<Result<(), WalError>>,
) {
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let relay = Arc::clone(relay);
        let stop = stop.clone();
        async move { relay.run(stop).await }
    });
    (stop, task)
}

fn event(aggregate: &str, n: u32) -> NewEvent {
    NewEvent::new("pedido", aggregate, "pedido.creado", json!({ "n": n }))
}

async fn commit(db: &Db, events: &[NewEvent]) {
    let mut tx = db.begin().await.unwrap();
    tx.enqueue_all(events).await.unwrap();
    tx.commit().await.unwrap();
}

async fn unpublished(db: &Db) -> i64 {
    let pool = db.postgres().unwrap();
    sqlx::query_scalar("SELECT count(*) FROM outbox WHERE publicado_en IS NULL")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Each record's id, in topic order per key, and how often each id was published.
fn delivered(records: &[Record]) -> (HashMap<String, Vec<u64>>, HashMap<Uuid, usize>) {
    let mut order: HashMap<String, Vec<u64>> = HashMap::new();
    let mut times: HashMap<Uuid, usize> = HashMap::new();
    for r in records {
        let e = Envelope::parse(&r.payload).unwrap();
        let first = !times.contains_key(&e.id);
        *times.entry(e.id).or_default() += 1;
        if first {
            order
                .entry(r.key.clone().unwrap())
                .or_default()
                .push(e.data["n"].as_u64().unwrap());
        }
    }
    (order, times)
}

/// Each key's events came in their `datos.n` order.
fn assert_in_order(order: &HashMap<String, Vec<u64>>) {
    for (key, ns) in order {
        let mut sorted = ns.clone();
        sorted.sort_unstable();
        assert_eq!(ns, &sorted, "order of {key}");
    }
}

async fn wait_published(log: &MemoryLog, n: usize) {
    let seen = wait_until(Duration::from_secs(30), || {
        let count = delivered(&log.records(TOPIC)).1.len();
        async move { count >= n }
    })
    .await;
    assert!(
        seen,
        "{} of {n} events published",
        delivered(&log.records(TOPIC)).1.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_rows_before_and_after_the_slot_in_commit_order_and_marks_them() {
    let s = setup().await;
    let db = &s.fresh.db;
    // Pending before the slot exists: published from the slot's snapshot first.
    commit(db, &[event("A", 0), event("B", 0)]).await;
    let relay = relay(&s, s.log.clone(), wal_config());
    let (stop, task) = start(&relay);
    wait_published(&s.log, 2).await;

    // A long transaction takes its seq first and commits last: its event goes out after the
    // short one that committed before it.
    let mut long = db.begin().await.unwrap();
    long.enqueue(&event("A", 1)).await.unwrap();
    commit(db, &[event("B", 1)]).await;
    wait_published(&s.log, 3).await;
    long.commit().await.unwrap();
    for n in 2..40 {
        commit(db, &[event("A", n), event("B", n), event("C", n)]).await;
    }
    wait_published(&s.log, 2 + 2 + 38 * 3).await;

    let records = s.log.records(TOPIC);
    let (order, times) = delivered(&records);
    assert!(
        times.values().all(|&n| n == 1),
        "an event was published twice"
    );
    assert_in_order(&order);
    let position = |id: &str| {
        records
            .iter()
            .position(|r| {
                r.key.as_deref() == Some(id.split(':').next().unwrap())
                    && Envelope::parse(&r.payload).unwrap().data["n"] == json!(1)
            })
            .unwrap()
    };
    assert!(
        position("B:1") < position("A:1"),
        "commit order: B's event first"
    );
    // The same record the polling relay publishes: the seed's headers and envelope.
    let first = &records[0];
    assert!(first.headers.get("id_evento").is_some());
    assert_eq!(first.headers.get("tipo"), Some("pedido.creado"));
    assert_eq!(Envelope::parse(&first.payload).unwrap().source, "pedidos");

    let marked = wait_until(Duration::from_secs(10), || async {
        unpublished(db).await == 0
    })
    .await;
    assert!(marked, "{} rows left unmarked", unpublished(db).await);
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(relay.stats().published(), 2 + 2 + 38 * 3);
    // The slot's position was confirmed past everything published: a new session reads
    // nothing again.
    let again = memory_log().await;
    let second = self::relay(&s, again.clone(), wal_config());
    let (stop, task) = start(&second);
    commit(db, &[event("D", 0)]).await;
    wait_published(&again, 1).await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(
        delivered(&again.records(TOPIC)).1.len(),
        1,
        "only the new row"
    );
    s.fresh.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_away_holds_the_slot_and_everything_drains_after() {
    let s = setup().await;
    let db = &s.fresh.db;
    let flaky = Arc::new(FlakyPublisher::new(s.log.clone() as Arc<dyn Publisher>));
    let relay = relay(&s, flaky.clone(), wal_config());
    let (stop, task) = start(&relay);
    commit(db, &[event("A", 0)]).await;
    wait_published(&s.log, 1).await;
    flaky.set(Fault::Unavailable);
    for n in 1..200 {
        commit(db, &[event("A", n), event("B", n)]).await;
    }
    // Nothing is marked or confirmed while the broker is away; the slot's lag grows.
    let lagging = wait_until(Duration::from_secs(10), || {
        let relay = Arc::clone(&relay);
        async move { relay.gauges().lag_bytes() > 0 && relay.gauges().lag_seconds() > 0.0 }
    })
    .await;
    assert!(lagging, "the slot's lag is not shown");
    assert_eq!(unpublished(db).await, 398);
    flaky.set(Fault::None);
    wait_published(&s.log, 399).await;
    let drained = wait_until(Duration::from_secs(10), || async {
        unpublished(db).await == 0
    })
    .await;
    assert!(drained);
    let (order, times) = delivered(&s.log.records(TOPIC));
    assert_eq!(times.len(), 399);
    assert_in_order(&order);
    stop.cancel();
    task.await.unwrap().unwrap();
    s.fresh.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_slot_stops_the_relay_and_the_polling_relay_finishes() {
    let s = setup().await;
    let db = &s.fresh.db;
    let relay = relay(&s, s.log.clone(), wal_config());
    let (stop, task) = start(&relay);
    commit(db, &[event("A", 0), event("B", 0)]).await;
    wait_published(&s.log, 2).await;
    // Its creation complete (a creation cut short is made again, not reported as dropped).
    let streaming = wait_until(Duration::from_secs(30), || {
        let relay = Arc::clone(&relay);
        async move { relay.gauges().streaming() }
    })
    .await;
    assert!(streaming, "the relay does not stream");
    stop.cancel();
    task.await.unwrap().unwrap();
    // Written while no relay runs, then the operator drops the slot.
    let later: Vec<NewEvent> = (1..30).map(|n| event("A", n)).collect();
    commit(db, &later).await;
    let pool = db.postgres().unwrap();
    // The stopped relay's sender may hold the slot a moment longer: the operator tries again.
    let dropped = wait_until(Duration::from_secs(10), || async {
        sqlx::query("SELECT pg_drop_replication_slot($1)")
            .bind(relay.slot())
            .execute(pool)
            .await
            .is_ok()
    })
    .await;
    assert!(dropped, "the slot could not be dropped");
    let (_stop, task) = start(&relay);
    let stopped = tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(stopped, Err(WalError::SlotDropped { ref slot }) if slot == relay.slot()),
        "{stopped:?}"
    );
    let exists: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)",
    )
    .bind(relay.slot())
    .fetch_one(pool)
    .await
    .unwrap();
    assert!(!exists, "a new slot was created silently");
    // The table is the truth: the polling relay publishes exactly what is left.
    let polling = Relay::new(
        db.outbox(),
        s.log.clone(),
        Arc::new(SystemClock),
        config("poll"),
    );
    while polling.drain_once().await.unwrap() > 0 {}
    assert_eq!(unpublished(db).await, 0);
    let (order, times) = delivered(&s.log.records(TOPIC));
    assert_eq!(times.len(), 31);
    assert_eq!(order["A"], (0..30).collect::<Vec<u64>>());
    // Recreating it on purpose publishes nothing twice: every row is marked.
    let mut wal = wal_config();
    wal.recreate_slot = true;
    let again = self::relay(&s, s.log.clone(), wal);
    let (stop, task) = start(&again);
    commit(db, &[event("A", 30)]).await;
    wait_published(&s.log, 32).await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert!(delivered(&s.log.records(TOPIC)).1.values().all(|&n| n == 1));
    s.fresh.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_relay_waits_and_takes_over_when_the_first_stops() {
    let s = setup().await;
    let db = &s.fresh.db;
    let first = relay(&s, s.log.clone(), wal_config());
    let (stop_first, first_task) = start(&first);
    commit(db, &[event("A", 0)]).await;
    wait_published(&s.log, 1).await;
    let streaming = wait_until(Duration::from_secs(20), || {
        let first = Arc::clone(&first);
        async move { first.gauges().streaming() }
    })
    .await;
    assert!(streaming, "the first relay does not stream");
    let second = relay(&s, s.log.clone(), wal_config());
    let (stop_second, second_task) = start(&second);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(first.gauges().streaming(), "the first relay streams");
    assert!(
        !second.gauges().streaming(),
        "two relays stream from one slot"
    );
    stop_first.cancel();
    first_task.await.unwrap().unwrap();
    let took_over = wait_until(Duration::from_secs(20), || {
        let second = Arc::clone(&second);
        async move { second.gauges().streaming() }
    })
    .await;
    assert!(took_over, "the second relay did not take over");
    commit(db, &[event("A", 1)]).await;
    wait_published(&s.log, 2).await;
    let marked = wait_until(Duration::from_secs(10), || {
        let second = Arc::clone(&second);
        async move { second.stats().published() == 1 }
    })
    .await;
    assert!(marked, "the second relay published and marked the new row");
    assert_eq!(first.stats().published(), 1);
    stop_second.cancel();
    second_task.await.unwrap().unwrap();
    s.fresh.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_transaction_of_fifty_thousand_rows_is_published_once_in_order() {
    const ROWS: u32 = 50_000;
    let s = setup().await;
    let db = &s.fresh.db;
    let relay = relay(&s, s.log.clone(), wal_config());
    let (stop, task) = start(&relay);
    commit(db, &[event("before", 0)]).await;
    wait_published(&s.log, 1).await;
    let big: Vec<NewEvent> = (0..ROWS)
        .map(|n| event(&format!("K{}", n % 97), n))
        .collect();
    commit(db, &big).await;
    commit(db, &[event("after", 0)]).await;
    let seen = wait_until(Duration::from_secs(120), || {
        let count = delivered(&s.log.records(TOPIC)).1.len();
        async move { count >= ROWS as usize + 2 }
    })
    .await;
    assert!(
        seen,
        "{} events published",
        delivered(&s.log.records(TOPIC)).1.len()
    );
    let records = s.log.records(TOPIC);
    let (order, times) = delivered(&records);
    assert_eq!(times.len(), ROWS as usize + 2);
    assert!(
        times.values().all(|&n| n == 1),
        "an event was published twice"
    );
    assert_in_order(&order);
    let marked = wait_until(Duration::from_secs(30), || async {
        unpublished(db).await == 0
    })
    .await;
    assert!(marked, "{} rows left unmarked", unpublished(db).await);
    stop.cancel();
    task.await.unwrap().unwrap();
    s.fresh.finish().await;
}
