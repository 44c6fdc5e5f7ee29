-- The timeline each slot was created on. A slot recorded here and missing from a server on
-- a later timeline was not dropped: a failover promoted a standby, which has no copy of the
-- slot (before PostgreSQL 17's failover slots). The relay then publishes the rows still
-- pending and streams from a new slot, instead of stopping for an operator.
ALTER TABLE entrega_wal_slots ADD COLUMN IF NOT EXISTS timeline BIGINT;
