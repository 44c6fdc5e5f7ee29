//! How the relays learn of new outbox rows on PostgreSQL. entrega's own transactions notify
//! once, after their commit, in a statement of their own: a `NOTIFY` inside the transaction
//! would hold the server's one notification lock until the commit is on disk, and every
//! writer of the outbox would wait for the others. Any other session (a seed's service
//! inserting rows itself) is still notified by the outbox's trigger. Asserted by counting
//! the notifications a plain listener receives: a `NOTIFY` inside the transaction and one
//! after it would be two.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use entrega::db::Backend;
use entrega::{MigrationSet, NewEvent};
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
