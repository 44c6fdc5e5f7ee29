-- Parking for ordered retries, named in English with the log's column names.
ALTER TABLE entrega_aparcados RENAME TO entrega_parked;
ALTER TABLE entrega_parked RENAME COLUMN grupo TO group_id;
ALTER TABLE entrega_parked RENAME COLUMN topico TO topic;
ALTER TABLE entrega_parked RENAME COLUMN particion TO partition_no;
ALTER TABLE entrega_parked RENAME COLUMN desplazamiento TO log_offset;
ALTER TABLE entrega_parked RENAME COLUMN clave TO msg_key;
ALTER TABLE entrega_parked RENAME COLUMN cabeceras TO headers;
ALTER TABLE entrega_parked RENAME COLUMN carga TO payload;
ALTER TABLE entrega_parked RENAME COLUMN intentos TO attempts;
ALTER TABLE entrega_parked RENAME COLUMN no_antes_ms TO not_before_ms;
ALTER TABLE entrega_parked RENAME COLUMN ultimo_error TO last_error;
ALTER TABLE entrega_parked RENAME COLUMN aparcado_ms TO parked_at_ms;
DROP INDEX IF EXISTS entrega_aparcados_clave;
CREATE INDEX IF NOT EXISTS entrega_parked_key
    ON entrega_parked (group_id, topic, partition_no, msg_key, log_offset);
