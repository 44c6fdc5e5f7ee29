-- Operator state of dead letters: one row per dead letter an operator replayed or discarded.
-- A dead letter without a row is pending. Named by its place in the dead-letter topic.
CREATE TABLE IF NOT EXISTS entrega_dlq_state (
    dlq_topic     TEXT    NOT NULL,
    partition_no  INTEGER NOT NULL,
    log_offset    INTEGER NOT NULL,
    state         TEXT    NOT NULL CHECK (state IN ('replayed', 'discarded')),
    changed_at_ms INTEGER NOT NULL,
    operator      TEXT    NOT NULL,
    reason        TEXT,
    replays       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (dlq_topic, partition_no, log_offset)
);

-- Every operator action on dead letters, dry runs included: who, when, what, how many.
CREATE TABLE IF NOT EXISTS entrega_dlq_audit (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms    INTEGER NOT NULL,
    operator TEXT    NOT NULL,
    action   TEXT    NOT NULL,
    filter   TEXT    NOT NULL,
    dry_run  INTEGER NOT NULL,
    matched  INTEGER NOT NULL,
    applied  INTEGER NOT NULL,
    refused  INTEGER NOT NULL,
    detail   TEXT
);
