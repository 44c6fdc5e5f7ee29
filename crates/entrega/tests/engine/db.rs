//! The one database handle on both backends: a transaction's business write, outbox row and
//! inbox key commit together or not at all; an application's migrations run once through
//! entrega's runner; per-backend texts run on their own backend.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use entrega::db::{query, query_each, Backend, Db, Migration};
use entrega_core::{MigrationSet, NewEvent, StoreError};
use serde_json::json;

use support::pg::FreshDb;
use support::TempDir;

const APP: &[Migration] = &[
    Migration::same(
        1,
        "saldo",
        "CREATE TABLE IF NOT EXISTS saldo (cuenta TEXT PRIMARY KEY, centimos BIGINT NOT NULL);
         INSERT INTO saldo (cuenta, centimos) VALUES ('A', 100) ON CONFLICT DO NOTHING;",
    ),
    Migration::each(
        2,
        "movimientos",
        "CREATE TABLE IF NOT EXISTS movimientos (id INTEGER PRIMARY KEY, cuenta TEXT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS movimientos (id BIGSERIAL PRIMARY KEY, cuenta TEXT NOT NULL)",
    ),
];

async fn migrated(backend: Backend, dir: &TempDir) -> FreshDb {
    let fresh = FreshDb::new(backend, dir, "app.db").await;
    fresh
        .db
        .migrate(&[MigrationSet::Outbox, MigrationSet::Inbox])
        .await
        .unwrap();
    fresh.db.apply_migrations("app", APP).await.unwrap();
    fresh
}

async fn balance(db: &Db) -> i64 {
    db.scalar(query("SELECT centimos FROM saldo WHERE cuenta = $1").bind("A"))
        .await
        .unwrap()
        .expect("account A")
}

async fn outbox_rows(db: &Db) -> i64 {
    db.scalar(query("SELECT COUNT(*) FROM outbox"))
        .await
        .unwrap()
        .unwrap()
}

async fn keys(db: &Db) -> i64 {
    db.scalar(query("SELECT COUNT(*) FROM mensajes_procesados"))
        .await
        .unwrap()
        .unwrap()
}

/// Claims `id`, takes 10 cents and enqueues an event, in one transaction; `commit` decides.
async fn charge(db: &Db, id: &str, commit: bool) -> Result<bool, StoreError> {
    let mut tx = db.begin().await?;
    if !tx.claim("pagos", id).await? {
        return Ok(false);
    }
    let changed = tx
        .execute(
            query("UPDATE saldo SET centimos = centimos - $1 WHERE cuenta = $2")
                .bind(10_i64)
                .bind("A"),
        )
        .await?;
    assert_eq!(changed, 1);
    let event = NewEvent::new("cuenta", "A", "cuenta.cargada", json!({ "centimos": 10 }));
    tx.enqueue(&event).await?;
    if commit {
        tx.commit().await?;
    } else {
        drop(tx);
    }
    Ok(true)
}

async fn effect_key_and_event_commit_together(backend: Backend) {
    let dir = TempDir::new();
    let store = migrated(backend, &dir).await;
    let db = store.db.clone();
    assert_eq!(db.backend(), backend);

    // Dropped without commit: nothing of the three is left.
    assert!(charge(&db, "m-1", false).await.unwrap());
    assert_eq!(
        (balance(&db).await, outbox_rows(&db).await, keys(&db).await),
        (100, 0, 0)
    );

    // Committed: all three.
    assert!(charge(&db, "m-1", true).await.unwrap());
    assert_eq!(
        (balance(&db).await, outbox_rows(&db).await, keys(&db).await),
        (90, 1, 1)
    );

    // The same message again is a duplicate: nothing applied twice.
    assert!(!charge(&db, "m-1", true).await.unwrap());
    assert_eq!(
        (balance(&db).await, outbox_rows(&db).await, keys(&db).await),
        (90, 1, 1)
    );
    assert_eq!(db.processed("pagos").await.unwrap(), 1);
    store.finish().await;
}

#[tokio::test]
async fn sqlite_effect_key_and_event_commit_together() {
    effect_key_and_event_commit_together(Backend::Sqlite).await;
}

#[tokio::test]
async fn postgres_effect_key_and_event_commit_together() {
    effect_key_and_event_commit_together(Backend::Postgres).await;
}

async fn app_migrations_run_once_through_entregas_runner(backend: Backend) {
    let dir = TempDir::new();
    let store = migrated(backend, &dir).await;
    let db = store.db.clone();
    // An operator deletes the seeded row; migrating again must not put it back.
    db.execute(query("DELETE FROM saldo")).await.unwrap();
    db.apply_migrations("app", APP).await.unwrap();
    let rows: Option<i64> = db
        .scalar(query("SELECT COUNT(*) FROM saldo"))
        .await
        .unwrap();
    assert_eq!(rows, Some(0));
    let recorded: Vec<(String, i64)> = db
        .fetch_all(query(
            "SELECT set_name, version FROM entrega_migrations WHERE set_name = $1 ORDER BY version",
        ).bind("app"))
        .await
        .unwrap();
    assert_eq!(recorded, vec![("app".to_owned(), 1), ("app".to_owned(), 2)]);

    // A database recorded further than this build knows is refused, not half-migrated.
    let older = &APP[..1];
    match db.apply_migrations("app", older).await {
        Err(StoreError::SchemaTooNew {
            found: 2,
            supported: 1,
        }) => {}
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    // entrega's own set names are not an application's to take.
    assert!(db.apply_migrations("outbox", APP).await.is_err());
    store.finish().await;
}

#[tokio::test]
async fn sqlite_app_migrations_run_once_through_entregas_runner() {
    app_migrations_run_once_through_entregas_runner(Backend::Sqlite).await;
}

#[tokio::test]
async fn postgres_app_migrations_run_once_through_entregas_runner() {
    app_migrations_run_once_through_entregas_runner(Backend::Postgres).await;
}

async fn each_backend_runs_its_own_text(backend: Backend) {
    let dir = TempDir::new();
    let store = FreshDb::new(backend, &dir, "app.db").await;
    let db = store.db.clone();
    let said: Option<String> = db
        .scalar(query_each("SELECT 'sqlite' || $1", "SELECT 'postgres' || $1").bind("!"))
        .await
        .unwrap();
    assert_eq!(
        said.as_deref(),
        Some(format!("{}!", backend.name()).as_str())
    );
    // Typed nulls bind on both (PostgreSQL types a parameter by what is bound).
    let none: Option<Option<i64>> = db
        .scalar(query("SELECT CAST($1 AS BIGINT)").bind(None::<i64>))
        .await
        .unwrap();
    assert_eq!(none, Some(None));
    // A bad statement is a classified error, not a panic.
    assert!(db
        .execute(query("SELECT * FROM no_such_table"))
        .await
        .is_err());
    assert_eq!(db.postgres().is_some(), backend == Backend::Postgres);
    assert_eq!(db.sqlite().is_some(), backend == Backend::Sqlite);
    store.finish().await;
}

#[tokio::test]
async fn sqlite_runs_its_own_text() {
    each_backend_runs_its_own_text(Backend::Sqlite).await;
}

#[tokio::test]
async fn postgres_runs_its_own_text() {
    each_backend_runs_its_own_text(Backend::Postgres).await;
}

/// `schema_behind` tells a database never migrated, one behind this build and a current one.
async fn schema_behind_names_what_is_missing(backend: Backend) {
    let dir = TempDir::new();
    let fresh = FreshDb::new(backend, &dir, "schema.db").await;
    let db = &fresh.db;
    assert_eq!(
        db.schema_behind().await.unwrap(),
        vec!["no entrega migrations applied".to_owned()]
    );
    db.migrate(&[MigrationSet::Outbox, MigrationSet::Inbox])
        .await
        .unwrap();
    assert!(db.schema_behind().await.unwrap().is_empty());
    db.execute(query(
        "DELETE FROM entrega_migrations WHERE set_name = 'inbox' AND version > 1",
    ))
    .await
    .unwrap();
    let behind = db.schema_behind().await.unwrap();
    assert_eq!(behind.len(), 1, "{behind:?}");
    assert!(behind[0].starts_with("inbox at 1 of "), "{behind:?}");
    fresh.finish().await;
}

#[tokio::test]
async fn sqlite_schema_behind_names_what_is_missing() {
    schema_behind_names_what_is_missing(Backend::Sqlite).await;
}

#[tokio::test]
async fn postgres_schema_behind_names_what_is_missing() {
    schema_behind_names_what_is_missing(Backend::Postgres).await;
}

#[tokio::test]
async fn unknown_urls_are_refused() {
    let err = Db::connect("mysql://x/y").await.unwrap_err();
    assert!(err.to_string().contains("mysql://x/y"), "{err}");
    let ttl = std::time::Duration::from_secs(1);
    let broker = entrega::Broker::connect("mqtt://x", ttl).await;
    assert!(matches!(
        broker,
        Err(entrega::BrokerError::UnknownScheme { .. })
    ));
    let broker = entrega::Broker::connect("amqp://x?prefetch=0", ttl).await;
    assert!(matches!(broker, Err(entrega::BrokerError::AmqpUrl { .. })));
    let broker = entrega::Broker::connect("amqp://guest:guest@127.0.0.1:5672", ttl).await;
    assert_eq!(broker.map(|b| b.kind()).ok(), Some("rabbitmq"));
}
