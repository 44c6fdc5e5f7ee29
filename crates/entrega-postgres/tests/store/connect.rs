//! Connecting: databases created race-free, errors classified as transient or not, and
//! every pooled session with entrega's limits.

use crate::common;

use common::{server_url, TestDb, TestResult};
use entrega_core::StoreError;
use entrega_postgres::{classify, connect, ensure_database};
use sqlx::Connection;

#[tokio::test]
async fn ensure_database_is_race_safe_and_returns_a_usable_url() -> TestResult {
    let name = format!("entrega_t_{}", uuid::Uuid::new_v4().simple());
    let server = server_url();
    let (a, b) = tokio::join!(
        ensure_database(&server, &name),
        ensure_database(&server, &name)
    );
    let (a, b) = (a?, b?);
    assert_eq!(a, b);
    assert!(a.ends_with(&format!("/{name}")));
    let pool = connect(&a).await?;
    let current: String = sqlx::query_scalar("SELECT current_database()::text")
        .fetch_one(&pool)
        .await?;
    assert_eq!(current, name);
    pool.close().await;
    let mut admin = sqlx::PgConnection::connect(&server).await?;
    sqlx::query(&format!("DROP DATABASE \"{name}\" WITH (FORCE)"))
        .execute(&mut admin)
        .await?;
    assert!(ensure_database(&server, "bad\"name").await.is_err());
    Ok(())
}

#[tokio::test]
async fn errors_are_classified() -> TestResult {
    // Nothing listens on port 1: a connection failure is worth retrying.
    let refused = sqlx::PgConnection::connect("postgres://postgres@127.0.0.1:1/none").await;
    let Err(refused) = refused else {
        return Err("connected to port 1".into());
    };
    assert!(classify(refused).is_transient());

    let db = TestDb::empty().await?;
    sqlx::query("CREATE TABLE keys (id TEXT PRIMARY KEY)")
        .execute(&db.pool)
        .await?;
    let insert = "INSERT INTO keys (id) VALUES ('a')";
    sqlx::query(insert).execute(&db.pool).await?;
    let duplicate = sqlx::query(insert).execute(&db.pool).await;
    let Err(duplicate) = duplicate else {
        return Err("duplicate key accepted".into());
    };
    let classified = classify(duplicate);
    assert!(matches!(classified, StoreError::Rejected { .. }));
    assert!(!classified.is_transient());

    // A serialization failure (40001) is transient.
    let raised = sqlx::query(
        "DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = 'serialization_failure'; END $$",
    )
    .execute(&db.pool)
    .await;
    let Err(raised) = raised else {
        return Err("no error raised".into());
    };
    assert!(classify(raised).is_transient());
    db.drop().await
}

#[tokio::test]
async fn pooled_sessions_run_without_jit() -> TestResult {
    let db = TestDb::empty().await?;
    // Every connection of the pool, not only the first: hold several at once.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(db.pool.acquire().await?);
    }
    for conn in &mut held {
        let jit: String = sqlx::query_scalar("SHOW jit")
            .fetch_one(&mut **conn)
            .await?;
        assert_eq!(jit, "off");
    }
    Ok(())
}

#[tokio::test]
async fn pooled_sessions_run_with_timeouts_and_keepalives() -> TestResult {
    let db = TestDb::empty().await?;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(db.pool.acquire().await?);
    }
    for conn in &mut held {
        for (name, value) in entrega_postgres::SESSION_LIMITS {
            let shown: String = sqlx::query_scalar(&format!("SHOW {name}"))
                .fetch_one(&mut **conn)
                .await?;
            assert_eq!((name, shown.as_str()), (name, value));
        }
    }
    drop(held);
    db.drop().await
}

#[tokio::test]
async fn a_url_sets_its_own_limits_and_they_are_enforced() -> TestResult {
    let db = TestDb::empty().await?;
    let url = format!(
        "{}?options=-c%20statement_timeout%3D300ms%20-c%20idle_in_transaction_session_timeout%3D300ms",
        db.url
    );
    let pool = entrega_postgres::connect(&url).await?;
    let shown: String = sqlx::query_scalar("SHOW statement_timeout")
        .fetch_one(&pool)
        .await?;
    assert_eq!(shown, "300ms");
    // A statement past its limit is cancelled, as a transient failure (57014).
    let slow = sqlx::query("SELECT pg_sleep(5)").execute(&pool).await;
    let Err(e) = slow else {
        return Err("a 5 s statement ran under a 300 ms limit".into());
    };
    let code = e
        .as_database_error()
        .and_then(|d| d.code().map(|c| c.into_owned()));
    assert_eq!(code.as_deref(), Some("57014"));
    assert!(classify(e).is_transient());
    // A transaction left idle is ended by the server: its row lock is released, and the
    // client finds its connection gone.
    sqlx::query("CREATE TABLE t (id INT PRIMARY KEY)")
        .execute(&pool)
        .await?;
    sqlx::query("INSERT INTO t VALUES (1)")
        .execute(&pool)
        .await?;
    let mut idle = pool.begin().await?;
    sqlx::query("UPDATE t SET id = 1 WHERE id = 1")
        .execute(&mut *idle)
        .await?;
    tokio::time::sleep(std::time::Duration::from_millis(1_000)).await;
    let other = sqlx::query("UPDATE t SET id = 1 WHERE id = 1")
        .execute(&pool)
        .await?;
    assert_eq!(
        other.rows_affected(),
        1,
        "the idle transaction still held its lock"
    );
    let after = sqlx::query("SELECT 1").execute(&mut *idle).await;
    assert!(after.is_err(), "the idle transaction survived its limit");
    drop(idle);
    pool.close().await;
    db.drop().await
}

/// `url` with a server nobody listens on (port 1) named before its own.
fn dead_server_first(url: &str) -> String {
    url.replacen('@', "@127.0.0.1:1,", 1)
}

#[tokio::test]
async fn a_url_naming_several_servers_uses_the_one_taking_writes() -> TestResult {
    let db = TestDb::empty().await?;
    let url = dead_server_first(&db.url);
    let pool = connect(&url).await?;
    let port: i32 = sqlx::query_scalar("SELECT inet_server_port()")
        .fetch_one(&pool)
        .await?;
    let mut own = sqlx::PgConnection::connect(&db.url).await?;
    let own_port: i32 = sqlx::query_scalar("SELECT inet_server_port()")
        .fetch_one(&mut own)
        .await?;
    assert_eq!(port, own_port, "the pool is on the server that answers");
    // Its sessions keep entrega's limits.
    let shown: String = sqlx::query_scalar("SHOW statement_timeout")
        .fetch_one(&pool)
        .await?;
    assert_eq!(shown, "1min");
    assert_eq!(
        entrega_postgres::current_server_url(&url).await?,
        db.url,
        "the server taking writes, alone in its URL"
    );
    pool.close().await;

    // A server whose sessions are read-only is not taken for writes; one not in recovery
    // is a primary all the same.
    let read_only = format!("{url}?options=-c%20default_transaction_read_only%3Don");
    let refused = connect(&read_only).await;
    let Err(refused) = refused else {
        return Err("a read-only server taken for read-write sessions".into());
    };
    assert!(refused.is_transient(), "{refused}");
    assert!(refused.to_string().contains("read-write"), "{refused}");
    let primary = format!("{read_only}&target_session_attrs=primary");
    connect(&primary).await?.close().await;
    let unknown = format!("{url}?target_session_attrs=standby");
    let Err(unknown) = connect(&unknown).await else {
        return Err("target_session_attrs=standby accepted".into());
    };
    assert!(!unknown.is_transient(), "{unknown}");
    db.drop().await
}
