-- The seed's processed-messages table, adopted in place when it already exists.
CREATE TABLE IF NOT EXISTS mensajes_procesados (
    id_mensaje   TEXT        NOT NULL,
    consumidor   TEXT        NOT NULL,
    procesado_en TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (id_mensaje, consumidor)
);

-- Purging by age scans this instead of the whole table.
CREATE INDEX IF NOT EXISTS mensajes_procesados_procesado_en ON mensajes_procesados (procesado_en);
