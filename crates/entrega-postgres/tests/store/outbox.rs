//! The outbox: transactional enqueue, lane leases shared by relays, fenced marking,
//! maintenance and commit wake-ups.

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{TestDb, TestResult};
use entrega_core::{
    LaneLease, LaneLeases, MigrationSet, NewEvent, OutboxMaintenance, OutboxReader, OutboxWakeup,
    StoreError,
};
use entrega_postgres::PgOutbox;
use serde_json::json;

const TTL: Duration = Duration::from_secs(10);

async fn lane_of(pool: &sqlx::PgPool, aggregate_id: &str) -> Result<u32, common::Error> {
    let lane: i32 = sqlx::query_scalar("SELECT (hashtext($1) & 63)")
        .bind(aggregate_id)
        .fetch_one(pool)
        .await?;
    Ok(u32::try_from(lane)?)
}

fn lanes(held: &[LaneLease]) -> BTreeSet<u32> {
    held.iter().map(|l| l.lane).collect()
}

#[tokio::test]
async fn a_rolled_back_transaction_leaves_no_row() -> TestResult {
    let db = TestDb::with(&[MigrationSet::Outbox]).await?;
    let outbox = PgOutbox::new(db.pool.clone());

    let mut tx = db.pool.begin().await?;
    PgOutbox::enqueue(
        &mut tx,
        &NewEvent::new("pedido", "P-1", "pedido.creado", json!({})),
    )
    .await?;
    tx.rollback().await?;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(rows, 0);
    assert_eq!(outbox.status(0).await?.pending, 0);

    let mut tx = db.pool.begin().await?;
    let events: Vec<NewEvent> = (0..3)
        .map(|i| NewEvent::new("pedido", "P-2", format!("pedido.paso{i}"), json!({"i": i})))
        .collect();
    PgOutbox::enqueue_all(&mut tx, &events).await?;
    tx.commit().await?;
    let lane = lane_of(&db.pool, "P-2").await?;
    let pending = outbox.pending(lane, 10).await?;
    let kinds: Vec<&str> = pending.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(kinds, ["pedido.paso0", "pedido.paso1", "pedido.paso2"]);
    assert!(pending.windows(2).all(|w| w[0].seq < w[1].seq));
    assert_eq!(pending[2].payload, json!({"i": 2}));
    assert_eq!(pending[0].id, events[0].id);
    db.drop().await
}

#[tokio::test]
async fn two_relays_split_the_lanes_and_a_leaver_hands_them_over() -> TestResult {
    let db = TestDb::with(&[MigrationSet::Outbox]).await?;
    let outbox = PgOutbox::new(db.pool.clone());
    let a = outbox.balance("a", 1_000, TTL).await?;
    assert_eq!(a.len(), 64);
    // b joins; a's lanes are not expired, so b gets nothing until a gives some back.
    assert!(outbox.balance("b", 1_100, TTL).await?.is_empty());
    let a = outbox.balance("a", 1_200, TTL).await?;
    let b = outbox.balance("b", 1_300, TTL).await?;
    assert_eq!((a.len(), b.len()), (32, 32));
    assert!(lanes(&a).is_disjoint(&lanes(&b)));
    assert!(
        b.iter().all(|l| l.token >= 2),
        "taken lanes get a new token"
    );

    outbox.release_all("a").await?;
    let b = outbox.balance("b", 1_400, TTL).await?;
    assert_eq!(b.len(), 64, "a clean leaver's lanes are free at once");
    db.drop().await
}

#[tokio::test]
async fn a_relay_that_lost_its_lane_cannot_mark_rows() -> TestResult {
    let db = TestDb::with(&[MigrationSet::Outbox]).await?;
    let outbox = PgOutbox::new(db.pool.clone());
    let event = NewEvent::new("pedido", "P-9", "pedido.creado", json!({"id": "P-9"}));
    let mut tx = db.pool.begin().await?;
    PgOutbox::enqueue(&mut tx, &event).await?;
    tx.commit().await?;
    let lane = lane_of(&db.pool, "P-9").await?;

    let old = outbox.balance("old", 0, Duration::from_secs(1)).await?;
    let old_lease = old
        .iter()
        .find(|l| l.lane == lane)
        .ok_or("lane missing")?
        .clone();
    let rows = outbox.pending(lane, 10).await?;
    assert_eq!(rows.len(), 1);

    // "old" stalls past its lease; "new" takes over every lane.
    let new = outbox.balance("new", 5_000, Duration::from_secs(1)).await?;
    assert_eq!(new.len(), 64);
    let new_lease = new
        .iter()
        .find(|l| l.lane == lane)
        .ok_or("lane missing")?
        .clone();
    assert!(new_lease.token > old_lease.token);

    let stale = outbox.mark_published(&old_lease, &[event.id], 5_100).await;
    assert!(
        matches!(stale, Err(StoreError::LeaseLost { .. })),
        "{stale:?}"
    );
    assert_eq!(
        outbox.pending(lane, 10).await?.len(),
        1,
        "nothing was marked"
    );

    outbox
        .mark_published(&new_lease, &[event.id], 5_200)
        .await?;
    assert!(outbox.pending(lane, 10).await?.is_empty());
    // Marking rows that are gone under a valid lease is not an error.
    outbox.purge_published(i64::MAX / 2).await?;
    outbox
        .mark_published(&new_lease, &[event.id], 5_300)
        .await?;
    db.drop().await
}

#[tokio::test]
async fn status_and_purge_report_the_backlog() -> TestResult {
    let db = TestDb::with(&[MigrationSet::Outbox]).await?;
    let outbox = PgOutbox::new(db.pool.clone());
    let events: Vec<NewEvent> = (0..4)
        .map(|i| NewEvent::new("pedido", format!("P-{i}"), "pedido.creado", json!({})))
        .collect();
    let mut tx = db.pool.begin().await?;
    PgOutbox::enqueue_all(&mut tx, &events).await?;
    tx.commit().await?;
    sqlx::query("UPDATE outbox SET creado_en = to_timestamp(100)")
        .execute(&db.pool)
        .await?;
    let status = outbox.status(100_000 + 2_500).await?;
    assert_eq!((status.pending, status.published), (4, 0));
    assert_eq!(status.oldest_pending_age_ms, 2_500);

    let held = outbox.balance("r", 0, TTL).await?;
    for e in &events[..3] {
        let lane = lane_of(&db.pool, &e.aggregate_id).await?;
        let lease = held.iter().find(|l| l.lane == lane).ok_or("lane missing")?;
        let at = if e.aggregate_id == "P-0" {
            1_000
        } else {
            9_000
        };
        outbox.mark_published(lease, &[e.id], at).await?;
    }
    assert_eq!(outbox.purge_published(5_000).await?, 1);
    let status = outbox.status(200_000).await?;
    assert_eq!((status.pending, status.published), (1, 2));
    db.drop().await
}

#[tokio::test]
async fn a_commit_wakes_a_waiting_relay_promptly() -> TestResult {
    let db = TestDb::with(&[MigrationSet::Outbox]).await?;
    let outbox = PgOutbox::new(db.pool.clone());
    // Let the listener connect and settle: its connection wakes waiters once.
    let settled = common::eventually(Duration::from_secs(10), || {
        let outbox = outbox.clone();
        async move {
            let started = Instant::now();
            outbox.wait(Duration::from_millis(300)).await;
            Ok(started.elapsed() >= Duration::from_millis(250))
        }
    })
    .await?;
    assert!(settled, "waits never settled");

    let waiter = outbox.clone();
    let task = tokio::spawn(async move {
        let started = Instant::now();
        waiter.wait(Duration::from_secs(30)).await;
        started.elapsed()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!task.is_finished(), "the wait returned without a commit");
    // A plain seed-style insert from another session: only the trigger can signal it.
    sqlx::query(
        "INSERT INTO outbox (id, agregado, agregado_id, tipo, carga)
         VALUES (gen_random_uuid(), 'pedido', 'P-1', 'pedido.creado', '{}')",
    )
    .execute(&db.pool)
    .await?;
    let waited = tokio::time::timeout(Duration::from_secs(20), task).await??;
    assert!(waited < Duration::from_secs(5), "woke after {waited:?}");
    db.drop().await
}
