-- Request/reply's tables named in English; states in English; times in epoch ms.
ALTER TABLE entrega_respuestas RENAME TO entrega_answers;
ALTER TABLE entrega_answers RENAME COLUMN clave TO request_key;
ALTER TABLE entrega_answers RENAME COLUMN consumidor TO consumer;
ALTER TABLE entrega_answers RENAME COLUMN respuesta TO answer;
ALTER TABLE entrega_answers RENAME COLUMN respondido_en TO answered_at_ms;
ALTER TABLE entrega_peticiones RENAME TO entrega_requests;
ALTER TABLE entrega_requests RENAME COLUMN id_correlacion TO correlation_id;
ALTER TABLE entrega_requests RENAME COLUMN cola TO queue;
ALTER TABLE entrega_requests RENAME COLUMN carga TO payload;
ALTER TABLE entrega_requests RENAME COLUMN estado TO state;
ALTER TABLE entrega_requests RENAME COLUMN respuesta TO reply;
ALTER TABLE entrega_requests RENAME COLUMN plazo_ms TO deadline_ms;
ALTER TABLE entrega_requests RENAME COLUMN enviada_ms TO sent_at_ms;
ALTER TABLE entrega_requests RENAME COLUMN respondida_ms TO replied_at_ms;
ALTER TABLE entrega_requests RENAME COLUMN creada_ms TO created_at_ms;
UPDATE entrega_requests SET state = CASE state
    WHEN 'pendiente' THEN 'pending'
    WHEN 'enviada' THEN 'sent'
    WHEN 'respondida' THEN 'replied'
    WHEN 'caducada' THEN 'expired'
    ELSE state END;
DROP INDEX IF EXISTS entrega_peticiones_estado;
CREATE INDEX IF NOT EXISTS entrega_requests_state ON entrega_requests (state, created_at_ms);
