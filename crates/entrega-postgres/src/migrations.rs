//! The migration runner on PostgreSQL: entrega's own schema, applied per [`MigrationSet`], and
//! an application's sets, all recorded in `entrega_migrations`.

use entrega_core::migration::{self, Migration, Step};
use entrega_core::{now_ms, MigrationSet, StoreError};
use sqlx::postgres::{PgConnection, PgPool};
use sqlx::Executor;

use crate::errors::classify;

/// Key of the transaction-scoped advisory lock that serialises concurrent migrators
/// ("entrega" in ASCII). Advisory locks are per database, so databases never wait on each other.
const MIGRATION_LOCK: i64 = 0x0065_6e74_7265_6761;

const OUTBOX: &[Migration<'static>] = &[
    Migration {
        version: 1,
        description: "outbox with lanes, notify trigger, relay lane leases",
        steps: &[Step::Sql(include_str!(
            "../migrations/outbox/0001_outbox.sql"
        ))],
    },
    Migration {
        version: 2,
        description:
            "outbox rows the transport refused: attempts, next attempt, last error, parking",
        steps: &[Step::Sql(include_str!(
            "../migrations/outbox/0002_refused_rows.sql"
        ))],
    },
    Migration {
        version: 3,
        description: "outbox headers: metadata copied onto the published message",
        steps: &[Step::Sql(include_str!(
            "../migrations/outbox/0003_headers.sql"
        ))],
    },
];

const INBOX: &[Migration<'static>] = &[
    Migration {
        version: 1,
        description: "mensajes_procesados with purge index",
        steps: &[Step::Sql(include_str!(
            "../migrations/inbox/0001_inbox.sql"
        ))],
    },
    Migration {
        version: 2,
        description: "entrega_aparcados: parking for ordered retries",
        steps: &[Step::Sql(include_str!(
            "../migrations/inbox/0002_parking.sql"
        ))],
    },
    Migration {
        version: 3,
        description: "entrega_respuestas: stored answers of idempotent request handlers",
        steps: &[Step::Sql(include_str!(
            "../migrations/inbox/0003_answers.sql"
        ))],
    },
    Migration {
        version: 4,
        description: "entrega_peticiones: requests awaiting their replies (durable request/reply)",
        steps: &[Step::Sql(include_str!(
            "../migrations/inbox/0004_requests.sql"
        ))],
    },
    Migration {
        version: 5,
        description: "entrega_retenidos: dead letters the broker refused, held for an operator",
        steps: &[Step::Sql(include_str!(
            "../migrations/inbox/0005_held_letters.sql"
        ))],
    },
];

const LOG: &[Migration<'static>] = &[Migration {
    version: 1,
    description: "log transport: topics, partitions, records, group offsets, members, leases",
    steps: &[Step::Sql(include_str!("../migrations/log/0001_log.sql"))],
}];

const DLQ: &[Migration<'static>] = &[Migration {
    version: 1,
    description: "dead-letter operator state and audit",
    steps: &[Step::Sql(include_str!("../migrations/dlq/0001_dlq.sql"))],
}];

fn steps(set: MigrationSet) -> &'static [Migration<'static>] {
    match set {
        MigrationSet::Outbox => OUTBOX,
        MigrationSet::Inbox => INBOX,
        MigrationSet::Log => LOG,
        MigrationSet::Dlq => DLQ,
    }
}

const VERSION_TABLE: &str = "CREATE TABLE IF NOT EXISTS entrega_migrations (
    set_name      TEXT   NOT NULL,
    version       BIGINT NOT NULL,
    description   TEXT   NOT NULL,
    applied_at_ms BIGINT NOT NULL,
    PRIMARY KEY (set_name, version)
)";

/// Brings the given sets up to the latest version this build knows.
///
/// Everything runs in one transaction holding a `pg_advisory_xact_lock`, so concurrent
/// callers apply each step once and a failure leaves no half-applied set. Tables created by
/// the seed's own SQL are adopted in place (every step uses `IF NOT EXISTS`). A set recorded
/// at a newer version than this build knows fails with [`StoreError::SchemaTooNew`].
pub async fn migrate(pool: &PgPool, sets: &[MigrationSet]) -> Result<(), StoreError> {
    let mut tx = begin_locked(pool).await?;
    let mut done: Vec<MigrationSet> = Vec::new();
    for &set in sets {
        if done.contains(&set) {
            continue;
        }
        done.push(set);
        apply_set(&mut tx, set.name(), steps(set)).await?;
    }
    tx.commit().await.map_err(classify)
}

/// Brings an application's set `name` up to date with the same runner, lock, rules and
/// record as entrega's own sets ([`migrate`]). `name` may not be one of entrega's set names.
pub async fn apply_migrations(
    pool: &PgPool,
    name: &str,
    migrations: &[Migration<'_>],
) -> Result<(), StoreError> {
    if migration::is_reserved_set(name) {
        return Err(StoreError::rejected(format!(
            "`{name}` is one of entrega's own migration sets"
        )));
    }
    let mut tx = begin_locked(pool).await?;
    apply_set(&mut tx, name, migrations).await?;
    tx.commit().await.map_err(classify)
}

/// A transaction holding the migration lock, with the record table in place. The lock is
/// taken before the `CREATE TABLE`: concurrent `CREATE TABLE IF NOT EXISTS` of one table can
/// still fail on PostgreSQL.
async fn begin_locked(
    pool: &PgPool,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
    let mut tx = pool.begin().await.map_err(classify)?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
    // `Executor::execute` with a plain `&str` runs the simple-query protocol (several
    // statements allowed) and, unlike `raw_sql`, keeps this future `Send`.
    (&mut *tx).execute(VERSION_TABLE).await.map_err(classify)?;
    Ok(tx)
}

async fn apply_set(
    conn: &mut PgConnection,
    name: &str,
    migrations: &[Migration<'_>],
) -> Result<(), StoreError> {
    let current: Option<i64> =
        sqlx::query_scalar("SELECT max(version) FROM entrega_migrations WHERE set_name = $1")
            .bind(name)
            .fetch_one(&mut *conn)
            .await
            .map_err(classify)?;
    let current = current.unwrap_or(0);
    let latest = migration::latest_version(migrations);
    if current > latest {
        return Err(StoreError::SchemaTooNew {
            found: current,
            supported: latest,
        });
    }
    for m in migrations.iter().filter(|m| m.version > current) {
        for step in m.steps {
            run_step(conn, step).await?;
        }
        sqlx::query(
            "INSERT INTO entrega_migrations (set_name, version, description, applied_at_ms)
             VALUES ($1, $2, $3, $4)",
        )
        .bind(name)
        .bind(m.version)
        .bind(m.description)
        .bind(now_ms())
        .execute(&mut *conn)
        .await
        .map_err(classify)?;
    }
    Ok(())
}

async fn run_step(conn: &mut PgConnection, step: &Step<'_>) -> Result<(), StoreError> {
    let sql = match step {
        Step::Sql(script) => (*script).to_owned(),
        // PostgreSQL has the guard in the statement itself.
        Step::AddColumn {
            table,
            column,
            definition,
        } => format!("ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {definition}"),
    };
    conn.execute(sql.as_str()).await.map_err(classify)?;
    Ok(())
}

/// The latest version of `set` this build knows (what [`migrate`] brings a database to).
pub fn latest_version(set: MigrationSet) -> i64 {
    migration::latest_version(steps(set))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>(_: &T) {}

    #[tokio::test]
    async fn migrate_future_is_send() {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://localhost/none")
            .ok();
        if let Some(pool) = pool {
            assert_send(&migrate(&pool, &[MigrationSet::Outbox]));
        }
    }
}
