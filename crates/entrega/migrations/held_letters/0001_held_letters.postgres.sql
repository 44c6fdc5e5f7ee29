-- Dead letters the broker refused (too large, topic missing): held here, in the consumer's
-- database, so the partition goes on and nothing is lost. One row per source record; holding
-- it again keeps the first. An operator sends them on (`km0 dlq held --send`).
CREATE TABLE IF NOT EXISTS entrega_retenidos (
    grupo          TEXT    NOT NULL,
    topico         TEXT    NOT NULL,
    particion      INTEGER NOT NULL,
    desplazamiento BIGINT  NOT NULL,
    destino        TEXT    NOT NULL,
    clave          TEXT,
    cabeceras      TEXT    NOT NULL,
    carga          BYTEA   NOT NULL,
    rechazo        TEXT    NOT NULL,
    retenido_ms    BIGINT  NOT NULL,
    PRIMARY KEY (grupo, topico, particion, desplazamiento)
);
