-- The columns entrega added to the seed's outbox, named in English (the seed's own columns
-- keep their names). Indexes follow their columns.
ALTER TABLE outbox RENAME COLUMN intentos TO attempts;
ALTER TABLE outbox RENAME COLUMN proximo_intento TO next_attempt_at;
ALTER TABLE outbox RENAME COLUMN ultimo_error TO last_error;
ALTER TABLE outbox RENAME COLUMN aparcado_en TO held_at;
ALTER TABLE outbox RENAME COLUMN cabeceras TO headers;
