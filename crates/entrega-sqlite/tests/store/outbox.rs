//! The outbox: enqueue in the caller's transaction, lanes, fenced marking, purge, wake-ups.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use crate::common;

use std::time::{Duration, Instant};

use common::TestDb;
use entrega_core::{
    lane_of, LaneLeases, MigrationSet, NewEvent, OutboxMaintenance, OutboxReader, OutboxWakeup,
    StoreError,
};
use entrega_sqlite::{begin_immediate, SqliteOutbox};
use serde_json::json;

const TTL: Duration = Duration::from_secs(10);
const T0: i64 = 1_800_000_000_000;

async fn outbox_db() -> (TestDb, SqliteOutbox) {
    let db = TestDb::new(&[MigrationSet::Outbox]).await;
    let outbox = SqliteOutbox::new(db.pool.clone());
    (db, outbox)
}

async fn enqueue(db: &TestDb, events: &[NewEvent]) {
    let mut tx = begin_immediate(&db.pool).await.unwrap();
    SqliteOutbox::enqueue_all(&mut tx, events).await.unwrap();
    tx.commit().await.unwrap();
}

async fn row_count(db: &TestDb) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM outbox")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_rolled_back_transaction_leaves_no_row() {
    let (db, outbox) = outbox_db().await;
    let event = NewEvent::new("pedido", "P-1", "pedido.creado", json!({"id": "P-1"}));
    let mut tx = begin_immediate(&db.pool).await.unwrap();
    SqliteOutbox::enqueue(&mut tx, &event).await.unwrap();
    tx.rollback().await.unwrap();

    // Dropped without commit: rolled back too.
    let mut tx = db.pool.begin().await.unwrap();
    SqliteOutbox::enqueue(&mut tx, &event).await.unwrap();
    drop(tx);

    assert_eq!(row_count(&db).await, 0);
    assert!(outbox.pending(lane_of("P-1"), 10).await.unwrap().is_empty());
}

#[tokio::test]
async fn pending_rows_come_per_lane_in_insertion_order() {
    let (db, outbox) = outbox_db().await;
    let mut first = NewEvent::new("pedido", "P-7", "pedido.creado", json!({"n": 1}));
    first.version = 2;
    let second = NewEvent::new("pedido", "P-7", "pedido.pagado", json!({"n": 2}));
    let third = NewEvent::new("pedido", "P-7", "pedido.cancelado", json!({"n": 3}));
    // Separate transactions, and an unrelated aggregate in between.
    enqueue(&db, &[first.clone()]).await;
    enqueue(
        &db,
        &[NewEvent::new(
            "producto",
            "queso-curado",
            "stock.actualizado",
            json!({}),
        )],
    )
    .await;
    enqueue(&db, &[second.clone(), third.clone()]).await;

    let lane = lane_of("P-7");
    let rows = outbox.pending(lane, 10).await.unwrap();
    let rows: Vec<_> = rows
        .into_iter()
        .filter(|r| r.aggregate_id == "P-7")
        .collect();
    let ids: Vec<_> = rows.iter().map(|r| r.id).collect();
    assert_eq!(ids, vec![first.id, second.id, third.id]);
    assert!(rows.windows(2).all(|w| w[0].seq < w[1].seq));
    assert_eq!(rows[0].version, 2);
    assert_eq!(rows[0].kind, "pedido.creado");
    assert_eq!(rows[0].aggregate, "pedido");
    assert_eq!(rows[0].payload, json!({"n": 1}));
    let now = entrega_core::now_ms();
    assert!(
        (now - rows[0].created_at_ms).abs() < 60_000,
        "creado_en read back as epoch ms"
    );

    let stored_lane: i64 = sqlx::query_scalar("SELECT lane FROM outbox WHERE id = ?")
        .bind(first.id.to_string())
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(stored_lane, i64::from(lane));
    assert_eq!(
        outbox.pending(lane, 1).await.unwrap().len(),
        1,
        "limit is honoured"
    );
}

#[tokio::test]
async fn a_seed_style_insert_is_published_from_lane_zero() {
    let (db, outbox) = outbox_db().await;
    sqlx::query(
        "INSERT INTO outbox (id, agregado, agregado_id, tipo, carga) VALUES (?, 'pedido', 'P-3', 'pedido.creado', ?)",
    )
    .bind("6f1c1b1e-9a56-4a53-9a2c-3f2f5b0c9d11")
    .bind(r#"{"id":"P-3"}"#)
    .execute(&db.pool)
    .await
    .unwrap();
    let rows = outbox.pending(0, 10).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].id.to_string(),
        "6f1c1b1e-9a56-4a53-9a2c-3f2f5b0c9d11"
    );
    assert_eq!(rows[0].version, 1);
}

#[tokio::test]
async fn marking_published_is_fenced_by_the_lease_token() {
    let (db, outbox) = outbox_db().await;
    let event = NewEvent::new("pedido", "P-5", "pedido.creado", json!({}));
    enqueue(&db, std::slice::from_ref(&event)).await;
    let lane = lane_of("P-5");

    let a = outbox.balance("relay-a", T0, TTL).await.unwrap();
    assert_eq!(a.len(), 64, "a lone instance takes every lane");
    let stale = a.into_iter().find(|l| l.lane == lane).unwrap();

    // relay-a goes silent; after the TTL relay-b takes over and the token moves on.
    let later = T0 + 10_001;
    let b = outbox.balance("relay-b", later, TTL).await.unwrap();
    assert_eq!(b.len(), 64);
    let fresh = b.into_iter().find(|l| l.lane == lane).unwrap();
    assert_eq!(fresh.token, stale.token + 1);

    let err = outbox
        .mark_published(&stale, &[event.id], later)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::LeaseLost { .. }), "{err:?}");
    assert!(err.is_transient());
    assert_eq!(
        outbox.pending(lane, 10).await.unwrap().len(),
        1,
        "nothing changed"
    );

    // Same owner, older token: refused as well (b left and came back in between).
    outbox.release_all("relay-b").await.unwrap();
    let back = outbox.balance("relay-b", later, TTL).await.unwrap();
    let current = back.into_iter().find(|l| l.lane == lane).unwrap();
    assert_eq!(current.token, fresh.token + 1);
    let err = outbox
        .mark_published(&fresh, &[event.id], later)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::LeaseLost { .. }), "{err:?}");
    assert_eq!(
        outbox.pending(lane, 10).await.unwrap().len(),
        1,
        "nothing changed"
    );

    outbox
        .mark_published(&current, &[event.id], later)
        .await
        .unwrap();
    assert!(outbox.pending(lane, 10).await.unwrap().is_empty());
    let published: String = sqlx::query_scalar("SELECT publicado_en FROM outbox WHERE id = ?")
        .bind(event.id.to_string())
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(published, "2027-01-15T08:00:10.001Z");
}

#[tokio::test]
async fn instances_split_lanes_and_take_over_after_release() {
    let (_db, outbox) = outbox_db().await;
    assert_eq!(outbox.balance("a", T0, TTL).await.unwrap().len(), 64);
    // b is live now, but a's leases are not expired: b gets nothing yet.
    assert!(outbox.balance("b", T0 + 1, TTL).await.unwrap().is_empty());
    // a sees two live instances and gives back its surplus; b takes it.
    let a = outbox.balance("a", T0 + 2, TTL).await.unwrap();
    let b = outbox.balance("b", T0 + 3, TTL).await.unwrap();
    assert_eq!((a.len(), b.len()), (32, 32));
    let mut all: Vec<u32> = a.iter().chain(&b).map(|l| l.lane).collect();
    all.sort_unstable();
    assert_eq!(all, (0..64).collect::<Vec<_>>());

    outbox.release_all("a").await.unwrap();
    let b = outbox.balance("b", T0 + 4, TTL).await.unwrap();
    assert_eq!(b.len(), 64, "released lanes are free at once");
}

#[tokio::test]
async fn purge_and_status_report_the_backlog() {
    let (db, outbox) = outbox_db().await;
    let events: Vec<_> = (0..3)
        .map(|i| NewEvent::new("pedido", "P-9", "pedido.creado", json!({"i": i})))
        .collect();
    enqueue(&db, &events).await;
    let lane = lane_of("P-9");
    let now = entrega_core::now_ms();
    let status = outbox.status(now + 5_000).await.unwrap();
    assert_eq!(status.pending, 3);
    assert_eq!(status.published, 0);
    assert!(status.oldest_pending_age_ms >= 5_000 && status.oldest_pending_age_ms < 65_000);

    let lease = outbox
        .balance("r", now, TTL)
        .await
        .unwrap()
        .into_iter()
        .find(|l| l.lane == lane)
        .unwrap();
    outbox
        .mark_published(&lease, &[events[0].id, events[1].id], now)
        .await
        .unwrap();
    let status = outbox.status(now).await.unwrap();
    assert_eq!((status.pending, status.published), (1, 2));

    assert_eq!(
        outbox.purge_published(now).await.unwrap(),
        0,
        "not older than the cut"
    );
    assert_eq!(outbox.purge_published(now + 1).await.unwrap(), 2);
    assert_eq!(row_count(&db).await, 1);
}

#[tokio::test]
async fn a_commit_in_this_process_wakes_the_relay() {
    let (db, outbox) = outbox_db().await;
    // Nothing committed: the wait runs to its timeout.
    let started = Instant::now();
    outbox.wait(Duration::from_millis(150)).await;
    assert!(started.elapsed() >= Duration::from_millis(140));

    // A rolled-back insert does not wake anyone either.
    let mut tx = db.pool.begin().await.unwrap();
    SqliteOutbox::enqueue(&mut tx, &NewEvent::new("pedido", "P-0", "x", json!({})))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let started = Instant::now();
    outbox.wait(Duration::from_millis(150)).await;
    assert!(started.elapsed() >= Duration::from_millis(140));

    let waiter = {
        let outbox = outbox.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            outbox.wait(Duration::from_secs(60)).await;
            started.elapsed()
        })
    };
    enqueue(
        &db,
        &[NewEvent::new("pedido", "P-1", "pedido.creado", json!({}))],
    )
    .await;
    let waited = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the relay was not woken by the commit")
        .unwrap();
    assert!(waited < Duration::from_secs(5));
    // The wake-up happened after the commit, so the row is visible to the woken relay.
    assert_eq!(outbox.pending(lane_of("P-1"), 10).await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_commit_before_the_wait_is_not_missed() {
    let (db, outbox) = outbox_db().await;
    enqueue(
        &db,
        &[NewEvent::new("pedido", "P-2", "pedido.creado", json!({}))],
    )
    .await;
    // The commit landed while no one was waiting (the relay was busy publishing).
    tokio::time::timeout(Duration::from_secs(5), outbox.wait(Duration::from_secs(60)))
        .await
        .expect("a wake-up that came before the wait was lost");
}

#[tokio::test]
async fn a_duplicate_event_id_is_rejected_as_permanent() {
    let (db, _outbox) = outbox_db().await;
    let event = NewEvent::new("pedido", "P-4", "pedido.creado", json!({}));
    enqueue(&db, std::slice::from_ref(&event)).await;
    let mut tx = begin_immediate(&db.pool).await.unwrap();
    let err = SqliteOutbox::enqueue(&mut tx, &event).await.unwrap_err();
    assert!(matches!(err, StoreError::Rejected { .. }), "{err:?}");
}
