-- Durable request/reply: each request a service waits a reply for, written in the same
-- transaction as the change that needs it, sent (and sent again) until its reply is applied
-- through the inbox or its deadline passes.
CREATE TABLE IF NOT EXISTS entrega_peticiones (
    id_correlacion TEXT   PRIMARY KEY,
    cola           TEXT   NOT NULL,
    carga          BYTEA  NOT NULL,
    estado         TEXT   NOT NULL,
    respuesta      BYTEA,
    plazo_ms       BIGINT NOT NULL,
    enviada_ms     BIGINT,
    respondida_ms  BIGINT,
    creada_ms      BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS entrega_peticiones_estado ON entrega_peticiones (estado, creada_ms);
