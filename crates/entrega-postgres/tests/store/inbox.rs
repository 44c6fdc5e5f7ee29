//! The idempotent consumer: claim in the effect's transaction, duplicates, purge.

use crate::common;

use std::time::Duration;

use common::{TestDb, TestResult};
use entrega_core::MigrationSet;
use entrega_postgres::PgInbox;

const CONSUMER: &str = "inventario.descuento_stock";

#[tokio::test]
async fn a_key_is_claimed_once_per_consumer_and_only_with_its_effect() -> TestResult {
    let db = TestDb::with(&[MigrationSet::Inbox]).await?;
    sqlx::query("CREATE TABLE stock (producto TEXT PRIMARY KEY, unidades INT NOT NULL)")
        .execute(&db.pool)
        .await?;
    sqlx::query("INSERT INTO stock VALUES ('tomate-rosa', 120)")
        .execute(&db.pool)
        .await?;

    // The effect's transaction rolls back: key and effect both vanish.
    let mut tx = db.pool.begin().await?;
    assert!(PgInbox::claim(&mut tx, CONSUMER, "evt-1").await?);
    sqlx::query("UPDATE stock SET unidades = unidades - 2")
        .execute(&mut *tx)
        .await?;
    tx.rollback().await?;
    assert_eq!(PgInbox::count(&db.pool, CONSUMER).await?, 0);

    // Applied once, then every redelivery is a duplicate.
    for _delivery in 0..3 {
        let mut tx = db.pool.begin().await?;
        if PgInbox::claim(&mut tx, CONSUMER, "evt-1").await? {
            sqlx::query("UPDATE stock SET unidades = unidades - 2")
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
    }
    let units: i32 = sqlx::query_scalar("SELECT unidades FROM stock")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(units, 118);
    assert_eq!(PgInbox::count(&db.pool, CONSUMER).await?, 1);

    // Another consumer of the same event has its own key.
    let mut tx = db.pool.begin().await?;
    assert!(PgInbox::claim(&mut tx, "inventario.aviso_productor", "evt-1").await?);
    tx.commit().await?;
    db.drop().await
}

#[tokio::test]
async fn a_concurrent_claim_waits_for_the_first_and_sees_the_duplicate() -> TestResult {
    let db = TestDb::with(&[MigrationSet::Inbox]).await?;
    let mut first = db.pool.begin().await?;
    assert!(PgInbox::claim(&mut first, CONSUMER, "evt-7").await?);

    let pool = db.pool.clone();
    let second = tokio::spawn(async move {
        let mut tx = pool.begin().await?;
        let claimed = PgInbox::claim(&mut tx, CONSUMER, "evt-7").await?;
        tx.commit().await?;
        Ok::<bool, common::Error>(claimed)
    });
    // The second claim blocks on the first's uncommitted key.
    let blocked = common::eventually(Duration::from_secs(10), || {
        let pool = db.pool.clone();
        async move {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .fetch_one(&pool)
            .await?;
            Ok(waiting > 0)
        }
    })
    .await?;
    assert!(blocked);
    first.commit().await?;
    assert!(!second.await??, "the second delivery must see a duplicate");
    assert_eq!(PgInbox::count(&db.pool, CONSUMER).await?, 1);
    db.drop().await
}

#[tokio::test]
async fn purge_deletes_only_old_keys() -> TestResult {
    let db = TestDb::with(&[MigrationSet::Inbox]).await?;
    let mut tx = db.pool.begin().await?;
    for id in ["old-1", "old-2", "new-1"] {
        assert!(PgInbox::claim(&mut tx, CONSUMER, id).await?);
    }
    tx.commit().await?;
    sqlx::query(
        "UPDATE mensajes_procesados SET procesado_en = now() - interval '2 hours'
         WHERE id_mensaje LIKE 'old-%'",
    )
    .execute(&db.pool)
    .await?;
    let purged = PgInbox::purge_older_than(&db.pool, Duration::from_secs(3600)).await?;
    assert_eq!(purged, 2);
    assert_eq!(PgInbox::count(&db.pool, CONSUMER).await?, 1);
    let mut tx = db.pool.begin().await?;
    assert!(!PgInbox::claim(&mut tx, CONSUMER, "new-1").await?);
    assert!(PgInbox::claim(&mut tx, CONSUMER, "old-1").await?);
    tx.commit().await?;
    db.drop().await
}
