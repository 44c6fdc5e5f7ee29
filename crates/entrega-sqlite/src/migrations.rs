//! entrega's own schema, applied per [`MigrationSet`] and recorded in `entrega_migrations`.

use entrega_core::{MigrationSet, StoreError};
use sqlx::{SqliteConnection, SqlitePool};

use crate::connect::begin_immediate;
use crate::errors::classify;

/// One step of a migration.
enum Step {
    /// Statements run as a script.
    Sql(&'static str),
    /// `ALTER TABLE .. ADD COLUMN` unless the column exists (SQLite has no `IF NOT EXISTS`
    /// there); needed to adopt tables created from the seed's own SQL.
    AddColumn {
        table: &'static str,
        column: &'static str,
        definition: &'static str,
    },
}

/// A numbered, described change to one set.
struct Migration {
    version: i64,
    description: &'static str,
    steps: &'static [Step],
}

const OUTBOX: &[Migration] = &[
    Migration {
        version: 1,
        description: "outbox, relay lanes and relay instances",
        steps: &[
            Step::Sql(include_str!("../migrations/outbox/0001_outbox.sql")),
            Step::AddColumn {
                table: "outbox",
                column: "lane",
                definition: "INTEGER NOT NULL DEFAULT 0",
            },
            Step::Sql(include_str!("../migrations/outbox/0001_relay_lanes.sql")),
        ],
    },
    Migration {
        version: 2,
        description:
            "outbox rows the transport refused: attempts, next attempt, last error, parking",
        steps: &[
            Step::AddColumn {
                table: "outbox",
                column: "intentos",
                definition: "INTEGER NOT NULL DEFAULT 0",
            },
            // Times as the seed's other columns: UTC text, `%Y-%m-%dT%H:%M:%fZ`.
            Step::AddColumn {
                table: "outbox",
                column: "proximo_intento",
                definition: "TEXT",
            },
            Step::AddColumn {
                table: "outbox",
                column: "ultimo_error",
                definition: "TEXT",
            },
            Step::AddColumn {
                table: "outbox",
                column: "aparcado_en",
                definition: "TEXT",
            },
            Step::Sql(include_str!("../migrations/outbox/0002_blocked_index.sql")),
        ],
    },
];

const INBOX: &[Migration] = &[
    Migration {
        version: 1,
        description: "mensajes_procesados",
        steps: &[Step::Sql(include_str!(
            "../migrations/inbox/0001_mensajes_procesados.sql"
        ))],
    },
    Migration {
        version: 2,
        description: "entrega_aparcados: parking for ordered retries",
        steps: &[Step::Sql(include_str!(
            "../migrations/inbox/0002_parking.sql"
        ))],
    },
];

const LOG: &[Migration] = &[Migration {
    version: 1,
    description: "log transport: topics, partitions, records, group offsets, members, leases",
    steps: &[Step::Sql(include_str!("../migrations/log/0001_log.sql"))],
}];

const DLQ: &[Migration] = &[Migration {
    version: 1,
    description: "dead-letter operator state and audit",
    steps: &[Step::Sql(include_str!("../migrations/dlq/0001_dlq.sql"))],
}];

fn migrations_of(set: MigrationSet) -> &'static [Migration] {
    match set {
        MigrationSet::Outbox => OUTBOX,
        MigrationSet::Inbox => INBOX,
        MigrationSet::Log => LOG,
        MigrationSet::Dlq => DLQ,
    }
}

/// The latest version of `set` this build knows.
pub(crate) fn latest_version(set: MigrationSet) -> i64 {
    migrations_of(set)
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap_or(0)
}

const VERSION_TABLE: &str = "CREATE TABLE IF NOT EXISTS entrega_migrations (
    set_name      TEXT    NOT NULL,
    version       INTEGER NOT NULL,
    description   TEXT    NOT NULL,
    applied_at_ms INTEGER NOT NULL,
    PRIMARY KEY (set_name, version)
)";

/// Brings the listed sets up to date. Idempotent, and safe to run from several processes at
/// once: everything happens in one `BEGIN IMMEDIATE` transaction, so a second migrator waits
/// and then finds nothing left to do. Fails with [`StoreError::SchemaTooNew`] when the
/// database records a newer version than this build knows, and changes nothing then.
pub async fn migrate(pool: &SqlitePool, sets: &[MigrationSet]) -> Result<(), StoreError> {
    let mut tx = begin_immediate(pool).await?;
    sqlx::query(VERSION_TABLE)
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
    for &set in sets {
        migrate_set(&mut tx, set).await?;
    }
    tx.commit().await.map_err(classify)
}

async fn migrate_set(conn: &mut SqliteConnection, set: MigrationSet) -> Result<(), StoreError> {
    let recorded: i64 = sqlx::query_scalar(
        "SELECT COALESCE(MAX(version), 0) FROM entrega_migrations WHERE set_name = ?",
    )
    .bind(set.name())
    .fetch_one(&mut *conn)
    .await
    .map_err(classify)?;
    let supported = latest_version(set);
    if recorded > supported {
        return Err(StoreError::SchemaTooNew {
            found: recorded,
            supported,
        });
    }
    for migration in migrations_of(set).iter().filter(|m| m.version > recorded) {
        for step in migration.steps {
            run_step(conn, step).await?;
        }
        sqlx::query(
            "INSERT INTO entrega_migrations (set_name, version, description, applied_at_ms)
             VALUES (?, ?, ?, ?)",
        )
        .bind(set.name())
        .bind(migration.version)
        .bind(migration.description)
        .bind(entrega_core::now_ms())
        .execute(&mut *conn)
        .await
        .map_err(classify)?;
        tracing::info!(
            set = set.name(),
            version = migration.version,
            "applied migration"
        );
    }
    Ok(())
}

async fn run_step(conn: &mut SqliteConnection, step: &Step) -> Result<(), StoreError> {
    match step {
        Step::Sql(script) => {
            sqlx::query(script)
                .execute(&mut *conn)
                .await
                .map_err(classify)?;
        }
        Step::AddColumn {
            table,
            column,
            definition,
        } => {
            let present: i64 =
                sqlx::query_scalar("SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = ?")
                    .bind(table)
                    .bind(column)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(classify)?;
            if present == 0 {
                let ddl = format!("ALTER TABLE {table} ADD COLUMN {column} {definition}");
                sqlx::query(&ddl)
                    .execute(&mut *conn)
                    .await
                    .map_err(classify)?;
            }
        }
    }
    Ok(())
}
