//! The migration runner on SQLite: entrega's own schema, applied per [`MigrationSet`], and
//! an application's sets, all recorded in `entrega_migrations`.

use entrega_core::migration::{self, Migration, Step};
use entrega_core::{MigrationSet, StoreError};
use sqlx::{Executor as _, SqliteConnection, SqlitePool};

use crate::connect::begin_immediate;
use crate::errors::classify;

const OUTBOX: &[Migration<'static>] = &[
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
    Migration {
        version: 3,
        description: "outbox headers: metadata copied onto the published message",
        // A JSON object of text values; NULL for rows written without any.
        steps: &[Step::AddColumn {
            table: "outbox",
            column: "cabeceras",
            definition: "TEXT",
        }],
    },
];

const INBOX: &[Migration<'static>] = &[
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

fn migrations_of(set: MigrationSet) -> &'static [Migration<'static>] {
    match set {
        MigrationSet::Outbox => OUTBOX,
        MigrationSet::Inbox => INBOX,
        MigrationSet::Log => LOG,
        MigrationSet::Dlq => DLQ,
    }
}

/// The latest version of `set` this build knows (what [`migrate`] brings a database to).
pub fn latest_version(set: MigrationSet) -> i64 {
    migration::latest_version(migrations_of(set))
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
        apply_set(&mut tx, set.name(), migrations_of(set)).await?;
    }
    tx.commit().await.map_err(classify)
}

/// Brings an application's set `name` up to date with the same runner, rules and record as
/// entrega's own sets ([`migrate`]): one transaction, each step once, refused when the
/// database records a newer step. `name` may not be one of entrega's set names.
pub async fn apply_migrations(
    pool: &SqlitePool,
    name: &str,
    migrations: &[Migration<'_>],
) -> Result<(), StoreError> {
    if migration::is_reserved_set(name) {
        return Err(StoreError::rejected(format!(
            "`{name}` is one of entrega's own migration sets"
        )));
    }
    let mut tx = begin_immediate(pool).await?;
    sqlx::query(VERSION_TABLE)
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
    apply_set(&mut tx, name, migrations).await?;
    tx.commit().await.map_err(classify)
}

async fn apply_set(
    conn: &mut SqliteConnection,
    name: &str,
    migrations: &[Migration<'_>],
) -> Result<(), StoreError> {
    let recorded: i64 = sqlx::query_scalar(
        "SELECT COALESCE(MAX(version), 0) FROM entrega_migrations WHERE set_name = ?",
    )
    .bind(name)
    .fetch_one(&mut *conn)
    .await
    .map_err(classify)?;
    let supported = migration::latest_version(migrations);
    if recorded > supported {
        return Err(StoreError::SchemaTooNew {
            found: recorded,
            supported,
        });
    }
    for migration in migrations.iter().filter(|m| m.version > recorded) {
        for step in migration.steps {
            run_step(conn, step).await?;
        }
        sqlx::query(
            "INSERT INTO entrega_migrations (set_name, version, description, applied_at_ms)
             VALUES (?, ?, ?, ?)",
        )
        .bind(name)
        .bind(migration.version)
        .bind(migration.description)
        .bind(entrega_core::now_ms())
        .execute(&mut *conn)
        .await
        .map_err(classify)?;
        tracing::info!(set = name, version = migration.version, "applied migration");
    }
    Ok(())
}

async fn run_step(conn: &mut SqliteConnection, step: &Step<'_>) -> Result<(), StoreError> {
    match step {
        Step::Sql(script) => {
            // A plain `&str` runs every statement of the script.
            conn.execute(*script).await.map_err(classify)?;
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
