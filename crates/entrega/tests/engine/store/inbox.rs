//! The idempotent consumer's keys (`mensajes_procesados`): claimed with the effect and only
//! with it, duplicates refused per consumer, a batch claimed at once, purged by age.

use std::time::Duration;

use entrega::db::{query, Backend, Db, TimeMs};
use entrega_core::MigrationSet;

use super::conformance::Fixture;
use crate::support::on_both_databases;

const CONSUMER: &str = "inventario.descuento_stock";

async fn with_stock(backend: Backend) -> Fixture {
    let fixture = Fixture::new(backend, &[MigrationSet::Inbox]).await.unwrap();
    let db = fixture.db();
    db.execute(query(
        "CREATE TABLE stock (producto TEXT PRIMARY KEY,
                             unidades INTEGER NOT NULL CHECK (unidades >= 0))",
    ))
    .await
    .unwrap();
    db.execute(query("INSERT INTO stock VALUES ('queso-curado', 5)"))
        .await
        .unwrap();
    fixture
}

/// The seed's consumer: claim the key, apply the effect, commit both together.
async fn consume(db: &Db, consumer: &str, message_id: &str, units: i32) -> bool {
    let mut tx = db.begin().await.unwrap();
    let fresh = tx.claim(consumer, message_id).await.unwrap();
    if fresh {
        tx.execute(
            query("UPDATE stock SET unidades = unidades - $1 WHERE producto = 'queso-curado'")
                .bind(units),
        )
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
    fresh
}

async fn stock(db: &Db) -> i64 {
    let units: Option<i64> = db
        .scalar(query(
            "SELECT CAST(unidades AS BIGINT) FROM stock WHERE producto = 'queso-curado'",
        ))
        .await
        .unwrap();
    units.unwrap()
}

async fn a_key_is_claimed_once_per_consumer(backend: Backend) {
    let fixture = with_stock(backend).await;
    let db = fixture.db();
    for _delivery in 0..3 {
        consume(db, CONSUMER, "evt-1", 2).await;
    }
    assert_eq!(stock(db).await, 3, "the effect ran once");
    assert_eq!(db.processed(CONSUMER).await.unwrap(), 1);
    // Another consumer of the same event keeps its own key.
    assert!(consume(db, "inventario.aviso_productor", "evt-1", 0).await);
    assert_eq!(db.processed("inventario.aviso_productor").await.unwrap(), 1);
    assert_eq!(db.processed(CONSUMER).await.unwrap(), 1);
    fixture.finish().await.unwrap();
}

async fn a_failed_effect_rolls_the_key_back_too(backend: Backend) {
    let fixture = with_stock(backend).await;
    let db = fixture.db();
    let mut tx = db.begin().await.unwrap();
    assert!(tx.claim(CONSUMER, "evt-2").await.unwrap());
    let effect = tx
        .execute(query(
            "UPDATE stock SET unidades = unidades - 50 WHERE producto = 'queso-curado'",
        ))
        .await;
    assert!(
        effect.is_err(),
        "the CHECK constraint refuses negative stock"
    );
    drop(tx);
    assert_eq!(db.processed(CONSUMER).await.unwrap(), 0);
    assert!(
        consume(db, CONSUMER, "evt-2", 1).await,
        "the redelivery is applied"
    );
    assert_eq!(stock(db).await, 4);
    fixture.finish().await.unwrap();
}

async fn a_batch_claims_its_new_keys_at_once(backend: Backend) {
    let fixture = with_stock(backend).await;
    let db = fixture.db();
    assert!(consume(db, CONSUMER, "b-2", 1).await);
    let mut tx = db.begin().await.unwrap();
    let claimed = tx
        .claim_all(CONSUMER, &["b-3", "b-1", "b-2", "b-3", "b-4"])
        .await
        .unwrap();
    let mut claimed: Vec<String> = claimed.into_iter().collect();
    claimed.sort();
    assert_eq!(
        claimed,
        ["b-1", "b-3", "b-4"],
        "b-2 was applied before; b-3 once"
    );
    // The batch refuses b-4: its key goes back, the others commit.
    assert_eq!(tx.unclaim_all(CONSUMER, &["b-4"]).await.unwrap(), 1);
    assert!(tx.claim_all(CONSUMER, &[]).await.unwrap().is_empty());
    assert_eq!(tx.unclaim_all(CONSUMER, &[]).await.unwrap(), 0);
    tx.commit().await.unwrap();
    assert_eq!(db.processed(CONSUMER).await.unwrap(), 3);
    assert!(
        consume(db, CONSUMER, "b-4", 1).await,
        "the refused one is new again"
    );
    fixture.finish().await.unwrap();
}

async fn keys_are_purged_by_age(backend: Backend) {
    let fixture = with_stock(backend).await;
    let db = fixture.db();
    for id in ["old-1", "old-2", "recent"] {
        assert!(consume(db, CONSUMER, id, 0).await);
    }
    if backend == Backend::Sqlite {
        // The column's default writes the seed tables' text form, which the purge compares.
        let written: Option<String> = db
            .scalar(query(
                "SELECT procesado_en FROM mensajes_procesados WHERE id_mensaje = 'recent'",
            ))
            .await
            .unwrap();
        let written = written.unwrap();
        assert_eq!(written.len(), "2026-01-01T00:00:00.000Z".len(), "{written}");
        assert!(written.ends_with('Z') && written.contains('T'), "{written}");
    }
    let two_hours_ago = entrega_core::now_ms() - 2 * 3_600_000;
    db.execute(
        query("UPDATE mensajes_procesados SET procesado_en = $1 WHERE id_mensaje LIKE 'old-%'")
            .bind(TimeMs(two_hours_ago)),
    )
    .await
    .unwrap();
    let purged = db.purge_processed(Duration::from_secs(3600)).await.unwrap();
    assert_eq!(purged, 2);
    assert_eq!(db.processed(CONSUMER).await.unwrap(), 1);
    assert!(
        !consume(db, CONSUMER, "recent", 0).await,
        "still a duplicate"
    );
    assert!(
        consume(db, CONSUMER, "old-1", 0).await,
        "purged: applied again"
    );
    fixture.finish().await.unwrap();
}

on_both_databases!(
    a_key_is_claimed_once_per_consumer,
    a_failed_effect_rolls_the_key_back_too,
    a_batch_claims_its_new_keys_at_once,
    keys_are_purged_by_age,
);

/// On PostgreSQL a second claim of a key another open transaction holds waits for it, then
/// sees the duplicate once the first commits. (SQLite serializes writers at `BEGIN`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_claim_waits_for_the_first_and_sees_the_duplicate() {
    let fixture = Fixture::new(Backend::Postgres, &[MigrationSet::Inbox])
        .await
        .unwrap();
    let db = fixture.db().clone();
    let mut first = db.begin().await.unwrap();
    assert!(first.claim(CONSUMER, "evt-7").await.unwrap());
    let second = tokio::spawn({
        let db = db.clone();
        async move {
            let mut tx = db.begin().await.unwrap();
            let claimed = tx.claim(CONSUMER, "evt-7").await.unwrap();
            tx.commit().await.unwrap();
            claimed
        }
    });
    let blocked = entrega_testkit::wait_until(Duration::from_secs(10), || {
        let db = db.clone();
        async move {
            let waiting: Option<i64> = db
                .scalar(query(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                ))
                .await
                .unwrap();
            waiting.unwrap_or(0) > 0
        }
    })
    .await;
    assert!(
        blocked,
        "the second claim waits on the first's uncommitted key"
    );
    first.commit().await.unwrap();
    assert!(
        !second.await.unwrap(),
        "the second delivery must see a duplicate"
    );
    assert_eq!(db.processed(CONSUMER).await.unwrap(), 1);
    fixture.finish().await.unwrap();
}
