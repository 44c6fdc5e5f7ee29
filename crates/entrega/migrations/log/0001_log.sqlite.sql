-- The database-backed log transport: topics split into partitions, each an append-only
-- sequence of records with dense offsets.
CREATE TABLE IF NOT EXISTS entrega_topics (
    topic         TEXT    PRIMARY KEY,
    partitions    INTEGER NOT NULL CHECK (partitions > 0),
    created_at_ms INTEGER NOT NULL DEFAULT 0
);

-- `next_offset` is bumped by every append while it holds the write lock, so offsets appear in
-- commit order.
CREATE TABLE IF NOT EXISTS entrega_partitions (
    topic        TEXT    NOT NULL,
    partition_no INTEGER NOT NULL,
    next_offset  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (topic, partition_no)
);

CREATE TABLE IF NOT EXISTS entrega_log (
    topic          TEXT    NOT NULL,
    partition_no   INTEGER NOT NULL,
    log_offset     INTEGER NOT NULL,
    msg_key        TEXT,
    headers        TEXT    NOT NULL DEFAULT '[]',
    payload        BLOB    NOT NULL,
    appended_at_ms INTEGER NOT NULL,
    PRIMARY KEY (topic, partition_no, log_offset)
);

-- Committed positions: the next offset each group will read.
CREATE TABLE IF NOT EXISTS entrega_group_offsets (
    group_id        TEXT    NOT NULL,
    topic           TEXT    NOT NULL,
    partition_no    INTEGER NOT NULL,
    next_offset     INTEGER NOT NULL,
    committed_at_ms INTEGER NOT NULL,
    PRIMARY KEY (group_id, topic, partition_no)
);

-- Members heartbeat here; the live count sets each member's fair share of partitions.
CREATE TABLE IF NOT EXISTS entrega_group_members (
    group_id   TEXT    NOT NULL,
    topic      TEXT    NOT NULL,
    member     TEXT    NOT NULL,
    seen_at_ms INTEGER NOT NULL,
    PRIMARY KEY (group_id, topic, member)
);

-- Which member reads which partition; `token` fences a member that lost its lease.
CREATE TABLE IF NOT EXISTS entrega_partition_leases (
    group_id      TEXT    NOT NULL,
    topic         TEXT    NOT NULL,
    partition_no  INTEGER NOT NULL,
    owner         TEXT,
    token         INTEGER NOT NULL DEFAULT 0,
    expires_at_ms INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (group_id, topic, partition_no)
);
