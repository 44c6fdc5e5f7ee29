//! The one migration runner: entrega's own sets and an application's alike, on either
//! backend, each step recorded in `entrega_migrations` in the same transaction as the step.
//!
//! Everything a call applies runs in one transaction, so a failure leaves no half-applied
//! set, and concurrent migrators queue: SQLite's write transactions start with
//! `BEGIN IMMEDIATE`, PostgreSQL's take a transaction-scoped advisory lock. The second one
//! then finds nothing left to do. A set recorded at a newer version than this build knows is
//! refused with [`StoreError::SchemaTooNew`] and nothing changes.

use entrega_core::migration::{self, Migration, Step};
use entrega_core::{now_ms, MigrationSet, StoreError};

use super::{query, schema, Backend, Db, Tx};

/// Key of the advisory lock that serialises PostgreSQL migrators ("entrega" in ASCII).
/// Advisory locks are per database, so databases never wait on each other.
const MIGRATION_LOCK: i64 = 0x0065_6e74_7265_6761;

/// The record of applied steps, created by the first migration of a database (`BIGINT` has
/// SQLite's integer affinity).
const VERSION_TABLE: &str = "CREATE TABLE IF NOT EXISTS entrega_migrations (
    set_name      TEXT   NOT NULL,
    version       BIGINT NOT NULL,
    description   TEXT   NOT NULL,
    applied_at_ms BIGINT NOT NULL,
    PRIMARY KEY (set_name, version)
)";

/// Brings entrega's `sets` up to date on `db`, each once even if listed twice.
pub(super) async fn own_sets(db: &Db, sets: &[MigrationSet]) -> Result<(), StoreError> {
    let backend = db.backend();
    let mut tx = begin(db).await?;
    adopt_sets_split_from_inbox(&mut tx).await?;
    let mut done: Vec<MigrationSet> = Vec::with_capacity(sets.len());
    for &set in sets {
        if done.contains(&set) {
            continue;
        }
        done.push(set);
        apply_set(&mut tx, set.name(), &schema::steps(set, backend)).await?;
    }
    tx.commit().await
}

/// Brings an application's set `name` up to date on `db`, with the same transaction, lock,
/// rules and record as entrega's own sets. `name` may not be one of entrega's set names.
pub(super) async fn application_set(
    db: &Db,
    name: &str,
    migrations: &[Migration<'_>],
) -> Result<(), StoreError> {
    if migration::is_reserved_set(name) {
        return Err(StoreError::rejected(format!(
            "`{name}` is one of entrega's own migration sets"
        )));
    }
    let mut tx = begin(db).await?;
    apply_set(&mut tx, name, migrations).await?;
    tx.commit().await
}

/// The latest version of `set` this build knows on `backend`.
pub(super) fn latest_version(set: MigrationSet, backend: Backend) -> i64 {
    migration::latest_version(&schema::steps(set, backend))
}

/// A write transaction that holds the migrators' lock, with the record table in place.
async fn begin(db: &Db) -> Result<Tx, StoreError> {
    let mut tx = db.begin().await?;
    if tx.backend() == Backend::Postgres {
        tx.execute(query("SELECT pg_advisory_xact_lock($1)").bind(MIGRATION_LOCK))
            .await?;
    }
    tx.script(VERSION_TABLE).await?;
    Ok(tx)
}

/// Moves the records of steps that an older build kept under `inbox` (request/reply's and
/// the held letters' tables) to the sets that own them now, so those sets do not run again
/// and `inbox` is not "newer than this build". Recognised by their descriptions, so a later
/// `inbox` step with the same number is never taken for one of them.
async fn adopt_sets_split_from_inbox(tx: &mut Tx) -> Result<(), StoreError> {
    for (old_version, described, set, version) in schema::MOVED_FROM_INBOX {
        tx.execute(
            query(
                "INSERT INTO entrega_migrations (set_name, version, description, applied_at_ms) \
                 SELECT $1, $2, description, applied_at_ms FROM entrega_migrations \
                 WHERE set_name = 'inbox' AND version = $3 AND description LIKE $4 \
                 AND NOT EXISTS (SELECT 1 FROM entrega_migrations \
                                 WHERE set_name = $1 AND version = $2)",
            )
            .bind(set.name())
            .bind(version)
            .bind(old_version)
            .bind(described),
        )
        .await?;
        tx.execute(
            query(
                "DELETE FROM entrega_migrations \
                 WHERE set_name = 'inbox' AND version = $1 AND description LIKE $2",
            )
            .bind(old_version)
            .bind(described),
        )
        .await?;
    }
    Ok(())
}

async fn apply_set(
    tx: &mut Tx,
    name: &str,
    migrations: &[Migration<'_>],
) -> Result<(), StoreError> {
    let recorded: i64 = tx
        .scalar(
            query(
                "SELECT CAST(COALESCE(MAX(version), 0) AS BIGINT) FROM entrega_migrations \
                 WHERE set_name = $1",
            )
            .bind(name),
        )
        .await?
        .unwrap_or(0);
    let supported = migration::latest_version(migrations);
    if recorded > supported {
        return Err(StoreError::SchemaTooNew {
            found: recorded,
            supported,
        });
    }
    for step in migrations.iter().filter(|m| m.version > recorded) {
        for part in step.steps {
            run_step(tx, part).await?;
        }
        tx.execute(
            query(
                "INSERT INTO entrega_migrations (set_name, version, description, applied_at_ms) \
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(name)
            .bind(step.version)
            .bind(step.description)
            .bind(now_ms()),
        )
        .await?;
        tracing::info!(set = name, version = step.version, "applied migration");
    }
    Ok(())
}

async fn run_step(tx: &mut Tx, step: &Step<'_>) -> Result<(), StoreError> {
    match step {
        Step::Sql(script) => tx.script(script).await,
        Step::AddColumn {
            table,
            column,
            definition,
        } => match tx.backend() {
            // PostgreSQL has the guard in the statement itself.
            Backend::Postgres => {
                let ddl =
                    format!("ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {definition}");
                tx.script(&ddl).await
            }
            Backend::Sqlite => {
                let present: i64 = tx
                    .scalar(
                        query("SELECT COUNT(*) FROM pragma_table_info($1) WHERE name = $2")
                            .bind(*table)
                            .bind(*column),
                    )
                    .await?
                    .unwrap_or(0);
                if present == 0 {
                    let ddl = format!("ALTER TABLE {table} ADD COLUMN {column} {definition}");
                    tx.script(&ddl).await?;
                }
                Ok(())
            }
        },
    }
}
