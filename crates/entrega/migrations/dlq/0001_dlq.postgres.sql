-- Operator state of dead letters: one row per dead letter an operator replayed or discarded.
-- A dead letter without a row is pending. Named by its place in the dead-letter topic.
CREATE TABLE IF NOT EXISTS entrega_dlq_state (
    dlq_topic     TEXT    NOT NULL,
    partition_no  INTEGER NOT NULL,
    log_offset    BIGINT  NOT NULL,
    state         TEXT    NOT NULL CHECK (state IN ('replayed', 'discarded')),
    changed_at_ms BIGINT  NOT NULL,
    operator      TEXT    NOT NULL,
    reason        TEXT,
    replays       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (dlq_topic, partition_no, log_offset)
);

-- Every operator action on dead letters, dry runs included: who, when, what, how many.
CREATE TABLE IF NOT EXISTS entrega_dlq_audit (
    id       BIGSERIAL PRIMARY KEY,
    at_ms    BIGINT  NOT NULL,
    operator TEXT    NOT NULL,
    action   TEXT    NOT NULL,
    filter   TEXT    NOT NULL,
    dry_run  BOOLEAN NOT NULL,
    matched  BIGINT  NOT NULL,
    applied  BIGINT  NOT NULL,
    refused  BIGINT  NOT NULL,
    detail   TEXT
);
