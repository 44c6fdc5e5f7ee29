-- The life of the relay instance that took each lane: a relay restarted under the same name
-- takes its earlier life's lanes back at once (the token still fences the earlier life).
ALTER TABLE entrega_relay_lanes ADD COLUMN incarnation BIGINT NOT NULL DEFAULT 0;
