-- Dead letters the broker refused, named in English with the log's column names.
ALTER TABLE entrega_retenidos RENAME TO entrega_held_letters;
ALTER TABLE entrega_held_letters RENAME COLUMN grupo TO group_id;
ALTER TABLE entrega_held_letters RENAME COLUMN topico TO topic;
ALTER TABLE entrega_held_letters RENAME COLUMN particion TO partition_no;
ALTER TABLE entrega_held_letters RENAME COLUMN desplazamiento TO log_offset;
ALTER TABLE entrega_held_letters RENAME COLUMN destino TO destination;
ALTER TABLE entrega_held_letters RENAME COLUMN clave TO msg_key;
ALTER TABLE entrega_held_letters RENAME COLUMN cabeceras TO headers;
ALTER TABLE entrega_held_letters RENAME COLUMN carga TO payload;
ALTER TABLE entrega_held_letters RENAME COLUMN rechazo TO refusal;
ALTER TABLE entrega_held_letters RENAME COLUMN retenido_ms TO held_at_ms;
