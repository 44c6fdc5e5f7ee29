-- The life of the group member that took each partition: a member that subscribes again
-- under the same name takes its earlier life's partitions back at once (the token still
-- fences the earlier life).
ALTER TABLE entrega_partition_leases ADD COLUMN incarnation BIGINT NOT NULL DEFAULT 0;
