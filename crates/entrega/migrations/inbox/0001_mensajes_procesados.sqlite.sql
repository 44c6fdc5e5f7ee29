-- The seed's processed-messages table: one row per (message, consumer) whose effect committed.
CREATE TABLE IF NOT EXISTS mensajes_procesados (
    id_mensaje   TEXT NOT NULL,
    consumidor   TEXT NOT NULL,
    procesado_en TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (id_mensaje, consumidor)
);

-- Purging by age.
CREATE INDEX IF NOT EXISTS mensajes_procesados_procesado_en ON mensajes_procesados (procesado_en);
