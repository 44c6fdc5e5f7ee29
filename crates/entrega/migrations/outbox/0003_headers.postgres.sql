-- Metadata that travels as message headers (the W3C `traceparent`, correlation ids): a JSON
-- object of text values, copied onto the published message. NULL for rows written without
-- any, such as the seed's own INSERT.
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS cabeceras JSONB;
