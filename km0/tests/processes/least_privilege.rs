//! Least privilege on PostgreSQL: `km0 migrate --roles`, run as the owner, creates and
//! migrates every database and gives each service a role that may only read and write the
//! rows of its own database. The test checks what such a role cannot do (drop, alter or
//! create a table, create a database, change or delete audit rows, write migration records,
//! connect to another service's database), that a process without `--migrate` creates
//! nothing, and that the whole order saga still runs under those roles: `km0 demo --reuse`
//! with every invariant held.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use common::run_km0;

use sqlx::{Connection, PgConnection};

const SERVICES: [&str; 6] = [
    "pedidos",
    "inventario",
    "reparto",
    "pagos",
    "catalogo",
    "pasarela",
];

/// `postgres://USER@HOST:PORT` of the test server with another user.
fn as_user(user: &str) -> String {
    let server = common::pg_server();
    let (scheme, rest) = server.split_once("://").unwrap();
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let host = host.split('/').next().unwrap();
    format!("{scheme}://{user}@{host}")
}

/// The SQLSTATE a statement failed with, or `None` if it ran.
async fn refused(conn: &mut PgConnection, sql: &str) -> Option<String> {
    match sqlx::query(sql).execute(&mut *conn).await {
        Ok(_) => None,
        Err(e) => Some(
            e.as_database_error()
                .and_then(|d| d.code().map(|c| c.into_owned()))
                .unwrap_or_else(|| e.to_string()),
        ),
    }
}

async fn cleanup(prefix: &str) {
    let mut admin = PgConnection::connect(&common::pg_server()).await.unwrap();
    let names: Vec<String> =
        sqlx::query_scalar("SELECT datname::text FROM pg_database WHERE datname LIKE $1")
            .bind(format!("{prefix}%"))
            .fetch_all(&mut admin)
            .await
            .unwrap();
    for name in names {
        sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .execute(&mut admin)
            .await
            .unwrap();
    }
    let roles: Vec<String> =
        sqlx::query_scalar("SELECT rolname::text FROM pg_roles WHERE rolname LIKE $1")
            .bind(format!("{prefix}%"))
            .fetch_all(&mut admin)
            .await
            .unwrap();
    for role in roles {
        sqlx::query(&format!("DROP ROLE IF EXISTS {role}"))
            .execute(&mut admin)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_run_under_roles_that_can_only_touch_their_own_rows() {
    let prefix = format!("km0lp{}_", std::process::id());
    let owner = common::pg_server();
    let broker_as = |user: &str| format!("{}/{prefix}broker", as_user(user));

    // Without --migrate, a service creates nothing: no database appears.
    let (ok, text) = run_km0(
        &[
            "--database",
            &owner,
            "--db-prefix",
            &prefix,
            "--broker",
            &format!("{owner}/{prefix}broker"),
            "outbox",
            "status",
        ],
        &[],
    );
    assert!(!ok, "{text}");
    let mut admin = PgConnection::connect(&owner).await.unwrap();
    let made: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM pg_database WHERE datname LIKE $1")
        .bind(format!("{prefix}%"))
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_eq!(made, 0, "a process without --migrate created a database");

    // The owner migrates and grants.
    let (ok, text) = run_km0(
        &[
            "--database",
            &owner,
            "--db-prefix",
            &prefix,
            "--broker",
            &format!("{owner}/{prefix}broker"),
            "migrate",
            "--roles",
        ],
        &[],
    );
    assert!(ok, "{text}");
    for service in SERVICES {
        assert!(
            text.contains(&format!("{service} (role {prefix}{service})")),
            "{text}"
        );
    }
    assert!(
        text.contains(&format!("broker (role {prefix}broker)")),
        "{text}"
    );

    // What a service's role cannot do, in its own database.
    let inventario = format!("{prefix}inventario");
    let url = format!("{}/{inventario}", as_user(&inventario));
    let mut conn = PgConnection::connect(&url).await.unwrap();
    let denied = Some("42501".to_owned());
    for sql in [
        "DROP TABLE stock",
        "ALTER TABLE stock ADD COLUMN x INTEGER",
        "CREATE TABLE intruso (x INTEGER)",
        "CREATE INDEX intruso ON stock (unidades)",
        "TRUNCATE mensajes_procesados",
        "UPDATE entrega_dlq_audit SET operator = 'mallory'",
        "DELETE FROM entrega_dlq_audit",
        "INSERT INTO entrega_migrations (set_name, version, description, applied_at_ms) \
         VALUES ('outbox', 99, 'x', 0)",
    ] {
        assert_eq!(refused(&mut conn, sql).await, denied, "{sql}");
    }
    assert_eq!(
        refused(&mut conn, &format!("CREATE DATABASE {prefix}intruso")).await,
        denied
    );
    // What it can: its rows, and appending to the audit.
    assert_eq!(
        refused(&mut conn, "UPDATE stock SET unidades = unidades").await,
        None
    );
    assert_eq!(
        refused(
            &mut conn,
            "INSERT INTO entrega_dlq_audit (at_ms, operator, action, filter, dry_run, matched, \
             applied, refused) VALUES (0, 'test', 'discard', '', true, 0, 0, 0)"
        )
        .await,
        None
    );
    conn.close().await.unwrap();
    // Another service's database is closed to it.
    let other = format!("{}/{prefix}pedidos", as_user(&inventario));
    assert!(PgConnection::connect(&other).await.is_err());

    // The whole order saga under those roles: each service as its own role, the log as the
    // broker's.
    let database = as_user(&format!("{prefix}{{service}}"));
    let (ok, text) = run_km0(
        &[
            "--database",
            &database,
            "--db-prefix",
            &prefix,
            "--broker",
            &broker_as(&format!("{prefix}broker")),
            "demo",
            "--reuse",
            "--orders",
            "40",
            "--no-progress",
        ],
        &[],
    );
    assert!(ok, "the demo failed under the service roles:\n{text}");
    let paid: i64 = {
        let url = format!("{owner}/{prefix}pedidos");
        let mut conn = PgConnection::connect(&url).await.unwrap();
        sqlx::query_scalar("SELECT COUNT(*) FROM pedidos WHERE estado = 'pagado'")
            .fetch_one(&mut conn)
            .await
            .unwrap()
    };
    assert!(paid > 0, "no order was paid under the roles");
    cleanup(&prefix).await;
}
