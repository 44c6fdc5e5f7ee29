//! `Db::write_batch` on SQLite and PostgreSQL (`ENTREGA_TEST_PG`): the rows each statement
//! affected, in order; a statement that fails undoes the whole batch; a batch whose caller
//! gives up mid-way is applied whole or not at all and leaves the database writable (no
//! transaction left open on a pooled connection); statements that cannot be joined into one
//! round trip still run as one transaction.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use entrega::db::{query, query_each, Backend, Db, Query};

use support::pg::FreshDb;
use support::TempDir;

const SCHEMA: [&str; 2] = [
    "CREATE TABLE marcas (id TEXT PRIMARY KEY, n BIGINT NOT NULL)",
    "CREATE TABLE lento (n BIGINT NOT NULL)",
];

async fn fresh(backend: Backend, dir: &TempDir) -> FreshDb {
    let fresh = FreshDb::new(backend, dir, "lote.db").await;
    for statement in SCHEMA {
        fresh.db.execute(query(statement)).await.unwrap();
    }
    fresh
}

fn mark(id: &str, n: i64) -> Query {
    query("INSERT INTO marcas (id, n) VALUES ($1, $2)")
        .bind(id)
        .bind(n)
}

async fn marks(db: &Db) -> Vec<(String, i64)> {
    db.fetch_all(query(
        "SELECT id, CAST(n AS BIGINT) FROM marcas ORDER BY id",
    ))
    .await
    .unwrap()
}

async fn count(db: &Db, table: &str) -> i64 {
    db.scalar(query(format!("SELECT COUNT(*) FROM {table}")))
        .await
        .unwrap()
        .unwrap_or(0)
}

/// `rows` rows into `lento`, slowly enough to give up on.
fn slow_insert(rows: i64) -> Query {
    query_each(
        "INSERT INTO lento (n) SELECT x FROM (WITH RECURSIVE c(x) AS \
         (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < $1) SELECT x FROM c)",
        "INSERT INTO lento (n) SELECT generate_series(1, $1::BIGINT)",
    )
    .bind(rows)
}

async fn each_statement_counts_its_own_rows(backend: Backend) {
    let dir = TempDir::new();
    let fresh = fresh(backend, &dir).await;
    let db = &fresh.db;
    let counts = db
        .write_batch(vec![
            query("INSERT INTO marcas (id, n) VALUES ($1, $2), ($3, $4), ($5, $6)")
                .bind("a")
                .bind(1)
                .bind("b")
                .bind(2)
                .bind("c")
                .bind(3),
            // Placeholders in a literal and a comment are not parameters.
            query("INSERT INTO marcas (id, n) VALUES ('$1 -- no', $1) /* $2 */ ON CONFLICT DO NOTHING")
                .bind(7),
            query("DELETE FROM marcas WHERE id = $1").bind("zz"),
        ])
        .await
        .unwrap();
    assert_eq!(counts, vec![3, 1, 0]);
    let counts = db
        .write_batch(vec![
            query("UPDATE marcas SET n = n + $1 WHERE id <> $2")
                .bind(10)
                .bind("c"),
            query("DELETE FROM marcas WHERE id = $1").bind("c"),
            query("INSERT INTO marcas (id, n) VALUES ($1, $2) ON CONFLICT DO NOTHING")
                .bind("a")
                .bind(0),
        ])
        .await
        .unwrap();
    assert_eq!(counts, vec![3, 1, 0]);
    assert_eq!(
        marks(db).await,
        vec![
            ("$1 -- no".to_owned(), 17),
            ("a".to_owned(), 11),
            ("b".to_owned(), 12)
        ]
    );
    fresh.finish().await;
}

async fn a_failing_statement_undoes_the_batch(backend: Backend) {
    let dir = TempDir::new();
    let fresh = fresh(backend, &dir).await;
    let db = &fresh.db;
    db.write_batch(vec![mark("a", 1)]).await.unwrap();
    let failed = db
        .write_batch(vec![
            mark("b", 2),
            slow_insert(10),
            mark("a", 3),
            mark("c", 4),
        ])
        .await;
    assert!(failed.is_err(), "a repeated key must fail the batch");
    assert_eq!(marks(db).await, vec![("a".to_owned(), 1)]);
    assert_eq!(count(db, "lento").await, 0);
    // Nothing is left locked or open: the next batch goes through at once.
    assert_eq!(
        db.write_batch(vec![mark("b", 2), mark("c", 3)])
            .await
            .unwrap(),
        vec![1, 1]
    );
    assert_eq!(count(db, "marcas").await, 3);
    fresh.finish().await;
}

async fn a_batch_given_up_on_is_whole_or_absent(backend: Backend) {
    let dir = TempDir::new();
    let fresh = fresh(backend, &dir).await;
    let db = &fresh.db;
    let rows = 600_000;
    let given_up = tokio::time::timeout(
        Duration::from_millis(30),
        db.write_batch(vec![
            mark("antes", 1),
            slow_insert(rows),
            mark("despues", 2),
        ]),
    )
    .await;
    assert!(
        given_up.is_err(),
        "the batch finished before it was given up on"
    );
    // The database stays writable (on SQLite the next batch waits, at most its busy
    // timeout, for the abandoned one to end) and the abandoned batch left all or nothing.
    db.write_batch(vec![mark("luego", 3)]).await.unwrap();
    let seen = marks(db).await;
    let slow = count(db, "lento").await;
    let ids: Vec<&str> = seen.iter().map(|(id, _)| id.as_str()).collect();
    let whole = ids == ["antes", "despues", "luego"] && slow == rows;
    let absent = ids == ["luego"] && slow == 0;
    assert!(
        whole || absent,
        "a part of the batch stayed: {ids:?}, {slow} slow rows"
    );
    fresh.finish().await;
}

async fn unjoinable_statements_still_run_as_one_transaction(backend: Backend) {
    let dir = TempDir::new();
    let fresh = fresh(backend, &dir).await;
    let db = &fresh.db;
    // On PostgreSQL a statement with RETURNING cannot go in the one-statement form; on
    // both, a text of two statements cannot be renumbered.
    let counts = db
        .write_batch(vec![
            mark("a", 1),
            query("UPDATE marcas SET n = n + 1 WHERE id = $1 RETURNING n").bind("a"),
        ])
        .await
        .unwrap();
    assert_eq!(counts.len(), 2);
    assert_eq!(marks(db).await, vec![("a".to_owned(), 2)]);
    let failed = db
        .write_batch(vec![
            mark("b", 1),
            query("INSERT INTO marcas (id, n) VALUES ('c', 1); INSERT INTO marcas (id, n) VALUES ('a', 1)"),
        ])
        .await;
    assert!(failed.is_err());
    assert_eq!(marks(db).await, vec![("a".to_owned(), 2)]);
    fresh.finish().await;
}

macro_rules! scenarios {
    ($name:ident, $backend:expr) => {
        mod $name {
            use entrega::db::Backend;

            #[tokio::test]
            async fn each_statement_counts_its_own_rows() {
                super::each_statement_counts_its_own_rows($backend).await;
            }

            #[tokio::test]
            async fn a_failing_statement_undoes_the_batch() {
                super::a_failing_statement_undoes_the_batch($backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_batch_given_up_on_is_whole_or_absent() {
                super::a_batch_given_up_on_is_whole_or_absent($backend).await;
            }

            #[tokio::test]
            async fn unjoinable_statements_still_run_as_one_transaction() {
                super::unjoinable_statements_still_run_as_one_transaction($backend).await;
            }
        }
    };
}

scenarios!(sqlite, Backend::Sqlite);
scenarios!(postgres, Backend::Postgres);
