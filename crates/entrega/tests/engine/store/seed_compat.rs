//! The seed's own SQL keeps working: its INSERT into `outbox` gets published, and a database
//! created with the seed's CREATE TABLE statements is adopted by `migrate`, on PostgreSQL (the
//! seed's database) and on SQLite.

use std::time::Duration;

use entrega::broker::DbLog;
use entrega_core::{
    headers, Headers, MigrationSet, NewEvent, OutgoingMessage, Publisher, TopicAdmin,
};
use serde_json::json;
use sqlx::Row;
use uuid::Uuid;

type Error = Box<dyn std::error::Error + Send + Sync>;
type TestResult = Result<(), Error>;

/// A PostgreSQL database of the test's own, dropped at the end.
struct TestDb {
    pool: sqlx::PgPool,
    name: String,
}

impl TestDb {
    async fn empty() -> Result<Self, Error> {
        let name = format!("entrega_t_{}", Uuid::new_v4().simple());
        let url =
            entrega_postgres::ensure_database(&crate::support::pg::server_url(), &name).await?;
        let pool = entrega_postgres::connect(&url).await?;
        Ok(Self { pool, name })
    }

    async fn with(sets: &[MigrationSet]) -> Result<Self, Error> {
        let db = Self::empty().await?;
        entrega::Db::from(db.pool.clone()).migrate(sets).await?;
        Ok(db)
    }

    async fn drop(self) -> TestResult {
        self.pool.close().await;
        crate::support::pg::drop_database(&self.name).await;
        Ok(())
    }
}

const SEED_SCHEMA: &str = "
CREATE TABLE outbox (
    id           UUID        PRIMARY KEY,
    agregado     TEXT        NOT NULL,
    agregado_id  TEXT        NOT NULL,
    tipo         TEXT        NOT NULL,
    version      INTEGER     NOT NULL DEFAULT 1,
    carga        JSONB       NOT NULL,
    creado_en    TIMESTAMPTZ NOT NULL DEFAULT now(),
    publicado_en TIMESTAMPTZ
);
CREATE INDEX outbox_pendientes ON outbox (creado_en) WHERE publicado_en IS NULL;
CREATE TABLE mensajes_procesados (
    id_mensaje   TEXT        NOT NULL,
    consumidor   TEXT        NOT NULL,
    procesado_en TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (id_mensaje, consumidor)
);";

/// The seed's INSERT, as its Python issues it (JSON text cast by the column type).
async fn seed_insert(pool: &sqlx::PgPool, id: Uuid, pedido: &str) -> TestResult {
    sqlx::query(
        "INSERT INTO outbox (id, agregado, agregado_id, tipo, carga)
         VALUES ($1, 'pedido', $2, 'pedido.creado', $3::text::jsonb)",
    )
    .bind(id)
    .bind(pedido)
    .bind(format!(r#"{{"id": "{pedido}", "importe_centimos": 1250}}"#))
    .execute(pool)
    .await?;
    Ok(())
}

async fn lane_of_row(pool: &sqlx::PgPool, id: Uuid) -> Result<u32, Error> {
    let lane: i16 = sqlx::query_scalar("SELECT lane FROM outbox WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await?;
    Ok(u32::try_from(lane)?)
}

#[tokio::test]
async fn rows_inserted_by_the_seed_sql_are_published() -> TestResult {
    let db = TestDb::with(&[MigrationSet::Outbox, MigrationSet::Log]).await?;
    let id = Uuid::new_v4();
    seed_insert(&db.pool, id, "P-2026-000123").await?;

    let outbox = entrega::Db::from(db.pool.clone()).outbox();
    let leases = outbox
        .leases
        .balance(
            &entrega_core::Holder::with_incarnation("relay-1", 1),
            1_000,
            Duration::from_secs(10),
        )
        .await?;
    assert_eq!(leases.len(), 64, "a lone relay holds every lane");
    let lane = lane_of_row(&db.pool, id).await?;
    let rows = outbox.reader.pending(lane, 10).await?;
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(row.id, id);
    assert_eq!(row.aggregate_id, "P-2026-000123");
    assert_eq!(row.kind, "pedido.creado");
    assert_eq!(row.version, 1, "the seed leaves version to its default");
    assert_eq!(row.payload.to_value()["importe_centimos"], 1250);
    assert!(row.created_at_ms > 0);

    // Publish it the way the relay does, then mark it.
    let log = DbLog::with_defaults(db.pool.clone().into());
    log.ensure_topic("pedidos.eventos", 3).await?;
    let envelope = row.envelope("pedidos");
    let message = OutgoingMessage {
        topic: "pedidos.eventos".into(),
        key: Some(row.aggregate_id.clone()),
        headers: Headers::new()
            .with(headers::TIPO, row.kind.clone())
            .with(headers::ID_EVENTO, row.id.to_string()),
        payload: envelope.to_bytes(),
    };
    log.publish(&[message]).await?;
    let lease = leases
        .iter()
        .find(|l| l.lane == lane)
        .ok_or("lane not held")?;
    outbox.reader.mark_published(lease, &[id], 2_000).await?;

    assert!(outbox.reader.pending(lane, 10).await?.is_empty());
    let published: bool =
        sqlx::query_scalar("SELECT publicado_en IS NOT NULL FROM outbox WHERE id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await?;
    assert!(published);
    let partition = entrega_core::partition_for("P-2026-000123", 3);
    let records = log.read("pedidos.eventos", partition, 0, 10).await?;
    assert_eq!(records.len(), 1);
    let wire: serde_json::Value = serde_json::from_slice(&records[0].payload)?;
    assert_eq!(wire["id_evento"], id.to_string());
    assert_eq!(wire["tipo"], "pedido.creado");
    assert_eq!(wire["datos"]["id"], "P-2026-000123");
    assert_eq!(records[0].headers.get(headers::TIPO), Some("pedido.creado"));
    db.drop().await
}

#[tokio::test]
async fn a_database_created_by_the_seed_sql_is_adopted() -> TestResult {
    let db = TestDb::empty().await?;
    sqlx::raw_sql(SEED_SCHEMA).execute(&db.pool).await?;
    let before = [Uuid::new_v4(), Uuid::new_v4()];
    for (i, id) in before.iter().enumerate() {
        seed_insert(&db.pool, *id, &format!("P-OLD-{i}")).await?;
    }
    sqlx::query(
        "INSERT INTO mensajes_procesados (id_mensaje, consumidor)
         VALUES ('evt-old', 'inventario.descuento_stock')",
    )
    .execute(&db.pool)
    .await?;

    let migrator = entrega::Db::from(db.pool.clone());
    migrator
        .migrate(&[MigrationSet::Outbox, MigrationSet::Inbox])
        .await?;
    migrator
        .migrate(&[MigrationSet::Outbox, MigrationSet::Inbox])
        .await?;

    // entrega's columns, index and trigger are there, on the seed's table.
    let columns: Vec<String> = sqlx::query_scalar(
        "SELECT column_name::text FROM information_schema.columns
         WHERE table_name = 'outbox' ORDER BY ordinal_position",
    )
    .fetch_all(&db.pool)
    .await?;
    assert!(columns.contains(&"seq".to_owned()) && columns.contains(&"lane".to_owned()));
    let trigger: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_trigger WHERE tgname = 'entrega_outbox_notify'",
    )
    .fetch_one(&db.pool)
    .await?;
    assert_eq!(trigger, 1);

    // Rows from before the migration and after it are all pending and publishable.
    let after = Uuid::new_v4();
    seed_insert(&db.pool, after, "P-NEW-0").await?;
    let outbox = entrega::Db::from(db.pool.clone()).outbox();
    let leases = outbox
        .leases
        .balance(
            &entrega_core::Holder::with_incarnation("relay-1", 1),
            1_000,
            Duration::from_secs(10),
        )
        .await?;
    let mut found = Vec::new();
    for lease in &leases {
        let rows = outbox.reader.pending(lease.lane, 100).await?;
        let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
        outbox.reader.mark_published(lease, &ids, 2_000).await?;
        found.extend(ids);
    }
    found.sort();
    let mut expected = vec![before[0], before[1], after];
    expected.sort();
    assert_eq!(found, expected);
    let unpublished: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE publicado_en IS NULL")
            .fetch_one(&db.pool)
            .await?;
    assert_eq!(unpublished, 0);

    // The seed's processed keys are honoured.
    let mut tx = entrega::db::Db::from(db.pool.clone()).begin().await?;
    assert!(!tx.claim("inventario.descuento_stock", "evt-old").await?);
    assert!(tx.claim("inventario.descuento_stock", "evt-new").await?);
    tx.commit().await?;
    let index: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_indexes WHERE indexname = 'mensajes_procesados_procesado_en'",
    )
    .fetch_one(&db.pool)
    .await?;
    assert_eq!(index, 1);
    let seq_order: Vec<i64> = sqlx::query("SELECT seq FROM outbox ORDER BY seq")
        .fetch_all(&db.pool)
        .await?
        .iter()
        .map(|r| r.get::<i64, _>("seq"))
        .collect();
    assert_eq!(seq_order.len(), 3);
    db.drop().await
}

/// Every set of entrega's own tables.
const SQLITE_ALL: &[MigrationSet] = &[
    MigrationSet::Outbox,
    MigrationSet::Inbox,
    MigrationSet::Log,
    MigrationSet::Dlq,
];

#[tokio::test]
async fn sqlite_tables_created_from_the_seed_sql_are_adopted() {
    let dir = crate::support::TempDir::new();
    let db = entrega::Db::connect(&dir.url("seed.db")).await.unwrap();
    let pool = db.sqlite().unwrap().clone();
    // The seed's tables as a SQLite user would write them: no `lane`, no entrega bookkeeping.
    sqlx::raw_sql(
        "CREATE TABLE outbox (
             id UUID PRIMARY KEY, agregado TEXT NOT NULL, agregado_id TEXT NOT NULL,
             tipo TEXT NOT NULL, version INTEGER NOT NULL DEFAULT 1, carga JSONB NOT NULL,
             creado_en TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP, publicado_en TIMESTAMPTZ);
         CREATE TABLE mensajes_procesados (
             id_mensaje TEXT NOT NULL, consumidor TEXT NOT NULL,
             procesado_en TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
             PRIMARY KEY (id_mensaje, consumidor));
         INSERT INTO outbox (id, agregado, agregado_id, tipo, carga)
         VALUES ('0b8f4a52-33a4-4f4e-a1a6-7a4b8d1c2e3f', 'pedido', 'P-1', 'pedido.creado', '{\"id\":\"P-1\"}');",
    )
    .execute(&pool)
    .await
    .unwrap();
    db.migrate(SQLITE_ALL).await.unwrap();

    let outbox = db.outbox();
    let pending = outbox.reader.pending(0, 10).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].payload, json!({"id": "P-1"}));
    assert!(pending[0].created_at_ms > 1_600_000_000_000);

    // New rows still get their computed lane.
    let event = NewEvent::new("pedido", "P-2", "pedido.creado", json!({}));
    let mut tx = db.begin().await.unwrap();
    tx.enqueue(&event).await.unwrap();
    tx.commit().await.unwrap();
    let lane = entrega_core::lane_of("P-2");
    let rows = outbox.reader.pending(lane, 10).await.unwrap();
    assert!(rows.iter().any(|r| r.id == event.id));
}

#[tokio::test]
async fn an_in_memory_sqlite_database_works_across_pool_connections() {
    let db = entrega::Db::connect("sqlite::memory:").await.unwrap();
    db.migrate(SQLITE_ALL).await.unwrap();
    let event = NewEvent::new("pedido", "P-9", "pedido.creado", json!({"n": 1}));
    let mut tx = db.begin().await.unwrap();
    tx.enqueue(&event).await.unwrap();
    // A second connection while the first is busy must see the same database.
    let outbox = db.outbox();
    tx.commit().await.unwrap();
    let rows = outbox
        .reader
        .pending(entrega_core::lane_of("P-9"), 10)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
}
