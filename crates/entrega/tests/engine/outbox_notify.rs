//! How the relays learn of new outbox rows, and subscribers of new log records, on
//! PostgreSQL. entrega's own transactions notify
//! once, after their commit, in a statement of their own: a `NOTIFY` inside the transaction
//! would hold the server's one notification lock until the commit is on disk, and every
//! writer of the outbox would wait for the others. Any other session (a seed's service
//! inserting rows itself) is still notified by the outbox's trigger. Asserted by counting
//! the notifications a plain listener receives: a `NOTIFY` inside the transaction and one
//! after it would be two.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use entrega::broker::DbLog;
use entrega::db::Backend;
use entrega::{MigrationSet, NewEvent, OutgoingMessage};
use entrega_core::{Publisher, TopicAdmin};
use serde_json::json;
use sqlx::postgres::PgListener;
use sqlx::Connection;

use support::pg::FreshDb;
use support::TempDir;

/// Notifications on the outbox's channel until none comes for `window`.
async fn received(listener: &mut PgListener, window: Duration) -> usize {
    let mut n = 0;
    while let Ok(Ok(_)) = tokio::time::timeout(window, listener.recv()).await {
        n += 1;
    }
    n
}

fn order(id: &str) -> NewEvent {
    NewEvent::new("pedido", id, "pedido.creado", json!({"id": id}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entrega_notifies_once_after_its_commit_and_other_writers_through_the_trigger() {
    let dir = TempDir::new();
    let fresh = FreshDb::new(Backend::Postgres, &dir, "pedidos.db").await;
    fresh.db.migrate(&[MigrationSet::Outbox]).await.unwrap();
    let mut listener = PgListener::connect(fresh.url()).await.unwrap();
    listener
        .listen(entrega_postgres::OUTBOX_CHANNEL)
        .await
        .unwrap();
    let window = Duration::from_millis(300);

    // entrega's transaction: one notification, after the commit.
    let mut tx = fresh.db.begin().await.unwrap();
    tx.enqueue_all(&[order("P-1"), order("P-2")]).await.unwrap();
    assert_eq!(
        received(&mut listener, window).await,
        0,
        "nothing before the commit"
    );
    tx.commit().await.unwrap();
    assert_eq!(received(&mut listener, window).await, 1);

    // Rolled back: none.
    let mut tx = fresh.db.begin().await.unwrap();
    tx.enqueue(&order("P-3")).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(received(&mut listener, window).await, 0);

    // A transaction that wrote no event: none.
    let tx = fresh.db.begin().await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(received(&mut listener, window).await, 0);

    // Another session, as the seed's services write: the trigger notifies.
    let mut seed = sqlx::PgConnection::connect(fresh.url()).await.unwrap();
    sqlx::query(
        "INSERT INTO outbox (id, agregado, agregado_id, tipo, carga)
         VALUES (gen_random_uuid(), 'pedido', 'P-4', 'pedido.creado', '{\"id\":\"P-4\"}')",
    )
    .execute(&mut seed)
    .await
    .unwrap();
    assert_eq!(received(&mut listener, window).await, 1);
    seed.close().await.unwrap();
    drop(listener);
    fresh.finish().await;
}

fn record(topic: &str, key: &str) -> OutgoingMessage {
    OutgoingMessage {
        topic: topic.to_owned(),
        key: Some(key.to_owned()),
        payload: b"{}".to_vec(),
        headers: entrega::Headers::new(),
    }
}

/// The database-backed log notifies its subscribers after each append commits, once per
/// topic, never inside the append's transaction (which would make appends wait for each
/// other's disk writes on the notification lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_notifies_each_topic_once_after_its_append() {
    let dir = TempDir::new();
    let fresh = FreshDb::new(Backend::Postgres, &dir, "broker.db").await;
    fresh.db.migrate(&[MigrationSet::Log]).await.unwrap();
    let log = DbLog::with_defaults(fresh.db.clone());
    log.ensure_topic("pedidos.eventos", 3).await.unwrap();
    log.ensure_topic("pagos.eventos", 1).await.unwrap();
    let mut listener = PgListener::connect(fresh.url()).await.unwrap();
    listener.listen("entrega_log").await.unwrap();
    let window = Duration::from_millis(300);

    // One partition: its own statement, then one notification.
    log.publish(&[record("pagos.eventos", "P-1")])
        .await
        .unwrap();
    let n = tokio::time::timeout(window, listener.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n.payload(), "pagos.eventos");
    assert_eq!(received(&mut listener, window).await, 0, "exactly one");

    // Several partitions of two topics in one transaction: one notification per topic.
    let batch: Vec<OutgoingMessage> = (0..12)
        .map(|i| record("pedidos.eventos", &format!("P-{i}")))
        .chain([record("pagos.eventos", "P-2")])
        .collect();
    log.publish(&batch).await.unwrap();
    let mut topics = Vec::new();
    while let Ok(Ok(n)) = tokio::time::timeout(window, listener.recv()).await {
        topics.push(n.payload().to_owned());
    }
    topics.sort();
    assert_eq!(topics, ["pagos.eventos", "pedidos.eventos"]);
    drop(listener);
    drop(log);
    fresh.finish().await;
}
