-- Stored answers of idempotent request handlers: a request seen again (same key, same
-- consumer) is answered with what was answered the first time, written in the same
-- transaction as the effect.
CREATE TABLE IF NOT EXISTS entrega_respuestas (
    clave         TEXT        NOT NULL,
    consumidor    TEXT        NOT NULL,
    respuesta     BYTEA       NOT NULL,
    respondido_en TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (clave, consumidor)
);
