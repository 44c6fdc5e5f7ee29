-- Durable request/reply: each request a service waits a reply for, written in the same
-- transaction as the change that needs it, sent (and sent again) until its reply is applied
-- through the inbox or its deadline passes.
CREATE TABLE IF NOT EXISTS entrega_peticiones (
    id_correlacion TEXT    PRIMARY KEY,
    cola           TEXT    NOT NULL,
    carga          BLOB    NOT NULL,
    estado         TEXT    NOT NULL,
    respuesta      BLOB,
    plazo_ms       INTEGER NOT NULL,
    enviada_ms     INTEGER,
    respondida_ms  INTEGER,
    creada_ms      INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS entrega_peticiones_estado ON entrega_peticiones (estado, creada_ms);
