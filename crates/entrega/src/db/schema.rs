//! entrega's own tables, one migration set per capability, the SQLite and PostgreSQL steps of
//! each set side by side. The scripts live in `crates/entrega/migrations/<set>/`, named
//! `<version>_<what>.<backend>.sql` (`<version>_<what>.sql` when both backends run it).
//!
//! Steps differ between the backends only where the dialects do: SQLite has no
//! `ADD COLUMN IF NOT EXISTS`, so columns added to tables the seed's own SQL may have created
//! are guarded steps ([`Step::AddColumn`]) there, and plain statements on PostgreSQL.

use entrega_core::migration::{Migration, Step};
use entrega_core::MigrationSet;

use super::Backend;

/// The steps of `set` on `backend`.
pub(super) fn steps(set: MigrationSet, backend: Backend) -> &'static [Migration<'static>] {
    let (sqlite, postgres) = match set {
        MigrationSet::Outbox => (OUTBOX_SQLITE, OUTBOX_POSTGRES),
        MigrationSet::Inbox => (INBOX_SQLITE, INBOX_POSTGRES),
        MigrationSet::Rpc => (RPC_SQLITE, RPC_POSTGRES),
        MigrationSet::HeldLetters => (HELD_SQLITE, HELD_POSTGRES),
        MigrationSet::Log => (LOG_SQLITE, LOG_POSTGRES),
        MigrationSet::Sagas => (SAGAS_SQLITE, SAGAS_POSTGRES),
        MigrationSet::Dlq => (DLQ_SQLITE, DLQ_POSTGRES),
    };
    match backend {
        Backend::Sqlite => sqlite,
        Backend::Postgres => postgres,
    }
}

/// A step that is one script.
macro_rules! script {
    ($set:literal, $file:literal) => {
        Step::Sql(include_str!(concat!("../../migrations/", $set, "/", $file)))
    };
}

/// A column SQLite adds unless present.
const fn add_column(column: &'static str, definition: &'static str) -> Step<'static> {
    Step::AddColumn {
        table: "outbox",
        column,
        definition,
    }
}

const OUTBOX_FIRST: &str = "outbox, relay lanes and relay instances";
const OUTBOX_REFUSED: &str =
    "outbox rows the transport refused: attempts, next attempt, last error, parking";
const OUTBOX_HEADERS: &str = "outbox headers: metadata copied onto the published message";
const OUTBOX_ENGLISH: &str =
    "outbox: the columns entrega added named in English (attempts, next_attempt_at, last_error, \
     held_at, headers)";

const OUTBOX_SQLITE: &[Migration<'static>] = &[
    Migration {
        version: 1,
        description: OUTBOX_FIRST,
        steps: &[
            script!("outbox", "0001_outbox.sqlite.sql"),
            add_column("lane", "INTEGER NOT NULL DEFAULT 0"),
            script!("outbox", "0001_relay_lanes.sqlite.sql"),
        ],
    },
    Migration {
        version: 2,
        description: OUTBOX_REFUSED,
        // Times as the seed's other columns: UTC text, `%Y-%m-%dT%H:%M:%fZ`.
        steps: &[
            add_column("intentos", "INTEGER NOT NULL DEFAULT 0"),
            add_column("proximo_intento", "TEXT"),
            add_column("ultimo_error", "TEXT"),
            add_column("aparcado_en", "TEXT"),
            script!("outbox", "0002_blocked_index.sqlite.sql"),
        ],
    },
    Migration {
        version: 3,
        description: OUTBOX_HEADERS,
        // A JSON object of text values; NULL for rows written without any.
        steps: &[add_column("cabeceras", "TEXT")],
    },
    Migration {
        version: 4,
        description: OUTBOX_ENGLISH,
        steps: &[script!("outbox", "0004_english_names.sql")],
    },
];

const OUTBOX_POSTGRES: &[Migration<'static>] = &[
    Migration {
        version: 1,
        description: OUTBOX_FIRST,
        steps: &[script!("outbox", "0001_outbox.postgres.sql")],
    },
    Migration {
        version: 2,
        description: OUTBOX_REFUSED,
        steps: &[script!("outbox", "0002_refused_rows.postgres.sql")],
    },
    Migration {
        version: 3,
        description: OUTBOX_HEADERS,
        steps: &[script!("outbox", "0003_headers.postgres.sql")],
    },
    Migration {
        version: 4,
        description: OUTBOX_ENGLISH,
        steps: &[script!("outbox", "0004_english_names.sql")],
    },
];

const INBOX_FIRST: &str = "mensajes_procesados with purge index";
const INBOX_PARKING: &str = "entrega_aparcados: parking for ordered retries";
const INBOX_ENGLISH: &str = "parking for ordered retries named in English: entrega_parked";

const INBOX_SQLITE: &[Migration<'static>] = &[
    Migration {
        version: 1,
        description: INBOX_FIRST,
        steps: &[script!("inbox", "0001_mensajes_procesados.sqlite.sql")],
    },
    Migration {
        version: 2,
        description: INBOX_PARKING,
        steps: &[script!("inbox", "0002_parking.sqlite.sql")],
    },
    Migration {
        version: 3,
        description: INBOX_ENGLISH,
        steps: &[script!("inbox", "0003_english_names.sqlite.sql")],
    },
];

const INBOX_POSTGRES: &[Migration<'static>] = &[
    Migration {
        version: 1,
        description: INBOX_FIRST,
        steps: &[script!("inbox", "0001_mensajes_procesados.postgres.sql")],
    },
    Migration {
        version: 2,
        description: INBOX_PARKING,
        steps: &[script!("inbox", "0002_parking.postgres.sql")],
    },
    Migration {
        version: 3,
        description: INBOX_ENGLISH,
        steps: &[script!("inbox", "0003_english_names.postgres.sql")],
    },
];

const RPC_ANSWERS: &str = "entrega_respuestas: stored answers of idempotent request handlers";
const RPC_REQUESTS: &str =
    "entrega_peticiones: requests awaiting their replies (durable request/reply)";
const RPC_ENGLISH: &str =
    "request/reply named in English: entrega_answers (answered_at_ms), entrega_requests";

const RPC_SQLITE: &[Migration<'static>] = &[
    Migration {
        version: 1,
        description: RPC_ANSWERS,
        steps: &[script!("rpc", "0001_answers.sqlite.sql")],
    },
    Migration {
        version: 2,
        description: RPC_REQUESTS,
        steps: &[script!("rpc", "0002_requests.sqlite.sql")],
    },
    Migration {
        version: 3,
        description: RPC_ENGLISH,
        steps: &[script!("rpc", "0003_english_names.sqlite.sql")],
    },
];

const RPC_POSTGRES: &[Migration<'static>] = &[
    Migration {
        version: 1,
        description: RPC_ANSWERS,
        steps: &[script!("rpc", "0001_answers.postgres.sql")],
    },
    Migration {
        version: 2,
        description: RPC_REQUESTS,
        steps: &[script!("rpc", "0002_requests.postgres.sql")],
    },
    Migration {
        version: 3,
        description: RPC_ENGLISH,
        steps: &[script!("rpc", "0003_english_names.postgres.sql")],
    },
];

const HELD: &str = "entrega_retenidos: dead letters the broker refused, held for an operator";
const HELD_ENGLISH: &str = "held dead letters named in English: entrega_held_letters";

const HELD_SQLITE: &[Migration<'static>] = &[
    Migration {
        version: 1,
        description: HELD,
        steps: &[script!("held_letters", "0001_held_letters.sqlite.sql")],
    },
    Migration {
        version: 2,
        description: HELD_ENGLISH,
        steps: &[script!("held_letters", "0002_english_names.sqlite.sql")],
    },
];

const HELD_POSTGRES: &[Migration<'static>] = &[
    Migration {
        version: 1,
        description: HELD,
        steps: &[script!("held_letters", "0001_held_letters.postgres.sql")],
    },
    Migration {
        version: 2,
        description: HELD_ENGLISH,
        steps: &[script!("held_letters", "0002_english_names.postgres.sql")],
    },
];

const SAGAS_FIRST: &str = "entrega_sagas and entrega_saga_historial";
const SAGAS_TRACE: &str = "entrega_sagas.traza: the trace its commands continue";
const SAGAS_ENGLISH: &str = "sagas named in English: columns, states, entrega_saga_history";
/// The first steps read alike on both backends (the added column is guarded).
const SAGAS_TRACE_COLUMN: Step<'static> = Step::AddColumn {
    table: "entrega_sagas",
    column: "traza",
    definition: "TEXT",
};

const SAGAS_SQLITE: &[Migration<'static>] = &[
    Migration {
        version: 1,
        description: SAGAS_FIRST,
        steps: &[script!("saga", "0001_sagas.sql")],
    },
    Migration {
        version: 2,
        description: SAGAS_TRACE,
        steps: &[SAGAS_TRACE_COLUMN],
    },
    Migration {
        version: 3,
        description: SAGAS_ENGLISH,
        steps: &[script!("saga", "0003_english_names.sqlite.sql")],
    },
];

const SAGAS_POSTGRES: &[Migration<'static>] = &[
    Migration {
        version: 1,
        description: SAGAS_FIRST,
        steps: &[script!("saga", "0001_sagas.sql")],
    },
    Migration {
        version: 2,
        description: SAGAS_TRACE,
        steps: &[SAGAS_TRACE_COLUMN],
    },
    Migration {
        version: 3,
        description: SAGAS_ENGLISH,
        steps: &[script!("saga", "0003_english_names.postgres.sql")],
    },
];

const LOG: &str = "log transport: topics, partitions, records, group offsets, members, leases";

const LOG_SQLITE: &[Migration<'static>] = &[Migration {
    version: 1,
    description: LOG,
    steps: &[script!("log", "0001_log.sqlite.sql")],
}];

const LOG_POSTGRES: &[Migration<'static>] = &[Migration {
    version: 1,
    description: LOG,
    steps: &[script!("log", "0001_log.postgres.sql")],
}];

const DLQ: &str = "dead-letter operator state and audit";

const DLQ_SQLITE: &[Migration<'static>] = &[Migration {
    version: 1,
    description: DLQ,
    steps: &[script!("dlq", "0001_dlq.sqlite.sql")],
}];

const DLQ_POSTGRES: &[Migration<'static>] = &[Migration {
    version: 1,
    description: DLQ,
    steps: &[script!("dlq", "0001_dlq.postgres.sql")],
}];

/// Steps that databases migrated before the tables had sets of their own recorded under
/// `inbox`: `(inbox version, what it created, the set and version that own it now)`.
pub(super) const MOVED_FROM_INBOX: [(i64, &str, MigrationSet, i64); 3] = [
    (3, "entrega_respuestas:%", MigrationSet::Rpc, 1),
    (4, "entrega_peticiones:%", MigrationSet::Rpc, 2),
    (5, "entrega_retenidos:%", MigrationSet::HeldLetters, 1),
];
