-- The seed's outbox, adopted in place when it already exists, plus entrega's additions.
-- Every added column has a default, so the seed's own
--   INSERT INTO outbox (id, agregado, agregado_id, tipo, carga) VALUES (...)
-- keeps working and its rows get published.
CREATE TABLE IF NOT EXISTS outbox (
    id           UUID        PRIMARY KEY,
    agregado     TEXT        NOT NULL,
    agregado_id  TEXT        NOT NULL,
    tipo         TEXT        NOT NULL,
    version      INTEGER     NOT NULL DEFAULT 1,
    carga        JSONB       NOT NULL,
    creado_en    TIMESTAMPTZ NOT NULL DEFAULT now(),
    publicado_en TIMESTAMPTZ
);

-- Insertion order within a lane (rows already present are numbered in table order).
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS seq BIGSERIAL;

-- The relay lane of the aggregate: computed by the database so any writer gets it right.
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS lane SMALLINT
    GENERATED ALWAYS AS ((hashtext(agregado_id) & 63)::smallint) STORED;

CREATE INDEX IF NOT EXISTS outbox_pendientes ON outbox (creado_en) WHERE publicado_en IS NULL;
CREATE INDEX IF NOT EXISTS outbox_lane_pending ON outbox (lane, seq) WHERE publicado_en IS NULL;

-- One notification per inserting statement wakes the relays; NOTIFY is delivered at commit,
-- so a woken relay finds the rows.
CREATE OR REPLACE FUNCTION entrega_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('entrega_outbox', '');
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS entrega_outbox_notify ON outbox;
CREATE TRIGGER entrega_outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION entrega_outbox_notify();

CREATE TABLE IF NOT EXISTS entrega_relay_lanes (
    lane          INT    PRIMARY KEY,
    owner         TEXT   NULL,
    token         BIGINT NOT NULL DEFAULT 0,
    expires_at_ms BIGINT NOT NULL DEFAULT 0
);
INSERT INTO entrega_relay_lanes (lane) SELECT generate_series(0, 63) ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS entrega_relay_instances (
    owner      TEXT   PRIMARY KEY,
    seen_at_ms BIGINT NOT NULL
);
