//! entrega's own tables, one migration set per capability, each version with its SQLite and
//! PostgreSQL steps side by side. The scripts live in `crates/entrega/migrations/<set>/`,
//! named `<version>_<what>.<backend>.sql` (`<version>_<what>.sql` when both backends run it).
//!
//! Steps differ between the backends only where the dialects do: SQLite has no
//! `ADD COLUMN IF NOT EXISTS`, so columns added to tables the seed's own SQL may have created
//! are guarded steps ([`Step::AddColumn`]) there, and plain statements on PostgreSQL.

use entrega_core::migration::{Migration, Step};
use entrega_core::MigrationSet;

use super::Backend;

/// One version of a set: what it does, and its steps on each backend.
struct Version {
    version: i64,
    description: &'static str,
    sqlite: &'static [Step<'static>],
    postgres: &'static [Step<'static>],
}

/// The steps of `set` on `backend`.
pub(super) fn steps(set: MigrationSet, backend: Backend) -> Vec<Migration<'static>> {
    let versions = match set {
        MigrationSet::Outbox => OUTBOX,
        MigrationSet::Inbox => INBOX,
        MigrationSet::Rpc => RPC,
        MigrationSet::HeldLetters => HELD_LETTERS,
        MigrationSet::Log => LOG,
        MigrationSet::Sagas => SAGAS,
        MigrationSet::Dlq => DLQ,
    };
    versions
        .iter()
        .map(|v| Migration {
            version: v.version,
            description: v.description,
            steps: match backend {
                Backend::Sqlite => v.sqlite,
                Backend::Postgres => v.postgres,
            },
        })
        .collect()
}

/// A step that is one script.
macro_rules! script {
    ($set:literal, $file:expr) => {
        Step::Sql(include_str!(concat!("../../migrations/", $set, "/", $file)))
    };
}

/// A column SQLite adds to `table` unless present.
const fn add_column(
    table: &'static str,
    column: &'static str,
    definition: &'static str,
) -> Step<'static> {
    Step::AddColumn {
        table,
        column,
        definition,
    }
}

/// A version whose steps are scripts of `$set`, by the shape of their files: `pair(stem)` runs
/// `stem.sqlite.sql` or `stem.postgres.sql`; `both(stem)` runs `stem.sql` on either; `renamed(stem)`
/// runs `stem.sql` on either, then `stem.postgres.sql` on PostgreSQL (constraint names and
/// types SQLite does not have).
macro_rules! version {
    ($set:literal, $version:literal, $description:expr, pair($stem:literal)) => {
        Version {
            version: $version,
            description: $description,
            sqlite: &[script!($set, concat!($stem, ".sqlite.sql"))],
            postgres: &[script!($set, concat!($stem, ".postgres.sql"))],
        }
    };
    ($set:literal, $version:literal, $description:expr, both($stem:literal)) => {
        Version {
            version: $version,
            description: $description,
            sqlite: &[script!($set, concat!($stem, ".sql"))],
            postgres: &[script!($set, concat!($stem, ".sql"))],
        }
    };
    ($set:literal, $version:literal, $description:expr, renamed($stem:literal)) => {
        Version {
            version: $version,
            description: $description,
            sqlite: &[script!($set, concat!($stem, ".sql"))],
            postgres: &[
                script!($set, concat!($stem, ".sql")),
                script!($set, concat!($stem, ".postgres.sql")),
            ],
        }
    };
}

const OUTBOX: &[Version] = &[
    Version {
        version: 1,
        description: "outbox, relay lanes and relay instances",
        sqlite: &[
            script!("outbox", "0001_outbox.sqlite.sql"),
            add_column("outbox", "lane", "INTEGER NOT NULL DEFAULT 0"),
            script!("outbox", "0001_relay_lanes.sqlite.sql"),
        ],
        postgres: &[script!("outbox", "0001_outbox.postgres.sql")],
    },
    Version {
        version: 2,
        description:
            "outbox rows the transport refused: attempts, next attempt, last error, parking",
        // Times as the seed's other columns: UTC text, `%Y-%m-%dT%H:%M:%fZ`.
        sqlite: &[
            add_column("outbox", "intentos", "INTEGER NOT NULL DEFAULT 0"),
            add_column("outbox", "proximo_intento", "TEXT"),
            add_column("outbox", "ultimo_error", "TEXT"),
            add_column("outbox", "aparcado_en", "TEXT"),
            script!("outbox", "0002_blocked_index.sqlite.sql"),
        ],
        postgres: &[script!("outbox", "0002_refused_rows.postgres.sql")],
    },
    Version {
        version: 3,
        description: "outbox headers: metadata copied onto the published message",
        // A JSON object of text values; NULL for rows written without any.
        sqlite: &[add_column("outbox", "cabeceras", "TEXT")],
        postgres: &[script!("outbox", "0003_headers.postgres.sql")],
    },
    version!(
        "outbox",
        4,
        "outbox: the columns entrega added named in English (attempts, next_attempt_at, \
         last_error, held_at, headers)",
        both("0004_english_names")
    ),
    Version {
        version: 5,
        description: "WAL relay: the publication of the outbox's inserts and the slots created",
        sqlite: &[],
        postgres: &[script!("outbox", "0005_wal_relay.postgres.sql")],
    },
    Version {
        version: 6,
        description: "WAL relay: the timeline each slot was created on",
        sqlite: &[],
        postgres: &[script!("outbox", "0006_wal_slot_timeline.postgres.sql")],
    },
    version!(
        "outbox",
        7,
        "relay lanes: the incarnation of the instance holding each",
        both("0007_lane_incarnations")
    ),
    Version {
        version: 8,
        description: "outbox: entrega's sessions notify the relays after their commit",
        sqlite: &[],
        postgres: &[script!("outbox", "0008_notify_after_commit.postgres.sql")],
    },
];

const INBOX: &[Version] = &[
    version!(
        "inbox",
        1,
        "mensajes_procesados with purge index",
        pair("0001_mensajes_procesados")
    ),
    version!(
        "inbox",
        2,
        "entrega_aparcados: parking for ordered retries",
        pair("0002_parking")
    ),
    version!(
        "inbox",
        3,
        "parking for ordered retries named in English: entrega_parked",
        renamed("0003_english_names")
    ),
];

const RPC: &[Version] = &[
    version!(
        "rpc",
        1,
        "entrega_respuestas: stored answers of idempotent request handlers",
        pair("0001_answers")
    ),
    version!(
        "rpc",
        2,
        "entrega_peticiones: requests awaiting their replies (durable request/reply)",
        pair("0002_requests")
    ),
    version!(
        "rpc",
        3,
        "request/reply named in English: entrega_answers (answered_at_ms), entrega_requests",
        renamed("0003_english_names")
    ),
];

const HELD_LETTERS: &[Version] = &[
    version!(
        "held_letters",
        1,
        "entrega_retenidos: dead letters the broker refused, held for an operator",
        pair("0001_held_letters")
    ),
    version!(
        "held_letters",
        2,
        "held dead letters named in English: entrega_held_letters",
        renamed("0002_english_names")
    ),
];

const LOG: &[Version] = &[
    version!(
        "log",
        1,
        "log transport: topics, partitions, records, group offsets, members, leases",
        pair("0001_log")
    ),
    version!(
        "log",
        2,
        "partition leases: the incarnation of the member holding each",
        both("0002_partition_incarnations")
    ),
];

const SAGAS: &[Version] = &[
    version!(
        "saga",
        1,
        "entrega_sagas and entrega_saga_historial",
        both("0001_sagas")
    ),
    Version {
        version: 2,
        description: "entrega_sagas.traza: the trace its commands continue",
        sqlite: &[add_column("entrega_sagas", "traza", "TEXT")],
        postgres: &[add_column("entrega_sagas", "traza", "TEXT")],
    },
    version!(
        "saga",
        3,
        "sagas named in English: columns, states, entrega_saga_history",
        renamed("0003_english_names")
    ),
];

const DLQ: &[Version] = &[
    version!(
        "dlq",
        1,
        "dead-letter operator state and audit",
        pair("0001_dlq")
    ),
    version!(
        "dlq",
        2,
        "one dead-letter action at a time",
        both("0002_dlq_action_lock")
    ),
];

/// Steps that databases migrated before the tables had sets of their own recorded under
/// `inbox`: `(inbox version, what it created, the set and version that own it now)`.
pub(super) const MOVED_FROM_INBOX: [(i64, &str, MigrationSet, i64); 3] = [
    (3, "entrega_respuestas:%", MigrationSet::Rpc, 1),
    (4, "entrega_peticiones:%", MigrationSet::Rpc, 2),
    (5, "entrega_retenidos:%", MigrationSet::HeldLetters, 1),
];
