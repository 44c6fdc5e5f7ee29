-- The database-backed log transport.
CREATE TABLE IF NOT EXISTS entrega_topics (
    topic         TEXT   PRIMARY KEY,
    partitions    INT    NOT NULL CHECK (partitions > 0),
    created_at_ms BIGINT NOT NULL DEFAULT 0
);

-- One row per partition; appends lock it to allocate offsets in commit order.
CREATE TABLE IF NOT EXISTS entrega_partitions (
    topic        TEXT   NOT NULL REFERENCES entrega_topics (topic) ON DELETE CASCADE,
    partition_no INT    NOT NULL,
    next_offset  BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (topic, partition_no)
);

CREATE TABLE IF NOT EXISTS entrega_log (
    topic          TEXT   NOT NULL,
    partition_no   INT    NOT NULL,
    log_offset     BIGINT NOT NULL,
    msg_key        TEXT   NULL,
    headers        TEXT   NOT NULL DEFAULT '[]',
    payload        BYTEA  NOT NULL,
    appended_at_ms BIGINT NOT NULL,
    PRIMARY KEY (topic, partition_no, log_offset)
);

CREATE TABLE IF NOT EXISTS entrega_group_offsets (
    group_id        TEXT   NOT NULL,
    topic           TEXT   NOT NULL,
    partition_no    INT    NOT NULL,
    next_offset     BIGINT NOT NULL,
    committed_at_ms BIGINT NOT NULL,
    PRIMARY KEY (group_id, topic, partition_no)
);

CREATE TABLE IF NOT EXISTS entrega_group_members (
    group_id   TEXT   NOT NULL,
    topic      TEXT   NOT NULL,
    member     TEXT   NOT NULL,
    seen_at_ms BIGINT NOT NULL,
    PRIMARY KEY (group_id, topic, member)
);

CREATE TABLE IF NOT EXISTS entrega_partition_leases (
    group_id      TEXT   NOT NULL,
    topic         TEXT   NOT NULL,
    partition_no  INT    NOT NULL,
    owner         TEXT   NULL,
    token         BIGINT NOT NULL DEFAULT 0,
    expires_at_ms BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (group_id, topic, partition_no)
);
