//! The relay's scenarios on both sources of the outbox, polling and the WAL, on one
//! PostgreSQL database each: the same records for the same rows, publish before mark, nothing
//! of a rolled-back transaction, a late commit published in its aggregate's order, a lost
//! confirmation published again with its id, published rows purged past retention.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega::db::{Backend, Db};
use entrega::{CancellationToken, Relay, RelayConfig, SystemClock, WalConfig, WalRelay};
use entrega_core::{
    Envelope, MigrationSet, NewEvent, OutgoingMessage, Publisher, Record, TopicAdmin,
    TransportError,
};
use entrega_testkit::memory::MemoryLog;
use entrega_testkit::{wait_until, Fault, FlakyPublisher};
use serde_json::json;
use uuid::Uuid;

use crate::support::pg::FreshDb;
use crate::support::relay_steps::{config, TOPIC};
use crate::support::TempDir;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Poll,
    Wal,
}

const SOURCES: [Source; 2] = [Source::Poll, Source::Wal];

struct Case {
    fresh: FreshDb,
    log: Arc<MemoryLog>,
    _dir: TempDir,
}

impl Case {
    async fn new() -> Self {
        let dir = TempDir::new();
        let fresh = FreshDb::new(Backend::Postgres, &dir, "unused").await;
        fresh.db.migrate(&[MigrationSet::Outbox]).await.unwrap();
        let log = Arc::new(MemoryLog::new());
        log.ensure_topic(TOPIC, 3).await.unwrap();
        Self {
            fresh,
            log,
            _dir: dir,
        }
    }

    fn db(&self) -> &Db {
        &self.fresh.db
    }

    /// Runs a relay of `source` publishing through `publisher` until the returned token is
    /// cancelled; the handle ends with the relay.
    fn run(
        &self,
        source: Source,
        publisher: Arc<dyn Publisher>,
        tune: impl FnOnce(&mut RelayConfig),
    ) -> (CancellationToken, tokio::task::JoinHandle<()>) {
        let mut relay_config = config(&format!("{source:?}"));
        relay_config.batch_size = 20;
        tune(&mut relay_config);
        let stop = CancellationToken::new();
        let token = stop.clone();
        let task = match source {
            Source::Poll => {
                let relay = Relay::new(
                    self.db().outbox(),
                    publisher,
                    Arc::new(SystemClock),
                    relay_config,
                );
                tokio::spawn(async move { relay.run(token).await.unwrap() })
            }
            Source::Wal => {
                let mut wal = WalConfig::default();
                wal.heartbeat_interval = Duration::from_millis(200);
                wal.status_interval = Duration::from_millis(100);
                let relay =
                    WalRelay::new(self.fresh.url(), self.db(), publisher, relay_config, wal)
                        .unwrap();
                tokio::spawn(async move { relay.run(token).await.unwrap() })
            }
        };
        (stop, task)
    }

    async fn commit(&self, events: &[NewEvent]) {
        let mut tx = self.db().begin().await.unwrap();
        tx.enqueue_all(events).await.unwrap();
        tx.commit().await.unwrap();
    }

    async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql)
            .fetch_one(self.db().postgres().unwrap())
            .await
            .unwrap()
    }

    async fn wait_ids(&self, n: usize, what: &str) {
        let seen = wait_until(Duration::from_secs(30), || {
            let count = ids(&self.log.records(TOPIC)).len();
            async move { count >= n }
        })
        .await;
        assert!(
            seen,
            "{what}: {} of {n} events",
            ids(&self.log.records(TOPIC)).len()
        );
    }

    async fn wait_marked(&self, what: &str) {
        let marked = wait_until(Duration::from_secs(30), || async {
            self.count("SELECT count(*) FROM outbox WHERE publicado_en IS NULL")
                .await
                == 0
        })
        .await;
        assert!(marked, "{what}: rows left unmarked");
    }
}

fn event(aggregate: &str, n: u32) -> NewEvent {
    NewEvent::new("pedido", aggregate, "pedido.creado", json!({ "n": n }))
}

/// How often each event id was published.
fn ids(records: &[Record]) -> HashMap<Uuid, usize> {
    let mut seen = HashMap::new();
    for r in records {
        *seen
            .entry(Envelope::parse(&r.payload).unwrap().id)
            .or_default() += 1;
    }
    seen
}

/// The `datos.n` of each key's first deliveries, in topic order.
fn first_order(records: &[Record]) -> HashMap<String, Vec<u64>> {
    let mut seen = std::collections::HashSet::new();
    let mut order: HashMap<String, Vec<u64>> = HashMap::new();
    for r in records {
        let e = Envelope::parse(&r.payload).unwrap();
        if seen.insert(e.id) {
            order
                .entry(r.key.clone().unwrap())
                .or_default()
                .push(e.data["n"].as_u64().unwrap());
        }
    }
    order
}

async fn stop(run: (CancellationToken, tokio::task::JoinHandle<()>)) {
    run.0.cancel();
    run.1.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_sources_publish_the_same_records_for_the_same_rows() {
    let case = Case::new().await;
    let mut rows = Vec::new();
    for n in 0..10 {
        rows.push(event(&format!("A{}", n % 3), n).with_header(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ));
    }
    let wal_log = case.log.clone();
    let run = case.run(Source::Wal, wal_log.clone(), |_| {});
    // One row from the slot's snapshot, the others from its stream.
    case.commit(&[event("W", 0)]).await;
    case.wait_ids(1, "wal running").await;
    case.commit(&rows).await;
    case.wait_ids(11, "wal").await;
    case.wait_marked("wal").await;
    stop(run).await;
    // The same rows again, pending, for the polling relay.
    sqlx::query("UPDATE outbox SET publicado_en = NULL")
        .execute(case.db().postgres().unwrap())
        .await
        .unwrap();
    let poll_log = Arc::new(MemoryLog::new());
    poll_log.ensure_topic(TOPIC, 3).await.unwrap();
    let run = case.run(Source::Poll, poll_log.clone(), |_| {});
    case.wait_marked("poll").await;
    stop(run).await;
    let by_id = |records: Vec<Record>| -> HashMap<Uuid, Record> {
        records
            .into_iter()
            .map(|r| (Envelope::parse(&r.payload).unwrap().id, r))
            .collect()
    };
    let (wal, poll) = (
        by_id(wal_log.records(TOPIC)),
        by_id(poll_log.records(TOPIC)),
    );
    assert_eq!(wal.len(), 11);
    for (id, w) in &wal {
        let p = &poll[id];
        assert_eq!((&w.key, w.partition), (&p.key, p.partition), "{id}: key");
        assert_eq!(w.payload, p.payload, "{id}: envelope");
        let headers = |r: &Record| {
            let mut h: Vec<(String, String)> = r
                .headers
                .iter()
                .map(|(n, v)| (n.to_owned(), v.to_owned()))
                .collect();
            h.sort();
            h
        };
        assert_eq!(headers(w), headers(p), "{id}: headers");
    }
    let traced = wal
        .values()
        .filter(|r| r.headers.get("traceparent").is_some())
        .count();
    assert_eq!(traced, 10, "the rows' own headers are published");
    case.fresh.finish().await;
}

/// Checks, at every publish, that none of the rows being published is marked yet.
struct ConfirmBeforeMark {
    db: Db,
    inner: Arc<dyn Publisher>,
    violations: AtomicUsize,
}

#[async_trait]
impl Publisher for ConfirmBeforeMark {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<(), TransportError> {
        for m in batch {
            let id = Uuid::parse_str(m.headers.get("id_evento").unwrap()).unwrap();
            let marked: bool =
                sqlx::query_scalar("SELECT publicado_en IS NOT NULL FROM outbox WHERE id = $1")
                    .bind(id)
                    .fetch_one(self.db.postgres().unwrap())
                    .await
                    .unwrap();
            if marked {
                self.violations.fetch_add(1, Ordering::SeqCst);
            }
        }
        self.inner.publish(batch).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_source_marks_only_what_the_broker_confirmed_and_nothing_rolled_back() {
    for source in SOURCES {
        let case = Case::new().await;
        let observer = Arc::new(ConfirmBeforeMark {
            db: case.db().clone(),
            inner: case.log.clone(),
            violations: AtomicUsize::new(0),
        });
        let run = case.run(source, observer.clone(), |_| {});
        let mut rolled_back = case.db().begin().await.unwrap();
        rolled_back.enqueue(&event("GONE", 0)).await.unwrap();
        rolled_back.rollback().await.unwrap();
        let rows: Vec<NewEvent> = (0..60).map(|n| event(&format!("A{}", n % 4), n)).collect();
        case.commit(&rows).await;
        case.wait_ids(60, &format!("{source:?}")).await;
        case.wait_marked(&format!("{source:?}")).await;
        stop(run).await;
        assert_eq!(
            observer.violations.load(Ordering::SeqCst),
            0,
            "{source:?}: marked before published"
        );
        let published = ids(&case.log.records(TOPIC));
        assert_eq!(
            published.len(),
            60,
            "{source:?}: the rolled-back event was published"
        );
        assert!(
            published.values().all(|&n| n == 1),
            "{source:?}: published twice"
        );
        case.fresh.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_source_publishes_a_late_commit_in_its_aggregates_order() {
    for source in SOURCES {
        let case = Case::new().await;
        let run = case.run(source, case.log.clone(), |_| {});
        // The WAL relay's slot is made once no transaction runs (PostgreSQL waits for those
        // running to end): it is running before the late transaction starts.
        case.commit(&[event("W", 0)]).await;
        case.wait_ids(1, &format!("{source:?} running")).await;
        let mut late = case.db().begin().await.unwrap();
        late.enqueue(&event("LATE", 0)).await.unwrap();
        let others: Vec<NewEvent> = (0..30).map(|n| event(&format!("O{}", n % 5), n)).collect();
        case.commit(&others).await;
        case.wait_ids(31, &format!("{source:?} before the late commit"))
            .await;
        late.commit().await.unwrap();
        case.commit(&[event("LATE", 1)]).await;
        case.wait_ids(33, &format!("{source:?} after the late commit"))
            .await;
        case.wait_marked(&format!("{source:?}")).await;
        stop(run).await;
        let order = first_order(&case.log.records(TOPIC));
        assert_eq!(
            order["LATE"],
            vec![0, 1],
            "{source:?}: the late commit out of order"
        );
        case.fresh.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_source_publishes_again_after_a_lost_confirmation_with_the_same_id() {
    for source in SOURCES {
        let case = Case::new().await;
        let flaky = Arc::new(FlakyPublisher::new(case.log.clone() as Arc<dyn Publisher>));
        flaky.set_times(Fault::LoseConfirmation, 1);
        let run = case.run(source, flaky.clone(), |_| {});
        let rows: Vec<NewEvent> = (0..10).map(|n| event("A", n)).collect();
        case.commit(&rows).await;
        case.wait_ids(10, &format!("{source:?}")).await;
        case.wait_marked(&format!("{source:?}")).await;
        stop(run).await;
        let records = case.log.records(TOPIC);
        let published = ids(&records);
        assert_eq!(published.len(), 10);
        assert!(
            published.values().any(|&n| n >= 2),
            "{source:?}: a batch whose confirmation was lost was not published again"
        );
        assert_eq!(first_order(&records)["A"], (0..10).collect::<Vec<u64>>());
        case.fresh.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_source_purges_published_rows_past_retention() {
    for source in SOURCES {
        let case = Case::new().await;
        let run = case.run(source, case.log.clone(), |c| {
            c.retention = Duration::ZERO;
            c.purge_interval = Duration::from_millis(100);
        });
        case.commit(&(0..5).map(|n| event("A", n)).collect::<Vec<_>>())
            .await;
        case.wait_ids(5, &format!("{source:?}")).await;
        let purged = wait_until(Duration::from_secs(15), || async {
            case.count("SELECT count(*) FROM outbox").await == 0
        })
        .await;
        stop(run).await;
        assert!(purged, "{source:?}: published rows were not purged");
        case.fresh.finish().await;
    }
}
