-- Stored answers of idempotent request handlers: a request seen again (same key, same
-- consumer) is answered with what was answered the first time, written in the same
-- transaction as the effect.
CREATE TABLE IF NOT EXISTS entrega_respuestas (
    clave         TEXT    NOT NULL,
    consumidor    TEXT    NOT NULL,
    respuesta     BLOB    NOT NULL,
    respondido_en INTEGER NOT NULL,
    PRIMARY KEY (clave, consumidor)
);
