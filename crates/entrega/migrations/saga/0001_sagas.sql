-- Sagas as their orchestrator runs them: one row per saga, only ever
-- written over the version it was read at, and its history, which only grows.
CREATE TABLE IF NOT EXISTS entrega_sagas (
    tipo TEXT NOT NULL, saga_id TEXT NOT NULL, estado TEXT NOT NULL,
    paso INTEGER NOT NULL, fase TEXT NOT NULL, intentos INTEGER NOT NULL,
    datos TEXT NOT NULL, resultados TEXT NOT NULL, motivo TEXT,
    proximo_ms BIGINT, plazo_ms BIGINT, eventos BIGINT NOT NULL, version BIGINT NOT NULL,
    creada_ms BIGINT NOT NULL, actualizada_ms BIGINT NOT NULL,
    PRIMARY KEY (tipo, saga_id));
CREATE INDEX IF NOT EXISTS entrega_sagas_proximo ON entrega_sagas (tipo, proximo_ms)
    WHERE proximo_ms IS NOT NULL;
CREATE INDEX IF NOT EXISTS entrega_sagas_estado ON entrega_sagas (tipo, estado);
CREATE TABLE IF NOT EXISTS entrega_saga_historial (
    tipo TEXT NOT NULL, saga_id TEXT NOT NULL, n BIGINT NOT NULL, en_ms BIGINT NOT NULL,
    que TEXT NOT NULL, paso TEXT NOT NULL, fase TEXT NOT NULL, clave TEXT,
    intento INTEGER, detalle TEXT,
    PRIMARY KEY (tipo, saga_id, n));
