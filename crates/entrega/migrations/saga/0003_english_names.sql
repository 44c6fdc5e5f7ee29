-- The sagas' tables, columns and stored states named in English.
ALTER TABLE entrega_sagas RENAME COLUMN tipo TO kind;
ALTER TABLE entrega_sagas RENAME COLUMN estado TO state;
ALTER TABLE entrega_sagas RENAME COLUMN paso TO step;
ALTER TABLE entrega_sagas RENAME COLUMN fase TO phase;
ALTER TABLE entrega_sagas RENAME COLUMN intentos TO attempts;
ALTER TABLE entrega_sagas RENAME COLUMN datos TO data;
ALTER TABLE entrega_sagas RENAME COLUMN resultados TO results;
ALTER TABLE entrega_sagas RENAME COLUMN motivo TO reason;
ALTER TABLE entrega_sagas RENAME COLUMN proximo_ms TO next_at_ms;
ALTER TABLE entrega_sagas RENAME COLUMN plazo_ms TO deadline_ms;
ALTER TABLE entrega_sagas RENAME COLUMN eventos TO events;
ALTER TABLE entrega_sagas RENAME COLUMN creada_ms TO created_at_ms;
ALTER TABLE entrega_sagas RENAME COLUMN actualizada_ms TO updated_at_ms;
ALTER TABLE entrega_sagas RENAME COLUMN traza TO trace;
UPDATE entrega_sagas SET
    state = CASE state
        WHEN 'en_curso' THEN 'running'
        WHEN 'compensando' THEN 'compensating'
        WHEN 'completada' THEN 'completed'
        WHEN 'compensada' THEN 'compensated'
        WHEN 'requiere_operador' THEN 'needs_operator'
        ELSE state END,
    phase = CASE phase
        WHEN 'accion' THEN 'action'
        WHEN 'compensacion' THEN 'compensation'
        ELSE phase END;
DROP INDEX IF EXISTS entrega_sagas_proximo;
DROP INDEX IF EXISTS entrega_sagas_estado;
CREATE INDEX IF NOT EXISTS entrega_sagas_next ON entrega_sagas (kind, next_at_ms)
    WHERE next_at_ms IS NOT NULL;
CREATE INDEX IF NOT EXISTS entrega_sagas_state ON entrega_sagas (kind, state);
ALTER TABLE entrega_saga_historial RENAME TO entrega_saga_history;
ALTER TABLE entrega_saga_history RENAME COLUMN tipo TO kind;
ALTER TABLE entrega_saga_history RENAME COLUMN en_ms TO at_ms;
ALTER TABLE entrega_saga_history RENAME COLUMN que TO what;
ALTER TABLE entrega_saga_history RENAME COLUMN paso TO step;
ALTER TABLE entrega_saga_history RENAME COLUMN fase TO phase;
ALTER TABLE entrega_saga_history RENAME COLUMN clave TO msg_key;
ALTER TABLE entrega_saga_history RENAME COLUMN intento TO attempt;
ALTER TABLE entrega_saga_history RENAME COLUMN detalle TO detail;
UPDATE entrega_saga_history SET
    what = CASE what
        WHEN 'iniciada' THEN 'started'
        WHEN 'enviado' THEN 'sent'
        WHEN 'respuesta' THEN 'replied'
        WHEN 'fallo' THEN 'failed'
        WHEN 'ignorada' THEN 'ignored'
        WHEN 'plazo_vencido' THEN 'deadline_passed'
        WHEN 'compensando' THEN 'compensating'
        WHEN 'completada' THEN 'completed'
        WHEN 'compensada' THEN 'compensated'
        WHEN 'requiere_operador' THEN 'needs_operator'
        WHEN 'cancelacion' THEN 'cancel_requested'
        WHEN 'reintento_operador' THEN 'operator_retry'
        ELSE what END,
    phase = CASE phase
        WHEN 'accion' THEN 'action'
        WHEN 'compensacion' THEN 'compensation'
        ELSE phase END;
