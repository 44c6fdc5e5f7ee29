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
    ($set:literal, $file:literal) => {
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
    Version {
        version: 4,
        description: "outbox: the columns entrega added named in English (attempts, \
                      next_attempt_at, last_error, held_at, headers)",
        sqlite: &[script!("outbox", "0004_english_names.sql")],
        postgres: &[script!("outbox", "0004_english_names.sql")],
    },
];

const INBOX: &[Version] = &[
    Version {
        version: 1,
        description: "mensajes_procesados with purge index",
        sqlite: &[script!("inbox", "0001_mensajes_procesados.sqlite.sql")],
        postgres: &[script!("inbox", "0001_mensajes_procesados.postgres.sql")],
    },
    Version {
        version: 2,
        description: "entrega_aparcados: parking for ordered retries",
        sqlite: &[script!("inbox", "0002_parking.sqlite.sql")],
        postgres: &[script!("inbox", "0002_parking.postgres.sql")],
    },
    Version {
        version: 3,
        description: "parking for ordered retries named in English: entrega_parked",
        sqlite: &[script!("inbox", "0003_english_names.sql")],
        postgres: &[
            script!("inbox", "0003_english_names.sql"),
            script!("inbox", "0003_english_names.postgres.sql"),
        ],
    },
];

const RPC: &[Version] = &[
    Version {
        version: 1,
        description: "entrega_respuestas: stored answers of idempotent request handlers",
        sqlite: &[script!("rpc", "0001_answers.sqlite.sql")],
        postgres: &[script!("rpc", "0001_answers.postgres.sql")],
    },
    Version {
        version: 2,
        description: "entrega_peticiones: requests awaiting their replies (durable request/reply)",
        sqlite: &[script!("rpc", "0002_requests.sqlite.sql")],
        postgres: &[script!("rpc", "0002_requests.postgres.sql")],
    },
    Version {
        version: 3,
        description:
            "request/reply named in English: entrega_answers (answered_at_ms), entrega_requests",
        sqlite: &[script!("rpc", "0003_english_names.sql")],
        postgres: &[
            script!("rpc", "0003_english_names.sql"),
            script!("rpc", "0003_english_names.postgres.sql"),
        ],
    },
];

const HELD_LETTERS: &[Version] = &[
    Version {
        version: 1,
        description: "entrega_retenidos: dead letters the broker refused, held for an operator",
        sqlite: &[script!("held_letters", "0001_held_letters.sqlite.sql")],
        postgres: &[script!("held_letters", "0001_held_letters.postgres.sql")],
    },
    Version {
        version: 2,
        description: "held dead letters named in English: entrega_held_letters",
        sqlite: &[script!("held_letters", "0002_english_names.sql")],
        postgres: &[
            script!("held_letters", "0002_english_names.sql"),
            script!("held_letters", "0002_english_names.postgres.sql"),
        ],
    },
];

const LOG: &[Version] = &[Version {
    version: 1,
    description: "log transport: topics, partitions, records, group offsets, members, leases",
    sqlite: &[script!("log", "0001_log.sqlite.sql")],
    postgres: &[script!("log", "0001_log.postgres.sql")],
}];

const SAGAS: &[Version] = &[
    Version {
        version: 1,
        description: "entrega_sagas and entrega_saga_historial",
        sqlite: &[script!("saga", "0001_sagas.sql")],
        postgres: &[script!("saga", "0001_sagas.sql")],
    },
    Version {
        version: 2,
        description: "entrega_sagas.traza: the trace its commands continue",
        sqlite: &[add_column("entrega_sagas", "traza", "TEXT")],
        postgres: &[add_column("entrega_sagas", "traza", "TEXT")],
    },
    Version {
        version: 3,
        description: "sagas named in English: columns, states, entrega_saga_history",
        sqlite: &[script!("saga", "0003_english_names.sql")],
        postgres: &[
            script!("saga", "0003_english_names.sql"),
            script!("saga", "0003_english_names.postgres.sql"),
        ],
    },
];

const DLQ: &[Version] = &[Version {
    version: 1,
    description: "dead-letter operator state and audit",
    sqlite: &[script!("dlq", "0001_dlq.sqlite.sql")],
    postgres: &[script!("dlq", "0001_dlq.postgres.sql")],
}];

/// Steps that databases migrated before the tables had sets of their own recorded under
/// `inbox`: `(inbox version, what it created, the set and version that own it now)`.
pub(super) const MOVED_FROM_INBOX: [(i64, &str, MigrationSet, i64); 3] = [
    (3, "entrega_respuestas:%", MigrationSet::Rpc, 1),
    (4, "entrega_peticiones:%", MigrationSet::Rpc, 2),
    (5, "entrega_retenidos:%", MigrationSet::HeldLetters, 1),
];
