-- Ordered retries: records of a failed key wait here, in offset order, until the head
-- succeeds or is dead-lettered. One row per source record; writing it again keeps the first.
CREATE TABLE IF NOT EXISTS entrega_aparcados (
    grupo          TEXT    NOT NULL,
    topico         TEXT    NOT NULL,
    particion      INTEGER NOT NULL,
    desplazamiento BIGINT  NOT NULL,
    clave          TEXT,
    cabeceras      TEXT    NOT NULL,
    carga          BLOB    NOT NULL,
    intentos       INTEGER NOT NULL,
    no_antes_ms    BIGINT  NOT NULL,
    ultimo_error   TEXT,
    aparcado_ms    BIGINT  NOT NULL,
    PRIMARY KEY (grupo, topico, particion, desplazamiento)
);

-- A key's head: the lowest offset of (group, topic, partition, key).
CREATE INDEX IF NOT EXISTS entrega_aparcados_clave
    ON entrega_aparcados (grupo, topico, particion, clave, desplazamiento);
