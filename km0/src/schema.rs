//! km0's own schema migrations (the services' tables), recorded apart from entrega's.
//!
//! Each step runs once per database, recorded in `km0_migrations`, so the seed rows of
//! `stock` are inserted exactly once even if an operator later deletes a product. Several
//! processes may start at once against the same database (crash tests, scaled services):
//! Postgres serialises them with a transaction-scoped advisory lock, SQLite with
//! `BEGIN IMMEDIATE`, and the loser then sees the steps recorded and skips them.

use entrega_core::StoreError;

use crate::config::Db;

/// One schema step of a service, written for each backend.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Position in the service's sequence, from 1.
    pub version: i64,
    /// What it does, recorded for operators.
    pub description: &'static str,
    /// Statements for SQLite (several allowed).
    pub sqlite: &'static str,
    /// Statements for PostgreSQL (several allowed).
    pub postgres: &'static str,
}

const SQLITE_TABLE: &str = "CREATE TABLE IF NOT EXISTS km0_migrations (
    service TEXT NOT NULL, version INTEGER NOT NULL, description TEXT NOT NULL,
    applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (service, version))";

const POSTGRES_TABLE: &str = "CREATE TABLE IF NOT EXISTS km0_migrations (
    service TEXT NOT NULL, version BIGINT NOT NULL, description TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (service, version))";

/// Arbitrary constant naming km0's migration lock among the database's advisory locks.
const POSTGRES_LOCK_KEY: i64 = 0x006b_6d30_5f6d_6967;

/// Creates the record table if needed, then runs and records every step of `steps` not yet
/// recorded for `service`, inside the open transaction `$tx`. One body for both backends;
/// `$sql` picks the step's statements for the backend.
macro_rules! apply_steps {
    ($tx:ident, $err:path, $table:expr, $sql:ident, $service:expr, $steps:expr) => {{
        sqlx::raw_sql($table)
            .execute(&mut *$tx)
            .await
            .map_err($err)?;
        for step in $steps {
            let done: Option<i64> = sqlx::query_scalar(
                "SELECT version FROM km0_migrations WHERE service = $1 AND version = $2",
            )
            .bind($service)
            .bind(step.version)
            .fetch_optional(&mut *$tx)
            .await
            .map_err($err)?;
            if done.is_some() {
                continue;
            }
            sqlx::raw_sql(step.$sql)
                .execute(&mut *$tx)
                .await
                .map_err($err)?;
            sqlx::query(
                "INSERT INTO km0_migrations (service, version, description) VALUES ($1, $2, $3)",
            )
            .bind($service)
            .bind(step.version)
            .bind(step.description)
            .execute(&mut *$tx)
            .await
            .map_err($err)?;
        }
        $tx.commit().await.map_err($err)
    }};
}

/// Applies the steps of `service` that this database has not recorded yet, in order, all in
/// one transaction.
pub async fn apply(db: &Db, service: &str, steps: &[Migration]) -> Result<(), StoreError> {
    match db {
        Db::Sqlite(pool) => {
            let mut tx = entrega_sqlite::begin_immediate(pool).await?;
            apply_steps!(
                tx,
                entrega_sqlite::classify,
                SQLITE_TABLE,
                sqlite,
                service,
                steps
            )
        }
        Db::Postgres(pool) => {
            let err = entrega_postgres::classify;
            let mut tx = pool.begin().await.map_err(err)?;
            // Taken before the CREATE TABLE: concurrent `CREATE TABLE IF NOT EXISTS` of the
            // same table can still fail on Postgres.
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(POSTGRES_LOCK_KEY)
                .execute(&mut *tx)
                .await
                .map_err(err)?;
            apply_steps!(
                tx,
                entrega_postgres::classify,
                POSTGRES_TABLE,
                postgres,
                service,
                steps
            )
        }
    }
}
