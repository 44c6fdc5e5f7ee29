-- One replay or discard at a time: the holder of the action lock and when its lease ends.
-- Taken before an action reads its selection, given back once it has recorded its marks; a
-- holder that died is passed over when its lease has ended.
CREATE TABLE IF NOT EXISTS entrega_dlq_actions (
    scope         TEXT   NOT NULL PRIMARY KEY,
    holder        TEXT   NOT NULL,
    expires_at_ms BIGINT NOT NULL
);
