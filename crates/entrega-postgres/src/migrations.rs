//! entrega's own schema migrations, recorded in `entrega_migrations`, applied per set.

use entrega_core::{now_ms, MigrationSet, StoreError};
use sqlx::postgres::PgPool;
use sqlx::Executor;

use crate::errors::classify;

/// Key of the transaction-scoped advisory lock that serialises concurrent migrators
/// ("entrega" in ASCII). Advisory locks are per database, so databases never wait on each other.
const MIGRATION_LOCK: i64 = 0x0065_6e74_7265_6761;

/// One schema step of a set.
struct Migration {
    version: i64,
    description: &'static str,
    sql: &'static str,
}

const OUTBOX: &[Migration] = &[
    Migration {
        version: 1,
        description: "outbox with lanes, notify trigger, relay lane leases",
        sql: include_str!("../migrations/outbox/0001_outbox.sql"),
    },
    Migration {
        version: 2,
        description:
            "outbox rows the transport refused: attempts, next attempt, last error, parking",
        sql: include_str!("../migrations/outbox/0002_refused_rows.sql"),
    },
];

const INBOX: &[Migration] = &[
    Migration {
        version: 1,
        description: "mensajes_procesados with purge index",
        sql: include_str!("../migrations/inbox/0001_inbox.sql"),
    },
    Migration {
        version: 2,
        description: "entrega_aparcados: parking for ordered retries",
        sql: include_str!("../migrations/inbox/0002_parking.sql"),
    },
];

const LOG: &[Migration] = &[Migration {
    version: 1,
    description: "log transport: topics, partitions, records, group offsets, members, leases",
    sql: include_str!("../migrations/log/0001_log.sql"),
}];

const DLQ: &[Migration] = &[Migration {
    version: 1,
    description: "dead-letter operator state and audit",
    sql: include_str!("../migrations/dlq/0001_dlq.sql"),
}];

fn steps(set: MigrationSet) -> &'static [Migration] {
    match set {
        MigrationSet::Outbox => OUTBOX,
        MigrationSet::Inbox => INBOX,
        MigrationSet::Log => LOG,
        MigrationSet::Dlq => DLQ,
    }
}

/// Brings the given sets up to the latest version this build knows.
///
/// Everything runs in one transaction holding a `pg_advisory_xact_lock`, so concurrent
/// callers apply each step once and a failure leaves no half-applied set. Tables created by
/// the seed's own SQL are adopted in place (every step uses `IF NOT EXISTS`). A set recorded
/// at a newer version than this build knows fails with [`StoreError::SchemaTooNew`].
pub async fn migrate(pool: &PgPool, sets: &[MigrationSet]) -> Result<(), StoreError> {
    let mut tx = pool.begin().await.map_err(classify)?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
    // `Executor::execute` with a plain `&str` runs the simple-query protocol (several
    // statements allowed) and, unlike `raw_sql`, keeps this future `Send`.
    (&mut *tx)
        .execute(
            "CREATE TABLE IF NOT EXISTS entrega_migrations (
            set_name      TEXT   NOT NULL,
            version       BIGINT NOT NULL,
            description   TEXT   NOT NULL,
            applied_at_ms BIGINT NOT NULL,
            PRIMARY KEY (set_name, version)
        )",
        )
        .await
        .map_err(classify)?;

    let mut done: Vec<MigrationSet> = Vec::new();
    for &set in sets {
        if done.contains(&set) {
            continue;
        }
        done.push(set);
        let current: Option<i64> =
            sqlx::query_scalar("SELECT max(version) FROM entrega_migrations WHERE set_name = $1")
                .bind(set.name())
                .fetch_one(&mut *tx)
                .await
                .map_err(classify)?;
        let current = current.unwrap_or(0);
        let all = steps(set);
        let latest = all.last().map_or(0, |m| m.version);
        if current > latest {
            return Err(StoreError::SchemaTooNew {
                found: current,
                supported: latest,
            });
        }
        for step in all.iter().filter(|m| m.version > current) {
            (&mut *tx).execute(step.sql).await.map_err(classify)?;
            sqlx::query(
                "INSERT INTO entrega_migrations (set_name, version, description, applied_at_ms)
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(set.name())
            .bind(step.version)
            .bind(step.description)
            .bind(now_ms())
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
        }
    }
    tx.commit().await.map_err(classify)
}

/// The latest version of `set` this build knows (what [`migrate`] brings a database to).
pub fn latest_version(set: MigrationSet) -> i64 {
    steps(set).last().map_or(0, |m| m.version)
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
