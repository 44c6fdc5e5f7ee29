//! The outbox through `Db`: enqueue in the caller's transaction, pending rows per lane in
//! insertion order, lane leases shared by relays, fenced marking, purge and status, and
//! wake-ups after commits, on SQLite and PostgreSQL.

use std::sync::Arc;
use std::time::{Duration, Instant};

use entrega::db::{query, query_each, Backend, Db, TimeMs};
use entrega::OutboxPorts;
use entrega_core::{MigrationSet, NewEvent, StoreError, SystemClock};
use serde_json::json;
use uuid::Uuid;

use super::conformance::Fixture;
use crate::support::on_both_databases;

const TTL: Duration = Duration::from_secs(10);
const T0: i64 = 1_800_000_000_000;

async fn outbox_db(backend: Backend) -> (Fixture, OutboxPorts) {
    let fixture = Fixture::new(backend, &[MigrationSet::Outbox])
        .await
        .unwrap();
    let ports = fixture.db().outbox_with_clock(Arc::new(SystemClock));
    (fixture, ports)
}

async fn enqueue(db: &Db, events: &[NewEvent]) {
    let mut tx = db.begin().await.unwrap();
    tx.enqueue_all(events).await.unwrap();
    tx.commit().await.unwrap();
}

async fn count(db: &Db, sql: &'static str) -> i64 {
    db.scalar::<i64>(query(sql)).await.unwrap().unwrap()
}

/// The lane the database gave a row (SQLite is given it; PostgreSQL computes it).
async fn lane_of_row(db: &Db, id: Uuid) -> u32 {
    let lane: Option<i64> = db
        .scalar(query("SELECT CAST(lane AS BIGINT) FROM outbox WHERE id = $1").bind(id))
        .await
        .unwrap();
    u32::try_from(lane.unwrap()).unwrap()
}

async fn a_rolled_back_transaction_leaves_no_row(backend: Backend) {
    let (fixture, outbox) = outbox_db(backend).await;
    let db = fixture.db();
    let event = NewEvent::new("pedido", "P-1", "pedido.creado", json!({"id": "P-1"}));
    let mut tx = db.begin().await.unwrap();
    tx.enqueue(&event).await.unwrap();
    tx.rollback().await.unwrap();
    // Dropped without commit: rolled back too.
    let mut tx = db.begin().await.unwrap();
    tx.enqueue_all(&[event.clone(), event.clone()]).await.ok();
    drop(tx);
    assert_eq!(count(db, "SELECT COUNT(*) FROM outbox").await, 0);
    assert_eq!(outbox.maintenance.status(0).await.unwrap().pending, 0);
    fixture.finish().await.unwrap();
}

async fn pending_rows_come_per_lane_in_insertion_order(backend: Backend) {
    let (fixture, outbox) = outbox_db(backend).await;
    let db = fixture.db();
    let mut first = NewEvent::new("pedido", "P-7", "pedido.creado", json!({"n": 1}));
    first.version = 2;
    let second = NewEvent::new("pedido", "P-7", "pedido.pagado", json!({"n": 2}));
    let third = NewEvent::new("pedido", "P-7", "pedido.cancelado", json!({"n": 3})).with_header(
        "traceparent",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    );
    // Separate transactions, an unrelated aggregate in between, then two in one statement.
    enqueue(db, &[first.clone()]).await;
    enqueue(
        db,
        &[NewEvent::new(
            "producto",
            "queso-curado",
            "stock.actualizado",
            json!({}),
        )],
    )
    .await;
    enqueue(db, &[second.clone(), third.clone()]).await;

    let lane = lane_of_row(db, first.id).await;
    let rows: Vec<_> = outbox
        .reader
        .pending(lane, 10)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.aggregate_id == "P-7")
        .collect();
    let ids: Vec<_> = rows.iter().map(|r| r.id).collect();
    assert_eq!(ids, vec![first.id, second.id, third.id]);
    assert!(rows.windows(2).all(|w| w[0].seq < w[1].seq));
    assert_eq!(rows[0].version, 2);
    assert_eq!(
        (rows[0].kind.as_str(), rows[0].aggregate.as_str()),
        ("pedido.creado", "pedido")
    );
    assert_eq!(rows[0].payload, json!({"n": 1}));
    assert_eq!(
        rows[2].headers, third.headers,
        "headers travel with the row"
    );
    assert!(rows[0].headers.is_empty());
    let now = entrega_core::now_ms();
    assert!(
        (now - rows[0].created_at_ms).abs() < 60_000,
        "creado_en read back as epoch ms"
    );
    if backend == Backend::Sqlite {
        assert_eq!(
            lane,
            entrega_core::lane_of("P-7"),
            "SQLite is given the lane"
        );
    }
    assert_eq!(
        outbox.reader.pending(lane, 1).await.unwrap().len(),
        1,
        "limit is honoured"
    );
    fixture.finish().await.unwrap();
}

async fn a_seed_style_insert_is_published(backend: Backend) {
    let (fixture, outbox) = outbox_db(backend).await;
    let db = fixture.db();
    let id = Uuid::parse_str("6f1c1b1e-9a56-4a53-9a2c-3f2f5b0c9d11").unwrap();
    // The seed's own INSERT: entrega's columns all take their defaults.
    db.execute(
        query_each(
            "INSERT INTO outbox (id, agregado, agregado_id, tipo, carga)
             VALUES ($1, 'pedido', 'P-3', 'pedido.creado', $2)",
            "INSERT INTO outbox (id, agregado, agregado_id, tipo, carga)
             VALUES ($1, 'pedido', 'P-3', 'pedido.creado', CAST($2 AS jsonb))",
        )
        .bind(id)
        .bind(r#"{"id":"P-3"}"#),
    )
    .await
    .unwrap();
    let lane = lane_of_row(db, id).await;
    if backend == Backend::Sqlite {
        assert_eq!(lane, 0, "the column's default");
    }
    let rows = outbox.reader.pending(lane, 10).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].id, id);
    assert_eq!(rows[0].version, 1, "the seed leaves version to its default");
    assert_eq!(rows[0].payload, json!({"id": "P-3"}));
    fixture.finish().await.unwrap();
}

async fn marking_published_is_fenced_by_the_lease_token(backend: Backend) {
    let (fixture, outbox) = outbox_db(backend).await;
    let db = fixture.db();
    let event = NewEvent::new("pedido", "P-5", "pedido.creado", json!({}));
    enqueue(db, std::slice::from_ref(&event)).await;
    let lane = lane_of_row(db, event.id).await;

    let a = outbox
        .leases
        .balance(&first_life("relay-a"), T0, TTL)
        .await
        .unwrap();
    assert_eq!(a.len(), 64, "a lone instance takes every lane");
    let stale = a.into_iter().find(|l| l.lane == lane).unwrap();
    // relay-a goes silent; after the TTL relay-b takes over and the token moves on.
    let later = T0 + 10_001;
    let b = outbox
        .leases
        .balance(&first_life("relay-b"), later, TTL)
        .await
        .unwrap();
    assert_eq!(b.len(), 64);
    let fresh = b.into_iter().find(|l| l.lane == lane).unwrap();
    assert_eq!(fresh.token, stale.token + 1);

    let err = outbox
        .reader
        .mark_published(&stale, &[event.id], later)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::LeaseLost { .. }), "{err:?}");
    assert!(err.is_transient());
    assert_eq!(
        outbox.reader.pending(lane, 10).await.unwrap().len(),
        1,
        "nothing changed"
    );

    // Same owner, older token: refused as well (b left and came back in between).
    outbox
        .leases
        .release_all(&first_life("relay-b"))
        .await
        .unwrap();
    let back = outbox
        .leases
        .balance(&first_life("relay-b"), later, TTL)
        .await
        .unwrap();
    let current = back.into_iter().find(|l| l.lane == lane).unwrap();
    assert_eq!(current.token, fresh.token + 1);
    let err = outbox
        .reader
        .mark_published(&fresh, &[event.id], later)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::LeaseLost { .. }), "{err:?}");

    outbox
        .reader
        .mark_published(&current, &[event.id], later)
        .await
        .unwrap();
    assert!(outbox.reader.pending(lane, 10).await.unwrap().is_empty());
    let published: Option<TimeMs> = db
        .scalar(query("SELECT publicado_en FROM outbox WHERE id = $1").bind(event.id))
        .await
        .unwrap();
    assert_eq!(published, Some(TimeMs(later)));
    if backend == Backend::Sqlite {
        let text: Option<String> = db
            .scalar(query("SELECT publicado_en FROM outbox WHERE id = $1").bind(event.id))
            .await
            .unwrap();
        assert_eq!(
            text.as_deref(),
            Some("2027-01-15T08:00:10.001Z"),
            "the seed's text form"
        );
    }
    // Marking rows that are gone under a valid lease is not an error.
    outbox
        .maintenance
        .purge_published(i64::MAX / 2)
        .await
        .unwrap();
    outbox
        .reader
        .mark_published(&current, &[event.id], later + 1)
        .await
        .unwrap();
    fixture.finish().await.unwrap();
}

async fn instances_split_lanes_and_take_over_after_release(backend: Backend) {
    let (fixture, outbox) = outbox_db(backend).await;
    let leases = &outbox.leases;
    assert_eq!(
        leases
            .balance(&first_life("a"), T0, TTL)
            .await
            .unwrap()
            .len(),
        64
    );
    // b is live now, but a's leases are not expired: b gets nothing yet.
    assert!(leases
        .balance(&first_life("b"), T0 + 1, TTL)
        .await
        .unwrap()
        .is_empty());
    // a sees two live instances and gives back its surplus; b takes it.
    let a = leases.balance(&first_life("a"), T0 + 2, TTL).await.unwrap();
    let b = leases.balance(&first_life("b"), T0 + 3, TTL).await.unwrap();
    assert_eq!((a.len(), b.len()), (32, 32));
    assert!(
        b.iter().all(|l| l.token >= 2),
        "taken lanes get a new token"
    );
    let mut all: Vec<u32> = a.iter().chain(&b).map(|l| l.lane).collect();
    all.sort_unstable();
    assert_eq!(all, (0..64).collect::<Vec<_>>());

    leases.release_all(&first_life("a")).await.unwrap();
    let b = leases.balance(&first_life("b"), T0 + 4, TTL).await.unwrap();
    assert_eq!(b.len(), 64, "released lanes are free at once");
    fixture.finish().await.unwrap();
}

async fn purge_and_status_report_the_backlog(backend: Backend) {
    let (fixture, outbox) = outbox_db(backend).await;
    let db = fixture.db();
    let events: Vec<_> = (0..4)
        .map(|i| NewEvent::new("pedido", format!("P-{i}"), "pedido.creado", json!({"i": i})))
        .collect();
    enqueue(db, &events).await;
    db.execute(query("UPDATE outbox SET creado_en = $1").bind(TimeMs(100_000)))
        .await
        .unwrap();
    let status = outbox.maintenance.status(100_000 + 2_500).await.unwrap();
    assert_eq!((status.pending, status.published), (4, 0));
    assert_eq!(status.oldest_pending_age_ms, 2_500);

    let held = outbox
        .leases
        .balance(&first_life("r"), 0, TTL)
        .await
        .unwrap();
    for e in &events[..3] {
        let lane = lane_of_row(db, e.id).await;
        let lease = held.iter().find(|l| l.lane == lane).unwrap();
        let at = if e.aggregate_id == "P-0" {
            1_000
        } else {
            9_000
        };
        outbox
            .reader
            .mark_published(lease, &[e.id], at)
            .await
            .unwrap();
    }
    let status = outbox.maintenance.status(200_000).await.unwrap();
    assert_eq!((status.pending, status.published), (1, 3));
    assert_eq!(
        outbox.maintenance.purge_published(1_000).await.unwrap(),
        0,
        "not older than the cut"
    );
    assert_eq!(outbox.maintenance.purge_published(5_000).await.unwrap(), 1);
    let status = outbox.maintenance.status(200_000).await.unwrap();
    assert_eq!((status.pending, status.published), (1, 2));
    fixture.finish().await.unwrap();
}

async fn a_commit_wakes_a_waiting_relay(backend: Backend) {
    let (fixture, outbox) = outbox_db(backend).await;
    let db = fixture.db();
    // Let the wake-ups settle (PostgreSQL's listener wakes waiters once when it connects).
    let settled = entrega_testkit::wait_until(Duration::from_secs(10), || {
        let wakeup = outbox.wakeup.clone();
        async move {
            let started = Instant::now();
            wakeup.wait(Duration::from_millis(300)).await;
            started.elapsed() >= Duration::from_millis(250)
        }
    })
    .await;
    assert!(settled, "waits never settled");

    // A rolled-back insert does not wake anyone.
    let mut tx = db.begin().await.unwrap();
    tx.enqueue(&NewEvent::new("pedido", "P-0", "x", json!({})))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let started = Instant::now();
    outbox.wakeup.wait(Duration::from_millis(300)).await;
    assert!(started.elapsed() >= Duration::from_millis(250));

    let wakeup = outbox.wakeup.clone();
    let waiter = tokio::spawn(async move {
        let started = Instant::now();
        wakeup.wait(Duration::from_secs(60)).await;
        started.elapsed()
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "the wait returned without a commit");
    let event = NewEvent::new("pedido", "P-1", "pedido.creado", json!({}));
    enqueue(db, std::slice::from_ref(&event)).await;
    let waited = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the relay was not woken by the commit")
        .unwrap();
    assert!(waited < Duration::from_secs(5), "woke after {waited:?}");
    // The wake-up came after the commit, so the row is visible to the woken relay.
    let lane = lane_of_row(db, event.id).await;
    assert_eq!(outbox.reader.pending(lane, 10).await.unwrap().len(), 1);
    fixture.finish().await.unwrap();
}

async fn a_commit_before_the_wait_is_not_missed(backend: Backend) {
    let (fixture, outbox) = outbox_db(backend).await;
    enqueue(
        fixture.db(),
        &[NewEvent::new("pedido", "P-2", "pedido.creado", json!({}))],
    )
    .await;
    // The commit landed while no one was waiting (the relay was busy publishing).
    tokio::time::timeout(
        Duration::from_secs(5),
        outbox.wakeup.wait(Duration::from_secs(60)),
    )
    .await
    .expect("a wake-up that came before the wait was lost");
    fixture.finish().await.unwrap();
}

async fn a_duplicate_event_id_is_rejected_as_permanent(backend: Backend) {
    let (fixture, _outbox) = outbox_db(backend).await;
    let db = fixture.db();
    let event = NewEvent::new("pedido", "P-4", "pedido.creado", json!({}));
    enqueue(db, std::slice::from_ref(&event)).await;
    let mut tx = db.begin().await.unwrap();
    let err = tx.enqueue(&event).await.unwrap_err();
    assert!(matches!(err, StoreError::Rejected { .. }), "{err:?}");
    assert!(!err.is_transient());
    drop(tx);
    fixture.finish().await.unwrap();
}

on_both_databases!(
    a_rolled_back_transaction_leaves_no_row,
    pending_rows_come_per_lane_in_insertion_order,
    a_seed_style_insert_is_published,
    marking_published_is_fenced_by_the_lease_token,
    instances_split_lanes_and_take_over_after_release,
    purge_and_status_report_the_backlog,
    a_commit_wakes_a_waiting_relay,
    a_commit_before_the_wait_is_not_missed,
    a_duplicate_event_id_is_rejected_as_permanent,
);

/// `name` in its first life: the lease tests here balance one life of each instance.
fn first_life(name: &str) -> entrega_core::Holder {
    entrega_core::Holder::with_incarnation(name, 1)
}
