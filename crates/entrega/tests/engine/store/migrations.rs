//! The one migration runner on both databases: each set applied once however often and
//! however concurrently it is asked for, only the sets asked for, a newer schema refused
//! without changes, and a database created before request/reply and the held letters had
//! sets of their own upgraded in place, its rows kept and its stores still working.

use std::sync::Arc;
use std::time::Duration;

use entrega::broker::{DbLog, LogConfig};
use entrega::db::{query, Backend, Db, TimeMs};
use entrega_core::{MigrationSet, ParkedAt, StoreError, Subscriber, SystemClock};

use crate::support::pg::{server_url, FreshDb};
use crate::support::{on_both_databases, TempDir};

const FILE: &str = "migrations.db";

/// Every step of every set, as `entrega_migrations` records them once all are applied.
const EVERY_STEP: &[(&str, i64)] = &[
    ("dlq", 1),
    ("dlq", 2),
    ("entrega_saga", 1),
    ("entrega_saga", 2),
    ("entrega_saga", 3),
    ("held_letters", 1),
    ("held_letters", 2),
    ("inbox", 1),
    ("inbox", 2),
    ("inbox", 3),
    ("log", 1),
    ("log", 2),
    ("outbox", 1),
    ("outbox", 2),
    ("outbox", 3),
    ("outbox", 4),
    ("outbox", 5),
    ("outbox", 6),
    ("outbox", 7),
    ("outbox", 8),
    ("rpc", 1),
    ("rpc", 2),
    ("rpc", 3),
];

async fn recorded(db: &Db) -> Vec<(String, i64)> {
    db.fetch_all(query(
        "SELECT set_name, CAST(version AS BIGINT) FROM entrega_migrations \
         ORDER BY set_name, version",
    ))
    .await
    .unwrap()
}

fn steps(expected: &[(&str, i64)]) -> Vec<(String, i64)> {
    expected
        .iter()
        .map(|(s, v)| ((*s).to_owned(), *v))
        .collect()
}

/// The names of the database's tables, sorted.
async fn tables(db: &Db) -> Vec<String> {
    let sql = match db.backend() {
        Backend::Sqlite => {
            "SELECT name FROM sqlite_master WHERE type = 'table' \
             AND name NOT LIKE 'sqlite_%' ORDER BY name"
        }
        Backend::Postgres => {
            "SELECT CAST(tablename AS TEXT) FROM pg_tables WHERE schemaname = 'public' \
             ORDER BY tablename"
        }
    };
    let names: Vec<(String,)> = db.fetch_all(query(sql)).await.unwrap();
    names.into_iter().map(|(n,)| n).collect()
}

/// A second connection pool on the same database.
async fn another(fresh: &FreshDb, dir: &TempDir) -> Db {
    let url = match fresh.name() {
        None => dir.url(FILE),
        Some(name) => entrega_postgres::ensure_database(&server_url(), &name)
            .await
            .unwrap(),
    };
    Db::connect(&url).await.unwrap()
}

async fn migrating_again_and_concurrently_changes_nothing(backend: Backend) {
    let dir = TempDir::new();
    let fresh = FreshDb::new(backend, &dir, FILE).await;
    let other = another(&fresh, &dir).await;
    // One migrator on a task of its own: the runner's futures can be spawned.
    let spawned = tokio::spawn({
        let db = other.clone();
        async move { db.migrate(&MigrationSet::ALL).await }
    });
    let (a, b) = tokio::join!(
        fresh.db.migrate(&MigrationSet::ALL),
        other.migrate(&[MigrationSet::Outbox, MigrationSet::Outbox]),
    );
    a.unwrap();
    b.unwrap();
    spawned.await.unwrap().unwrap();
    fresh.db.migrate(&MigrationSet::ALL).await.unwrap();
    assert_eq!(recorded(&fresh.db).await, steps(EVERY_STEP));
    let lanes: Option<i64> = fresh
        .db
        .scalar(query(
            "SELECT CAST(COUNT(*) AS BIGINT) FROM entrega_relay_lanes",
        ))
        .await
        .unwrap();
    assert_eq!(lanes, Some(64), "lane rows are created once");
    assert!(fresh.db.schema_behind().await.unwrap().is_empty());
    other.close().await;
    fresh.finish().await;
}

async fn only_the_requested_sets_are_created(backend: Backend) {
    let dir = TempDir::new();
    let fresh = FreshDb::new(backend, &dir, FILE).await;
    fresh.db.migrate(&[MigrationSet::Inbox]).await.unwrap();
    assert_eq!(
        tables(&fresh.db).await,
        [
            "entrega_migrations",
            "entrega_parked",
            "mensajes_procesados"
        ]
    );
    assert_eq!(
        recorded(&fresh.db).await,
        steps(&[("inbox", 1), ("inbox", 2), ("inbox", 3)])
    );

    fresh
        .db
        .migrate(&[MigrationSet::Rpc, MigrationSet::HeldLetters])
        .await
        .unwrap();
    let now = tables(&fresh.db).await;
    for table in [
        "entrega_answers",
        "entrega_requests",
        "entrega_held_letters",
    ] {
        assert!(now.iter().any(|t| t == table), "{table} missing: {now:?}");
    }
    assert!(!now.iter().any(|t| t == "outbox" || t == "entrega_log"));

    fresh.db.migrate(&[MigrationSet::Dlq]).await.unwrap();
    let dlq: Vec<String> = tables(&fresh.db)
        .await
        .into_iter()
        .filter(|t| t.starts_with("entrega_dlq"))
        .collect();
    assert_eq!(
        dlq,
        [
            "entrega_dlq_actions",
            "entrega_dlq_audit",
            "entrega_dlq_state"
        ]
    );
    assert_eq!(
        recorded(&fresh.db).await,
        steps(&[
            ("dlq", 1),
            ("dlq", 2),
            ("held_letters", 1),
            ("held_letters", 2),
            ("inbox", 1),
            ("inbox", 2),
            ("inbox", 3),
            ("rpc", 1),
            ("rpc", 2),
            ("rpc", 3)
        ])
    );
    fresh.finish().await;
}

async fn a_newer_schema_is_refused_without_changes(backend: Backend) {
    let dir = TempDir::new();
    let fresh = FreshDb::new(backend, &dir, FILE).await;
    fresh.db.migrate(&[MigrationSet::Inbox]).await.unwrap();
    fresh
        .db
        .execute(query(
            "INSERT INTO entrega_migrations (set_name, version, description, applied_at_ms) \
             VALUES ('outbox', 99, 'from the future', 0)",
        ))
        .await
        .unwrap();
    let err = fresh
        .db
        .migrate(&[MigrationSet::Log, MigrationSet::Outbox])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::SchemaTooNew {
                found: 99,
                supported: 8
            }
        ),
        "{err:?}"
    );
    assert!(!err.is_transient());
    // The whole call was one transaction: the log set asked for first is not there either.
    let now = tables(&fresh.db).await;
    assert!(!now
        .iter()
        .any(|t| t == "entrega_relay_lanes" || t == "entrega_log"));
    // Other sets are unaffected when asked alone.
    fresh.db.migrate(&[MigrationSet::Rpc]).await.unwrap();
    fresh.finish().await;
}

async fn an_application_set_may_not_take_an_entrega_name(backend: Backend) {
    let dir = TempDir::new();
    let fresh = FreshDb::new(backend, &dir, FILE).await;
    for set in MigrationSet::ALL {
        let step = entrega::db::Migration::same(1, "mine", "CREATE TABLE mine (id TEXT)");
        let refused = fresh.db.apply_migrations(set.name(), &[step]).await;
        assert!(
            matches!(refused, Err(StoreError::Rejected { .. })),
            "{}: {refused:?}",
            set.name()
        );
    }
    assert!(!tables(&fresh.db).await.iter().any(|t| t == "mine"));
    fresh.finish().await;
}

on_both_databases!(
    migrating_again_and_concurrently_changes_nothing,
    only_the_requested_sets_are_created,
    a_newer_schema_is_refused_without_changes,
    an_application_set_may_not_take_an_entrega_name,
    a_database_of_the_earlier_layout_is_upgraded_in_place,
);

/// Rows of each table of the earlier layout, by its name then (`renamed`: by its name now).
async fn row_counts(db: &Db, renamed: bool) -> Vec<(&'static str, i64)> {
    let mut counts = Vec::new();
    for (then, now) in EARLIER_TABLES {
        let table = if renamed { now } else { then };
        let n: Option<i64> = db
            .scalar(query(format!(
                "SELECT CAST(COUNT(*) AS BIGINT) FROM {table}"
            )))
            .await
            .unwrap();
        counts.push((*then, n.unwrap()));
    }
    counts
}

/// entrega's tables in a database `km0 migrate` created before the split and the English
/// names: (name then, name now).
const EARLIER_TABLES: &[(&str, &str)] = &[
    ("outbox", "outbox"),
    ("entrega_relay_lanes", "entrega_relay_lanes"),
    ("entrega_relay_instances", "entrega_relay_instances"),
    ("mensajes_procesados", "mensajes_procesados"),
    ("entrega_aparcados", "entrega_parked"),
    ("entrega_respuestas", "entrega_answers"),
    ("entrega_peticiones", "entrega_requests"),
    ("entrega_retenidos", "entrega_held_letters"),
    ("entrega_dlq_state", "entrega_dlq_state"),
    ("entrega_dlq_audit", "entrega_dlq_audit"),
    ("entrega_sagas", "entrega_sagas"),
    ("entrega_saga_historial", "entrega_saga_history"),
    ("entrega_topics", "entrega_topics"),
    ("entrega_partitions", "entrega_partitions"),
    ("entrega_log", "entrega_log"),
    ("entrega_group_offsets", "entrega_group_offsets"),
    ("entrega_group_members", "entrega_group_members"),
    ("entrega_partition_leases", "entrega_partition_leases"),
];

/// Loads the dump of a database created by the earlier layout into `db`.
async fn load_earlier(db: &Db) {
    match db.backend() {
        Backend::Sqlite => {
            let script = include_str!("fixtures/before_capability_sets.sqlite.sql");
            sqlx::raw_sql(script)
                .execute(db.sqlite().unwrap())
                .await
                .unwrap();
        }
        Backend::Postgres => {
            let script = include_str!("fixtures/before_capability_sets.postgres.sql");
            sqlx::raw_sql(script)
                .execute(db.postgres().unwrap())
                .await
                .unwrap();
        }
    }
}

async fn a_database_of_the_earlier_layout_is_upgraded_in_place(backend: Backend) {
    let dir = TempDir::new();
    let fresh = FreshDb::new(backend, &dir, FILE).await;
    load_earlier(&fresh.db).await;
    let before = row_counts(&fresh.db, false).await;
    assert!(before.iter().all(|(_, n)| *n > 0), "{before:?}");

    fresh.db.migrate(&MigrationSet::ALL).await.unwrap();
    fresh.db.migrate(&MigrationSet::ALL).await.unwrap();

    // The inbox steps that created request/reply's and the held letters' tables are now
    // recorded under the sets that own them, and every table entrega owns has its English
    // name; nothing ran twice, nothing is behind.
    assert_eq!(recorded(&fresh.db).await, steps(EVERY_STEP));
    assert!(fresh.db.schema_behind().await.unwrap().is_empty());
    assert_eq!(
        row_counts(&fresh.db, true).await,
        before,
        "rows were lost or added"
    );

    still_works(&fresh.db).await;
    fresh.finish().await;
}

/// Each store reads the rows the earlier build wrote and takes new ones.
async fn still_works(db: &Db) {
    // Inbox: the key consumed before is a duplicate; a new one is claimed.
    let mut tx = db.begin().await.unwrap();
    assert!(!tx
        .claim("inventario", "0b5d1c1e-0000-4000-8000-000000000001")
        .await
        .unwrap());
    assert!(tx.claim("inventario", "new-key").await.unwrap());
    // Request/reply: the stored answer is answered again; the pending request is there.
    let answer = tx.stored_answer("pagos", "idem-1").await.unwrap();
    assert_eq!(answer.as_deref(), Some(&br#"{"ok":true}"#[..]));
    tx.commit().await.unwrap();
    let pending: Option<String> = db
        .scalar(query(
            "SELECT state FROM entrega_requests WHERE correlation_id = 'corr-1'",
        ))
        .await
        .unwrap();
    assert_eq!(pending.as_deref(), Some("pending"), "the state in English");
    // Times entrega keeps are epoch ms on both backends (PostgreSQL's were a timestamp).
    let answered: Option<i64> = db
        .scalar(query(
            "SELECT CAST(answered_at_ms AS BIGINT) FROM entrega_answers \
             WHERE request_key = 'idem-1'",
        ))
        .await
        .unwrap();
    let expected = match db.backend() {
        Backend::Sqlite => 1_796_000_000_000,
        Backend::Postgres => 1_796_119_200_000,
    };
    assert_eq!(answered, Some(expected));
    // The saga's row and history: states in English, the saga still readable.
    let saga: Option<(String, String)> = db
        .fetch_optional(query(
            "SELECT state, phase FROM entrega_sagas WHERE kind = 'pedido' AND saga_id = 'P-UP-1'",
        ))
        .await
        .unwrap();
    assert_eq!(saga, Some(("running".to_owned(), "action".to_owned())));
    let what: Option<String> = db
        .scalar(query(
            "SELECT what FROM entrega_saga_history WHERE saga_id = 'P-UP-1' AND n = 1",
        ))
        .await
        .unwrap();
    assert_eq!(what.as_deref(), Some("started"));

    // Outbox: the pending row is read, the held one is not.
    let ports = db.outbox();
    let mut rows = Vec::new();
    for lane in 0..64 {
        rows.extend(ports.reader.pending(lane, 10).await.unwrap());
    }
    let ids: Vec<String> = rows.iter().map(|r| r.aggregate_id.clone()).collect();
    assert_eq!(ids, ["P-UP-2"], "pending rows");
    let status = ports
        .maintenance
        .status(entrega_core::now_ms())
        .await
        .unwrap();
    assert_eq!((status.pending, status.held, status.published), (2, 1, 1));

    // Parking, held letters, dead-letter marks: the rows are read back.
    let at = ParkedAt {
        group: "inventario",
        topic: "pedidos.eventos",
        partition: 0,
    };
    assert_eq!(
        db.parking().parked_keys(at).await.unwrap(),
        [Some("P-UP-1".to_owned())]
    );
    let held = db.held_letters().list(10).await.unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].refusal, "message too large");
    let marks = db
        .dead_letters()
        .marks("pedidos.eventos.dlq")
        .await
        .unwrap();
    assert_eq!(marks.len(), 1);
    assert_eq!(db.dead_letters().audit(10).await.unwrap().len(), 1);

    // The log: the group reads the record it had not consumed, from its committed offset.
    let log = DbLog::new(db.clone(), LogConfig::default(), Arc::new(SystemClock));
    let mut subscription = log
        .subscribe("inventario", "pedidos.eventos", "member-new")
        .await
        .unwrap();
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while got.is_empty() && tokio::time::Instant::now() < deadline {
        got = subscription
            .poll(10, Duration::from_millis(500))
            .await
            .unwrap();
    }
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].partition, got[0].offset), (0, 0));
    assert_eq!(got[0].key.as_deref(), Some("P-UP-1"));
    subscription.close().await.unwrap();

    let _: Option<TimeMs> = db
        .scalar(query(
            "SELECT procesado_en FROM mensajes_procesados WHERE id_mensaje = 'new-key'",
        ))
        .await
        .unwrap();
}
