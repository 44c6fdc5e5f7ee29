-- The WAL relay (PostgreSQL only): the publication its replication slot decodes, and the
-- record of the slots entrega created.
--
-- The publication carries the outbox's inserts only: the marks and purges of published rows
-- are updates and deletes, and never reach the stream.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'entrega_outbox') THEN
        CREATE PUBLICATION entrega_outbox FOR TABLE outbox WITH (publish = 'insert');
    END IF;
END
$$;

-- A slot recorded here and missing from the server was dropped (or lost): the relay stops
-- rather than create a new one silently, since the events between would never be read.
-- `caught_up_at` is set once the rows committed before the slot existed were published.
CREATE TABLE IF NOT EXISTS entrega_wal_slots (
    slot         TEXT        PRIMARY KEY,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    caught_up_at TIMESTAMPTZ
);
