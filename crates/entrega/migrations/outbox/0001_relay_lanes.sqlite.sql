CREATE INDEX IF NOT EXISTS outbox_pendientes ON outbox (creado_en) WHERE publicado_en IS NULL;

-- Pending rows of one lane in rowid order (every index ends with the rowid).
CREATE INDEX IF NOT EXISTS outbox_lane_pending ON outbox (lane) WHERE publicado_en IS NULL;

-- Which relay instance publishes which lane; `token` fences a holder that lost its lease.
CREATE TABLE IF NOT EXISTS entrega_relay_lanes (
    lane          INTEGER PRIMARY KEY,
    owner         TEXT,
    token         INTEGER NOT NULL DEFAULT 0,
    expires_at_ms INTEGER NOT NULL DEFAULT 0
);

INSERT OR IGNORE INTO entrega_relay_lanes (lane)
WITH RECURSIVE lanes (n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM lanes WHERE n < 63)
SELECT n FROM lanes;

-- Relay instances seen recently; the live count sets each instance's fair share of lanes.
CREATE TABLE IF NOT EXISTS entrega_relay_instances (
    owner      TEXT    PRIMARY KEY,
    seen_at_ms INTEGER NOT NULL
);
