-- PostgreSQL only, after 0003_english_names.sql: constraint names, and times as epoch ms.
-- ADR 0003: times entrega keeps are epoch ms, as on SQLite.
ALTER TABLE entrega_answers ALTER COLUMN answered_at_ms DROP DEFAULT;
ALTER TABLE entrega_answers ALTER COLUMN answered_at_ms TYPE BIGINT
    USING (EXTRACT(EPOCH FROM answered_at_ms) * 1000)::BIGINT;
ALTER TABLE entrega_answers RENAME CONSTRAINT entrega_respuestas_pkey TO entrega_answers_pkey;
ALTER TABLE entrega_requests RENAME CONSTRAINT entrega_peticiones_pkey TO entrega_requests_pkey;
